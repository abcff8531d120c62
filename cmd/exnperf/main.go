package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/exn-project/exn/perf/demo"
	"github.com/exn-project/exn/perf/report"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	sub := "demo"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		sub, args = args[0], args[1:]
	}
	switch sub {
	case "demo":
		return runDemo(args, stdout, stderr)
	case "report":
		return report.Main(args, stdout, stderr)
	case "help":
		usage(stderr)
		return 0
	default:
		fmt.Fprintf(stderr, "exnperf: unknown subcommand %q\n", sub)
		usage(stderr)
		return 2
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, `usage: exnperf [demo|report] [flags]
subcommands:
  demo   (default) in-process N-node cluster: TCP and EXT-DS throughput and latency, every pair
         up to 8 nodes, else the ring and 2 random peers per node (-all-pairs, -peers, -budget)
  report runs the benchmark matrix, writes docs/benchmarks.md and docs/charts/*.svg
run "exnperf demo -h" or "exnperf report -h" for the flags`)
}

func runDemo(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("exnperf demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	nodes := fs.Int("nodes", 4, "number of nodes in the in-process cluster (>= 2)")
	dur := fs.Duration("time", time.Second, "throughput test length per pair")
	maxMiB := fs.Int64("max-mib", 0, "cap on MiB sent per pair (0: no cap)")
	rtt := fs.Int("rtt", 2000, "1-byte TCP round trips per pair")
	mtu := fs.Int("mtu", 0, "IP MTU (0: 65521)")
	allUpTo := fs.Int("all-pairs", demo.DefaultAllUpTo, "measure every ordered pair when there are at most this many nodes (0: always sample)")
	peers := fs.Int("peers", demo.DefaultPeers, "when sampling: random peers per node besides the ring successor i -> i+1 (0: ring only)")
	seed := fs.Uint64("seed", 1, "seed of the random peers")
	budget := fs.Duration("budget", 120*time.Second, "time the measurements should take: -time and -rtt are scaled down to fit (0: no limit)")
	dir := fs.String("dir", ".", "directory for the default output files")
	jsonPath := fs.String("json", "", "JSON results file (default DIR/exnperf-results.json; \"-\" to skip)")
	svgPath := fs.String("svg", "", "SVG chart file (default DIR/exnperf-results.svg; \"-\" to skip)")
	if code, ok := report.ParseFlags(fs, args, stderr, "exnperf"); !ok {
		return code
	}
	// The output directory is made now, not found missing after the run.
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		fmt.Fprintf(stderr, "exnperf: %v\n", err)
		return 1
	}
	if *jsonPath == "" {
		*jsonPath = filepath.Join(*dir, "exnperf-results.json")
	}
	if *svgPath == "" {
		*svgPath = filepath.Join(*dir, "exnperf-results.svg")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// The library reads 0 as its default and < 0 as none.
	if *allUpTo == 0 {
		*allUpTo = -1
	}
	if *peers == 0 {
		*peers = -1
	}
	o := demo.Options{Nodes: *nodes, Duration: *dur, MaxBytes: *maxMiB << 20, RoundTrips: *rtt, MTU: *mtu,
		Sampling: demo.Sampling{AllUpTo: *allUpTo, Peers: *peers, Seed: *seed}, Budget: *budget}
	tty := isTerminal(stdout)
	if tty {
		start := time.Now()
		o.Progress = func(done, total int, what string) {
			fmt.Fprintf(stdout, "\r\033[K[%d/%d pairs, %4.1fs] %s", done, total, time.Since(start).Seconds(), what)
		}
	}
	res, err := demo.Run(ctx, o)
	if tty {
		fmt.Fprint(stdout, "\r\033[K")
	}
	if err != nil {
		fmt.Fprintf(stderr, "exnperf: %v\n", err)
		return 1
	}
	if err := demo.WriteTable(stdout, res); err != nil {
		fmt.Fprintf(stderr, "exnperf: %v\n", err)
		return 1
	}
	if *jsonPath != "-" {
		if err := demo.WriteJSON(*jsonPath, res); err != nil {
			fmt.Fprintf(stderr, "exnperf: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "results: %s\n", *jsonPath)
	}
	if *svgPath != "-" {
		if err := demo.WriteSVG(*svgPath, res); err != nil {
			fmt.Fprintf(stderr, "exnperf: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "chart:   %s\n", *svgPath)
	}
	return 0
}

// isTerminal reports whether w is a terminal, for the progress line.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

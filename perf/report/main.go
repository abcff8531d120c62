package report

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
)

// Main is "exnperf report":
//
//	exnperf report [-quick] [-count N] [-out docs] [-results DIR] [-from DIR] [-only SECTION,...] [-note TEXT]
func Main(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("exnperf report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	quick := fs.Bool("quick", false, "short benchtimes and -count 1: the whole matrix in a few minutes")
	count := fs.Int("count", 0, "runs per benchmark, medians over them (default 3, 1 with -quick)")
	out := fs.String("out", "", "docs directory for benchmarks.md and charts/ (default: docs/ of the module)")
	results := fs.String("results", "", "directory for each section's JSON results (default OUT/results)")
	from := fs.String("from", "", "regenerate from the JSON results in this directory; run nothing")
	only := fs.String("only", "", "comma-separated sections to run (others are kept from the results directory): "+strings.Join(SectionIDs(), ","))
	note := fs.String("note", "", "extra sentence for the machine note (e.g. what else was running)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: exnperf report [flags]\n\nRuns the benchmark matrix (go test -bench as child processes; the namespace\nbenchmarks only as root), saves OUT/results/SECTION.json and writes\nOUT/benchmarks.md and OUT/charts/*.svg.\n\nflags:")
		fs.PrintDefaults()
	}
	if code, ok := ParseFlags(fs, args, stderr, "exnperf report"); !ok {
		return code
	}
	o := Options{Quick: *quick, Count: *count, Out: *out, Results: *results, From: *from, Note: *note}
	if *only != "" {
		o.Only = strings.Split(*only, ",")
	}
	if _, err := o.Selected(); err != nil {
		fmt.Fprintf(stderr, "exnperf report: %v\n", err)
		return 2
	}
	wd, _ := os.Getwd()
	root, err := FindRoot(wd)
	if err != nil && o.From == "" {
		fmt.Fprintf(stderr, "exnperf report: %v (run it inside the exn module)\n", err)
		return 1
	}
	o.Root = root
	if o.Out == "" {
		if root != "" {
			o.Out = filepath.Join(root, "docs")
		} else {
			o.Out = "docs"
		}
	}
	if f, ok := stdout.(*os.File); ok && IsTerminal(f) {
		o.Progress, o.Log = stdout, stdout
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := Report(ctx, o); err != nil {
		fmt.Fprintf(stderr, "exnperf report: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "wrote %s and %s\n", filepath.Join(o.Out, "benchmarks.md"), filepath.Join(o.Out, "charts"))
	return 0
}

// ParseFlags parses args into fs, a command line without positional
// arguments. ok says the command goes on; otherwise code is its exit
// status: 0 after -h, 2 after a bad flag or an argument (named on stderr,
// after prog).
func ParseFlags(fs *flag.FlagSet, args []string, stderr io.Writer, prog string) (code int, ok bool) {
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0, false
		}
		return 2, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected arguments %q\n", prog, fs.Args())
		return 2, false
	}
	return 0, true
}

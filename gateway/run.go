package gateway

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"github.com/exn-project/exn/fabric/backend"
)

// Configure is exnd's command line up to the point of starting: parse
// args (and the --config file), check the files they name, and under
// --check-config report the configuration valid. done is true when the
// process should exit now with code: 0 (help, or --check-config passed),
// 1 for a failure (a missing file, a backend not built in), 2 for a bad
// command line or configuration (any error under --check-config). The
// messages go to stderr.
func Configure(args []string, stderr io.Writer) (cfg Config, code int, done bool) {
	cfg, err := Parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return cfg, 0, true
	}
	if err == nil {
		_, err = Check(cfg)
	}
	if err != nil {
		fmt.Fprintf(stderr, "exnd: %v\n", err)
		if errors.Is(err, ErrUsage) || cfg.CheckOnly {
			return cfg, 2, true
		}
		return cfg, 1, true
	}
	if cfg.CheckOnly {
		fmt.Fprintf(stderr, "exnd: configuration OK: %s\n", cfg.Summary())
		return cfg, 0, true
	}
	return cfg, 0, false
}

// NewLogger is the text logger exnd writes to w at cfg.LogLevel.
// maxProcs bounds --gomaxprocs (far above any host exnd runs on).
const maxProcs = 1024

// Procs is the number of Go scheduler Ps exnd should run with, given
// env (the GOMAXPROCS environment variable, "" if unset) and def, the
// runtime's default (runtime.GOMAXPROCS(0) at start); 0 means leave it.
// --gomaxprocs wins; else the environment; else, on the fabrics whose
// data path runs through exnd between hosts (ofi and net), one fewer
// than def (at least 1), which leaves a CPU to the applications and the
// kernel's work for them. On ofi, the provider calls are long cgo calls,
// during which the runtime hands the P to another thread whenever every
// P is busy. On net, each goroutine hand-off with a P idle wakes another
// thread for it, and the kernel's TCP work runs in exnd's threads. On a
// small host shared with the applications both cost more than the
// parallelism gains (docs/operations.md, "GOMAXPROCS", has the
// measurements). shm keeps the default: it measured no better with one
// P fewer.
func (c Config) Procs(env string, def int) int {
	switch {
	case c.GOMAXPROCS > 0:
		return c.GOMAXPROCS
	case env != "" || (c.Fabric.Kind != backend.OFI && c.Fabric.Kind != backend.Net):
		return 0
	}
	return max(1, def-1)
}

// SetProcs applies Procs to the runtime and logs the choice.
func SetProcs(cfg Config, log *slog.Logger) {
	def := runtime.GOMAXPROCS(0)
	if n := cfg.Procs(os.Getenv("GOMAXPROCS"), def); n > 0 && n != def {
		runtime.GOMAXPROCS(n)
		log.Info("exnd: Go scheduler Ps set", "gomaxprocs", n, "default", def, "fabric", cfg.Fabric.String())
	}
}

func NewLogger(w io.Writer, cfg Config) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: cfg.LogLevel}))
}

// Main is exnd's whole life, as cmd/exnd/main.go wires it: Configure,
// then Run until SIGINT or SIGTERM (or a fatal error). It returns the
// process exit code: Configure's, or 0 after a clean shutdown and 1 for a
// failure at run time.
func Main(args []string, stderr io.Writer) int {
	cfg, code, done := Configure(args, stderr)
	if done {
		return code
	}
	log := NewLogger(stderr, cfg)
	SetProcs(cfg, log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := Run(ctx, cfg, log); err != nil {
		log.Error("exnd failed", "err", err)
		return 1
	}
	return 0
}

// Summary is the configuration on one line, as --check-config prints it.
func (c Config) Summary() string {
	addrs := make([]string, len(c.Addrs))
	for i, a := range c.Addrs {
		addrs[i] = a.String()
	}
	s := fmt.Sprintf("node %d, fabric %s, ifname %s, mtu %d, eager-threshold %d, addr [%s], control %q, metrics %q",
		c.Node, c.Fabric, c.Ifname, c.MTU, c.EagerThreshold, strings.Join(addrs, ","), c.Control, c.Metrics)
	if c.Peers != "" {
		s += ", peers " + c.Peers
	}
	return s
}

// Run starts a node and serves until ctx is done, then shuts it down.
func Run(ctx context.Context, cfg Config, log *slog.Logger, opts ...Option) error {
	d, err := Start(cfg, log, opts...)
	if err != nil {
		return err
	}
	var runErr error
	select {
	case <-ctx.Done():
		log.Info("exnd shutting down", "reason", context.Cause(ctx))
	case runErr = <-d.Done():
		log.Error("exnd stopping", "err", runErr)
	}
	if err := d.Close(); err != nil {
		return errors.Join(runErr, fmt.Errorf("shutdown: %w", err))
	}
	log.Info("exnd stopped")
	return runErr
}

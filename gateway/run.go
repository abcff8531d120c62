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
	"strings"
	"syscall"
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

package daemon

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

// Main is exnd's whole life: parse args (and the --config file), check
// the files they name, then either report the configuration valid
// (--check-config) or start, wait for SIGINT or SIGTERM (or a fatal
// error), and shut down. It returns the process exit code: 0, 1 for a
// failure at run time, 2 for a bad command line or configuration (any
// error under --check-config).
func Main(args []string, stderr io.Writer) int {
	cfg, err := Parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err == nil {
		_, err = Check(cfg)
	}
	if err != nil {
		fmt.Fprintf(stderr, "exnd: %v\n", err)
		if errors.Is(err, ErrUsage) || cfg.CheckOnly {
			return 2
		}
		return 1
	}
	if cfg.CheckOnly {
		fmt.Fprintf(stderr, "exnd: configuration OK: %s\n", cfg.Summary())
		return 0
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))

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

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
	"syscall"
)

// Main is exnd's whole life: parse args, start, wait for SIGINT or SIGTERM
// (or a fatal error), shut down. It returns the process exit code.
func Main(args []string, stderr io.Writer) int {
	cfg, err := Parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "exnd: %v\n", err)
		if errors.Is(err, ErrUsage) {
			return 2
		}
		return 1
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

// Run starts a node and serves until ctx is done, then shuts it down.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	d, err := Start(cfg, log)
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

package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/exn-project/exn/gateway"
)

// main wires exnd: the configuration from the command line (and the
// --config file) through the gateway library, then one node that runs
// until SIGINT or SIGTERM. gateway.Main is the same sequence as one call,
// for tests and programs that embed exnd.
func main() {
	cfg, code, done := gateway.Configure(os.Args[1:], os.Stderr)
	if done {
		os.Exit(code)
	}
	log := gateway.NewLogger(os.Stderr, cfg)
	gateway.SetProcs(cfg, log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := gateway.Run(ctx, cfg, log)
	stop()
	if err != nil {
		log.Error("exnd failed", "err", err)
		os.Exit(1)
	}
}

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/exn-project/exn/control"
)

const usage = `usage: exnctl [--control PATH] [--json] [--timeout D] COMMAND
commands:
  status          node, MAC, fabric, interface and uptime
  neighbors       the neighbour table (IP -> MAC -> node)
  stats           every counter of the fabric, EXT-Eth, TAP and EXT-DS
  conns           EXT-DS connections and their modes
  liveness        fabric peers up and down, and neighbour entries invalidated
  netstack        userspace mode: addresses, listeners, forwards and counters
  ping NODE [-c N] VELO ping-pong to NODE's management VPID (like ibping)
`

func main() {
	fs := flag.NewFlagSet("exnctl", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage); fs.PrintDefaults() }
	path := fs.String("control", envOr("EXTDS_CONTROL", control.DefaultPath), "exnd control socket")
	asJSON := fs.Bool("json", false, "print the raw JSON response (for scripts)")
	timeout := fs.Duration("timeout", 10*time.Second, "give up after this long")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	args := fs.Args()
	if len(args) == 0 {
		fs.Usage()
		os.Exit(2)
	}
	op, rest, err := request(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "exnctl:", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	c, err := control.Dial(ctx, *path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "exnctl: is exnd running? %v\n", err)
		os.Exit(1)
	}
	defer c.Close()
	var data json.RawMessage
	if err := c.Call(ctx, &data, op, rest...); err != nil {
		fmt.Fprintln(os.Stderr, "exnctl:", err)
		os.Exit(1)
	}
	if *asJSON {
		os.Stdout.Write(append(data, '\n'))
		return
	}
	if err := control.Format(os.Stdout, data); err != nil {
		fmt.Fprintln(os.Stderr, "exnctl:", err)
		os.Exit(1)
	}
}

// request turns the command line into a control operation and arguments,
// validating them here so that a typo gets a usage error, not a round trip.
func request(args []string) (string, []string, error) {
	switch cmd := args[0]; cmd {
	case "status", "neighbors", "stats", "conns", "liveness", "netstack":
		if len(args) != 1 {
			return "", nil, fmt.Errorf("%s takes no arguments", cmd)
		}
		return cmd, nil, nil
	case "ping":
		pf := flag.NewFlagSet("ping", flag.ContinueOnError)
		count := pf.Int("c", 5, "number of pings")
		if len(args) < 2 {
			return "", nil, fmt.Errorf("ping needs a NODE")
		}
		node, err := strconv.ParseUint(args[1], 10, 16)
		if err != nil {
			return "", nil, fmt.Errorf("ping: node %q: want 0..65535", args[1])
		}
		if err := pf.Parse(args[2:]); err != nil {
			return "", nil, err
		}
		if *count < 1 || *count > 10000 {
			return "", nil, fmt.Errorf("ping: -c %d: want 1..10000", *count)
		}
		return "ping", []string{strconv.FormatUint(node, 10), strconv.Itoa(*count)}, nil
	default:
		return "", nil, fmt.Errorf("unknown command %q\n%s", cmd, usage)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// Package daemon is exnd: its flags, their validation, and the wiring of
// fabric NIC, EXT-Eth engine, neighbour table and TAP into one running
// node. cmd/exnd only calls Parse and Run.
package daemon

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/backend"
)

// Defaults from DESIGN.md.
const (
	DefaultIfname         = "exn0"
	DefaultMTU            = 65521 // the largest MTU a TAP takes
	DefaultEagerThreshold = 480   // four VELO fragments (§5.4.6.2)
	DefaultControl        = "/run/exn/exnd.sock"
	minMTU                = 68 // IPv4's minimum
	maxIfname             = 15 // IFNAMSIZ - 1
)

// ErrNotImplemented marks a flag whose feature is not in this build yet.
var ErrNotImplemented = errors.New("not implemented yet")

// ErrUsage marks a bad command line; exnd exits 2 on it.
var ErrUsage = errors.New("usage")

// Config is exnd's validated configuration.
type Config struct {
	Node           fabric.NodeID
	Fabric         backend.Spec
	Peers          string // peers file, "" for none
	Ifname         string
	Addrs          []netip.Prefix
	MTU            int
	EagerThreshold int
	Netstack       bool
	Metrics        string
	Control        string
	LogLevel       slog.Level
}

// prefixList is a repeatable, comma-separated --addr flag.
type prefixList struct{ p *[]netip.Prefix }

func (l prefixList) String() string {
	if l.p == nil {
		return ""
	}
	s := make([]string, len(*l.p))
	for i, p := range *l.p {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

func (l prefixList) Set(v string) error {
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return fmt.Errorf("want CIDR like 10.77.0.1/24 or fd77::1/64: %w", err)
		}
		*l.p = append(*l.p, p)
	}
	return nil
}

// Parse parses and validates exnd's command line (without the program
// name). Usage and flag errors go to stderr. Every error names the flag
// at fault and wraps ErrUsage (or ErrNotImplemented).
func Parse(args []string, stderr io.Writer) (Config, error) {
	fs := flag.NewFlagSet("exnd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		c        Config
		nodeID   = fs.String("node-id", "", "this node's fabric `ID` (0-65535; required)")
		fab      = fs.String("fabric", "", "fabric backend: mem, shm:NAME, net:LISTEN_ADDR or ofi:PROVIDER (required)")
		logLevel = fs.String("log-level", "info", "log `level`: debug, info, warn or error")
	)
	fs.StringVar(&c.Peers, "peers", "", "peers `FILE`: one 'NODE_ID ADDRESS[:PORT] [IP]' a line")
	fs.StringVar(&c.Ifname, "ifname", DefaultIfname, "TAP interface `name`")
	fs.Var(prefixList{&c.Addrs}, "addr", "`CIDR` to put on the interface, IPv4 or IPv6 (repeatable, or comma-separated)")
	fs.IntVar(&c.MTU, "mtu", DefaultMTU, "interface MTU in `bytes`")
	fs.IntVar(&c.EagerThreshold, "eager-threshold", DefaultEagerThreshold, "largest frame in `bytes` sent eagerly over VELO; larger ones use rendezvous")
	fs.BoolVar(&c.Netstack, "netstack", false, "userspace mode: a gVisor netstack instead of the TAP")
	fs.StringVar(&c.Metrics, "metrics", "", "serve Prometheus metrics on `ADDR`")
	fs.StringVar(&c.Control, "control", DefaultControl, "control socket `PATH`")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return Config{}, err
		}
		return Config{}, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("%w: unexpected argument %q (exnd takes flags only)", ErrUsage, fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	if *nodeID == "" {
		return Config{}, fmt.Errorf("%w: --node-id is required", ErrUsage)
	}
	n, err := strconv.ParseUint(*nodeID, 0, 16)
	if err != nil {
		return Config{}, fmt.Errorf("%w: --node-id %q: want an integer 0-65535", ErrUsage, *nodeID)
	}
	c.Node = fabric.NodeID(n)

	if *fab == "" {
		return Config{}, fmt.Errorf("%w: --fabric is required (mem, shm:NAME, net:LISTEN_ADDR or ofi:PROVIDER)", ErrUsage)
	}
	if c.Fabric, err = backend.Parse(*fab); err != nil {
		return Config{}, fmt.Errorf("%w: --fabric: %w", ErrUsage, err)
	}

	if err := c.LogLevel.UnmarshalText([]byte(*logLevel)); err != nil {
		return Config{}, fmt.Errorf("%w: --log-level %q: want debug, info, warn or error", ErrUsage, *logLevel)
	}
	if c.Ifname == "" || len(c.Ifname) > maxIfname || strings.ContainsAny(c.Ifname, "/ \t\n:") {
		return Config{}, fmt.Errorf("%w: --ifname %q: want 1-%d characters, no '/', ':' or spaces", ErrUsage, c.Ifname, maxIfname)
	}
	if c.MTU < minMTU || c.MTU > DefaultMTU {
		return Config{}, fmt.Errorf("%w: --mtu %d: want %d-%d", ErrUsage, c.MTU, minMTU, DefaultMTU)
	}
	// The eager threshold bounds a whole frame, so it cannot be below the
	// smallest Ethernet header plus payload, nor above the MTU plus header.
	if c.EagerThreshold < 14 || c.EagerThreshold > c.MTU+14 {
		return Config{}, fmt.Errorf("%w: --eager-threshold %d: want 14-%d (MTU+14)", ErrUsage, c.EagerThreshold, c.MTU+14)
	}
	for _, p := range c.Addrs {
		if p.Addr().Zone() != "" {
			return Config{}, fmt.Errorf("%w: --addr %s: no zone allowed", ErrUsage, p)
		}
		if p.Addr().Is6() && c.MTU < 1280 {
			return Config{}, fmt.Errorf("%w: --addr %s: IPv6 needs --mtu of at least 1280, have %d", ErrUsage, p, c.MTU)
		}
	}

	// Features owned by other issues: refuse rather than ignore.
	if c.Netstack {
		return Config{}, fmt.Errorf("--netstack: userspace netstack mode: %w", ErrNotImplemented)
	}
	if set["metrics"] {
		return Config{}, fmt.Errorf("--metrics %s: metrics endpoint: %w", c.Metrics, ErrNotImplemented)
	}
	if set["control"] {
		return Config{}, fmt.Errorf("--control %s: control socket: %w", c.Control, ErrNotImplemented)
	}
	return c, nil
}

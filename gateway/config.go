// Package daemon is exnd: its flags and configuration file, their
// validation, and the wiring of fabric NIC, EXT-Eth engine, neighbour
// table, TAP, control socket and metrics endpoint into one running node.
// cmd/exnd only calls Main.
package gateway

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/extds/shimsrv"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/backend"
	"github.com/exn-project/exn/fabric/peers"
	"github.com/exn-project/exn/tap"
)

// Defaults from docs/design.md.
const (
	DefaultIfname         = "exn0"
	DefaultMTU            = 65521 // the largest MTU a TAP takes
	DefaultEagerThreshold = 480   // four VELO fragments (§5.4.6.2)
	DefaultControl        = control.DefaultPath
	minMTU                = 68  // IPv4's minimum
	maxIfname             = 15  // IFNAMSIZ - 1
	maxSocketPath         = 107 // sizeof(sun_path) - 1
	// MaxConfigLine bounds one line of the configuration file.
	MaxConfigLine = 4096
)

// ErrNotImplemented marks a flag whose feature is not in this build yet.
var ErrNotImplemented = errors.New("not implemented yet")

// ErrUsage marks a bad command line or configuration file; exnd exits 2
// on it.
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
	// Offload opens the TAP with IFF_VNET_HDR and checksum/TSO/USO
	// offloads (--offload, default true; docs/ext-eth.md "Offloads").
	Offload bool
	// Push carries rendezvous frames by receiver-granted PUT where the
	// fabric orders a PUT before a later message (--push, default true;
	// docs/ext-eth-engine.md "Push").
	Push bool
	// Liveness is how the net fabric finds dead peers (--liveness):
	// "swim" (membership, the default) or "heartbeat" (a heartbeat on
	// every session); docs/membership.md. On ofi, "swim" runs
	// membership beside the provider and "heartbeat" keeps its own
	// liveness; mem and shm ignore it.
	Liveness string
	// Sessions is when the net fabric makes its sessions (--sessions):
	// "lazy" (on a peer's first use, the default) or "eager" (every
	// pair at start); docs/fabric-net.md "Sessions on first use".
	Sessions string
	// GOMAXPROCS is exnd's Go scheduler Ps (--gomaxprocs); 0 picks them
	// (Procs).
	GOMAXPROCS int
	// EXTDSDirect lets shimmed programs exchange bytes through a
	// connection buffer, without exnd's relay (--extds-direct, default
	// true; docs/direct.md): on shm one buffer both programs map; on net
	// and ofi a copy per node, joined by exnd's engine by RMA (issue #38).
	EXTDSDirect bool
	// EXTDSShortHold is how long a listener port whose shimmed
	// connections close within milliseconds stays plain TCP
	// (--extds-short-hold, default 1s, 0 never; docs/shim.md "Short
	// connections").
	EXTDSShortHold time.Duration
	// EXTDSReclaimIdle is how long a direction of a direct connection
	// moves no byte before exnd gives its ring's pages back
	// (--extds-reclaim-idle, default 5s, 0 never; docs/direct.md "Rings
	// that shrink when idle").
	EXTDSReclaimIdle time.Duration
	Metrics          string // host:port to serve /metrics on, "" for none
	Control          string // control socket path, "" for none
	// ControlAccess is who may use the control socket (--control-access).
	ControlAccess control.Policy
	LogLevel      slog.Level

	// File is the --config file the settings came from, "" for none.
	File string
	// CheckOnly is --check-config: validate and exit, start nothing.
	CheckOnly bool

	// where names the origin of each setting for error messages:
	// "--mtu" or "FILE:LINE: mtu". addrWhere is per element of Addrs.
	where     map[string]string
	addrWhere []string
	// controlIsDefault: neither a flag nor the file chose Control. Then a
	// socket that cannot be served (another exnd on the host holds the
	// default path) is a warning, not a failure; see startControl.
	controlIsDefault bool

	// NS is userspace mode's --socks, --forward and --expose (netstack.go).
	NS NetstackConfig
	ns netstackFlags
}

// field names setting name as the user gave it: the flag, or the file
// and line it came from.
func (c *Config) field(name string) string {
	if w, ok := c.where[name]; ok {
		return w
	}
	return "--" + name
}

// prefixList is a repeatable, comma-separated --addr flag. It records
// where each prefix came from in *where.
type prefixList struct {
	p      *[]netip.Prefix
	where  *[]string
	origin *string
}

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
		*l.where = append(*l.where, *l.origin)
	}
	return nil
}

// notInFile are flags the configuration file cannot set.
var notInFile = map[string]bool{"config": true, "check-config": true}

// repeatable are flags a file may give more than once.
// --forward and --expose are netstack.go's.
var repeatable = map[string]bool{"addr": true, "forward": true, "expose": true}

// Parse parses and validates exnd's command line (without the program
// name) and the configuration file it names. Usage and flag errors go to
// stderr. Every error names the flag (or the file, line and setting) at
// fault and wraps ErrUsage (or ErrNotImplemented). Files the settings
// name (the peers file) are checked by Check, not here.
func Parse(args []string, stderr io.Writer) (Config, error) {
	fs := flag.NewFlagSet("exnd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	origin := "--addr"
	var (
		c        = Config{where: map[string]string{}}
		nodeID   = fs.String("node-id", "", "this node's fabric `ID` (0-65535; required)")
		fab      = fs.String("fabric", "", "fabric backend: mem, shm:NAME, net:LISTEN_ADDR or ofi:PROVIDER (required)")
		logLevel = fs.String("log-level", "info", "log `level`: debug, info, warn or error")
		access   = fs.String("control-access", "all", "who may use the control socket and EXT-DS: all (every local user, for their own sockets; mode 0666), group:GROUP (mode 0660) or root (mode 0600)")
	)
	fs.StringVar(&c.Peers, "peers", "", "peers `FILE`: one 'NODE_ID ADDRESS[:PORT] [IP]' a line")
	fs.StringVar(&c.Ifname, "ifname", DefaultIfname, "TAP interface `name`")
	fs.Var(prefixList{&c.Addrs, &c.addrWhere, &origin}, "addr", "`CIDR` to put on the interface, IPv4 or IPv6 (repeatable, or comma-separated)")
	fs.IntVar(&c.MTU, "mtu", DefaultMTU, "interface MTU in `bytes`")
	fs.IntVar(&c.EagerThreshold, "eager-threshold", DefaultEagerThreshold, "largest frame in `bytes` sent eagerly over VELO; larger ones use rendezvous")
	fs.BoolVar(&c.Netstack, "netstack", false, "userspace mode: a gVisor netstack instead of the TAP")
	fs.BoolVar(&c.Offload, "offload", true, "open the TAP with a virtio-net header: checksum offload and TSO/USO super-frames, carried to peers that take them")
	fs.BoolVar(&c.Push, "push", true, "carry large frames by receiver-granted PUT where the fabric places a PUT before a later message (ofi:tcp), without a GET per frame (false: advert and GET only)")
	fs.StringVar(&c.Liveness, "liveness", "swim", "how the net fabric finds dead peers: swim (membership by SWIM, a constant cost per node at any cluster size) or heartbeat (a heartbeat on every session; the cost grows with the cluster); on ofi, swim runs membership beside the provider (fabric port + 100) and heartbeat keeps its own liveness; every node must use the same (docs/membership.md)")
	fs.StringVar(&c.Sessions, "sessions", "lazy", "when the net fabric makes a session to a peer: lazy (on first use, by either side; multicast reaches nodes without one by datagram) or eager (every pair at start); nodes may differ; heartbeat liveness is always eager (docs/fabric-net.md)")
	fs.IntVar(&c.GOMAXPROCS, "gomaxprocs", 0, "Go scheduler Ps for exnd (0: one fewer than the CPUs on an ofi or net fabric, Go's default elsewhere; GOMAXPROCS in the environment takes precedence over 0)")
	fs.BoolVar(&c.EXTDSDirect, "extds-direct", true, "let two programs under libextds.so move their bytes through a connection buffer instead of exnd's relay: on shm one shared buffer, exnd out of the data path; on net and ofi a copy per node that exnd's engine joins by RMA PUT (false: exnd relays every byte)")
	fs.DurationVar(&c.EXTDSReclaimIdle, "extds-reclaim-idle", shimsrv.DefaultReclaimIdle, "give the pages of a direct connection's ring back to /dev/shm once it has moved no byte for this `DURATION` (up to twice it; 0: never)")
	fs.DurationVar(&c.EXTDSShortHold, "extds-short-hold", shimsrv.DefaultShortHold, "keep a listener port whose shimmed connections close within milliseconds on plain TCP for this `DURATION`, then try EXT-DS again (0: never; at most 2.032s)")
	fs.StringVar(&c.Metrics, "metrics", "", "serve Prometheus metrics at http://`ADDR`/metrics (host:port; empty: off)")
	fs.StringVar(&c.Control, "control", DefaultControl, "control socket `PATH` (empty: off)")
	fs.StringVar(&c.File, "config", "", "read settings from `FILE` ('name = value' lines; flags override it)")
	fs.BoolVar(&c.CheckOnly, "check-config", false, "validate flags and the configuration file, then exit 0 (valid) or 2")
	addNetstackFlags(fs, &c.ns)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return Config{}, err
		}
		return Config{}, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("%w: unexpected argument %q (exnd takes flags only)", ErrUsage, fs.Arg(0))
	}
	// From here on a failed Parse still says whether --check-config was
	// asked for, so that Main exits 2 on any error in that mode.
	failed := Config{File: c.File, CheckOnly: c.CheckOnly}
	onCommandLine := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCommandLine[f.Name] = true })
	if c.File != "" {
		if err := readFile(fs, c.File, onCommandLine, c.where, &origin); err != nil {
			return failed, err
		}
	}
	if err := c.validate(*nodeID, *fab, *logLevel); err != nil {
		return failed, err
	}
	pol, err := control.ParsePolicy(*access, lookupGroup)
	if err != nil {
		return failed, fmt.Errorf("%w: %s %v", ErrUsage, c.field("control-access"), err)
	}
	c.ControlAccess = pol
	_, inFile := c.where["control"]
	c.controlIsDefault = !onCommandLine["control"] && !inFile
	return c, nil
}

// lookupGroup resolves a group name for --control-access group:NAME.
func lookupGroup(name string) (int, error) {
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(g.Gid)
}

// readFile applies the settings of a configuration file to fs, skipping
// those given on the command line, and records where each came from.
//
// Format: one "name = value" a line, name being a flag name without
// dashes; '#' starts a comment; blank lines are ignored; a repeatable
// setting (addr) may appear on several lines, any other only once.
func readFile(fs *flag.FlagSet, path string, skip map[string]bool, where map[string]string, origin *string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%w: --config: %w", ErrUsage, err)
	}
	defer f.Close()
	return parseFile(fs, path, f, skip, where, origin)
}

func parseFile(fs *flag.FlagSet, path string, r io.Reader, skip map[string]bool, where map[string]string, origin *string) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 256), MaxConfigLine)
	line := 0
	seen := map[string]int{}
	for sc.Scan() {
		line++
		text := sc.Text()
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		text = strings.TrimSpace(text)
		if text == "" {
			continue
		}
		at := fmt.Sprintf("%s:%d", path, line)
		name, value, ok := strings.Cut(text, "=")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if !ok || name == "" {
			return fmt.Errorf("%w: %s: want 'name = value', have %q", ErrUsage, at, text)
		}
		fl := fs.Lookup(name)
		if fl == nil || notInFile[name] {
			return fmt.Errorf("%w: %s: unknown setting %q (settings are exnd's flag names without dashes)", ErrUsage, at, name)
		}
		if prev, dup := seen[name]; dup && !repeatable[name] {
			return fmt.Errorf("%w: %s: %s given again (first on line %d)", ErrUsage, at, name, prev)
		}
		seen[name] = line
		if skip[name] {
			continue // the command line overrides the file
		}
		*origin = at + ": addr"
		if err := fs.Set(name, value); err != nil {
			return fmt.Errorf("%w: %s: %s = %q: %w", ErrUsage, at, name, value, err)
		}
		where[name] = at + ": " + name
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return fmt.Errorf("%w: %s:%d: line longer than %d bytes", ErrUsage, path, line+1, MaxConfigLine)
		}
		return fmt.Errorf("%w: --config %s: %w", ErrUsage, path, err)
	}
	return nil
}

func (c *Config) validate(nodeID, fab, logLevel string) error {
	bad := func(name, format string, args ...any) error {
		return fmt.Errorf("%w: %s %s", ErrUsage, c.field(name), fmt.Sprintf(format, args...))
	}
	inFile := ""
	if c.File != "" {
		inFile = " (flag, or setting in " + c.File + ")"
	}
	if nodeID == "" {
		return fmt.Errorf("%w: --node-id is required%s", ErrUsage, inFile)
	}
	n, err := strconv.ParseUint(nodeID, 0, 16)
	if err != nil {
		return bad("node-id", "%q: want an integer 0-65535", nodeID)
	}
	c.Node = fabric.NodeID(n)

	if fab == "" {
		return fmt.Errorf("%w: --fabric is required%s (mem, shm:NAME, net:LISTEN_ADDR or ofi:PROVIDER)", ErrUsage, inFile)
	}
	if c.Fabric, err = backend.Parse(fab); err != nil {
		return bad("fabric", "%q: %v", fab, err)
	}
	if c.Fabric.Kind == backend.Net && c.Peers == "" {
		return bad("fabric", "%s: the net backend needs --peers (the address of every node)", c.Fabric)
	}
	if err := c.LogLevel.UnmarshalText([]byte(logLevel)); err != nil {
		return bad("log-level", "%q: want debug, info, warn or error", logLevel)
	}
	if c.Ifname == "" || len(c.Ifname) > maxIfname || strings.ContainsAny(c.Ifname, "/ \t\n:") {
		return bad("ifname", "%q: want 1-%d characters, no '/', ':' or spaces", c.Ifname, maxIfname)
	}
	if c.MTU < minMTU || c.MTU > DefaultMTU {
		return bad("mtu", "%d: want %d-%d", c.MTU, minMTU, DefaultMTU)
	}
	if c.GOMAXPROCS < 0 || c.GOMAXPROCS > maxProcs {
		return bad("gomaxprocs", "%d: want 0 (pick) to %d", c.GOMAXPROCS, maxProcs)
	}
	if c.EXTDSReclaimIdle < 0 {
		return bad("extds-reclaim-idle", "%v: want 0 (never) or more", c.EXTDSReclaimIdle)
	}
	if c.EXTDSShortHold < 0 || c.EXTDSShortHold > extds.MaxHold {
		return bad("extds-short-hold", "%v: want 0-%v", c.EXTDSShortHold, extds.MaxHold)
	}
	// The eager threshold bounds a whole frame, so it cannot be below the
	// Ethernet header nor above the largest frame (MTU plus header).
	if maxFrame := tap.FrameSize(c.MTU); c.EagerThreshold < tap.HeaderLen || c.EagerThreshold > maxFrame {
		return bad("eager-threshold", "%d: want %d-%d (MTU+%d, the largest frame)", c.EagerThreshold, tap.HeaderLen, maxFrame, tap.HeaderLen)
	}
	for i, p := range c.Addrs {
		at := c.addrWhere[i]
		if p.Addr().Zone() != "" {
			return fmt.Errorf("%w: %s %s: no zone allowed", ErrUsage, at, p)
		}
		if p.Addr().Is6() && c.MTU < 1280 {
			return fmt.Errorf("%w: %s %s: IPv6 needs an MTU of at least 1280, have %d", ErrUsage, at, p, c.MTU)
		}
	}
	if c.Metrics != "" {
		host, port, err := net.SplitHostPort(c.Metrics)
		if err != nil {
			return bad("metrics", "%q: want HOST:PORT like 127.0.0.1:9464", c.Metrics)
		}
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return bad("metrics", "%q: port %q: want 0-65535", c.Metrics, port)
		}
		if host != "" {
			if _, err := netip.ParseAddr(host); err != nil && host != "localhost" {
				return bad("metrics", "%q: host %q: want an IP address or localhost", c.Metrics, host)
			}
		}
	}
	if len(c.Control) > maxSocketPath || strings.ContainsRune(c.Control, 0) {
		return bad("control", "%q: want a path of at most %d bytes", c.Control, maxSocketPath)
	}

	return c.validateNetstack(&c.ns)
}

// Check validates what Parse cannot without reading other files: that the
// peers file parses. It is what --check-config adds to Parse, and Start
// runs it too. Errors wrap ErrUsage and name the setting.
func Check(c Config) ([]peers.Peer, error) {
	if c.Peers == "" {
		return nil, nil
	}
	ps, err := peers.Load(c.Peers)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrUsage, c.field("peers"), err)
	}
	return ps, nil
}

package gateway

// Userspace access (--netstack): a gVisor netstack (exn/node) takes the
// TAP's place under the daemon's own engine, so nothing needs root, and
// local programs reach the fabric through a SOCKS5 proxy (--socks, whose
// protocol is socks5.go), TCP port forwards (--forward) and inbound
// forwards (--expose). This file has their settings, the stack as the
// daemon's device (nsDevice) and the services' listeners and splices.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/exn/node"
	"github.com/exn-project/exn/fabric"
)

// Limits of the userspace-mode services.
const (
	// socksHandshakeTimeout bounds a SOCKS5 greeting plus request, and
	// dialTimeout a connect to the fabric or to a local server.
	spliceBuf = 64 << 10
)

// maxNetstackConns bounds the connections the userspace-mode front doors
// (the SOCKS5 listener, the forwards and the exposes together) carry at
// once; more are refused at accept. A variable for the tests, which set it
// before starting a daemon (each daemon reads it once).
var maxNetstackConns int64 = 4096

// Timeouts of the userspace-mode services. The handshake timeout is
// atomic so that tests may shorten it while a daemon runs.
var (
	socksHandshakeTimeout = newAtomicInt64(int64(10 * time.Second)) // nanoseconds
	dialTimeout           = 10 * time.Second
)

func newAtomicInt64(v int64) *atomic.Int64 {
	a := new(atomic.Int64)
	a.Store(v)
	return a
}

// NetstackConfig is the userspace-mode part of Config.
type NetstackConfig struct {
	// Socks is the host:port of the local SOCKS5 listener, "" for none.
	Socks string
	// Forwards are --forward LOCAL=REMOTE: a local TCP listener whose
	// connections go to REMOTE on the fabric.
	Forwards []Forward
	// Exposes are --expose REMOTEPORT=LOCALADDR: a fabric TCP listener on
	// the node's addresses whose connections go to a local server.
	Exposes []Expose
}

// Forward is one --forward.
type Forward struct {
	Local  string         // host:port to listen on
	Remote netip.AddrPort // fabric address to connect to
}

// Expose is one --expose.
type Expose struct {
	Port  uint16 // fabric port to listen on (every node address)
	Local string // host:port of the local server
}

// listFlag is a repeatable string flag.
type listFlag struct{ v *[]string }

func (l listFlag) String() string {
	if l.v == nil {
		return ""
	}
	return strings.Join(*l.v, " ")
}

func (l listFlag) Set(s string) error { *l.v = append(*l.v, s); return nil }

// netstackFlags are the raw userspace-mode flags, checked by validate.
type netstackFlags struct {
	socks            string
	forward, expose  []string
	socksSet, netSet bool
}

// addNetstackFlags registers --socks, --forward and --expose on fs.
func addNetstackFlags(fs *flag.FlagSet, f *netstackFlags) {
	fs.StringVar(&f.socks, "socks", "", "with --netstack: serve SOCKS5 (CONNECT, no auth) at `HOST:PORT`, e.g. 127.0.0.1:1080")
	fs.Var(listFlag{&f.forward}, "forward", "with --netstack: forward local TCP `LOCAL=REMOTE` (e.g. 127.0.0.1:5201=10.88.0.2:5201) to the fabric (repeatable)")
	fs.Var(listFlag{&f.expose}, "expose", "with --netstack: accept TCP on fabric `PORT=LOCALADDR` (e.g. 8080=127.0.0.1:80) and connect it to a local server (repeatable)")
}

// validateNetstack checks the userspace-mode settings and fills c.NS. It
// also refuses those settings without --netstack, and --netstack settings
// the mode cannot honour.
func (c *Config) validateNetstack(f *netstackFlags) error {
	bad := func(name, format string, args ...any) error {
		return fmt.Errorf("%w: %s %s", ErrUsage, c.field(name), fmt.Sprintf(format, args...))
	}
	if !c.Netstack {
		for name, set := range map[string]bool{"socks": f.socks != "", "forward": len(f.forward) > 0, "expose": len(f.expose) > 0} {
			if set {
				return bad(name, "needs --netstack (it serves the userspace stack; with a TAP, programs use exn0 directly)")
			}
		}
		return nil
	}
	var v4, v6 int
	for i, p := range c.Addrs {
		if p.Addr().Is4() {
			v4++
		} else {
			v6++
		}
		if v4 > 1 || v6 > 1 {
			return fmt.Errorf("%w: %s %s: --netstack takes one IPv4 and at most one IPv6 address", ErrUsage, c.addrWhere[i], p)
		}
	}
	if v4 == 0 {
		return bad("addr", "is required with --netstack: the node's IPv4 address, e.g. 10.88.0.1/24")
	}
	if c.MTU < netstackMinMTU {
		return bad("mtu", "%d: --netstack needs at least %d", c.MTU, netstackMinMTU)
	}
	if f.socks != "" {
		if err := checkLocalAddr(f.socks); err != nil {
			return bad("socks", "%q: %v", f.socks, err)
		}
		c.NS.Socks = f.socks
	}
	locals := map[string]string{}
	if c.NS.Socks != "" {
		locals[c.NS.Socks] = "--socks"
	}
	for _, s := range f.forward {
		local, remote, ok := strings.Cut(s, "=")
		if !ok {
			return bad("forward", "%q: want LOCAL=REMOTE, e.g. 127.0.0.1:5201=10.88.0.2:5201", s)
		}
		if err := checkLocalAddr(local); err != nil {
			return bad("forward", "%q: local %q: %v", s, local, err)
		}
		ap, err := netip.ParseAddrPort(remote)
		if err != nil || ap.Port() == 0 || ap.Addr().Zone() != "" || !ap.Addr().IsValid() ||
			ap.Addr().IsUnspecified() || ap.Addr().IsMulticast() {
			return bad("forward", "%q: remote %q: want IP:PORT of a fabric node (e.g. 10.88.0.2:5201, [fd88::2]:5201)", s, remote)
		}
		if prev, dup := locals[local]; dup {
			return bad("forward", "%q: local %s already used by %s", s, local, prev)
		}
		locals[local] = "--forward " + s
		c.NS.Forwards = append(c.NS.Forwards, Forward{Local: local, Remote: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())})
	}
	ports := map[uint16]bool{}
	for _, s := range f.expose {
		port, local, ok := strings.Cut(s, "=")
		if !ok {
			return bad("expose", "%q: want PORT=LOCALADDR, e.g. 8080=127.0.0.1:80", s)
		}
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil || p == 0 {
			return bad("expose", "%q: port %q: want 1-65535", s, port)
		}
		if err := checkLocalAddr(local); err != nil {
			return bad("expose", "%q: local %q: %v", s, local, err)
		}
		if _, pt, _ := net.SplitHostPort(local); pt == "0" {
			return bad("expose", "%q: local %q: want a server's port, not 0", s, local)
		}
		if ports[uint16(p)] {
			return bad("expose", "%q: fabric port %d exposed twice", s, p)
		}
		ports[uint16(p)] = true
		c.NS.Exposes = append(c.NS.Exposes, Expose{Port: uint16(p), Local: local})
	}
	return nil
}

// netstackMinMTU is the smallest MTU the userspace stack takes (IPv6's
// minimum, which gVisor needs for its dual stack).
const netstackMinMTU = 1280

// checkLocalAddr accepts HOST:PORT with an IP literal or "localhost" (or
// empty: every local address) and a port 0-65535.
func checkLocalAddr(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("want HOST:PORT like 127.0.0.1:1080")
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("port %q: want 0-65535", port)
	}
	if host != "" && host != "localhost" {
		if _, err := netip.ParseAddr(host); err != nil {
			return fmt.Errorf("host %q: want an IP address or localhost", host)
		}
	}
	return nil
}

// nsDevice is the userspace stack in the TAP's place: Read pulls the
// frames the stack sends, Write delivers frames to it. It implements
// tap.Device.
type nsDevice struct {
	n   *node.Node
	mtu int
}

// openNetstack starts the userspace node on nic as the daemon's device:
// the daemon's engine carries its frames as it does a TAP's.
func openNetstack(cfg Config, nic fabric.NIC, log *slog.Logger) (*nsDevice, error) {
	ncfg := node.Config{NIC: nic, MTU: cfg.MTU, External: true, Logger: log}
	for _, p := range cfg.Addrs {
		if p.Addr().Is4() {
			ncfg.Addr = p
		} else {
			ncfg.Addr6 = p
		}
	}
	n, err := node.New(ncfg)
	if err != nil {
		return nil, err
	}
	return &nsDevice{n: n, mtu: cfg.MTU}, nil
}

func (d *nsDevice) Read(bufs [][]byte, sizes []int) (int, error) {
	return d.n.Link().ReadFrames(bufs, sizes)
}

func (d *nsDevice) Write(frames [][]byte) (int, error) {
	if err := d.n.Link().DeliverFrames(frames); err != nil {
		return 0, err
	}
	return len(frames), nil
}

func (d *nsDevice) Name() string { return "netstack" }
func (d *nsDevice) MTU() int     { return d.mtu }
func (d *nsDevice) Close() error { return d.n.Close() }

// Node returns the userspace node.
func (d *nsDevice) Node() *node.Node { return d.n }

// nsStats are the userspace services' counters.
type nsStats struct {
	Accepted  atomic.Uint64 // connections accepted (all services)
	Refused   atomic.Uint64 // over maxNetstackConns, bad SOCKS5 handshakes, failed dials
	Active    atomic.Int64
	BytesOut  atomic.Uint64 // local → fabric
	BytesIn   atomic.Uint64 // fabric → local
	PeerReset func() uint64
}

// nsServices owns the listeners and connections of userspace mode.
type nsServices struct {
	log      *slog.Logger
	n        *node.Node
	ctx      context.Context
	stop     context.CancelFunc
	maxConns int64
	wg       sync.WaitGroup
	stats    nsStats

	mu     sync.Mutex
	lns    []net.Listener
	conns  map[net.Conn]struct{}
	closed bool

	socksAddr         string   // as bound
	forwards, exposes []string // as in NetstackStatus
}

// startNetstackServices is the part "netstack services" (parts.go) that
// serves --socks, --forward and --expose. Its closer stops them and then the node, while the engine
// still runs, so the resets of aborted connections reach the fabric.
func startNetstackServices(d *Daemon) (started, error) {
	if !d.cfg.Netstack {
		return started{}, nil
	}
	dev, ok := d.dev.(*nsDevice)
	if !ok {
		return started{}, errors.New("--netstack: the device is not the userspace stack")
	}
	s := &nsServices{log: d.log.With("part", "netstack"), n: dev.n, conns: map[net.Conn]struct{}{},
		maxConns: maxNetstackConns}
	s.stats.PeerReset = dev.n.PeerResets
	s.ctx, s.stop = context.WithCancel(context.Background())
	fail := func(err error) (started, error) {
		s.close()
		return started{}, err
	}
	ns := d.cfg.NS
	if ns.Socks != "" {
		ln, err := net.Listen("tcp", ns.Socks)
		if err != nil {
			return fail(fmt.Errorf("--socks: %w", err))
		}
		s.serve(ln, "socks", s.socks)
		s.socksAddr = ln.Addr().String()
		s.log.Info("socks5 listening", "addr", ln.Addr().String())
	}
	for _, f := range ns.Forwards {
		ln, err := net.Listen("tcp", f.Local)
		if err != nil {
			return fail(fmt.Errorf("--forward %s=%s: %w", f.Local, f.Remote, err))
		}
		remote := f.Remote.String()
		s.serve(ln, "forward", func(c net.Conn) { s.forward(c, remote) })
		s.forwards = append(s.forwards, ln.Addr().String()+"="+remote)
		s.log.Info("forwarding", "local", ln.Addr().String(), "remote", remote)
	}
	for _, e := range ns.Exposes {
		ln, err := dev.n.Listen("tcp", ":"+strconv.Itoa(int(e.Port)))
		if err != nil {
			return fail(fmt.Errorf("--expose %d=%s: %w", e.Port, e.Local, err))
		}
		local := e.Local
		s.serve(ln, "expose", func(c net.Conn) { s.expose(c, local) })
		s.exposes = append(s.exposes, strconv.Itoa(int(e.Port))+"="+local)
		s.log.Info("exposing", "fabric_port", e.Port, "local", local)
	}
	closeFn := func() error {
		s.close()
		if err := dev.n.Close(); err != nil {
			return fmt.Errorf("close netstack: %w", err)
		}
		return nil
	}
	ops := map[string]control.HandlerFunc{"netstack": func(context.Context, []string) (any, error) { return s.snapshot(), nil }}
	return started{close: closeFn, ops: ops}, nil
}

// NetstackStatus is the "netstack" control operation's answer.
type NetstackStatus struct {
	Addr       string   `json:"addr"`
	Addr6      string   `json:"addr6,omitempty"`
	Socks      string   `json:"socks,omitempty"`    // bound address
	Forwards   []string `json:"forwards,omitempty"` // "LOCAL=REMOTE", LOCAL as bound
	Exposes    []string `json:"exposes,omitempty"`  // "PORT=LOCALADDR"
	Accepted   uint64   `json:"accepted"`
	Refused    uint64   `json:"refused"`
	Active     int64    `json:"active"`
	BytesOut   uint64   `json:"bytes_out"`
	BytesIn    uint64   `json:"bytes_in"`
	PeerResets uint64   `json:"peer_resets"`
}

func (s *nsServices) snapshot() NetstackStatus {
	s.mu.Lock()
	st := NetstackStatus{
		Socks: s.socksAddr, Forwards: append([]string(nil), s.forwards...), Exposes: append([]string(nil), s.exposes...),
		Addr: s.n.Addr().String(), Accepted: s.stats.Accepted.Load(), Refused: s.stats.Refused.Load(),
		Active: s.stats.Active.Load(), BytesOut: s.stats.BytesOut.Load(), BytesIn: s.stats.BytesIn.Load(),
		PeerResets: s.stats.PeerReset(),
	}
	s.mu.Unlock()
	if s.n.Addr6().IsValid() {
		st.Addr6 = s.n.Addr6().String()
	}
	return st
}

// serve accepts on ln until close and runs handle for each connection on
// a goroutine of its own; handle owns the connection.
func (s *nsServices) serve(ln net.Listener, what string, handle func(net.Conn)) {
	s.mu.Lock()
	s.lns = append(s.lns, ln)
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				if s.ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
					s.log.Warn("accept failed", "service", what, "err", err)
					// A transient error (EMFILE): do not spin.
					select {
					case <-s.ctx.Done():
					case <-time.After(50 * time.Millisecond):
						continue
					}
				}
				return
			}
			if !s.track(c) {
				s.stats.Refused.Add(1)
				c.Close()
				continue
			}
			s.stats.Accepted.Add(1)
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer s.untrack(c)
				handle(c)
			}()
		}
	}()
}

// track registers a connection to be closed on shutdown; it refuses one
// over the limit or after close.
func (s *nsServices) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.stats.Active.Load() >= s.maxConns {
		return false
	}
	s.conns[c] = struct{}{}
	s.stats.Active.Add(1)
	return true
}

func (s *nsServices) untrack(c net.Conn) {
	c.Close()
	s.mu.Lock()
	if _, ok := s.conns[c]; ok {
		delete(s.conns, c)
		s.stats.Active.Add(-1)
	}
	s.mu.Unlock()
}

// close stops the listeners, closes every connection and waits for the
// goroutines. It is idempotent.
func (s *nsServices) close() {
	s.stop()
	s.mu.Lock()
	s.closed = true
	lns := s.lns
	s.lns = nil
	conns := make([]net.Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, ln := range lns {
		ln.Close()
	}
	for _, c := range conns {
		c.Close()
	}
	s.wg.Wait()
}

// dialFabric connects to addr over the userspace stack.
func (s *nsServices) dialFabric(addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(s.ctx, dialTimeout)
	defer cancel()
	return s.n.DialContext(ctx, "tcp", addr)
}

// forward carries local connection c to remote on the fabric.
func (s *nsServices) forward(c net.Conn, remote string) {
	fc, err := s.dialFabric(remote)
	if err != nil {
		s.stats.Refused.Add(1)
		s.log.Debug("forward: dial failed", "remote", remote, "err", err)
		return
	}
	s.splice(c, fc)
}

// expose carries fabric connection c to the local server at local.
func (s *nsServices) expose(c net.Conn, local string) {
	d := net.Dialer{Timeout: dialTimeout}
	lc, err := d.DialContext(s.ctx, "tcp", local)
	if err != nil {
		s.stats.Refused.Add(1)
		s.log.Debug("expose: dial failed", "local", local, "err", err)
		return
	}
	s.splice(lc, c)
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, spliceBuf); return &b }}

type closeWriter interface{ CloseWrite() error }

// splice copies between local and fabric in both directions until both
// have finished. An EOF is passed on as a half close; an error in either
// direction closes both connections (which resets the other side). The
// caller's untrack closes local; splice closes fc.
func (s *nsServices) splice(local, fc net.Conn) {
	s.mu.Lock()
	closed := s.closed
	if !closed {
		s.conns[fc] = struct{}{} // closed on shutdown; not counted
	}
	s.mu.Unlock()
	defer func() {
		fc.Close()
		s.mu.Lock()
		delete(s.conns, fc)
		s.mu.Unlock()
	}()
	if closed {
		return
	}
	done := make(chan struct{})
	pipe := func(dst, src net.Conn, count *atomic.Uint64) {
		bp := bufPool.Get().(*[]byte)
		defer bufPool.Put(bp)
		_, err := io.CopyBuffer(countingWriter{dst, count}, onlyReader{src}, *bp)
		if err != nil {
			local.Close()
			fc.Close()
			return
		}
		if cw, ok := dst.(closeWriter); ok {
			if cw.CloseWrite() == nil {
				return
			}
		}
		dst.Close()
	}
	go func() {
		defer close(done)
		pipe(local, fc, &s.stats.BytesIn)
	}()
	pipe(fc, local, &s.stats.BytesOut)
	<-done
}

// onlyReader and countingWriter hide WriteTo and ReadFrom so io.CopyBuffer
// uses the pooled buffer (gonet's ReadFrom would allocate per call);
// countingWriter also counts the bytes as they pass.
type onlyReader struct{ io.Reader }

type countingWriter struct {
	w io.Writer
	n *atomic.Uint64
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(uint64(n))
	return n, err
}

// socks serves one SOCKS5 client.
func (s *nsServices) socks(c net.Conn) {
	c.SetDeadline(time.Now().Add(time.Duration(socksHandshakeTimeout.Load())))
	dst, err := socksHandshake(c)
	if err != nil {
		s.stats.Refused.Add(1)
		s.log.Debug("socks5: handshake", "peer", c.RemoteAddr().String(), "err", err)
		return
	}
	fc, err := s.dialFabric(dst.String())
	if err != nil {
		s.stats.Refused.Add(1)
		c.Write(socksReply(socksDialCode(err), netip.AddrPort{}))
		s.log.Debug("socks5: connect", "dst", dst.String(), "err", err)
		return
	}
	var bound netip.AddrPort
	if ta, ok := fc.LocalAddr().(*net.TCPAddr); ok {
		bound = ta.AddrPort()
	}
	if _, err := c.Write(socksReply(socksOK, bound)); err != nil {
		fc.Close()
		return
	}
	c.SetDeadline(time.Time{})
	s.splice(c, fc)
}

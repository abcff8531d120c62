package shimsrv

// The Server: its options, counters, the table of operations it installs
// on the control socket, refusals, introspection and Close. What each
// operation does is in its own file: listen.go (the listen registry),
// switch.go (shim-connect / shim-accept), splice.go (the bytes of a
// switched connection), state.go (registrations across restarts).
//
// Goroutines: one sweeper (dead listener PIDs, listen.go) and two per
// switched connection (app→fabric, fabric→app, splice.go); Close stops and
// joins them all, and waits for operations in progress (enter). Locks:
// mu guards closed, listens, conns and nextID; it is never held across
// I/O. Counters are atomics and need no lock.

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/extds"
)

// Version is the shim protocol version this server speaks. 2: no
// request names a PID (the kernel says who calls), shim-listen carries
// the listening socket, and accepts are claimed out of band. 3: the
// direct buffer's layout version 2 (rung flags). 4: one bell per side
// (layout version 3): a direct answer carries V, the buffer and the
// side's bell, and shim-relay V and the bell (docs/direct.md). 5: layout
// version 4, whose producer lock exnd takes to give an idle ring's pages
// back (reclaim.go).
const Version = 5

// Tunables, with why.
const (
	// BufSize is each splice direction's buffer, pooled (no allocation
	// per message). app → fabric: one read takes everything the
	// application has queued in the socketpair (up to SockBuf), so a bulk
	// stream becomes few large RMA PUTs (exnd's rings are 4 MiB) rather
	// than one per application write. fabric → app: one TryRead takes a
	// whole PUT chunk.
	BufSize = 1 << 20
	// SockBuf is SO_SNDBUF and SO_RCVBUF of both socketpair ends. An
	// AF_UNIX stream writer blocks once its SO_SNDBUF worth of data is
	// unread (the default, 208 KiB, is less than two iperf3 writes); a
	// larger buffer lets either side run ahead and the other take more per
	// wake-up. exnd (CAP_NET_ADMIN) sets it past net.core.wmem_max /
	// rmem_max (SO_SNDBUFFORCE); without the capability the kernel caps
	// it at those limits, which only makes the buffer smaller.
	SockBuf = 4 << 20
	// DefaultPeekTimeout bounds shim-accept's wait for the client's first
	// bytes. Trade-off: a plain client that waits for a server banner
	// (SMTP-style) costs this delay once per connection before the server
	// application sees it; an EXT-DS client's hello arrives within a
	// round trip.
	DefaultPeekTimeout = 200 * time.Millisecond
	// DefaultSweep is how often listener registrations of dead PIDs are
	// dropped. A dead listener costs a client at most one failed
	// handshake (second line of defense) until the sweep.
	DefaultSweep = time.Second
	// opTimeout bounds one shim-connect or shim-accept (probe, handshake),
	// on top of extds' own handshake timeout.
	opTimeout = 10 * time.Second
	// logLimit is the most per-connection log lines per second.
	logLimit = 10
)

// Option configures a Server.
type Option func(*Server)

// WithPeekTimeout sets shim-accept's wait for the first bytes.
func WithPeekTimeout(d time.Duration) Option { return func(s *Server) { s.peekTO = d } }

// WithSweepInterval sets how often dead listener PIDs are dropped.
func WithSweepInterval(d time.Duration) Option { return func(s *Server) { s.sweep = d } }

// ConnInfo describes one switched connection (exnctl conns).
type ConnInfo struct {
	ID         uint64    `json:"id"`
	Mode       string    `json:"mode"` // "extds" (relayed by exnd) or "direct" (docs/direct.md); fallbacks stay the shim's plain sockets
	Side       string    `json:"side"` // "connect" or "accept"
	Local      string    `json:"local"`
	Remote     string    `json:"remote"`
	FabricPeer string    `json:"fabric_peer"` // node:vpid
	PID        int       `json:"pid"`
	UID        uint32    `json:"uid"`
	BytesIn    uint64    `json:"bytes_in"`  // fabric → application
	BytesOut   uint64    `json:"bytes_out"` // application → fabric
	Since      time.Time `json:"since"`
}

// Stats are the shim server's counters.
type Stats struct {
	Switched  uint64            `json:"switched"`  // connections put onto EXT-DS (relayed or direct)
	Fallbacks map[string]uint64 `json:"fallbacks"` // answered "tcp", by extds.FallbackReason
	Errors    uint64            `json:"errors"`    // shim-connect/accept that failed
	Refused   map[string]uint64 `json:"refused"`   // requests refused, by reason (Reason*)
	Resets    uint64            `json:"resets"`    // switched connections that ended by a reset
	Active    int               `json:"active"`
	Listens   int               `json:"listens"` // (port, pid) registrations
	BytesIn   uint64            `json:"bytes_in"`
	BytesOut  uint64            `json:"bytes_out"`
	// Direct counts writes to applications made straight from the EXT-DS
	// receive loop, without a goroutine hand-off (see deliver).
	Direct uint64 `json:"direct"`
	// Direct connections (docs/direct.md): made, open now, handed to the
	// relay after exec, and the bytes the programs moved (from the
	// buffers' cursors: live connections are read at the snapshot).
	DirectConns  uint64 `json:"direct_conns"`
	DirectActive int    `json:"direct_active"`
	DirectRelays uint64 `json:"direct_relays"`
	// DirectReclaims: idle rings whose pages went back (reclaim.go).
	DirectReclaims uint64 `json:"direct_reclaims"`
	DirectBytesIn  uint64 `json:"direct_bytes_in"`
	DirectBytesOut uint64 `json:"direct_bytes_out"`
	// Holds counts listener ports put on hold for short connections
	// (hold.go); the answers given during holds are Fallbacks
	// ["short_lived"].
	Holds uint64 `json:"holds"`
}

// Server serves the shim's operations for one Device.
type Server struct {
	dev    *extds.Device
	dialer *extds.Dialer
	log    *slog.Logger
	peekTO time.Duration
	sweep  time.Duration
	// listenAdded (capacity 1) wakes a sweeper that stopped its ticker
	// because there was no registration (kickSweeper).
	listenAdded chan struct{}
	// statePath keeps registrations across exnd restarts (state.go).
	statePath string

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	listens map[listenKey]*listenReg
	conns   map[uint64]*conn
	nextID  uint64
	// Direct connections (direct.go); directCfg nil: relay only.
	directCfg *DirectConfig
	dconns    map[uint64]*dconn
	dnext     uint64
	pool      ringPool // accepting side's ready buffers (dpool.go)
	// livenessPeriod: directLiveness's poll without a PeerWatcher.
	livenessPeriod time.Duration
	// livenessStarted, if set (tests only), runs first in directLiveness.
	livenessStarted func()
	// livenessOn: the directLiveness goroutine runs (direct.go).
	livenessOn bool
	// reclaimOn: the reclaimer runs (reclaim.go).
	reclaimOn bool
	dpeak     int // most direct connections at once since the reclaimer last ended
	// Holds for short connections (hold.go): shortHold 0 is off.
	shortHold time.Duration
	holdMu    sync.Mutex
	runs      map[uint16]int // listener port → short connections in a row
	holds     atomic.Uint64

	switched, errs, resets atomic.Uint64
	bytesIn, bytesOut      atomic.Uint64
	direct                 atomic.Uint64
	directConns, relays    atomic.Uint64
	reclaims               atomic.Uint64
	directIn, directOut    atomic.Uint64
	fallbacks              sync.Map // reason string → *atomic.Uint64
	refused                sync.Map // reason string → *atomic.Uint64
	logWin, logN           atomic.Int64
	// upgrading: the 4-tuples with an upgrade being agreed (upgrade.go), under mu.
	upgrading map[extds.TupleKey]struct{}
}

// New returns a server for dev. dialer upgrades shim-connect sockets (its
// Device should be dev; a nil dialer means &extds.Dialer{Device: dev}).
func New(dev *extds.Device, dialer *extds.Dialer, log *slog.Logger, opts ...Option) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if dialer == nil {
		dialer = &extds.Dialer{Device: dev}
	}
	s := &Server{
		dev: dev, dialer: dialer, log: log, peekTO: DefaultPeekTimeout, sweep: DefaultSweep,
		listens: make(map[listenKey]*listenReg), conns: make(map[uint64]*conn), listenAdded: make(chan struct{}, 1),
		dconns: make(map[uint64]*dconn), livenessPeriod: directLivenessPeriod, runs: make(map[uint16]int),
		pool: ringPool{ready: make(chan pooled, poolSize), want: make(chan struct{}, 1)},
	}
	for _, o := range opts {
		o(s)
	}
	if s.peekTO <= 0 {
		s.peekTO = DefaultPeekTimeout
	}
	if s.sweep <= 0 {
		s.sweep = DefaultSweep
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if n, err := s.restore(); err != nil {
		s.log.Warn("extds shim: listeners not restored", "err", err)
	} else if n > 0 {
		s.log.Info("extds shim: listeners restored from the state file", "count", n, "path", s.statePath)
	}
	s.wg.Add(1)
	go s.sweeper()
	return s
}

// Register installs the shim operations on cs.
func (s *Server) Register(cs *control.Server) {
	for op, h := range s.Handlers() {
		cs.Handle(op, h)
	}
	for op, h := range s.FDHandlers() {
		cs.HandleFD(op, h)
	}
}

// Handlers are the operations without descriptors: shim-hello,
// shim-listen, shim-unlisten (for a caller that registers them itself).
func (s *Server) Handlers() map[string]control.HandlerFunc {
	return map[string]control.HandlerFunc{
		"shim-hello":    s.hello,
		"shim-unlisten": s.unlisten,
	}
}

// FDHandlers are the operations that take a socket: shim-connect and
// shim-accept.
func (s *Server) FDHandlers() map[string]control.FDHandlerFunc {
	return map[string]control.FDHandlerFunc{
		"shim-listen": s.listen,
		"shim-connect": func(ctx context.Context, r *control.Request) (any, []*os.File, error) {
			return s.switchFD(ctx, r, sideConnect)
		},
		"shim-accept": func(ctx context.Context, r *control.Request) (any, []*os.File, error) {
			return s.switchFD(ctx, r, sideAccept)
		},
		"shim-relay": s.relay,
	}
}

func (s *Server) hello(_ context.Context, args []string) (any, error) {
	if len(args) != 1 {
		return nil, s.refuse(ReasonBadRequest, "shim-hello: want VERSION, got %d arguments", len(args))
	}
	if v, err := strconv.Atoi(args[0]); err != nil || v != Version {
		return nil, s.refuse(ReasonVersion, "shim-hello: version %q not supported (this exnd speaks %d)", args[0], Version)
	}
	return HelloResult{Version: Version}, nil
}

// HelloResult is shim-hello's data (docs/shim.md, "Control protocol").
type HelloResult struct {
	Version int `json:"version"`
}

func parsePort(s string) (uint16, error) {
	p, err := strconv.ParseUint(s, 10, 16)
	if err != nil || p == 0 {
		return 0, fmt.Errorf("bad port %q", s)
	}
	return uint16(p), nil
}

// caller is the kernel's word on who sent the request (SO_PEERCRED).
func (s *Server) caller(ctx context.Context, op string) (control.Peer, error) {
	p, ok := control.PeerFrom(ctx)
	if !ok {
		return p, s.refuse(ReasonNoPeer, "%s: the caller's credentials are unknown", op)
	}
	return p, nil
}

// callerWithFile is caller for a request that takes no arguments and
// exactly one descriptor (what names the descriptor in the refusal).
func (s *Server) callerWithFile(ctx context.Context, op, what string, r *control.Request) (control.Peer, error) {
	who, err := s.caller(ctx, op)
	if err != nil {
		return who, err
	}
	if len(r.Args) != 0 || len(r.Files) != 1 {
		return who, s.refuse(ReasonBadRequest, "%s: want no arguments and 1 %s, got %d and %d", op, what, len(r.Args), len(r.Files))
	}
	return who, nil
}

var empty = struct{}{}

const (
	sideConnect = "connect"
	sideAccept  = "accept"
)

// Refusal reasons (Stats.Refused, exn_shim_refused_total).
const (
	ReasonBadRequest   = "bad_request"   // wrong arguments or descriptors
	ReasonVersion      = "version"       // shim-hello with another version
	ReasonNoPeer       = "no_peer_cred"  // the kernel did not say who called
	ReasonNotListening = "not_listening" // shim-listen with a socket that is not a listening TCP socket
	ReasonNotOwner     = "not_owner"     // another uid's registration
	ReasonLimit        = "too_many"      // MaxListensPerUser
)

// refuse counts a refused request and returns its error.
func (s *Server) refuse(reason, format string, args ...any) error {
	v, _ := s.refused.LoadOrStore(reason, new(atomic.Uint64))
	v.(*atomic.Uint64).Add(1)
	return fmt.Errorf(format, args...)
}

// refuseLocked is refuse under s.mu (it takes no lock of its own).
func (s *Server) refuseLocked(reason, format string, args ...any) error {
	return s.refuse(reason, format, args...)
}

func (s *Server) fallback(reason string) {
	v, _ := s.fallbacks.LoadOrStore(reason, new(atomic.Uint64))
	v.(*atomic.Uint64).Add(1)
}

// logConn logs a per-connection event, at most logLimit a second.
func (s *Server) logConn(level slog.Level, msg string, args ...any) {
	now := time.Now().Unix()
	if w := s.logWin.Load(); w != now && s.logWin.CompareAndSwap(w, now) {
		s.logN.Store(0)
	}
	if s.logN.Add(1) > logLimit {
		return
	}
	s.log.Log(context.Background(), level, msg, args...)
}

// Conns lists the switched connections.
func (s *Server) Conns() []ConnInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]ConnInfo, 0, len(s.conns))
	for _, e := range s.conns {
		out = append(out, ConnInfo{
			ID: e.id, Mode: extds.ModeEXTDS.String(), Side: e.side, Local: e.local, Remote: e.remote,
			FabricPeer: e.peer, PID: e.pid, UID: e.uid, BytesIn: e.in.Load(), BytesOut: e.out.Load(), Since: e.since,
		})
	}
	for _, dc := range s.dconns {
		sent, recvd := dc.ep.Counters()
		out = append(out, ConnInfo{
			ID: dc.id, Mode: "direct", Side: dc.side, Local: dc.local, Remote: dc.remote,
			FabricPeer: dc.peer, PID: dc.pid, UID: dc.uid, BytesIn: recvd, BytesOut: sent, Since: dc.since,
		})
	}
	return out
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	st := Stats{
		Switched: s.switched.Load(), Errors: s.errs.Load(), Resets: s.resets.Load(),
		BytesIn: s.bytesIn.Load(), BytesOut: s.bytesOut.Load(), Direct: s.direct.Load(),
		Fallbacks: make(map[string]uint64), Refused: make(map[string]uint64),
	}
	s.fallbacks.Range(func(k, v any) bool {
		st.Fallbacks[k.(string)] = v.(*atomic.Uint64).Load()
		return true
	})
	s.refused.Range(func(k, v any) bool {
		st.Refused[k.(string)] = v.(*atomic.Uint64).Load()
		return true
	})
	st.DirectConns, st.DirectRelays = s.directConns.Load(), s.relays.Load()
	st.DirectReclaims = s.reclaims.Load()
	st.Holds = s.holds.Load()
	st.DirectBytesIn, st.DirectBytesOut = s.directIn.Load(), s.directOut.Load()
	s.mu.Lock()
	st.Active, st.Listens, st.DirectActive = len(s.conns), len(s.listens), len(s.dconns)
	for _, dc := range s.dconns {
		out, in := dc.ep.Counters()
		st.DirectBytesIn += in
		st.DirectBytesOut += out
	}
	s.mu.Unlock()
	// Switched and the byte totals count every EXT-DS connection, relayed
	// or direct; the Direct* fields are the direct share.
	st.BytesIn += st.DirectBytesIn
	st.BytesOut += st.DirectBytesOut
	return st
}

// Close unregisters every listener, resets every switched connection
// (peers get RESET, applications lose their sockets), cancels operations
// in progress and joins all goroutines. It is idempotent. Close it before
// the Device.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	listens := s.listens
	s.listens = make(map[listenKey]*listenReg)
	conns := make([]*conn, 0, len(s.conns))
	for _, e := range s.conns {
		conns = append(conns, e)
	}
	s.mu.Unlock()
	s.cancel()
	for _, l := range listens {
		l.unreg()
	}
	for _, e := range conns {
		s.resetApp(e)
		abort(e.c)
	}
	s.closeDirect()
	s.wg.Wait()
	if s.directCfg != nil {
		s.closePool()
	}
	return nil
}

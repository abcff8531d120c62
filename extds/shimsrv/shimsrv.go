// Package shimsrv is exnd's side of the LD_PRELOAD shim (libextds.so): the
// control-socket operations through which the shim registers listening
// ports and hands over connected TCP sockets, and the splice that moves a
// switched connection's bytes between an AF_UNIX socketpair end (which the
// shim dup3's over the application's descriptor) and an extds.Conn.
//
// Protocol (control lines "OP ARGS\n", one JSON response line
// {"ok":..,"data":..,"error":..}, descriptors as SCM_RIGHTS):
//
//	shim-hello 1              → {"version":1}
//	shim-listen PORT PID      → {}   register PORT for PID (probes answer yes)
//	shim-unlisten PORT PID    → {}   remove it (idempotent)
//	shim-connect PID  + fd    → {"mode":"extds","id":N} + socketpair end
//	                          | {"mode":"tcp","reason":R}  (no fd)
//	shim-accept PID   + fd    → same as shim-connect
//
// Any failure is {"ok":false,"error":"..."}; the shim then keeps plain TCP.
// See docs/extds.md ("Shim server") for the behaviour in detail.
//
// Goroutines: one sweeper (dead listener PIDs) and two per switched
// connection (app→fabric, fabric→app); Close stops and joins them all, and
// waits for operations in progress. Locks: mu guards closed, listens,
// conns and nextID; it is never held across I/O.
package shimsrv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/internal/sys"
)

// Version is the shim protocol version this server speaks. 2: no
// request names a PID (the kernel says who calls), shim-listen carries
// the listening socket, and accepts are claimed out of band.
const Version = 2

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
	Mode       string    `json:"mode"` // always "extds": fallbacks stay the shim's plain sockets
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
	Switched  uint64            `json:"switched"`  // connections spliced onto EXT-DS
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

	switched, errs, resets atomic.Uint64
	bytesIn, bytesOut      atomic.Uint64
	direct                 atomic.Uint64
	fallbacks              sync.Map // reason string → *atomic.Uint64
	refused                sync.Map // reason string → *atomic.Uint64
	logWin, logN           atomic.Int64
}

// listenKey is one listening socket: its port and inode (the kernel's
// identity of the socket, shared by every process that inherited it).
type listenKey struct {
	port uint16
	ino  uint64
}

// listenReg is a registration: who made it (SO_PEERCRED) and how to
// withdraw it from the Device.
type listenReg struct {
	uid   uint32
	pid   int
	addr  netip.Addr // the socket's bound address (getsockname); invalid: unknown (an old state file)
	unreg func()
}

// conn is one switched connection and its splice.
type conn struct {
	id        uint64
	pid       int    // SO_PEERCRED of the caller that handed the socket over
	uid       uint32 // the connection's owner: only its fd reaches it
	side      string
	c         *extds.Conn
	uc        *net.UnixConn
	local     string
	remote    string
	peer      string
	since     time.Time
	in, out   atomic.Uint64
	left      atomic.Int32 // splice goroutines still running
	reset     atomic.Bool
	closeOnce sync.Once

	// fabric → application delivery (see deliver). dmu is held by
	// whoever moves bytes from c to uc: the rx loop's notify (TryLock
	// only, never waits) or fabricToApp (which may block while holding
	// it). dbuf is nil once fabricToApp has ended.
	dmu  sync.Mutex
	dbuf []byte        // under dmu: the direction's buffer (pooled)
	pend []byte        // under dmu: read from c, not yet written to uc
	kick chan struct{} // cap 1: fabricToApp has work (pend, flush, EOF, error)
	urc  syscall.RawConn
	wp   []byte // under dmu: uwrite's argument and results
	wn   int
	werr error
	uwr  func(fd uintptr) // writes wp to the raw fd without waiting; made once
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, BufSize); return &b }}

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
		"shim-connect": func(ctx context.Context, r *control.Request) (any, *os.File, error) {
			return s.switchFD(ctx, r, sideConnect)
		},
		"shim-accept": func(ctx context.Context, r *control.Request) (any, *os.File, error) {
			return s.switchFD(ctx, r, sideAccept)
		},
	}
}

// ---- simple operations ----

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

var empty = struct{}{}

// listen registers the listening socket the caller hands over (its
// port, from the kernel). The registration belongs to the caller's uid
// and lives while that socket does (see sweepDead); exnd does not keep
// the descriptor, so a listener the application closes really closes.
func (s *Server) listen(ctx context.Context, r *control.Request) (any, *os.File, error) {
	const op = "shim-listen"
	who, err := s.caller(ctx, op)
	if err != nil {
		return nil, nil, err
	}
	if len(r.Args) != 0 || len(r.Files) != 1 {
		return nil, nil, s.refuse(ReasonBadRequest, "%s: want no arguments and 1 listening socket, got %d and %d", op, len(r.Args), len(r.Files))
	}
	var port uint16
	var ino uint64
	var bound netip.AddrPort
	var ierr error
	if err := rawFD(r.Files[0], func(fd int) {
		if port, ierr = sys.ListeningTCPPort(fd); ierr == nil {
			if ino, ierr = sys.SocketInode(fd); ierr == nil {
				bound, ierr = sys.SockName(fd)
			}
		}
	}); err != nil || ierr != nil {
		return nil, nil, s.refuse(ReasonNotListening, "%s: %v", op, errors.Join(err, ierr))
	}
	k := listenKey{port: port, ino: ino}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, errors.New("shim-listen: exnd is shutting down")
	}
	if l, ok := s.listens[k]; ok {
		if l.uid != who.UID && who.UID != 0 {
			return nil, nil, s.refuseLocked(ReasonNotOwner, "%s: port %d is registered by another user", op, port)
		}
		return ListenResult{Port: port}, nil, nil // idempotent
	}
	n := 0
	for _, l := range s.listens {
		if l.uid == who.UID {
			n++
		}
	}
	if n >= MaxListensPerUser {
		return nil, nil, s.refuseLocked(ReasonLimit, "%s: uid %d has %d listeners registered", op, who.UID, n)
	}
	unreg, err := s.dev.RegisterClaimPort(port)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", op, err)
	}
	s.listens[k] = &listenReg{uid: who.UID, pid: who.PID, addr: bound.Addr(), unreg: unreg}
	s.saveLocked()
	s.kickSweeper()
	return ListenResult{Port: port}, nil, nil
}

// ListenResult is shim-listen's data.
type ListenResult struct {
	Port uint16 `json:"port"`
}

// unlisten says the caller closed its listener on PORT: registrations of
// the caller's uid for PORT whose socket is gone are dropped now (the
// sweep would drop them within a second). A socket another process still
// holds (a forked worker) stays registered.
func (s *Server) unlisten(ctx context.Context, args []string) (any, error) {
	const op = "shim-unlisten"
	who, err := s.caller(ctx, op)
	if err != nil {
		return nil, err
	}
	if len(args) != 1 {
		return nil, s.refuse(ReasonBadRequest, "%s: want PORT, got %d arguments", op, len(args))
	}
	port, err := parsePort(args[0])
	if err != nil {
		return nil, s.refuse(ReasonBadRequest, "%s: %v", op, err)
	}
	live, lerr := sys.ListeningTCP()
	var drop []func()
	s.mu.Lock()
	mine, others := 0, 0
	for k, l := range s.listens {
		if k.port != port {
			continue
		}
		if l.uid != who.UID && who.UID != 0 {
			others++
			continue
		}
		mine++
		if _, ok := live[k.ino]; lerr == nil && !ok {
			delete(s.listens, k)
			drop = append(drop, l.unreg)
		}
	}
	if len(drop) > 0 {
		s.saveLocked()
	}
	s.mu.Unlock()
	for _, f := range drop {
		f()
	}
	if mine == 0 && others > 0 {
		return nil, s.refuse(ReasonNotOwner, "%s: port %d is registered by another user", op, port)
	}
	return empty, nil
}

// sweeper drops listener registrations whose socket is gone (closed by
// every process that had it, or its processes killed). With no
// registration it stops its ticker and sleeps until one is added, so an
// idle exnd has no timer from here (docs/wakeup.md).
func (s *Server) sweeper() {
	defer s.wg.Done()
	t := time.NewTicker(s.sweep)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			if s.sweepDead() == 0 {
				t.Stop()
				select {
				case <-s.ctx.Done():
					return
				case <-s.listenAdded:
				}
				t.Reset(s.sweep)
			}
		}
	}
}

// kickSweeper wakes a sweeper idle for lack of registrations.
func (s *Server) kickSweeper() {
	select {
	case s.listenAdded <- struct{}{}:
	default: // a kick is pending
	}
}

// sweepDead drops the dead registrations and returns how many remain.
func (s *Server) sweepDead() int {
	live, err := sys.ListeningTCP()
	if err != nil {
		s.logConn(slog.LevelWarn, "extds shim: cannot list listening sockets", "err", err)
		return 1 // keep sweeping
	}
	var dead []func()
	s.mu.Lock()
	for k, l := range s.listens {
		if p, ok := live[k.ino]; !ok || p != k.port {
			delete(s.listens, k)
			dead = append(dead, l.unreg)
			s.logConn(slog.LevelInfo, "extds shim: listener gone", "port", k.port, "pid", l.pid, "uid", l.uid)
		}
	}
	if len(dead) > 0 {
		s.saveLocked()
	}
	left := len(s.listens)
	s.mu.Unlock()
	for _, f := range dead {
		f()
	}
	return left
}

// ---- shim-connect / shim-accept ----

const (
	sideConnect = "connect"
	sideAccept  = "accept"
)

// SwitchResult is the data of shim-connect and shim-accept: Mode "extds"
// with the connection's ID (the socketpair end comes with it), or "tcp"
// with the fallback reason.
type SwitchResult struct {
	Mode   string `json:"mode"`
	ID     uint64 `json:"id,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// enter counts an operation in progress, unless the server is closed.
func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

func (s *Server) switchFD(ctx context.Context, r *control.Request, side string) (any, *os.File, error) {
	op := "shim-" + side
	who, err := s.caller(ctx, op)
	if err != nil {
		return nil, nil, err
	}
	if len(r.Args) != 0 || len(r.Files) != 1 {
		return nil, nil, s.refuse(ReasonBadRequest, "%s: want no arguments and 1 socket descriptor, got %d and %d", op, len(r.Args), len(r.Files))
	}
	pid := who.PID
	if !s.enter() {
		return nil, nil, fmt.Errorf("%s: exnd is shutting down", op)
	}
	defer s.wg.Done()
	res, out, err := s.switchSocket(ctx, r.Files[0], who, side)
	if err != nil {
		s.errs.Add(1)
		s.logConn(slog.LevelWarn, "extds shim: "+op+" failed", "pid", pid, "err", err)
		return nil, nil, fmt.Errorf("%s: %w", op, err)
	}
	return res, out, nil
}

// switchSocket upgrades the application's socket f. f stays owned by the
// control server (it closes it after the response); exnd works on a dup.
func (s *Server) switchSocket(ctx context.Context, f *os.File, who control.Peer, side string) (any, *os.File, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, nil, err
	}
	var isTCP, nonblock bool
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		if isTCP, ierr = sys.IsTCPSocket(int(fd)); ierr == nil {
			nonblock, ierr = sys.Nonblocking(int(fd))
		}
	}); err != nil {
		return nil, nil, err
	}
	if ierr != nil {
		return nil, nil, ierr
	}
	if !isTCP {
		return nil, nil, errors.New("descriptor is not a TCP socket")
	}
	if side == sideAccept {
		var la netip.AddrPort
		if err := rc.Control(func(fd uintptr) { la, ierr = sys.SockName(int(fd)) }); err != nil || ierr != nil {
			return nil, nil, errors.Join(err, ierr)
		}
		if !s.mayAccept(who, la) {
			// Another user's registration: no claim is made for this
			// connection, so its client is never told to go ahead.
			_ = s.refuse(ReasonNotOwner, "shim-accept: port %d is registered by another user", la.Port())
			s.fallback(ReasonNotOwner)
			return SwitchResult{Mode: "tcp", Reason: ReasonNotOwner}, nil, nil
		}
	}
	// net.FileConn dups f and sets O_NONBLOCK, which lives in the open
	// file description the application shares: restore it whenever the
	// application keeps its socket (fallback, error).
	restore := func() {
		_ = rc.Control(func(fd uintptr) { _ = sys.SetNonblocking(int(fd), nonblock) })
	}
	nc, err := net.FileConn(f)
	if err != nil {
		restore()
		return nil, nil, err
	}
	shadow, ok := nc.(*net.TCPConn)
	if !ok {
		nc.Close()
		restore()
		return nil, nil, fmt.Errorf("descriptor is a %T, not a TCP connection", nc)
	}
	if shadow.RemoteAddr() == nil {
		shadow.Close()
		restore()
		return nil, nil, errors.New("descriptor is not a connected TCP socket (accept it first)")
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()

	var c *extds.Conn
	if side == sideConnect {
		c, err = s.dialer.Upgrade(ctx, shadow)
	} else {
		c, err = s.accept(ctx, shadow)
	}
	if err != nil {
		shadow.Close()
		restore()
		return nil, nil, err
	}
	if c.Mode() != extds.ModeEXTDS {
		why, _ := c.FallbackReason()
		c.Close() // the dup only
		restore()
		s.fallback(why.String())
		return SwitchResult{Mode: "tcp", Reason: why.String()}, nil, nil
	}
	app, mine, err := sys.Socketpair("extds-shim")
	if err != nil {
		abort(c)
		return nil, nil, err
	}
	if err := sizeBuffers(app); err != nil {
		app.Close()
		mine.Close()
		abort(c)
		return nil, nil, err
	}
	mc, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		app.Close()
		abort(c)
		return nil, nil, err
	}
	uc, ok := mc.(*net.UnixConn)
	if !ok {
		mc.Close()
		app.Close()
		abort(c)
		return nil, nil, fmt.Errorf("socketpair end is a %T", mc)
	}
	if err := setBuffers(uc); err != nil {
		uc.Close()
		app.Close()
		abort(c)
		return nil, nil, err
	}
	urc, err := uc.SyscallConn()
	if err != nil {
		uc.Close()
		app.Close()
		abort(c)
		return nil, nil, err
	}
	e := &conn{
		pid: who.PID, uid: who.UID, side: side, c: c, uc: uc, since: time.Now(),
		local: c.LocalAddr().String(), remote: c.RemoteAddr().String(),
		kick: make(chan struct{}, 1), urc: urc,
	}
	if fp, ok := c.FabricPeer(); ok {
		e.peer = fp.String()
	}
	if !s.start(e) {
		app.Close()
		e.uc.Close()
		abort(c)
		return nil, nil, errors.New("exnd is shutting down")
	}
	s.switched.Add(1)
	s.logConn(slog.LevelDebug, "extds shim: switched", "id", e.id, "side", side, "pid", who.PID,
		"uid", who.UID, "local", e.local, "remote", e.remote, "peer", e.peer)
	return SwitchResult{Mode: "extds", ID: e.id}, app, nil
}

// setBuffers sets uc's socket buffers to SockBuf: past
// net.core.wmem_max/rmem_max when exnd has CAP_NET_ADMIN (a stock
// kernel's 208 KiB limit would otherwise undo the point), capped by them
// otherwise.
func setBuffers(uc *net.UnixConn) error {
	rc, err := uc.SyscallConn()
	if err != nil {
		return fmt.Errorf("socket buffer: %w", err)
	}
	return sys.SetSockBuf(rc, SockBuf)
}

// sizeBuffers sets the socket buffers of the application's end f
// through a dup (closed again). The dup makes f's open file
// non-blocking; the shim sets O_NONBLOCK as the application's
// descriptor had it when it installs the socket.
func sizeBuffers(f *os.File) error {
	nc, err := net.FileConn(f)
	if err != nil {
		return err
	}
	defer nc.Close()
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		return fmt.Errorf("socketpair end is a %T", nc)
	}
	return setBuffers(uc)
}

func abort(c *extds.Conn) {
	_ = c.SetLinger(0)
	_ = c.Close()
}

// Refusal reasons (Stats.Refused, exn_shim_refused_total).
const (
	ReasonBadRequest   = "bad_request"   // wrong arguments or descriptors
	ReasonVersion      = "version"       // shim-hello with another version
	ReasonNoPeer       = "no_peer_cred"  // the kernel did not say who called
	ReasonNotListening = "not_listening" // shim-listen with a socket that is not a listening TCP socket
	ReasonNotOwner     = "not_owner"     // another uid's registration
	ReasonLimit        = "too_many"      // MaxListensPerUser
)

// MaxListensPerUser bounds one uid's listener registrations (each costs
// a Device port registration and a sweep check).
const MaxListensPerUser = 1024

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

// rawFD runs fn on f's descriptor.
func rawFD(f *os.File, fn func(fd int)) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Control(func(fd uintptr) { fn(int(fd)) })
}

func (s *Server) fallback(reason string) {
	v, _ := s.fallbacks.LoadOrStore(reason, new(atomic.Uint64))
	v.(*atomic.Uint64).Add(1)
}

// accept decides an accepted socket's mode. It claims the connection
// (extds.Device.Claim: the client's exnd is told to go ahead only now,
// when a shimmed acceptor with exnd access holds the socket), then peeks
// the first bytes without consuming them: an EXT-DS hello runs the
// server handshake, anything else leaves the socket plain TCP with its
// stream untouched. A client whose IP is not on the fabric cannot send a
// hello: no wait. Otherwise the wait is the peek timeout plus the claim
// timeout, extended to the handshake timeout once the client was told to
// go ahead. Trade-off: a plain client on the fabric of a
// server-speaks-first protocol waits that long once per connection.
func (s *Server) accept(ctx context.Context, shadow *net.TCPConn) (*extds.Conn, error) {
	la, lok := tcpAddrPort(shadow.LocalAddr())
	ra, rok := tcpAddrPort(shadow.RemoteAddr())
	if !lok || !rok || !s.dev.OnFabric(ra.Addr()) {
		return s.dev.AcceptShadow(ctx, shadow, nil)
	}
	cl := s.dev.Claim(extds.TupleKey{Local: la, Remote: ra})
	defer cl.Close()
	// The client's CLAIM may still be on its way (its exnd sends it after
	// the TCP handshake and a control round trip): wait as long as the
	// client would wait for the answer, on top of the peek timeout.
	peeked, err := s.peek(shadow, s.peekTO+extds.DefaultClaimTimeout)
	if hello, plain := extds.ClassifyPeek(peeked); err == nil && !hello && !plain && cl.Close() {
		// Agreed: the hello is on its way (or the client gave up at the
		// same moment and writes its own bytes): wait for them.
		peeked, err = s.peek(shadow, extds.DefaultHandshakeTimeout)
	}
	if err != nil {
		return nil, err
	}
	return s.dev.AcceptShadow(ctx, shadow, peeked)
}

func tcpAddrPort(a net.Addr) (netip.AddrPort, bool) {
	t, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, false
	}
	return t.AddrPort(), true
}

// peek waits (bounded by to) for the first bytes of an accepted socket
// without consuming them: until they are an EXT-DS hello, certainly not
// one, EOF, or the timeout. It waits in Go's poller (the socket is
// non-blocking), not in a blocked system call. A timeout with nothing
// read returns no bytes (plain TCP), or with some, those.
func (s *Server) peek(shadow *net.TCPConn, to time.Duration) ([]byte, error) {
	rc, err := shadow.SyscallConn()
	if err != nil {
		return nil, err
	}
	buf := make([]byte, extds.HelloPrefixLen)
	_ = shadow.SetReadDeadline(time.Now().Add(to))
	defer shadow.SetReadDeadline(time.Time{})
	var n int
	var perr error
	err = rc.Read(func(fd uintptr) bool {
		k, e := sys.RecvPeek(int(fd), buf)
		if sys.IsEAGAIN(e) {
			return false // nothing yet: wait for readability
		}
		if e != nil {
			perr = e
			return true
		}
		n = k
		if k == 0 {
			return true // EOF before any byte
		}
		hello, plain := extds.ClassifyPeek(buf[:k])
		return hello || plain // a strict prefix of the magic: wait for more
	})
	if perr != nil {
		return nil, perr
	}
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		return nil, err
	}
	return buf[:n], nil // a timeout leaves whatever arrived: plain TCP
}

// ---- splice ----

// start registers e and starts its splice, unless the server is closed.
func (s *Server) start(e *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.nextID++
	e.id = s.nextID
	s.conns[e.id] = e
	e.left.Store(2)
	s.wg.Add(2)
	bp := bufPool.Get().(*[]byte)
	e.dbuf = *bp
	e.uwr = func(fd uintptr) { e.wn, e.werr = syscall.Write(int(fd), e.wp) }
	if err := e.c.SetReadNotify(func() { s.deliver(e) }, func() { kickConn(e) }); err != nil {
		kickConn(e) // not EXT-DS (cannot happen): fabricToApp reads the error
	}
	go s.appToFabric(e)
	go s.fabricToApp(e, bp)
	return true
}

// appToFabric copies the application's writes onto the extds connection.
// EOF (the application shut down its writes or closed) becomes
// CloseWrite; then it waits for the application's end to hang up
// entirely and closes the connection (with unread data that is a reset,
// as TCP's close is).
func (s *Server) appToFabric(e *conn) {
	defer s.done(e)
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	for {
		n, err := e.uc.Read(buf)
		if n > 0 {
			if _, werr := e.c.Write(buf[:n]); werr != nil {
				s.failed(e, "write to fabric", werr)
				return
			}
			e.out.Add(uint64(n))
			s.bytesOut.Add(uint64(n))
		}
		switch {
		case err == nil:
			continue
		case err == io.EOF:
			if cerr := e.c.CloseWrite(); cerr != nil {
				s.failed(e, "close write", cerr)
				return
			}
			s.waitHangup(e)
			_ = e.c.Close()
			return
		case errors.Is(err, net.ErrClosed):
			return // we closed the unix end (reset or shutdown)
		default:
			// ECONNRESET: the application closed with data we had not
			// read yet. Reset the peer, as TCP would.
			s.logConn(slog.LevelDebug, "extds shim: app socket error", "id", e.id, "err", err)
			abort(e.c)
			return
		}
	}
}

// waitHangup returns when the application's end of the socketpair is
// gone (POLLHUP), or the unix end was closed here. It waits in Go's
// poller: the release of the peer wakes it.
func (s *Server) waitHangup(e *conn) {
	rc, err := e.uc.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Read(func(fd uintptr) bool {
		hup, err := sys.HungUp(int(fd))
		return hup || err != nil
	})
}

// Fabric → application. The EXT-DS receive loop delivers to the
// application's socket itself (deliver): TryRead, then a write that does
// not wait. Only what cannot be done without waiting goes to the
// fabricToApp goroutine, through kick: the rest of a partial write (the
// application is not reading), returning credits (a fabric Send), a
// ZCopy segment (Read drives it), EOF, errors. A ping-pong message thus
// reaches the application without a goroutine hand-off.

// directMax: when more than this is readable the receive loop leaves
// all of it to fabricToApp. The loop serves every connection of its
// vdev, and copying a bulk stream there (in pieces that each wake the
// application) serialises what two cores do in parallel otherwise
// (receive loop ∥ copy to the application): delivering the first 16 KiB
// of each chunk directly took iperf3 through the shim from 0.97x to
// 0.26x of TCP over exn0. 16 KiB covers request/response messages.
const directMax = 16 << 10

func kickConn(e *conn) {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// deliver runs on the EXT-DS receive loop (Conn notify) with no extds
// lock held. It must not block.
func (s *Server) deliver(e *conn) {
	if !e.dmu.TryLock() {
		kickConn(e) // fabricToApp is delivering: make it look again
		return
	}
	defer e.dmu.Unlock()
	if e.dbuf == nil || len(e.pend) > 0 {
		return // ended, or fabricToApp owes the application bytes first
	}
	if e.c.Buffered() > directMax {
		kickConn(e) // bulk: fabricToApp
		return
	}
	for budget := directMax; ; {
		n, flush, err := e.c.TryRead(e.dbuf[:budget])
		if n > 0 {
			w := e.uwrite(e.dbuf[:n])
			if w > 0 {
				e.in.Add(uint64(w))
				s.bytesIn.Add(uint64(w))
				s.direct.Add(1)
			}
			if w < n {
				e.pend = e.dbuf[w:n] // EAGAIN or an error: fabricToApp writes (or fails) it
				kickConn(e)
				return
			}
			budget -= n
		}
		if flush {
			kickConn(e)
		}
		if err != nil || n == 0 {
			if err != extds.ErrWouldBlock {
				kickConn(e) // EOF, an error, ZCopy: fabricToApp
			}
			return
		}
		if budget == 0 {
			kickConn(e) // bulk: fabricToApp takes the rest
			return
		}
	}
}

// uwrite writes p to the application's socket without waiting (it is
// O_NONBLOCK) and returns how much went; EAGAIN and errors count as 0.
// Under dmu; no allocation.
func (e *conn) uwrite(p []byte) int {
	e.wp, e.wn, e.werr = p, 0, nil
	if err := e.urc.Control(e.uwr); err != nil {
		return 0
	}
	e.wp = nil
	if e.werr != nil || e.wn < 0 {
		return 0
	}
	return e.wn
}

// fabricToApp does the fabric → application work that may wait (see
// deliver): it drains c whenever kicked, with blocking writes. The
// peer's SHUTDOWN becomes shutdown(SHUT_WR) of the unix end; a reset, a
// dead peer or a protocol error closes the unix end (see resetApp).
func (s *Server) fabricToApp(e *conn, bp *[]byte) {
	defer s.done(e)
	defer func() {
		_ = e.c.SetReadNotify(nil, nil)
		e.dmu.Lock()
		e.dbuf, e.pend = nil, nil
		e.dmu.Unlock()
		bufPool.Put(bp)
	}()
	for {
		e.dmu.Lock()
		stop := s.drain(e)
		e.dmu.Unlock()
		if stop {
			return
		}
		<-e.kick // Conn kicks on data, EOF, failure and Close
	}
}

// drain moves everything readable now to the application, blocking on
// its socket as needed; under dmu. It reports whether the splice ended.
func (s *Server) drain(e *conn) (stop bool) {
	buf := e.dbuf
	for {
		if len(e.pend) > 0 {
			p := e.pend
			e.pend = nil
			if s.appWrite(e, p) {
				return true
			}
		}
		n, flush, err := e.c.TryRead(buf)
		if err == extds.ErrNeedRead {
			n, err = e.c.Read(buf) // a ZCopy segment: Read drives and waits
			flush = false
		}
		if n > 0 && s.appWrite(e, buf[:n]) {
			return true
		}
		if flush {
			e.c.FlushCredits()
		}
		switch {
		case err == nil:
			continue
		case err == extds.ErrWouldBlock:
			return false
		case err == io.EOF:
			e.c.FlushCredits()
			_ = e.uc.CloseWrite()
			return true
		case errors.Is(err, net.ErrClosed):
			return true // closed here: the application hung up, or Close
		default:
			s.failed(e, "read from fabric", err)
			return true
		}
	}
}

// appWrite writes p to the application (waiting for room), counts it,
// and reports whether the splice ended.
func (s *Server) appWrite(e *conn, p []byte) (stop bool) {
	n, err := e.uc.Write(p)
	e.in.Add(uint64(n))
	s.bytesIn.Add(uint64(n))
	if err != nil {
		if !errors.Is(err, net.ErrClosed) {
			// The application is gone (EPIPE, ECONNRESET): data for a
			// closed socket resets the peer.
			abort(e.c)
		}
		return true
	}
	return false
}

// failed ends a connection whose fabric side broke: the application's
// end is closed (see resetApp) and the extds connection released.
func (s *Server) failed(e *conn, what string, err error) {
	if e.reset.CompareAndSwap(false, true) {
		s.resets.Add(1)
	}
	s.logConn(slog.LevelDebug, "extds shim: connection reset", "id", e.id, "what", what, "err", err)
	s.resetApp(e)
	abort(e.c)
}

// resetApp closes exnd's end of the socketpair. AF_UNIX has no RST: the
// application reads ECONNRESET only if exnd's end still holds data the
// application wrote (the kernel then sets ECONNRESET on its end, which is
// what a writer blocked on a dead peer sees); otherwise it reads EOF, and
// its next write fails with EPIPE. SO_LINGER does not apply to AF_UNIX.
func (s *Server) resetApp(e *conn) {
	e.closeOnce.Do(func() { _ = e.uc.Close() })
}

// done runs as each splice goroutine ends; the last one releases e.
func (s *Server) done(e *conn) {
	if e.left.Add(-1) == 0 {
		e.closeOnce.Do(func() { _ = e.uc.Close() })
		_ = e.c.Close() // no-op if already closed
		s.mu.Lock()
		delete(s.conns, e.id)
		s.mu.Unlock()
		s.logConn(slog.LevelDebug, "extds shim: closed", "id", e.id, "in", e.in.Load(), "out", e.out.Load())
	}
	s.wg.Done()
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

// ---- introspection, shutdown ----

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
	s.mu.Lock()
	st.Active, st.Listens = len(s.conns), len(s.listens)
	s.mu.Unlock()
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
	s.wg.Wait()
	return nil
}

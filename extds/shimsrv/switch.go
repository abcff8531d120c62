package shimsrv

// shim-connect / shim-accept: the application hands exnd its connected or
// accepted TCP socket; exnd upgrades it to EXT-DS (extds.Dialer.Upgrade
// for a connect, a claim, a peek and extds.Device.AcceptShadow for an
// accept) and answers with one end of an AF_UNIX socketpair, which the
// shim dup3's over the application's descriptor, or says "tcp" with the
// reason and leaves the socket as it was (nothing written into it).
//
// Locks: none held across the handshake. enter counts the operation
// under s.mu so Close can wait for it; the switched connection is entered
// in s.conns by start (splice.go), under s.mu, only once its splice can
// run. Each operation is bounded by opTimeout and the caller's context.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/extds/dring"
	"github.com/exn-project/exn/internal/sys"
)

// SwitchResult is the data of shim-connect and shim-accept: Mode "extds"
// with the connection's ID (the socketpair end comes with it), or "tcp"
// with the fallback reason.
type SwitchResult struct {
	Mode string `json:"mode"`
	ID   uint64 `json:"id,omitempty"`
	// Side and Ring: mode "direct" only (docs/direct.md).
	Side   *int   `json:"side,omitempty"`
	Ring   int    `json:"ring,omitempty"`
	Reason string `json:"reason,omitempty"`
	// HoldMS: reason short_lived only: how long (ms) the shim may make
	// such connections plain TCP without asking (hold.go). HoldEnd: the
	// same hold's end on the host's CLOCK_MONOTONIC (ns), so that the
	// time the answer spends on its way to the shim is not added to the
	// hold; the shim keeps the earlier of the two.
	HoldMS  uint64 `json:"hold_ms,omitempty"`
	HoldEnd uint64 `json:"hold_end,omitempty"`
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

func (s *Server) switchFD(ctx context.Context, r *control.Request, side string) (any, []*os.File, error) {
	op := "shim-" + side
	who, err := s.caller(ctx, op)
	if err != nil {
		return nil, nil, err
	}
	// The one optional argument: "direct", the shim can take a direct
	// connection (docs/direct.md), without it exnd relays; or
	// "fd_limit", the shim has no room for the descriptors a switch
	// takes and keeps the socket as plain TCP (docs/direct.md,
	// "Descriptors").
	// Or "upgrade": an established connection that stays the
	// program's while exnd agrees a direct one (upgrade.go).
	direct := len(r.Args) == 1 && r.Args[0] == "direct"
	fdLimit := len(r.Args) == 1 && r.Args[0] == ArgFDLimit
	upgrade := len(r.Args) == 1 && r.Args[0] == ArgUpgrade
	if (len(r.Args) != 0 && !direct && !fdLimit && !upgrade) || len(r.Files) != 1 {
		return nil, nil, s.refuse(ReasonBadRequest, "%s: want no argument or \"direct\", %q or %q and 1 socket descriptor, got %d and %d", op, ArgFDLimit, ArgUpgrade, len(r.Args), len(r.Files))
	}
	pid := who.PID
	if !s.enter() {
		return nil, nil, fmt.Errorf("%s: exnd is shutting down", op)
	}
	defer s.wg.Done()
	if upgrade && !s.exndRoom(side) {
		s.fallback(ArgFDLimit)
		return SwitchResult{Mode: "tcp", Reason: ArgFDLimit}, nil, nil
	}
	if upgrade {
		return s.upgradeFD(ctx, r.Files[0], who, side)
	}
	if fdLimit || !s.exndRoom(side) {
		return s.stayTCP(ctx, r.Files[0], side, ArgFDLimit)
	}
	res, out, err := s.switchSocket(ctx, r.Files[0], who, side, direct && s.directCfg != nil)
	if err != nil {
		s.errs.Add(1)
		s.logConn(slog.LevelWarn, "extds shim: "+op+" failed", "pid", pid, "err", err)
		return nil, nil, fmt.Errorf("%s: %w", op, err)
	}
	return res, out, nil
}

// exndFDReserve is the least descriptor room exnd keeps for everything
// but switched connections (its fabric sessions, control connections,
// scrapes), and exndFDReserveDiv the share of its limit it keeps when
// that is more: a switch takes a few descriptors at once (the socket, a
// socketpair, the buffer and the bell, the shadow connection) and keeps
// two, switches run concurrently, and sys.FDRoom counts the holes closed
// descriptors leave as room. Below it exnd answers as the shim does when
// it has no room (fallback fd_limit), so that no connection is refused
// for exnd's own limit (issue #32: "none is refused"). Measured:
// TestShimBurst10k refused a few dozen of 10,000 connections with a
// fixed 128 at exnd's limit of 20,000.
//
// The accepting side keeps twice the share of the connecting side, so
// that of two exnds filling alike the acceptor gives up first: its
// decline reaches the client's exnd with its CLAIM's answer at once,
// while a client that stays TCP on its own sends no CLAIM, and the
// acceptor then waits out the peek and claim timeouts (0.5 s) for every
// such connection before it answers (BenchmarkShimScale at 10,000
// connections: the server took minutes).
const (
	exndFDReserve    = 128
	exndFDReserveDiv = 16
)

// exndRoom reports whether exnd has the descriptors for one more switch
// of side (sys.FDRoom); an error of the probe counts as room (the switch
// then fails as it would have).
func (s *Server) exndRoom(side string) bool {
	room, limit, err := sys.FDRoom()
	div := exndFDReserveDiv
	if side != sideAccept {
		div *= 2
	}
	return err != nil || room >= max(exndFDReserve, limit/div)
}

// ArgFDLimit is shim-connect's and shim-accept's argument, and the
// fallback reason, for a program without room for the descriptors a
// switch takes.
const ArgFDLimit = "fd_limit"

// stayTCP answers a shim that keeps its socket f as plain TCP for reason
// (it asks so that exnd counts it and tells the other side at once: for
// an accepted connection it declines the client's claim, which would
// otherwise wait out the claim timeout; for a connected one it tells the
// acceptor that no claim comes, which would otherwise wait out the peek
// and claim timeouts). Nothing is read from or written to f.
func (s *Server) stayTCP(ctx context.Context, f *os.File, side, reason string) (any, []*os.File, error) {
	_, ts, err := readTCPSocket(f, true)
	if err != nil {
		return nil, nil, err
	}
	if side == sideAccept {
		s.dev.DeclineClaim(extds.TupleKey{Local: ts.local, Remote: ts.remote})
	} else if err := s.dev.Forgo(ctx, ts.local, ts.remote); err != nil {
		s.logConn(slog.LevelDebug, "extds shim: could not tell the acceptor that no claim comes", "local", ts.local, "remote", ts.remote, "err", err)
	}
	s.fallback(reason)
	return SwitchResult{Mode: "tcp", Reason: reason}, nil, nil
}

// tcpSocket is what exnd reads of the application's socket before it
// touches it.
type tcpSocket struct {
	nonblock      bool           // O_NONBLOCK, to restore if the program keeps the socket
	local, remote netip.AddrPort // with names only
}

// readTCPSocket reads the application's socket f and returns its raw
// connection (switchSocket restores O_NONBLOCK through it) with what it
// read: an error if f is not a TCP socket; with names, its addresses too.
func readTCPSocket(f *os.File, names bool) (syscall.RawConn, tcpSocket, error) {
	var ts tcpSocket
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, ts, err
	}
	var isTCP bool
	var ierr error
	err = rc.Control(func(fd uintptr) {
		if isTCP, ierr = sys.IsTCPSocket(int(fd)); ierr != nil || !isTCP {
			return
		}
		if ts.nonblock, ierr = sys.Nonblocking(int(fd)); ierr == nil && names {
			ts.local, ts.remote, ierr = sys.SockPeerName(int(fd))
		}
	})
	if err = errors.Join(err, ierr); err != nil {
		return nil, ts, err
	}
	if !isTCP {
		return nil, ts, errors.New("descriptor is not a TCP socket")
	}
	return rc, ts, nil
}

// switchSocket upgrades the application's socket f. f stays owned by the
// control server (it closes it after the response); exnd works on a dup.
func (s *Server) switchSocket(ctx context.Context, f *os.File, who control.Peer, side string, direct bool) (any, []*os.File, error) {
	rc, ts, err := readTCPSocket(f, side == sideAccept)
	if err != nil {
		return nil, nil, err
	}
	nonblock := ts.nonblock
	if side == sideAccept {
		la, ra := ts.local, ts.remote
		if !s.mayAccept(who, la) {
			// Another user's registration: no claim is made for this
			// connection, so its client is never told to go ahead.
			_ = s.refuse(ReasonNotOwner, "shim-accept: port %d is registered by another user", la.Port())
			s.fallback(ReasonNotOwner)
			return SwitchResult{Mode: "tcp", Reason: ReasonNotOwner}, nil, nil
		}
		if res, held := s.heldAccept(extds.TupleKey{Local: la, Remote: ra}); held {
			return res, nil, nil
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

	var (
		c     *extds.Conn
		di    *extds.DirectInfo
		fs    *dring.Files
		dname string
		prep  *directPrep // accept: made while the COMMIT comes
		perr  error
		rem   *remoteSide // across hosts (remote.go): until a dconn takes it over
	)
	remote := direct && s.directCfg.Engine != nil
	switch {
	case side == sideConnect && direct:
		open := s.directOpen(&fs)
		if remote {
			open = s.remoteOpen(&fs, &rem)
		}
		c, di, err = s.dialer.UpgradeDirect(ctx, shadow, open)
	case side == sideConnect:
		c, err = s.dialer.Upgrade(ctx, shadow)
	case direct:
		create := s.directCreate(&fs, &dname)
		if remote {
			create = s.remoteCreate(&fs, &rem)
		}
		prepare := func(di extds.DirectInfo) {
			prep, perr = s.prepareDirect(fs, &di, shadow.LocalAddr(), shadow.RemoteAddr(), who, side, rem)
			fs = nil // taken over
			if prep != nil {
				rem = nil // prep.dc's
			}
		}
		c, di, err = s.accept(ctx, shadow, create, prepare)
		err = s.settleNamed(dname, err, di, prep, fs) // a failed bell is reset below
	default:
		c, _, err = s.accept(ctx, shadow, nil, nil)
	}
	if err == nil {
		err = prep.startRemote(di) // across hosts, the acceptor
	}
	if prep != nil && (err != nil || di == nil) {
		prep.discard(err != nil) // the client may be direct: reset
		prep = nil
	}
	if err == nil && perr != nil {
		err = perr // prepareDirect reset the buffer
	}
	switch {
	case err != nil && fs != nil && side == sideAccept:
		// The client may have opened the buffer and be direct (a COMMIT
		// that never came): it must read a reset, not wait forever.
		resetFiles(fs, 1)
	case (err != nil || di == nil) && fs != nil:
		fs.Close()
	case err == nil && di != nil && prep == nil:
		// Agreed in the shadow handshake, or on the connecting side.
		prep, err = s.prepareDirect(fs, di, shadow.LocalAddr(), shadow.RemoteAddr(), who, side, rem)
		if prep != nil {
			rem = nil // prep.dc's
		}
	}
	rem.close() // made, and never entered: reset (the peer may have started)
	if err != nil {
		shadow.Close()
		restore()
		return nil, nil, err
	}
	if prep != nil {
		res, out, err := s.enterDirect(prep)
		shadow.Close() // exnd's dup; the program's descriptor becomes V
		if err != nil {
			restore()
			return nil, nil, err
		}
		return res, out, nil
	}
	if c.Mode() != extds.ModeEXTDS {
		why, _ := c.FallbackReason()
		c.Close() // the dup only
		restore()
		if why == extds.FallbackShortLived {
			var hold time.Duration
			if side == sideConnect {
				hold = s.peerHold(shadow.RemoteAddr())
			}
			return s.shortLived(hold), nil, nil
		}
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
	if la, ok := tcpAddrPort(c.LocalAddr()); ok {
		e.lport = la.Port()
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
	return SwitchResult{Mode: "extds", ID: e.id}, []*os.File{app}, nil
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

// rawFD runs fn on f's descriptor.
func rawFD(f *os.File, fn func(fd int)) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Control(func(fd uintptr) { fn(int(fd)) })
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
func (s *Server) accept(ctx context.Context, shadow *net.TCPConn, create func() (extds.DirectInfo, error), prepare func(extds.DirectInfo)) (*extds.Conn, *extds.DirectInfo, error) {
	la, lok := tcpAddrPort(shadow.LocalAddr())
	ra, rok := tcpAddrPort(shadow.RemoteAddr())
	if !lok || !rok || !s.dev.OnFabric(ra.Addr()) {
		c, err := s.dev.AcceptShadow(ctx, shadow, nil)
		return c, nil, err
	}
	key := extds.TupleKey{Local: la, Remote: ra}
	if made, ok := madeAt(shadow); ok && s.dev.SkippedByHold(key, made) {
		// Made while its client skipped asking (a hold; this server
		// accepts late): no CLAIM and no hello come (extds/internal/agree/hold.go).
		return s.dev.AcceptHeld(shadow), nil, nil
	}
	// A direct CLAIM, and the client's word that none comes (Forgo),
	// interrupt the peek below (a past read deadline).
	interrupt := func() { _ = shadow.SetReadDeadline(time.Unix(1, 0)) }
	var cl *extds.Claim
	if create != nil {
		// A direct CLAIM is answered here, not by the rx loop.
		cl = s.dev.ClaimDirect(key, interrupt)
	} else {
		cl = s.dev.Claim(key)
	}
	cl.WakeOnForgo(interrupt)
	defer cl.Close()
	if cl.Held() {
		// Its CLAIM was declined by a hold (extds/internal/agree/hold.go): no hello.
		return s.dev.AcceptHeld(shadow), nil, nil
	}
	if cl.Forgone() {
		// Its client's shim had no room for EXT-DS and said so (Forgo).
		return s.dev.AcceptForgone(shadow), nil, nil
	}
	// The client's CLAIM may still be on its way (its exnd sends it after
	// the TCP handshake and a control round trip): wait as long as the
	// client would wait for the answer, on top of the peek timeout. Its
	// word that none comes (Forgo) ends the wait too.
	peeked, err := s.peek(shadow, s.peekTO+extds.DefaultClaimTimeout, func() bool { return cl.DirectPending() || cl.Forgone() })
	if err == nil && cl.Forgone() {
		return s.dev.AcceptForgone(shadow), nil, nil
	}
	if err == nil && cl.DirectPending() {
		// Agreed over the fabric, nothing in the stream (extds/internal/agree/claimdirect.go).
		c, di, err := cl.AgreeDirect(ctx, shadow, create, prepare)
		if err != nil || c != nil || di != nil {
			return c, di, err
		}
		// create failed: the client was told to go ahead the ordinary
		// way; its hello (a direct offer) follows on the stream.
		peeked, err = s.peek(shadow, extds.DefaultHandshakeTimeout, nil)
	} else if hello, plain := extds.ClassifyPeek(peeked); err == nil && !hello && !plain && cl.Close() {
		// Agreed: the hello is on its way (or the client gave up at the
		// same moment and writes its own bytes): wait for them.
		peeked, err = s.peek(shadow, extds.DefaultHandshakeTimeout, nil)
	}
	if err != nil {
		return nil, nil, err
	}
	if create == nil || s.directCfg.Engine != nil {
		// Across hosts a direct connection is agreed over the fabric
		// only (CLAIM_RDIRECT): a direct offer in the stream is answered
		// with the ordinary handshake, and the relay.
		c, err := s.dev.AcceptShadow(ctx, shadow, peeked)
		return c, nil, err
	}
	return s.dev.AcceptShadowDirect(ctx, shadow, peeked, create)
}

// madeAt is when the accepted connection shadow was made, from the age
// of the last ACK its client sent (for a client that has sent nothing
// yet, the handshake's); ok false if the kernel does not say.
func madeAt(shadow *net.TCPConn) (time.Time, bool) {
	rc, err := shadow.SyscallConn()
	if err != nil {
		return time.Time{}, false
	}
	var age time.Duration
	var ierr error
	if err := rc.Control(func(fd uintptr) { age, ierr = sys.TCPSinceLastAck(int(fd)) }); err != nil || ierr != nil {
		return time.Time{}, false
	}
	return time.Now().Add(-age), true
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
// read returns no bytes (plain TCP), or with some, those. done, when not
// nil, is asked once the deadline is set: true returns no bytes at once
// (whoever makes it true sets a past read deadline, which ends a wait
// already begun).
func (s *Server) peek(shadow *net.TCPConn, to time.Duration, done func() bool) ([]byte, error) {
	rc, err := shadow.SyscallConn()
	if err != nil {
		return nil, err
	}
	buf := make([]byte, extds.HelloPrefixLen)
	_ = shadow.SetReadDeadline(time.Now().Add(to))
	defer shadow.SetReadDeadline(time.Time{})
	if done != nil && done() {
		return nil, nil
	}
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

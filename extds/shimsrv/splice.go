package shimsrv

// The splice of a switched connection: bytes between the exnd end of the
// socketpair (uc) and the extds.Conn, in both directions.
//
// Application → fabric: appToFabric reads uc into a pooled buffer and
// writes the Conn (one read takes what the application queued, so bulk
// becomes few large PUTs).
//
// Fabric → application. The EXT-DS receive loop delivers to the
// application's socket itself (deliver): TryRead, then a write that does
// not wait. Only what cannot be done without waiting goes to the
// fabricToApp goroutine, through kick: the rest of a partial write (the
// application is not reading), returning credits (a fabric Send), a
// ZCopy segment (Read drives it), EOF, errors. A ping-pong message thus
// reaches the application without a goroutine hand-off.
//
// Locks: e.dmu is held by whoever moves bytes from the Conn to uc: the
// receive loop's notify (TryLock only, never waits) or fabricToApp (which
// may block holding it). s.mu only for the s.conns entry (start, done).
// The two splice goroutines are owned by the Server (s.wg) and counted
// in e.left; the last one to end closes both sides (done).

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/internal/sys"
)

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
	lport     uint16 // the local TCP port (accept: the listener's)
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
		s.connEnded(e.side, e.lport, e.since)
		s.logConn(slog.LevelDebug, "extds shim: closed", "id", e.id, "in", e.in.Load(), "out", e.out.Load())
	}
	s.wg.Done()
}

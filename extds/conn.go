package extds

// Conn, and the one place its mode is dispatched.
//
// A Conn is one of two things behind one net.Conn API, fixed when the
// handshake (handshake.go) returns it:
//
//	ModeTCP    c.fb != nil: a plain socket (fallback.go). No EXT-DS state
//	           is used; every exported method below hands the call to fb.
//	ModeEXTDS  c.fb == nil: a stream over the fabric, whose state is the
//	           rest of Conn and whose paths live in their own files:
//	             stream.go        constants, the segment queue, wake-ups,
//	                              waits and spins, fabric sends
//	             stream_write.go  Write, CloseWrite, SetLinger (BCopy send)
//	             stream_read.go   Read, TryRead, read notification, credits
//	             stream_rx.go     the rx loop's handlers (onMsg, onNotify)
//	             stream_close.go  failure, Close, release, housekeeping
//	             copy.go          ReadFrom / WriteTo
//	             zcopy.go         RegisteredBuffer / WriteBuffer (ZCopy)
//
// Every exported method of Conn is in this file, and each checks the mode
// once, first; the unexported methods it calls are EXT-DS only.
//
// Locks of an EXT-DS connection (each file repeats the part it uses):
// wsem is the writer slot (Write, ReadFrom, WriteBuffer hold it for the
// whole call); wmu orders the messages of writers, CloseWrite and Close
// (and guards wbatch); a writer holds it except while ReadFrom is in its
// source's Read. rmu serialises readers (and guards rbatch). mu guards
// every protocol field below it and is never held across a fabric Send or
// Post; the rx loop takes only mu. Order: wsem, then wmu or rmu, then mu,
// then Device.mu. A ring used without mu (the writer's copy into the tx
// mirror, ReadFrom's source Read into it, WriteTo's Write from the rx
// ring) is pinned (txPin, rxPin): a release meanwhile leaves it
// registered, and the unpin deregisters it. See copy.go. A ModeTCP
// connection has no locks of its own.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/exn-project/exn/fabric"
)

// Mode says how a connection carries data.
type Mode uint8

const (
	ModeEXTDS Mode = iota + 1 // over the fabric (EXT-DS)
	ModeTCP                   // plain TCP fallback
)

func (m Mode) String() string {
	switch m {
	case ModeEXTDS:
		return "extds"
	case ModeTCP:
		return "tcp"
	}
	return "invalid"
}

// ZCopyMode selects the zero-copy technique of WriteBuffer.
type ZCopyMode uint8

const (
	ZCopyOff   ZCopyMode = iota // WriteBuffer uses BCopy
	ZCopyRead                   // receiver RMA GETs from the advertised source
	ZCopyWrite                  // sender RMA PUTs into the advertised sink
)

// Conn is a stream connection over EXT-DS, or over plain TCP after a
// fallback (see Mode). It implements net.Conn; methods are safe for
// concurrent use, Read and Write each serialise their callers.
type Conn struct {
	laddr, raddr net.Addr

	// ModeTCP: the fallback (fallback.go); nil in ModeEXTDS, and then
	// every field below is the EXT-DS stream's.
	fb *tcpPath

	// ModeEXTDS: fixed once established (handshake.go).
	dev          *Device
	cfg          *config
	vd           *vdev
	id           uint32
	peer         atomic.Uint32 // node | vpid<<16 | 1<<24 once known
	peerAddr     fabric.Addr
	peerID       uint32
	peerRing     fabric.NLA
	peerRingSize uint32
	peerEager    uint32
	shadow       net.Conn
	rxRing       fabric.Region
	txRing       fabric.Region
	ringSize     uint32
	eagerWin     uint32
	ctx          context.Context
	cancel       context.CancelFunc
	done         chan struct{} // closed by Close
	rdWake       chan struct{}
	wrWake       chan struct{}
	rdDL, wrDL   deadline
	// rdSpin, wrSpin: the learned spin of Read's and Write's waits
	// (spin.go), under mu.
	rdSpin, wrSpin spinBudget

	wsem   sync.Mutex // the writer slot: Write, ReadFrom, WriteBuffer (see ReadFrom)
	wmu    sync.Mutex
	wbatch [sendBatch]fabric.Message
	wrma   [1]fabric.RMA
	rmu    sync.Mutex
	rbatch [1]fabric.Message

	mu sync.Mutex
	// receive side
	segs       segQueue
	eager      []byte
	eHead      uint32
	eLen       uint32
	rxUsed     uint32
	rxWpos     uint32
	early      []fabric.NLA
	freedRing  uint32
	freedEager uint32
	rdShut     bool
	rxNote     func() // SetReadNotify: on the rx loop, no lock held
	rxKick     func() // SetReadNotify: on failure and Close, mu may be held
	notePend   bool   // rxNote is due once the rx loop releases mu
	// Pins: a writer (wsem) or reader (rmu) is using txRing.Buf or
	// rxRing.Buf without mu; releaseLocked leaves a pinned ring registered
	// (on shm: mapped) and the unpin deregisters it.
	txPin, rxPin             bool
	txDeregLate, rxDeregLate bool
	// transmit side
	txFree  uint32
	txWpos  uint32
	txEager uint32
	wrShut  bool
	// zcopy, receiver
	zcSink    fabric.Region
	zcRdPos   uint32          // next unread byte in the sink
	zcRdLen   uint32          // unread bytes in the sink
	zcPending uint32          // GET posted / sink advertised, of this length
	zcGot     bool            // GET completed (read mode)
	zcPutLen  uint32          // ZC_PUT received (write mode)
	zcPutNote bool            // PUT completer notification received
	bufs      []fabric.Region // RegisteredBuffers not yet released
	// zcopy, sender
	zcActive  bool
	zcSinkNLA fabric.NLA
	zcSinkLen uint32
	zcDone    bool
	// lifecycle
	err         error // fatal; both directions
	closed      bool
	released    bool
	linger      int
	lingerUntil time.Time
	shadowLost  time.Time
}

var _ net.Conn = (*Conn)(nil)

// Mode reports whether c runs over EXT-DS or fell back to TCP.
func (c *Conn) Mode() Mode {
	if c.fb != nil {
		return ModeTCP
	}
	return ModeEXTDS
}

// FallbackReason says why a ModeTCP connection is not EXT-DS; ok is false
// in ModeEXTDS and for connections made without a Device.
func (c *Conn) FallbackReason() (r FallbackReason, ok bool) {
	if c.fb == nil {
		return 0, false
	}
	return c.fb.why, c.fb.fell
}

// LocalAddr returns the shadow (or fallback) TCP connection's local address.
func (c *Conn) LocalAddr() net.Addr { return c.laddr }

// RemoteAddr returns the shadow (or fallback) TCP connection's remote address.
func (c *Conn) RemoteAddr() net.Addr { return c.raddr }

// FabricPeer returns the peer's (node, VPID); ok is false in ModeTCP.
func (c *Conn) FabricPeer() (fabric.Addr, bool) {
	if c.fb != nil {
		return fabric.Addr{}, false
	}
	return c.peerAddr, true
}

// SetDeadline sets the read and write deadlines. A passed deadline makes
// blocked and future calls fail with os.ErrDeadlineExceeded.
func (c *Conn) SetDeadline(t time.Time) error {
	if c.fb != nil {
		return c.fb.SetDeadline(t)
	}
	if err := c.setDeadline(&c.rdDL, t); err != nil {
		return err
	}
	return c.setDeadline(&c.wrDL, t)
}

// SetReadDeadline sets the read deadline.
func (c *Conn) SetReadDeadline(t time.Time) error {
	if c.fb != nil {
		return c.fb.SetReadDeadline(t)
	}
	return c.setDeadline(&c.rdDL, t)
}

// SetWriteDeadline sets the write deadline. A ZCopy WriteBuffer that times
// out resets the connection: the peer may still be reading the buffer.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if c.fb != nil {
		return c.fb.SetWriteDeadline(t)
	}
	return c.setDeadline(&c.wrDL, t)
}

// Write sends p. It returns when all of p is in the peer's receive buffers
// (VELO mailbox or RMA ring) — not when the peer has read it — or on
// error. Writes larger than the threshold use the RMA ring while it has
// room and VELO otherwise.
func (c *Conn) Write(p []byte) (int, error) {
	if c.fb != nil {
		return c.fb.Write(p)
	}
	return c.write(p)
}

// CloseWrite flushes nothing (writes are already in the peer's buffers)
// and sends SHUTDOWN: the peer reads io.EOF after the data. Further
// writes fail with EPIPE.
func (c *Conn) CloseWrite() error {
	if c.fb != nil {
		if err, ok := c.fb.closeWrite(); ok {
			return err
		}
		return c.opErr("close", errors.New("closewrite not supported"))
	}
	return c.closeWrite()
}

// SetLinger sets the close behaviour as for TCP: sec < 0 (default) Close
// returns at once and the connection drains in the background; sec == 0
// Close resets at once (abortive close, peer sees ECONNRESET); sec > 0
// Close blocks until the peer has read everything or sec seconds pass,
// then resets.
func (c *Conn) SetLinger(sec int) error {
	if c.fb != nil {
		return c.fb.setLinger(sec)
	}
	return c.setLinger(sec)
}

// Read reads stream data in order. It returns io.EOF after the peer's
// SHUTDOWN and ECONNRESET after its RESET.
func (c *Conn) Read(p []byte) (int, error) {
	if c.fb != nil {
		return c.fb.Read(p)
	}
	return c.read(p)
}

// Close closes the connection. Blocked Read and Write calls return
// net.ErrClosed. The close is graceful by default: SHUTDOWN follows the
// data already written, and the rings stay registered in the background
// until the peer has read it (bounded by the drain timeout). Unread
// received data turns the close into a reset, as in TCP. See SetLinger.
func (c *Conn) Close() error {
	if c.fb != nil {
		return c.fb.Close()
	}
	return c.closeStream()
}

// abortAny closes c at once whatever its mode (a connection handshaken
// but never handed to the application).
func (c *Conn) abortAny() {
	if c.fb != nil {
		c.fb.Close()
		return
	}
	c.abort(net.ErrClosed, true)
}

// ReadFrom implements io.ReaderFrom: it reads r until io.EOF and sends
// what it read, like a series of Writes, reading straight into the
// connection's transmit ring (one copy less than io.Copy through a
// buffer). It returns the bytes sent and nil at r's EOF, r's error as it
// is, or the connection's error (*net.OpError, Op "readfrom").
//
// Ordering: ReadFrom occupies the write side for its whole duration;
// other Writes, ReadFroms and WriteBuffers wait for it. CloseWrite and
// Close do not: Close unblocks a ReadFrom waiting for credits with
// net.ErrClosed at once, and one blocked in r.Read when r returns; bytes
// read from r after CloseWrite or Close are dropped with EPIPE or
// net.ErrClosed. The write deadline bounds waits for credits, not r.Read.
// ModeTCP: io.Copy to the socket (its own ReadFrom, e.g. splice).
func (c *Conn) ReadFrom(r io.Reader) (int64, error) {
	if c.fb != nil {
		return c.fb.readFrom(r)
	}
	return c.readFrom(r)
}

// WriteTo implements io.WriterTo: it writes the stream to w until the
// peer's SHUTDOWN (then it returns nil, as io.Copy expects), straight out
// of the receive buffers (one copy less than io.Copy through a buffer).
// Each w.Write gets the contiguous bytes of one received chunk or of the
// eager buffer; what w takes is consumed and its credits go back to the
// peer as after a Read. It returns w's error as it is, or the
// connection's (*net.OpError, Op "writeto"; ECONNRESET after a RESET).
//
// WriteTo occupies the read side; other Reads wait for it. The read
// deadline bounds the waits for data, not w.Write. Close makes it return
// net.ErrClosed (at once when waiting, after w.Write returns when in
// it); closing with unread data — the bytes w.Write has not returned
// from count — resets the connection, as for Read. ModeTCP: io.Copy from
// the socket (its own WriteTo, e.g. splice).
func (c *Conn) WriteTo(w io.Writer) (int64, error) {
	if c.fb != nil {
		return c.fb.writeTo(w)
	}
	return c.writeTo(w)
}

// RegisteredBuffer allocates size bytes of fabric-registered memory for
// WriteBuffer. In ModeTCP it returns ordinary memory (WriteBuffer then
// writes it to the socket), so callers need no mode check.
func (c *Conn) RegisteredBuffer(size int) (*Buffer, error) {
	if size <= 0 || size > maxZCopy {
		return nil, c.opErr("register", fmt.Errorf("buffer size %d not in 1..%d", size, maxZCopy))
	}
	if c.fb != nil {
		return &Buffer{c: c, b: make([]byte, size)}, nil
	}
	return c.registeredBuffer(size)
}

// WriteBuffer writes b.Bytes()[off:off+n]. From ZCopy threshold bytes up,
// on an EXT-DS connection with ZCopy enabled, the data moves zero-copy by
// RMA straight out of b, and the call blocks until the peer has read all
// of it; otherwise it is a Write. b must not change until it returns. A
// deadline that expires during a ZCopy transfer resets the connection.
func (c *Conn) WriteBuffer(b *Buffer, off, n int) (int, error) {
	if b == nil || b.c != c || off < 0 || n < 0 || off > len(b.b) || n > len(b.b)-off {
		return 0, c.opErr("write", errors.New("buffer range invalid or not of this connection"))
	}
	if c.fb != nil || c.cfg.zcMode == ZCopyOff || n < c.cfg.zcThreshold || b.reg.NLA == 0 {
		return c.Write(b.b[off : off+n])
	}
	return c.writeBuffer(b, off, n)
}

// SetReadNotify lets a reader that does not park in Read (exnd's shim
// splice, which writes into a socket straight from the receive loop)
// learn when c has something to read.
//
// notify runs on the receive loop (or on a Read or Write of another
// connection of the vdev polling in its place, see spinWaitLocked) with
// no lock held, after a message or an RMA completion made data or EOF
// readable. It may call TryRead (not
// Read, FlushCredits or Write: the receive loop serves every connection
// of its vdev and must not wait) and must not block.
//
// kick runs when a Read waiting on c would wake for another reason: c
// failed (reset, peer down, protocol error) or was closed. c's lock may
// be held: kick must only signal (a non-blocking channel send), never
// call c.
//
// Either may run spuriously. Read deadlines are not reported. Data that
// arrived before SetReadNotify is not notified: drain with TryRead after
// installing. nil, nil removes both. Not for ModeTCP connections.
func (c *Conn) SetReadNotify(notify, kick func()) error {
	if c.fb != nil {
		return c.opErr("set", errors.New("read notification needs an EXT-DS connection"))
	}
	c.setReadNotify(notify, kick)
	return nil
}

// TryRead is a Read that neither waits nor sends: it returns what is
// readable now (VELO data, a completed RMA chunk), io.EOF after the
// peer's SHUTDOWN, or c's error; otherwise ErrWouldBlock or ErrNeedRead.
// flush (with any result) says freed receive space has reached the point
// where Read would return it to the peer: the caller must then call FlushCredits from a
// goroutine that may block (the sender stalls without credits). At EOF
// flush reports any freed space at all.
func (c *Conn) TryRead(p []byte) (n int, flush bool, err error) {
	if c.fb != nil {
		return 0, false, ErrNeedRead
	}
	return c.tryRead(p)
}

// Buffered returns how many bytes TryRead could return now: the ready
// data segments at the head of the receive queue.
func (c *Conn) Buffered() int {
	if c.fb != nil {
		return 0
	}
	return c.buffered()
}

// FlushCredits returns the receive space TryRead freed to the peer (all
// of it, in one RMA_AVAIL). It may block like a Write; call it when
// TryRead says flush.
func (c *Conn) FlushCredits() {
	if c.fb == nil {
		c.flushCredits(true)
	}
}

func (c *Conn) opErr(op string, err error) error {
	if err == nil {
		return nil
	}
	if err == io.EOF {
		return err
	}
	return &net.OpError{Op: op, Net: "extds", Source: c.laddr, Addr: c.raddr, Err: err}
}

// errReset is what a peer's RESET (or abortive close) looks like locally.
var errReset = fmt.Errorf("connection reset by peer: %w", syscall.ECONNRESET)

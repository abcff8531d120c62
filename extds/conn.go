package extds

// One EXT-DS connection: the BCopy/ZCopy send and receive paths.
//
// Send (Write, under wmu; one writer at a time):
//
//	write ≤ threshold                 → VELO fragments (eager credit)
//	write > threshold, ring has room  → copy into the tx mirror ring at the
//	                                    peer's write offset, RMA PUT into
//	                                    the peer's ring, then RMA_INFO
//	ring short, ≤ ringFullVELOMax of  → VELO fragments (eager credit)
//	  the write left
//	ring short, more left             → wait for RMA_AVAIL (spin, then
//	                                    park: spinWaitLocked), then PUT
//	ReadFrom                          → source Read straight into the tx
//	                                    mirror, then as above (copy.go)
//	WriteBuffer ≥ zcopy threshold     → ZC_SRC (peer GETs) or ZC_WANT /
//	                                    ZC_SINK / PUT / ZC_PUT; blocks
//	                                    until ZC_DONE
//
// Receive (rx loop → Conn.onMsg/onNotify; Read under rmu):
//
//	VELO          → bytes into the eager FIFO, a VELO segment (coalesced)
//	RMA_INFO      → an RMA segment, ready once its completer notification
//	                (matched by LastFrame) has arrived
//	SHUTDOWN      → an EOF segment
//	ZC_SRC/WANT   → a ZCopy segment the reader drives (GET or sink advert)
//	Read          → consumes segments in order; freed ring and eager bytes
//	                go back as RMA_AVAIL once ≥ 1/creditFraction is free
//	WriteTo       → the same, writing ring and eager slices to its
//	                destination instead of copying them out (copy.go)
//
// Order across the paths is the order of the segment queue, which is the
// order of VELO messages on the one (source vpid, target vpid) pair the
// connection uses: a VELO fragment never overtakes an RMA chunk still in
// flight, because the reader stops at an RMA segment that is not ready.
//
// Locks: wsem is the writer slot (Write, ReadFrom, WriteBuffer hold it for
// the whole call); wmu orders the messages of writers, CloseWrite and
// Close (and guards wbatch); a writer holds it except while ReadFrom is
// in its source's Read. rmu serialises readers (and guards rbatch). mu
// guards every protocol field below it and is never held across a fabric
// Send or Post; the rx loop takes only mu. Order: wsem, then wmu or rmu,
// then mu, then Device.mu. A ring used without mu (the writer's copy into
// the tx mirror, ReadFrom's source Read into it, WriteTo's Write from the
// rx ring) is pinned (txPin, rxPin): a release meanwhile leaves it
// registered, and the unpin deregisters it. See copy.go.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
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

const (
	// sendBatch is the most VELO fragments one Send carries: 32 × 116 B
	// = 3.7 KiB, enough to amortise the call while keeping a write's
	// hold on the mailbox short.
	sendBatch = 32
	// minPutChunk: below this a ring PUT (PUT + notification + RMA_INFO)
	// costs more than the VELO fragments it replaces, so a short
	// contiguous space is used only to finish a write or to wrap the ring.
	minPutChunk = 4 << 10
	// ringFullVELOMax: when the peer's ring is full, a large write waits
	// for RMA_AVAIL unless at most this much of it is left, which goes as
	// VELO fragments (one Send of sendBatch fragments). VELO moves 116 B
	// per mailbox slot with a copy in and out of the slot, the eager
	// buffer and a decode per fragment, at the receiver that is already
	// behind; waiting for the credits it is about to return and PUTting
	// is faster: streams of 1 MiB writes between processes on shm went
	// from 1.5 to 2.9 GB/s (docs/extds.md, "Numbers").
	ringFullVELOMax = sendBatch * fragData
	// maxPutsInFlight: a PUT is made only while the ring holds fewer than
	// about this many chunks of its size (outstanding bytes < this ×
	// chunk); otherwise the write treats the ring as short. Every PUT is
	// one RMA_INFO in the peer's mailbox and one segment to decode, and
	// with the 1 MiB ring, 1 KiB writes could have 1024 of them
	// outstanding — the whole shm mailbox (1024 slots), so senders slept
	// on its space: 1 KiB streams fell to 0.4–0.5× of the 256 KiB ring.
	// 256 (a quarter of the mailbox) gave them back (1.65× in the same
	// run) and does not limit writes of 4 KiB and more.
	maxPutsInFlight = 256
	// maxSegs bounds the receive segment queue. A well-behaved sender
	// creates at most about 2 × ring / minPutChunk RMA segments plus as
	// many VELO ones between them; more is a protocol violation.
	maxSegs = 1 << 14
	// maxEarly bounds completer notifications that arrived before their
	// RMA_INFO (normal on a fabric that completes a PUT inside Post).
	maxEarly = 1 << 10
	// maxZCopy is the largest single ZCopy transfer accepted.
	maxZCopy = 1 << 30
)

const (
	segVELO uint8 = iota
	segRMA
	segEOF
	segZCSrc
	segZCWant
)

type seg struct {
	kind  uint8
	ready bool
	n     uint32     // bytes remaining
	off   uint32     // segRMA: ring offset of the next byte
	last  fabric.NLA // segRMA: LastFrame the completer notification names
	nla   fabric.NLA // segZCSrc: source address of the next byte
}

// segQueue is a growable ring of segments.
type segQueue struct {
	buf        []seg
	head, size int
}

func (q *segQueue) len() int { return q.size }
func (q *segQueue) peek() *seg {
	if q.size == 0 {
		return nil
	}
	return &q.buf[q.head]
}
func (q *segQueue) tail() *seg {
	if q.size == 0 {
		return nil
	}
	return &q.buf[(q.head+q.size-1)%len(q.buf)]
}
func (q *segQueue) push(s seg) {
	if q.size == len(q.buf) {
		nb := make([]seg, max(16, 2*len(q.buf)))
		for i := 0; i < q.size; i++ {
			nb[i] = q.buf[(q.head+i)%len(q.buf)]
		}
		q.buf, q.head = nb, 0
	}
	q.buf[(q.head+q.size)%len(q.buf)] = s
	q.size++
}
func (q *segQueue) pop() {
	q.buf[q.head] = seg{}
	q.head = (q.head + 1) % len(q.buf)
	q.size--
}

// Conn is a stream connection over EXT-DS, or over plain TCP after a
// fallback (see Mode). It implements net.Conn; methods are safe for
// concurrent use, Read and Write each serialise their callers.
type Conn struct {
	mode         Mode
	laddr, raddr net.Addr

	// ModeTCP
	tcp  net.Conn // reader (may replay peeked bytes)
	raw  net.Conn // the socket (CloseWrite, SetLinger)
	why  FallbackReason
	fell bool // why is set: a Device chose TCP

	// ModeEXTDS: fixed once established.
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

func (c *Conn) peerIs(a fabric.Addr) bool {
	return c.peer.Load() == uint32(a.Node)|uint32(a.VPID)<<16|1<<24
}

func (c *Conn) peerNode() (fabric.NodeID, bool) {
	p := c.peer.Load()
	return fabric.NodeID(p), p != 0
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (c *Conn) wakeAll() {
	wake(c.rdWake)
	wake(c.wrWake)
	if c.rxKick != nil {
		c.rxKick()
	}
}

// rdReadyLocked wakes a waiting Read and, with SetReadNotify, makes the
// rx loop call the notify function once it has released mu.
func (c *Conn) rdReadyLocked() {
	wake(c.rdWake)
	if c.rxNote != nil {
		c.notePend = true
	}
}

// takeNoteLocked returns the notify function if it is due.
func (c *Conn) takeNoteLocked() func() {
	if !c.notePend {
		return nil
	}
	c.notePend = false
	return c.rxNote
}

// Mode reports whether c runs over EXT-DS or fell back to TCP.
func (c *Conn) Mode() Mode { return c.mode }

// FallbackReason says why a ModeTCP connection is not EXT-DS; ok is false
// in ModeEXTDS and for connections made without a Device.
func (c *Conn) FallbackReason() (r FallbackReason, ok bool) { return c.why, c.fell }

// LocalAddr returns the shadow (or fallback) TCP connection's local address.
func (c *Conn) LocalAddr() net.Addr { return c.laddr }

// RemoteAddr returns the shadow (or fallback) TCP connection's remote address.
func (c *Conn) RemoteAddr() net.Addr { return c.raddr }

// FabricPeer returns the peer's (node, VPID); ok is false in ModeTCP.
func (c *Conn) FabricPeer() (fabric.Addr, bool) {
	if c.mode != ModeEXTDS {
		return fabric.Addr{}, false
	}
	return c.peerAddr, true
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

// ---- deadlines ----

// SetDeadline sets the read and write deadlines. A passed deadline makes
// blocked and future calls fail with os.ErrDeadlineExceeded.
func (c *Conn) SetDeadline(t time.Time) error {
	if c.mode == ModeTCP {
		return c.raw.SetDeadline(t)
	}
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// SetReadDeadline sets the read deadline.
func (c *Conn) SetReadDeadline(t time.Time) error {
	if c.mode == ModeTCP {
		return c.raw.SetReadDeadline(t)
	}
	if c.isClosed() {
		return c.opErr("set", net.ErrClosed)
	}
	c.rdDL.set(t)
	return nil
}

// SetWriteDeadline sets the write deadline. A ZCopy WriteBuffer that times
// out resets the connection: the peer may still be reading the buffer.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if c.mode == ModeTCP {
		return c.raw.SetWriteDeadline(t)
	}
	if c.isClosed() {
		return c.opErr("set", net.ErrClosed)
	}
	c.wrDL.set(t)
	return nil
}

func (c *Conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// waitLocked releases mu, waits for a wake-up, the deadline or Close, and
// retakes mu. It returns the reason to stop, if any.
func (c *Conn) waitLocked(wakeCh chan struct{}, dl *deadline) error {
	dch := dl.wait()
	c.mu.Unlock()
	var err error
	select {
	case <-wakeCh:
	case <-dch:
		err = os.ErrDeadlineExceeded
	case <-c.done:
		err = net.ErrClosed
	}
	c.mu.Lock()
	return err
}

// send delivers msgs for a writer. Once a chunk's credits are reserved
// its messages must go out whatever the deadline says (a half-sent chunk
// would desynchronise the ring offsets), so the deadline is checked only
// while waiting for credits, and the Send is bounded by Close or failure
// (c.ctx) and by the peer's liveness; back-pressure from a live peer is
// transient because its rx loop never waits on applications.
func (c *Conn) send(msgs []fabric.Message) error {
	if _, err := c.vd.ep.Send(c.ctx, msgs); err != nil {
		return c.sendErr(err)
	}
	return nil
}

// sendErr maps a failed fabric Send to the caller's error and fails the
// connection when the fabric says the peer is gone.
func (c *Conn) sendErr(err error) error {
	switch {
	case errors.Is(err, fabric.ErrPeerDown), errors.Is(err, fabric.ErrUnknownNode):
		c.dev.ctr.peerDown.Add(1)
		e := fmt.Errorf("peer %v: %w", c.peerAddr, fabric.ErrPeerDown)
		c.fail(e, false)
		return e
	case errors.Is(err, context.Canceled), errors.Is(err, net.ErrClosed):
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.err != nil {
			return c.err
		}
		if isClosedChan(c.wrDL.wait()) {
			return os.ErrDeadlineExceeded
		}
		return net.ErrClosed
	case errors.Is(err, context.DeadlineExceeded):
		return os.ErrDeadlineExceeded
	}
	c.fail(err, true)
	return err
}

// ---- write path ----

var errWriteShut = fmt.Errorf("write after CloseWrite: %w", syscall.EPIPE)

// ringWaitLocked says whether a large write that finds too little room in
// the peer's ring should wait for RMA_AVAIL instead of going on as VELO
// fragments: when at least half the ring is outstanding, its credits are
// due (the reader returns them at 1/creditFraction = 1/4), so waiting
// cannot deadlock.
func (c *Conn) ringWaitLocked() bool {
	return 2*(c.peerRingSize-c.txFree) >= c.peerRingSize
}

// wrCheckLocked returns why a write cannot proceed, if it cannot.
func (c *Conn) wrCheckLocked() error {
	switch {
	case c.closed:
		return net.ErrClosed
	case c.err != nil:
		return c.err
	case c.wrShut:
		return errWriteShut
	case isClosedChan(c.wrDL.wait()):
		return os.ErrDeadlineExceeded
	}
	return nil
}

// Write sends p. It returns when all of p is in the peer's receive buffers
// (VELO mailbox or RMA ring) — not when the peer has read it — or on
// error. Writes larger than the threshold use the RMA ring while it has
// room and VELO otherwise.
func (c *Conn) Write(p []byte) (int, error) {
	if c.mode == ModeTCP {
		return c.tcp.Write(p)
	}
	c.wsem.Lock()
	defer c.wsem.Unlock()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	n, err := c.writeLocked(p)
	return n, c.opErr("write", err)
}

func (c *Conn) writeLocked(p []byte) (int, error) {
	total := 0
	large := len(p) > c.cfg.threshold
	for len(p) > 0 {
		c.mu.Lock()
		if err := c.wrCheckLocked(); err != nil {
			c.mu.Unlock()
			return total, err
		}
		put := false
		var chunk, off uint32
		if large && c.peerRingSize > 0 {
			want := uint32(min(len(p), fabric.MaxRMALen))
			contig := min(c.txFree, c.peerRingSize-c.txWpos)
			chunk = min(want, contig)
			if chunk > 0 && (chunk == want || chunk >= minPutChunk || chunk == c.peerRingSize-c.txWpos) &&
				uint64(c.peerRingSize-c.txFree) < maxPutsInFlight*uint64(chunk) {
				put = true
				off = c.txWpos
				c.txWpos = (c.txWpos + chunk) % c.peerRingSize
				c.txFree -= chunk
				c.txPin = true
			}
		}
		if !put {
			// A large write waits for ring credits rather than go on as
			// VELO fragments, except for its last ringFullVELOMax bytes
			// (see ringWaitLocked).
			if c.txEager == 0 || large && len(p) > ringFullVELOMax && c.ringWaitLocked() {
				c.dev.ctr.creditWaits.Add(1)
				free, eager := c.txFree, c.txEager
				if err := c.spinWaitLocked(c.wrWake, &c.wrDL, func() bool {
					return c.txFree != free || c.txEager != eager || c.closed || c.err != nil || c.wrShut || isClosedChan(c.wrDL.wait())
				}); err != nil {
					c.mu.Unlock()
					return total, err
				}
				c.mu.Unlock()
				continue
			}
			chunk = uint32(min(len(p), sendBatch*fragData, int(c.txEager)))
			c.txEager -= chunk
			if large {
				c.dev.ctr.ringFull.Add(1)
			}
		}
		c.mu.Unlock()
		var err error
		if put {
			err = c.putChunk(p[:chunk], off)
			c.mu.Lock()
			c.unpinTxLocked()
			c.mu.Unlock()
		} else {
			err = c.sendFrags(p[:chunk], int(chunk) == len(p))
		}
		if err != nil {
			return total, err
		}
		p = p[chunk:]
		total += int(chunk)
	}
	return total, nil
}

// sendFrags sends p (≤ sendBatch fragments) as VELO data.
func (c *Conn) sendFrags(p []byte, last bool) error {
	k := 0
	for len(p) > 0 {
		n := min(len(p), fragData)
		encData(&c.wbatch[k], c.peerAddr, c.peerID, last && n == len(p), p[:n])
		p = p[n:]
		k++
	}
	if err := c.send(c.wbatch[:k]); err != nil {
		return err
	}
	c.dev.ctr.veloMsgs.Add(uint64(k))
	for i := 0; i < k; i++ {
		c.dev.ctr.txVELO.Add(uint64(c.wbatch[i].Len) - hdrLen)
	}
	return nil
}

// putChunk copies p into the tx mirror at off (reserved and pinned by the
// caller), PUTs it to the same offset of the peer's ring and announces it
// with RMA_INFO.
func (c *Conn) putChunk(p []byte, off uint32) error {
	copy(c.txRing.Buf[off:], p)
	return c.putMirror(off, uint32(len(p)))
}

// putMirror PUTs n bytes at off of the tx mirror to the same offset of the
// peer's ring and announces them with RMA_INFO. wmu is held.
func (c *Conn) putMirror(off, n uint32) error {
	c.wrma[0] = fabric.RMA{
		Op: fabric.OpPut, Peer: c.peerAddr,
		Local: c.txRing.NLA + fabric.NLA(off), Remote: c.peerRing + fabric.NLA(off),
		Len: n, Notify: fabric.NotifyCompleter,
	}
	if _, err := c.vd.ep.Post(c.wrma[:]); err != nil {
		return c.sendErr(err)
	}
	encTwo(&c.wbatch[0], c.peerAddr, TagRMAInfo, c.peerID, off, n)
	if err := c.send(c.wbatch[:1]); err != nil {
		return err
	}
	c.dev.ctr.rmaPuts.Add(1)
	c.dev.ctr.txRMA.Add(uint64(n))
	return nil
}

// unpinTxLocked ends a writer's use of txRing.Buf outside mu; if the
// connection was released meanwhile, the ring is deregistered now.
func (c *Conn) unpinTxLocked() {
	c.txPin = false
	if c.txDeregLate {
		c.txDeregLate = false
		_ = c.vd.ep.Deregister(c.txRing.NLA) // fails only if the endpoint is gone, which frees it too
	}
}

// unpinRxLocked is unpinTxLocked for a reader's use of rxRing.Buf.
func (c *Conn) unpinRxLocked() {
	c.rxPin = false
	if c.rxDeregLate {
		c.rxDeregLate = false
		_ = c.vd.ep.Deregister(c.rxRing.NLA)
	}
}

// CloseWrite flushes nothing (writes are already in the peer's buffers)
// and sends SHUTDOWN: the peer reads io.EOF after the data. Further
// writes fail with EPIPE.
func (c *Conn) CloseWrite() error {
	if c.mode == ModeTCP {
		if cw, ok := c.raw.(interface{ CloseWrite() error }); ok {
			return cw.CloseWrite()
		}
		return c.opErr("close", errors.New("closewrite not supported"))
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	if err := c.wrCheckLocked(); err != nil {
		c.mu.Unlock()
		if errors.Is(err, syscall.EPIPE) {
			return nil
		}
		return c.opErr("close", err)
	}
	c.wrShut = true
	c.mu.Unlock()
	encCtl(&c.wbatch[0], c.peerAddr, TagShutdown, c.peerID)
	return c.opErr("close", c.send(c.wbatch[:1]))
}

// SetLinger sets the close behaviour as for TCP: sec < 0 (default) Close
// returns at once and the connection drains in the background; sec == 0
// Close resets at once (abortive close, peer sees ECONNRESET); sec > 0
// Close blocks until the peer has read everything or sec seconds pass,
// then resets.
func (c *Conn) SetLinger(sec int) error {
	if c.mode == ModeTCP {
		if l, ok := c.raw.(interface{ SetLinger(int) error }); ok {
			return l.SetLinger(sec)
		}
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.opErr("set", net.ErrClosed)
	}
	c.linger = sec
	return nil
}

// ---- read path ----

// Read reads stream data in order. It returns io.EOF after the peer's
// SHUTDOWN and ECONNRESET after its RESET.
func (c *Conn) Read(p []byte) (int, error) {
	if c.mode == ModeTCP {
		return c.tcp.Read(p)
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	n, err := c.readLocked(p)
	return n, c.opErr("read", err)
}

func (c *Conn) readLocked(p []byte) (int, error) {
	c.mu.Lock()
	for {
		if c.closed {
			c.mu.Unlock()
			return 0, net.ErrClosed
		}
		if c.err != nil {
			err := c.err
			c.mu.Unlock()
			return 0, err
		}
		if isClosedChan(c.rdDL.wait()) {
			c.mu.Unlock()
			return 0, os.ErrDeadlineExceeded
		}
		if len(p) == 0 {
			c.mu.Unlock()
			return 0, nil
		}
		s := c.segs.peek()
		if s == nil {
			if err := c.spinWaitLocked(c.rdWake, &c.rdDL, c.readableLocked); err != nil {
				c.mu.Unlock()
				return 0, err
			}
			continue
		}
		var n int
		var act zcAction
		switch s.kind {
		case segVELO:
			n = c.copyEagerLocked(p, s)
		case segRMA:
			if !s.ready {
				if err := c.spinWaitLocked(c.rdWake, &c.rdDL, c.readableLocked); err != nil {
					c.mu.Unlock()
					return 0, err
				}
				continue
			}
			n = copy(p[:min(len(p), int(s.n))], c.rxRing.Buf[s.off:])
			s.off += uint32(n)
			s.n -= uint32(n)
			c.rxUsed -= uint32(n)
			c.freedRing += uint32(n)
			if s.n == 0 {
				c.segs.pop()
			}
		case segEOF:
			c.mu.Unlock()
			c.flushCredits(true)
			return 0, io.EOF
		case segZCSrc, segZCWant:
			var err error
			n, err = c.zcReadLocked(p, s, &act)
			if err != nil {
				c.mu.Unlock()
				return 0, err
			}
		}
		if act.pending() {
			c.mu.Unlock()
			if err := c.zcStep(&act); err != nil {
				return n, err
			}
			if n == 0 {
				c.mu.Lock()
				continue
			}
			c.dev.ctr.rxBytes.Add(uint64(n))
			return n, nil
		}
		if n == 0 {
			// A ZCopy segment waiting for its transfer.
			if err := c.waitLocked(c.rdWake, &c.rdDL); err != nil {
				c.mu.Unlock()
				return 0, err
			}
			continue
		}
		c.mu.Unlock()
		c.dev.ctr.rxBytes.Add(uint64(n))
		c.flushCredits(false)
		return n, nil
	}
}

// Spin of Read and of a Write waiting for credits. Across processes on
// shm every hop of a request/answer exchange would otherwise be a wake-up:
// the peer's Send rings the doorbell of this process's parked rx loop,
// and the rx loop then hands the data (or the credits) to the goroutine
// parked in Read or Write. A waiter first polls the vdev's endpoint itself
// (vdev.poll under rxMu, so messages are still dispatched in order) for
// connSpinBudget and takes what it waits for on its own thread; then it
// parks (docs/wakeup.md). The spin never yields: a yielding spin keeps the
// goroutine on the scheduler's run queue, where it is found before the
// network is ever polled.
const (
	// connSpinBudget is the longest a waiter polls before it parks. It is
	// about what parking costs here: the wake-up chain it replaces (the
	// peer's doorbell ring, the rx loop's netpoller wake-up, the hand-off
	// to this goroutine) measured 20–40 µs between two processes on this
	// 2-core host, so a spin of that length at most doubles the cost of
	// a wait that parks anyway, and a request/answer exchange between
	// two spinning processes (a few µs a round trip) never parks.
	connSpinBudget = 20 * time.Microsecond
)

// spinWaitLocked waits until ready() may have become true: it spins for
// connSpinBudget, then parks on wakeCh like waitLocked. mu is held on
// entry and exit, and when ready is called.
func (c *Conn) spinWaitLocked(wakeCh chan struct{}, dl *deadline, ready func() bool) error {
	if c.spinLocked(time.Now(), ready) {
		// The wake-up token for what arrived is stale now.
		select {
		case <-wakeCh:
		default:
		}
		return nil
	}
	return c.waitLocked(wakeCh, dl)
}

// spinLocked polls c's vdev until ready() or connSpinBudget has passed
// since start. mu is held on entry and exit (released while polling).
func (c *Conn) spinLocked(start time.Time, ready func() bool) bool {
	v := c.vd
	for {
		c.mu.Unlock()
		if v.rxMu.TryLock() {
			_, err := v.poll()
			v.rxMu.Unlock()
			if err != nil {
				c.mu.Lock()
				return false // the rx loop reports it
			}
		}
		c.mu.Lock()
		if ready() {
			return true
		}
		if time.Since(start) > connSpinBudget {
			return false
		}
	}
}

// readableLocked says whether Read has something to act on without
// waiting: a ready segment, EOF, an error, Close or the deadline.
func (c *Conn) readableLocked() bool {
	if c.closed || c.err != nil || isClosedChan(c.rdDL.wait()) {
		return true
	}
	s := c.segs.peek()
	return s != nil && (s.kind != segRMA || s.ready)
}

func (c *Conn) copyEagerLocked(p []byte, s *seg) int {
	want := min(len(p), int(s.n))
	n := 0
	for n < want {
		end := min(int(c.eHead)+want-n, len(c.eager))
		k := copy(p[n:], c.eager[c.eHead:end])
		n += k
		c.eHead = uint32((int(c.eHead) + k) % len(c.eager))
	}
	c.eLen -= uint32(n)
	s.n -= uint32(n)
	c.freedEager += uint32(n)
	if s.n == 0 {
		c.segs.pop()
	}
	return n
}

// flushCredits returns freed ring and eager space as one RMA_AVAIL once a
// 1/creditFraction of either has been freed (or always, with all).
// Batching keeps credit traffic to a few messages per ring turn.
func (c *Conn) flushCredits(all bool) {
	c.mu.Lock()
	fr, fe := c.freedRing, c.freedEager
	if !c.creditsDueLocked(all) {
		c.mu.Unlock()
		return
	}
	c.freedRing, c.freedEager = 0, 0
	c.mu.Unlock()
	encTwo(&c.rbatch[0], c.peerAddr, TagRMAAvail, c.peerID, fr, fe)
	// c.ctx, not a timeout context: no allocation per credit message; the
	// peer's rx loop drains without waiting on applications, and its death
	// ends the Send with ErrPeerDown.
	if _, err := c.vd.ep.Send(c.ctx, c.rbatch[:]); err != nil {
		if errors.Is(err, fabric.ErrPeerDown) {
			c.fail(fmt.Errorf("peer %v: %w", c.peerAddr, fabric.ErrPeerDown), false)
		}
		return
	}
	c.dev.ctr.creditMsgs.Add(1)
	c.dev.ctr.creditBytes.Add(uint64(fr) + uint64(fe))
}

// creditsDueLocked says whether flushCredits(all) would send.
func (c *Conn) creditsDueLocked(all bool) bool {
	fr, fe := c.freedRing, c.freedEager
	frac := uint32(c.cfg.creditFraction)
	return !(fr == 0 && fe == 0 || !all && fr < c.ringSize/frac && fe < c.eagerWin/frac || c.err != nil || c.released)
}

// ---- non-waiting reads and read notification (exnd's shim splice) ----

// ErrWouldBlock is TryRead's answer when nothing can be read without
// waiting: no data yet, the next RMA chunk still in flight, or another
// Read or TryRead in progress.
var ErrWouldBlock = errors.New("extds: read would block")

// ErrNeedRead is TryRead's answer when the next segment is a ZCopy
// transfer: only Read, which drives it with fabric operations and waits
// for them, can take it.
var ErrNeedRead = errors.New("extds: next data needs Read")

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
	if c.mode != ModeEXTDS {
		return c.opErr("set", errors.New("read notification needs an EXT-DS connection"))
	}
	c.mu.Lock()
	c.rxNote, c.rxKick, c.notePend = notify, kick, false
	c.mu.Unlock()
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
	if c.mode != ModeEXTDS {
		return 0, false, ErrNeedRead
	}
	if !c.rmu.TryLock() {
		return 0, false, ErrWouldBlock
	}
	defer c.rmu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return 0, false, c.opErr("read", net.ErrClosed)
	case c.err != nil:
		return 0, false, c.opErr("read", c.err)
	case isClosedChan(c.rdDL.wait()):
		return 0, false, c.opErr("read", os.ErrDeadlineExceeded)
	case len(p) == 0:
		return 0, false, nil
	}
	s := c.segs.peek()
	if s == nil {
		return 0, c.creditsDueLocked(false), ErrWouldBlock
	}
	switch s.kind {
	case segVELO:
		n = c.copyEagerLocked(p, s)
	case segRMA:
		if !s.ready {
			return 0, c.creditsDueLocked(false), ErrWouldBlock
		}
		n = copy(p[:min(len(p), int(s.n))], c.rxRing.Buf[s.off:])
		s.off += uint32(n)
		s.n -= uint32(n)
		c.rxUsed -= uint32(n)
		c.freedRing += uint32(n)
		if s.n == 0 {
			c.segs.pop()
		}
	case segEOF:
		return 0, c.creditsDueLocked(true), io.EOF
	default:
		return 0, c.creditsDueLocked(false), ErrNeedRead
	}
	c.dev.ctr.rxBytes.Add(uint64(n))
	return n, c.creditsDueLocked(false), nil
}

// Buffered returns how many bytes TryRead could return now: the ready
// data segments at the head of the receive queue.
func (c *Conn) Buffered() int {
	if c.mode != ModeEXTDS {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for i := 0; i < c.segs.len(); i++ {
		s := &c.segs.buf[(c.segs.head+i)%len(c.segs.buf)]
		if s.kind != segVELO && (s.kind != segRMA || !s.ready) {
			break
		}
		n += int(s.n)
	}
	return n
}

// FlushCredits returns the receive space TryRead freed to the peer (all
// of it, in one RMA_AVAIL). It may block like a Write; call it when
// TryRead says flush.
func (c *Conn) FlushCredits() {
	if c.mode == ModeEXTDS {
		c.flushCredits(true)
	}
}

// ---- receive handlers (rx loop) ----

func (c *Conn) protoErr(why string, args ...any) {
	c.dev.drop(DropProtocol, append([]any{"conn", c.id, "peer", c.peerAddr, "why", why}, args...)...)
	c.failLocked(fmt.Errorf("%s: %w", why, ErrProtocol), true)
}

// onMsg handles one message for this connection. It runs on the rx loop.
func (c *Conn) onMsg(m *msg) {
	c.mu.Lock()
	c.onMsgLocked(m)
	f := c.takeNoteLocked()
	c.mu.Unlock()
	if f != nil {
		f()
	}
}

func (c *Conn) onMsgLocked(m *msg) {
	if c.released {
		return
	}
	if c.err != nil && m.tag != TagReset {
		return // already failed; drain silently
	}
	if c.closed {
		switch m.tag {
		case TagVELO, TagVELOLast, TagRMAInfo, TagZCSrc, TagZCWant, TagZCPut:
			// Data for a closed socket: reset, as TCP does.
			c.failLocked(errReset, true)
			return
		}
	}
	switch m.tag {
	case TagVELO, TagVELOLast:
		n := uint32(len(m.data))
		if c.rdShut {
			c.protoErr("data after shutdown")
			return
		}
		if c.eLen+n > c.eagerWin {
			c.protoErr("eager window overflow", "have", c.eLen, "got", n)
			return
		}
		tailPos := (int(c.eHead) + int(c.eLen)) % len(c.eager)
		k := copy(c.eager[tailPos:], m.data)
		copy(c.eager, m.data[k:])
		c.eLen += n
		if t := c.segs.tail(); t != nil && t.kind == segVELO {
			t.n += n
		} else if !c.pushLocked(seg{kind: segVELO, ready: true, n: n}) {
			return
		}
		c.rdReadyLocked()
	case TagRMAInfo:
		off, n := m.a, m.b
		if c.rdShut {
			c.protoErr("data after shutdown")
			return
		}
		if off != c.rxWpos || uint64(off)+uint64(n) > uint64(c.ringSize) || c.rxUsed+n > c.ringSize {
			c.protoErr("rma_info outside ring", "off", off, "len", n, "wpos", c.rxWpos, "used", c.rxUsed)
			return
		}
		c.rxWpos = (off + n) % c.ringSize
		c.rxUsed += n
		last := fabric.LastFrame(c.rxRing.NLA+fabric.NLA(off), n)
		ready := false
		for i, e := range c.early {
			if e == last {
				c.early[i] = c.early[len(c.early)-1]
				c.early = c.early[:len(c.early)-1]
				ready = true
				break
			}
		}
		if !c.pushLocked(seg{kind: segRMA, ready: ready, n: n, off: off, last: last}) {
			return
		}
		if ready {
			c.rdReadyLocked()
		}
	case TagRMAAvail:
		if uint64(c.txFree)+uint64(m.a) > uint64(c.peerRingSize) || uint64(c.txEager)+uint64(m.b) > uint64(c.peerEager) {
			c.protoErr("credit overflow", "ring", m.a, "eager", m.b)
			return
		}
		c.txFree += m.a
		c.txEager += m.b
		wake(c.wrWake)
		if c.closed && c.drainedLocked() {
			c.releaseLocked()
		}
	case TagShutdown:
		if c.rdShut {
			c.protoErr("duplicate shutdown")
			return
		}
		c.rdShut = true
		c.pushLocked(seg{kind: segEOF, ready: true})
		c.rdReadyLocked()
	case TagReset:
		c.dev.ctr.resetsRecv.Add(1)
		c.failLocked(errReset, false)
	case TagZCSrc, TagZCWant:
		if c.rdShut || m.b > maxZCopy {
			c.protoErr("bad zcopy advert", "len", m.b)
			return
		}
		k := segZCSrc
		if m.tag == TagZCWant {
			k = segZCWant
		}
		if c.pushLocked(seg{kind: k, ready: true, n: m.b, nla: m.nla}) {
			c.rdReadyLocked()
		}
	case TagZCSink:
		if !c.zcActive || c.zcSinkLen != 0 {
			c.protoErr("unexpected zc_sink")
			return
		}
		c.zcSinkNLA, c.zcSinkLen = m.nla, m.b
		wake(c.wrWake)
	case TagZCPut:
		if h := c.segs.peek(); h == nil || h.kind != segZCWant || c.zcPending == 0 || c.zcPutLen != 0 || m.b != c.zcPending {
			c.protoErr("unexpected zc_put", "len", m.b)
			return
		}
		c.zcPutLen = m.b
		c.rdReadyLocked()
	case TagZCDone:
		if !c.zcActive || c.zcDone {
			c.protoErr("unexpected zc_done")
			return
		}
		c.zcDone = true
		wake(c.wrWake)
	}
}

func (c *Conn) pushLocked(s seg) bool {
	if c.segs.len() >= maxSegs {
		c.protoErr("segment queue overflow")
		return false
	}
	c.segs.push(s)
	return true
}

// onNotify handles an RMA notification whose local NLA is in one of c's
// regions. It runs on the rx loop.
func (c *Conn) onNotify(n *fabric.Notification) {
	c.mu.Lock()
	c.onNotifyLocked(n)
	f := c.takeNoteLocked()
	c.mu.Unlock()
	if f != nil {
		f()
	}
}

func (c *Conn) onNotifyLocked(n *fabric.Notification) {
	if c.released || c.err != nil {
		return
	}
	if n.Err != fabric.NErrNone {
		c.dev.ctr.notifyErrors.Add(1)
		c.dev.rlog.warn("extds: rma error", "conn", c.id, "op", n.Op, "err", n.Err, "peer", n.Peer)
		if n.Err == fabric.NErrPeerDown {
			c.dev.ctr.peerDown.Add(1)
			c.failLocked(fmt.Errorf("rma %v: %w", n.Op, fabric.ErrPeerDown), false)
			return
		}
		if n.Err == fabric.NErrAccess && n.Op == fabric.OpPut && c.peerIs(n.Peer) {
			// Our PUT into the peer's ring found it deregistered: the
			// peer released the connection (its RESET or NOCONN may be
			// behind this notification). That is a reset, not a
			// protocol violation.
			c.failLocked(fmt.Errorf("peer ring gone: %w", errReset), false)
			return
		}
		c.failLocked(fmt.Errorf("rma %v: %v: %w", n.Op, n.Err, ErrProtocol), true)
		return
	}
	if n.Kind != fabric.KindCompleter || !c.peerIs(n.Peer) {
		c.dev.drop(DropNotify, "conn", c.id, "kind", n.Kind, "peer", n.Peer)
		return
	}
	region := n.Local.Region()
	switch {
	case n.Op == fabric.OpPut && region == c.rxRing.NLA.Region():
		for i := 0; i < c.segs.len(); i++ {
			s := &c.segs.buf[(c.segs.head+i)%len(c.segs.buf)]
			if s.kind == segRMA && !s.ready && s.last == n.Local {
				s.ready = true
				c.rdReadyLocked()
				return
			}
		}
		if len(c.early) >= maxEarly {
			c.protoErr("too many unmatched rma completions")
			return
		}
		c.early = append(c.early, n.Local)
	case c.zcSink.NLA != 0 && region == c.zcSink.NLA.Region() && c.zcPending != 0:
		if n.Local != fabric.LastFrame(c.zcSink.NLA, c.zcPending) {
			c.protoErr("zcopy completion at wrong address")
			return
		}
		if n.Op == fabric.OpGet {
			c.zcGot = true
		} else {
			c.zcPutNote = true
		}
		c.rdReadyLocked()
	default:
		c.dev.drop(DropNotify, "conn", c.id, "kind", n.Kind, "op", n.Op, "local", n.Local)
	}
}

// ---- failure, close, release ----

// fail makes c unusable with err (ECONNRESET, peer down, protocol) and
// wakes every blocked call; with reset it queues a RESET to the peer.
// Callable from any goroutine.
func (c *Conn) fail(err error, reset bool) {
	c.mu.Lock()
	c.failLocked(err, reset)
	c.mu.Unlock()
}

func (c *Conn) failLocked(err error, reset bool) {
	if c.released {
		return
	}
	if c.err == nil {
		c.err = err
		if reset && c.peer.Load() != 0 {
			c.dev.sendCtl(c.vd, c.peerAddr, c.peerID, TagReset)
		}
		c.cancel()
		c.wakeAll()
	}
	if c.closed {
		c.releaseLocked()
	}
}

// drainedLocked: the peer has returned every credit, so it has read all
// our data and no PUT from the tx ring is in flight.
func (c *Conn) drainedLocked() bool {
	return c.txFree == c.peerRingSize && c.txEager == c.peerEager
}

// releaseLocked frees c's fabric resources and table entries. Called once,
// with mu held, after Close.
func (c *Conn) releaseLocked() {
	if c.released {
		return
	}
	c.released = true
	d := c.dev
	d.mu.Lock()
	if d.conns[c.id] == c {
		delete(d.conns, c.id)
	}
	if k := (peerKey{c.peerAddr, c.peerID}); c.peerID != 0 && d.byPeer[k] == c {
		delete(d.byPeer, k)
	}
	for _, r := range append([]fabric.Region{c.rxRing, c.txRing, c.zcSink}, c.bufs...) {
		if r.NLA != 0 {
			delete(d.regions, r.NLA.Region())
		}
	}
	d.mu.Unlock()
	for _, r := range append([]fabric.Region{c.rxRing, c.txRing, c.zcSink}, c.bufs...) {
		switch {
		case r.NLA == 0:
		case r.NLA == c.txRing.NLA && c.txPin:
			c.txDeregLate = true // the writer's unpin deregisters it
		case r.NLA == c.rxRing.NLA && c.rxPin:
			c.rxDeregLate = true
		default:
			_ = c.vd.ep.Deregister(r.NLA) // fails only if the endpoint is gone, which frees it too
		}
	}
	// The region fields stay: a pinned ring is still in use (see txPin);
	// RMA on a deregistered one fails with an error.
	c.bufs = nil
	if c.shadow != nil {
		c.shadow.Close()
	}
	c.rdDL.stop()
	c.wrDL.stop()
	d.ctr.active.Add(-1)
}

// tick runs on the housekeeping goroutine: shadow loss and drain timeout.
func (c *Conn) tick(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return
	}
	if !c.shadowLost.IsZero() && c.err == nil && !c.rdShut && now.Sub(c.shadowLost) > c.cfg.shadowGrace {
		c.failLocked(fmt.Errorf("shadow connection lost: %w", syscall.ECONNRESET), true)
		return
	}
	if c.closed && !c.lingerUntil.IsZero() && now.After(c.lingerUntil) {
		c.dev.ctr.reaped.Add(1)
		c.failLocked(fmt.Errorf("drain timeout: %w", net.ErrClosed), true)
	}
}

// abort resets c at once (abortive close, Device.Close): a RESET is sent
// synchronously with a bounded wait, then resources are released.
func (c *Conn) abort(err error, reset bool) {
	c.mu.Lock()
	if c.released {
		c.mu.Unlock()
		return
	}
	send := reset && c.err == nil && c.peer.Load() != 0
	if c.err == nil {
		c.err = err
	}
	c.cancel()
	c.wakeAll()
	c.mu.Unlock()
	if send {
		var fm [1]fabric.Message
		encCtl(&fm[0], c.peerAddr, TagReset, c.peerID)
		ctx, cancel := context.WithTimeout(context.Background(), ctrlSendTimeout)
		if _, e := c.vd.ep.Send(ctx, fm[:]); e == nil {
			c.dev.ctr.resetsSent.Add(1)
		}
		cancel()
	}
	c.mu.Lock()
	c.closed = true
	c.releaseLocked()
	c.mu.Unlock()
}

// Close closes the connection. Blocked Read and Write calls return
// net.ErrClosed. The close is graceful by default: SHUTDOWN follows the
// data already written, and the rings stay registered in the background
// until the peer has read it (bounded by the drain timeout). Unread
// received data turns the close into a reset, as in TCP. See SetLinger.
func (c *Conn) Close() error {
	if c.mode == ModeTCP {
		return c.raw.Close()
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	}
	c.closed = true
	linger := c.linger
	failed := c.err != nil
	unread := c.segs.len() > 0 && c.segs.peek().kind != segEOF
	close(c.done)
	c.cancel()
	c.wakeAll()
	c.mu.Unlock()

	if failed {
		c.mu.Lock()
		c.releaseLocked()
		c.mu.Unlock()
		return nil
	}
	if linger == 0 || unread {
		c.abort(errReset, true)
		return nil
	}
	c.wmu.Lock() // writers have seen closed and left
	c.mu.Lock()
	needShut := !c.wrShut
	c.wrShut = true
	c.mu.Unlock()
	fr, fe := c.takeCredits()
	var msgs [2]fabric.Message
	k := 0
	if fr|fe != 0 {
		encTwo(&msgs[k], c.peerAddr, TagRMAAvail, c.peerID, fr, fe)
		k++
	}
	if needShut {
		encCtl(&msgs[k], c.peerAddr, TagShutdown, c.peerID)
		k++
	}
	var err error
	if k > 0 {
		ctx, cancel := context.WithTimeout(c.dev.ctx, ctrlSendTimeout)
		_, err = c.vd.ep.Send(ctx, msgs[:k])
		cancel()
	}
	c.wmu.Unlock()
	if err != nil {
		c.abort(fmt.Errorf("send shutdown: %w", err), false)
		return nil
	}
	if c.shadow != nil {
		c.shadow.Close()
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if c.drainedLocked() || c.err != nil {
		c.releaseLocked()
		return nil
	}
	if linger < 0 {
		c.lingerUntil = time.Now().Add(c.cfg.drainTimeout)
		return nil
	}
	t := time.NewTimer(time.Duration(linger) * time.Second)
	defer t.Stop()
	for !c.drainedLocked() && c.err == nil && !c.released {
		c.mu.Unlock()
		select {
		case <-c.wrWake:
		case <-t.C:
			c.mu.Lock()
			if !c.drainedLocked() && !c.released {
				c.dev.ctr.lingerExpired.Add(1)
				c.mu.Unlock()
				c.abort(errReset, true)
				c.mu.Lock()
			}
			return nil
		}
		c.mu.Lock()
	}
	c.releaseLocked()
	return nil
}

func (c *Conn) takeCredits() (uint32, uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fr, fe := c.freedRing, c.freedEager
	c.freedRing, c.freedEager = 0, 0
	return fr, fe
}

package extds

// The EXT-DS stream's shared machinery: protocol constants, the receive
// segment queue, wake-ups, waits (spin, then park) and fabric sends. The
// send path is stream_write.go, the consuming side stream_read.go, the rx
// loop's handlers stream_rx.go, the end of a connection stream_close.go.
//
// Order across the paths is the order of the segment queue, which is the
// order of VELO messages on the one (source vpid, target vpid) pair the
// connection uses: a VELO fragment never overtakes an RMA chunk still in
// flight, because the reader stops at an RMA segment that is not ready.
//
// Locks: everything here runs with Conn.mu held ("Locked" names) or takes
// it briefly, except send and sendErr, which are called without mu (a
// fabric Send is never made under mu) by a writer holding wmu or a reader
// holding rmu. The waits release mu while parked or polling and retake it;
// spinLocked takes the vdev's rxMu only by TryLock, so a waiter never
// blocks the rx loop. wake never blocks (a one-slot channel).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/exn-project/exn/extds/internal/wire"
	"github.com/exn-project/exn/fabric"
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
	ringFullVELOMax = sendBatch * wire.FragData
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

// unlockNote releases mu and then calls the notify function if the
// handling done under mu made it due (rx loop: onMsg, onNotify).
func (c *Conn) unlockNote() {
	f := c.takeNoteLocked()
	c.mu.Unlock()
	if f != nil {
		f()
	}
}

func (c *Conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// setDeadline sets one of c's deadlines, unless c is closed.
func (c *Conn) setDeadline(dl *deadline, t time.Time) error {
	if c.isClosed() {
		return c.opErr("set", net.ErrClosed)
	}
	dl.set(t)
	return nil
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
	// connSpinBudget is what a waiter polls before it parks, until its
	// Conn learned better (spin.go). It is
	// about what parking costs here: the wake-up chain it replaces (the
	// peer's doorbell ring, the rx loop's netpoller wake-up, the hand-off
	// to this goroutine) measured 20–40 µs between two processes on this
	// 2-core host, so a spin of that length at most doubles the cost of
	// a wait that parks anyway, and a request/answer exchange between
	// two spinning processes (a few µs a round trip) never parks.
	connSpinBudget = 20 * time.Microsecond
)

// spinWaitLocked waits until ready() may have become true: it spins for
// sb's learned budget (spin.go), then parks on wakeCh like waitLocked,
// and tells sb how the wait went. mu is held on entry and exit, and when
// ready is called.
func (c *Conn) spinWaitLocked(sb *spinBudget, wakeCh chan struct{}, dl *deadline, ready func() bool) error {
	budget := sb.next()
	start := time.Now()
	if budget > 0 && c.spinLocked(start, budget, ready) {
		sb.hit()
		c.dev.ctr.waitsSpun.Add(1)
		// The wake-up token for what arrived is stale now.
		select {
		case <-wakeCh:
		default:
		}
		return nil
	}
	c.dev.ctr.waitsParked.Add(1)
	at := time.Now()
	err := c.waitLocked(wakeCh, dl)
	if err == nil {
		sb.parked(at.Sub(start), time.Since(at), c.vd.colocated)
	}
	return err
}

// spinLocked polls c's vdev until ready() or budget has passed since
// start. mu is held on entry and exit (released while polling).
func (c *Conn) spinLocked(start time.Time, budget time.Duration, ready func() bool) bool {
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
		if time.Since(start) > budget {
			return false
		}
	}
}

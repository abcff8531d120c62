package extds

// The EXT-DS receive side as the application sees it: Read, TryRead and
// read notification, and the return of credits (WriteTo is copy.go, the
// ZCopy segments zcopy.go; what fills the queue is stream_rx.go).
//
//	Read          → consumes segments in order; freed ring and eager bytes
//	                go back as RMA_AVAIL once ≥ 1/creditFraction is free
//	TryRead       → the same without waiting or sending (exnd's splice),
//	                saying when credits are due (FlushCredits)
//
// Locks: a reader takes rmu (serialises readers, guards rbatch), then mu
// for the segment queue; mu is released while it waits (spinWaitLocked,
// waitLocked) and before the RMA_AVAIL Send. TryRead only tries rmu.
// The rx ring is read under mu here; WriteTo pins it (rxPin) instead.

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/exn-project/exn/extds/internal/wire"
	"github.com/exn-project/exn/fabric"
)

// read is Read on an EXT-DS connection.
func (c *Conn) read(p []byte) (int, error) {
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
			if err := c.spinWaitLocked(&c.rdSpin, c.rdWake, &c.rdDL, c.readableLocked); err != nil {
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
				if err := c.spinWaitLocked(&c.rdSpin, c.rdWake, &c.rdDL, c.readableLocked); err != nil {
					c.mu.Unlock()
					return 0, err
				}
				continue
			}
			n = c.copyRingLocked(p, s)
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

// unpinRxLocked is unpinTxLocked for a reader's use of rxRing.Buf.
func (c *Conn) unpinRxLocked() {
	c.rxPin = false
	if c.rxDeregLate {
		c.rxDeregLate = false
		_ = c.vd.ep.Deregister(c.rxRing.NLA)
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

// copyRingLocked copies the ready RMA segment s (the head) out of the rx
// ring into p and consumes what it copied.
func (c *Conn) copyRingLocked(p []byte, s *seg) int {
	n := copy(p[:min(len(p), int(s.n))], c.rxRing.Buf[s.off:])
	c.consumeLocked(s, uint32(n))
	return n
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
	wire.EncTwo(&c.rbatch[0], c.peerAddr, TagRMAAvail, c.peerID, fr, fe)
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

// setReadNotify is SetReadNotify on an EXT-DS connection.
func (c *Conn) setReadNotify(notify, kick func()) {
	c.mu.Lock()
	c.rxNote, c.rxKick, c.notePend = notify, kick, false
	c.mu.Unlock()
}

// tryRead is TryRead on an EXT-DS connection.
func (c *Conn) tryRead(p []byte) (n int, flush bool, err error) {
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
		n = c.copyRingLocked(p, s)
	case segEOF:
		return 0, c.creditsDueLocked(true), io.EOF
	default:
		return 0, c.creditsDueLocked(false), ErrNeedRead
	}
	c.dev.ctr.rxBytes.Add(uint64(n))
	return n, c.creditsDueLocked(false), nil
}

// buffered is Buffered on an EXT-DS connection.
func (c *Conn) buffered() int {
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

package extds

// The end of an EXT-DS connection: failure (fail), Close (graceful:
// SHUTDOWN, then the rings stay registered until the peer returns every
// credit or the drain timeout; abortive: RESET), release of fabric
// resources, and the housekeeping tick (shadow loss, drain timeout).
//
// Locks: fail and failLocked take mu; releaseLocked runs once, with mu
// held, and takes Device.mu inside it to drop the table entries. Close
// takes wmu after writers have seen closed (so SHUTDOWN follows their
// last message) and releases mu around every fabric Send; abort sends its
// RESET with mu released and a bounded wait. A pinned ring is left
// registered by releaseLocked and deregistered by its unpin.

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/exn-project/exn/extds/internal/wire"
	"github.com/exn-project/exn/fabric"
)

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
		wire.EncCtl(&fm[0], c.peerAddr, TagReset, c.peerID)
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

// closeStream is Close on an EXT-DS connection.
func (c *Conn) closeStream() error {
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
		wire.EncTwo(&msgs[k], c.peerAddr, TagRMAAvail, c.peerID, fr, fe)
		k++
	}
	if needShut {
		wire.EncCtl(&msgs[k], c.peerAddr, TagShutdown, c.peerID)
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

package extds

// The EXT-DS receive handlers: what the vdev's rx loop (device.go) does
// with a message or an RMA notification for this connection.
//
//	VELO          → bytes into the eager FIFO, a VELO segment (coalesced)
//	RMA_INFO      → an RMA segment, ready once its completer notification
//	                (matched by LastFrame) has arrived
//	RMA_AVAIL     → credits back to the writer
//	SHUTDOWN      → an EOF segment
//	RESET         → the connection fails with ECONNRESET
//	ZC_SRC/WANT   → a ZCopy segment the reader drives (GET or sink advert)
//	ZC_SINK/PUT/DONE → the ZCopy exchange (zcopy.go)
//
// Locks: the rx loop takes only mu (never wsem, wmu or rmu: it serves every
// connection of its vdev and must not wait on an application), and sends
// nothing itself: a RESET goes through the Device's control queue. The
// read notification (SetReadNotify) runs after mu is released.

import (
	"fmt"

	"github.com/exn-project/exn/extds/internal/wire"
	"github.com/exn-project/exn/fabric"
)

func (c *Conn) protoErr(why string, args ...any) {
	c.dev.drop(DropProtocol, append([]any{"conn", c.id, "peer", c.peerAddr, "why", why}, args...)...)
	c.failLocked(fmt.Errorf("%s: %w", why, ErrProtocol), true)
}

// onMsg handles one message for this connection. It runs on the rx loop.
func (c *Conn) onMsg(m *wire.Msg) {
	c.mu.Lock()
	c.onMsgLocked(m)
	c.unlockNote()
}

func (c *Conn) onMsgLocked(m *wire.Msg) {
	if c.released {
		return
	}
	if c.err != nil && m.Tag != TagReset {
		return // already failed; drain silently
	}
	if c.closed {
		switch m.Tag {
		case TagVELO, TagVELOLast, TagRMAInfo, TagZCSrc, TagZCWant, TagZCPut:
			// Data for a closed socket: reset, as TCP does.
			c.failLocked(errReset, true)
			return
		}
	}
	switch m.Tag {
	case TagVELO, TagVELOLast:
		n := uint32(len(m.Data))
		if c.rdShut {
			c.protoErr("data after shutdown")
			return
		}
		if c.eLen+n > c.eagerWin {
			c.protoErr("eager window overflow", "have", c.eLen, "got", n)
			return
		}
		tailPos := (int(c.eHead) + int(c.eLen)) % len(c.eager)
		k := copy(c.eager[tailPos:], m.Data)
		copy(c.eager, m.Data[k:])
		c.eLen += n
		if t := c.segs.tail(); t != nil && t.kind == segVELO {
			t.n += n
		} else if !c.pushLocked(seg{kind: segVELO, ready: true, n: n}) {
			return
		}
		c.rdReadyLocked()
	case TagRMAInfo:
		off, n := m.A, m.B
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
		if uint64(c.txFree)+uint64(m.A) > uint64(c.peerRingSize) || uint64(c.txEager)+uint64(m.B) > uint64(c.peerEager) {
			c.protoErr("credit overflow", "ring", m.A, "eager", m.B)
			return
		}
		c.txFree += m.A
		c.txEager += m.B
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
		if c.rdShut || m.B > maxZCopy {
			c.protoErr("bad zcopy advert", "len", m.B)
			return
		}
		k := segZCSrc
		if m.Tag == TagZCWant {
			k = segZCWant
		}
		if c.pushLocked(seg{kind: k, ready: true, n: m.B, nla: m.NLA}) {
			c.rdReadyLocked()
		}
	case TagZCSink:
		if !c.zcActive || c.zcSinkLen != 0 {
			c.protoErr("unexpected zc_sink")
			return
		}
		c.zcSinkNLA, c.zcSinkLen = m.NLA, m.B
		wake(c.wrWake)
	case TagZCPut:
		if h := c.segs.peek(); h == nil || h.kind != segZCWant || c.zcPending == 0 || c.zcPutLen != 0 || m.B != c.zcPending {
			c.protoErr("unexpected zc_put", "len", m.B)
			return
		}
		c.zcPutLen = m.B
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
	c.unlockNote()
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

package rdirect

// The receive loop: one goroutine per Engine. It takes CDCs out of the
// endpoint's mailbox and applies them (Conn.receive), and takes the
// notifications of the pump's PUTs: a requester notification marks a
// flight landed (fabrics without PutOrderer), an error notification
// resets the connection (or, peer down, every connection to that node).
// It never sends (a Send may block on the peer's mailbox, and the peer's
// receive loop must always drain ours): what needs a CDC is kicked to
// the pump. It parks in ep.Wait, the fabric's own spin-then-park.

import (
	"github.com/exn-project/exn/fabric"
)

const rxBatch = 64

func (e *Engine) rxLoop() {
	defer e.wg.Done()
	var msgs [rxBatch]fabric.Message
	var ns [rxBatch]fabric.Notification
	for {
		n, err := e.ep.Recv(msgs[:])
		if err != nil {
			return
		}
		for i := range n {
			e.handle(&msgs[i])
		}
		k, err := e.ep.PollNotifications(ns[:])
		if err != nil {
			return
		}
		for i := range k {
			e.notified(&ns[i])
		}
		if n == 0 && k == 0 {
			if err := e.ep.Wait(e.ctx); err != nil {
				return
			}
		}
	}
}

// handle takes one message of the mailbox. Safe for concurrent use (the
// connection's state is under its rxMu), so FuzzCDC calls it directly.
func (e *Engine) handle(m *fabric.Message) {
	e.st.cdcsRecv.Add(1)
	var d cdc
	p := m.Payload()
	if m.MC || m.Tag != TagCDC || decode(p, &d) != nil {
		// A connection's peer that sends it garbage resets it; garbage
		// from anyone else is dropped.
		if c := e.lookup(dstOf(p)); c != nil && c.from(m.Peer) {
			c.reset(ReasonMalformed, true)
		} else {
			e.st.unknown.Add(1)
		}
		return
	}
	c := e.lookup(d.dst)
	if c == nil {
		e.st.unknown.Add(1)
		return
	}
	c.receive(m.Peer, &d)
}

// notified takes one notification.
func (e *Engine) notified(n *fabric.Notification) {
	if n.Kind != fabric.KindRequester || n.Op != fabric.OpPut {
		return // nothing the engine asked for
	}
	if !e.ordered {
		e.inflight.Add(-1)
		if e.capWait.Load() && e.capWait.Swap(false) {
			e.wake()
		}
	}
	e.mu.RLock()
	c := e.regions[n.Local.Region()]
	e.mu.RUnlock()
	if c == nil {
		return // closed since
	}
	if n.Err != fabric.NErrNone {
		if n.Err == fabric.NErrPeerDown {
			e.resetNode(n.Peer.Node)
			return
		}
		c.reset(ReasonFabric, true)
		return
	}
	if e.ordered {
		return
	}
	first := false
	c.txMu.Lock()
	for i := range c.flN {
		f := &c.fl[(c.flHead+i)%maxInflight]
		if !f.done && f.last == n.Local {
			f.done = true
			first = i == 0
			break
		}
	}
	c.txMu.Unlock()
	if first {
		e.kick(c)
	}
}

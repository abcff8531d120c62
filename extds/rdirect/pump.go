package rdirect

// The transmit pump: one goroutine per Engine.
//
//	kicks (Start, Reset, Close, Kick, rx: a window update due, a completion,
//	       an upgrade word the peer changed)
//	bells (the program wrote, or consumed while the engine was armed, or
//	       changed the upgrade word: upgrade.go)
//	     └──► hot list: service each ──► PUTs (Post), CDCs (one Send)
//	          work done: go on; none for Engine.spin: park
//	park: arm every hot connection (cons_wait[S] += 1; prod_wait[1−S]
//	      += 1 if the peer's writer is blocked), re-check them (Dekker:
//	      the program stores its cursor, then loads the count; the pump
//	      adds to the count, then loads the cursor), then wait on the
//	      epoll set of the bells (one per connection, B_{1−S}) in Go's
//	      netpoller. A connection stays armed, and out of the hot list,
//	      until its bell or a kick wakes the pump: a wake-up costs
//	      O(ready), an idle connection nothing.
//
// A bell that reads end of file (the program's bell B_S is closed
// everywhere: the program is gone, or closed it behind the shim's back)
// leaves the epoll set, which is level-triggered and would report it for
// ever; the connection is looked at, not reset. exnd stores fin and
// rd_closed at the program's last close, which it sees on E, and kicks
// (Conn.Kick): the program's bell closes with its last descriptors,
// often before exnd has stored them, so a reset here would turn a clean
// close into a reset.
//
// The hot list holds the connections the pump polls while it spins;
// disarmed, so that the program's writes ring nothing.

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/exn-project/exn/extds/dring"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/sys"
)

type pump struct {
	e       *Engine
	hot     []*Conn
	kq      []*Conn
	out     []fabric.Message
	outConn []*Conn
	reqs    []fabric.RMA
	buf     [64]byte
}

func newPump(e *Engine) *pump {
	return &pump{
		e: e, out: make([]fabric.Message, 0, maxBatch), outConn: make([]*Conn, 0, maxBatch),
		reqs: make([]fabric.RMA, 0, 8),
	}
}

// run is the pump's loop, until Engine.stop.
func (p *pump) run() {
	e := p.e
	last := time.Now()
	for !e.stop.Load() {
		did := p.drainKicks()
		for i := 0; i < len(p.hot); i++ {
			c := p.hot[i]
			if p.service(c) {
				did = true
			}
			if c.detachDone { // removed from hot by detach: look at i again
				i--
			}
		}
		p.flush(e.ctx)
		if did {
			last = time.Now()
			continue
		}
		if len(p.hot) > 0 && e.spin > 0 && time.Since(last) < e.spin {
			continue
		}
		p.park()
		last = time.Now()
	}
	p.final()
}

// final sends the rsts Engine.Close asked for, bounded in time.
func (p *pump) final() {
	e := p.e
	p.drainKicks()
	for i := 0; i < len(p.hot); i++ {
		c := p.hot[i]
		if c.dead.Load() && c.started.Load() && !c.detachDone && c.rstPending.Swap(false) {
			p.queue(c, flagRst)
		}
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Second)
	p.flush(ctx)
	cancel()
	for _, c := range p.hot {
		p.disarm(c)
		c.hot = false
	}
	clear(p.hot)
	p.hot = p.hot[:0]
}

// drainKicks moves the kicked connections into the hot list.
func (p *pump) drainKicks() bool {
	e := p.e
	if !e.pending.Swap(false) {
		return false
	}
	e.kmu.Lock()
	p.kq, e.kq = e.kq, p.kq[:0]
	e.kmu.Unlock()
	for _, c := range p.kq {
		c.queued.Store(false)
		p.makeHot(c)
	}
	n := len(p.kq)
	clear(p.kq)
	p.kq = p.kq[:0]
	return n > 0
}

func (p *pump) makeHot(c *Conn) {
	if c.hot || c.detachDone {
		return
	}
	p.disarm(c)
	c.hot = true
	p.hot = append(p.hot, c)
}

// removeHot takes c out of the hot list.
func (p *pump) removeHot(c *Conn) {
	for i, x := range p.hot {
		if x == c {
			last := len(p.hot) - 1
			p.hot[i] = p.hot[last]
			p.hot[last] = nil
			p.hot = p.hot[:last]
			break
		}
	}
	c.hot = false
}

// arm announces the engine as a parked waiter in c's buffer.
func (p *pump) arm(c *Conn) {
	if !c.armedData {
		c.tx.ConsWait.Add(1)
		c.armedData = true
	}
	want := c.peerBlocked.Load()
	switch {
	case want && !c.armedSpace:
		c.rx.ProdWait.Add(1)
		c.armedSpace = true
		c.spaceArmed.Store(true)
	case !want && c.armedSpace:
		c.rx.ProdWait.Add(^uint32(0))
		c.armedSpace = false
		c.spaceArmed.Store(false)
	}
}

// disarm withdraws what arm announced.
func (p *pump) disarm(c *Conn) {
	if c.armedData {
		c.tx.ConsWait.Add(^uint32(0))
		c.armedData = false
	}
	if c.armedSpace {
		c.rx.ProdWait.Add(^uint32(0))
		c.armedSpace = false
		c.spaceArmed.Store(false)
	}
}

// detach lets go of a closing connection: out of the hot list and the
// epoll set, disarmed; Close waits for it.
func (p *pump) detach(c *Conn) {
	if c.detachDone {
		return
	}
	if c.started.Load() && c.rstPending.Swap(false) {
		p.queue(c, flagRst)
	}
	p.removeHot(c)
	p.disarm(c)
	if !c.bellGone {
		_ = p.e.poll.Del(c.bell)
	}
	c.detachDone = true
	close(c.detached)
}

// service does what c needs now: rst, PUTs of new bytes, a CDC. It
// reports whether it did anything.
func (p *pump) service(c *Conn) bool {
	if c.detachDone {
		return false
	}
	if c.closing.Load() {
		p.detach(c)
		return true
	}
	if !c.started.Load() {
		return false
	}
	if c.dead.Load() {
		if c.rstPending.Swap(false) {
			p.queue(c, flagRst)
			return true
		}
		return false
	}
	if c.tx.Rst.Load() != 0 || c.rx.Rst.Load() != 0 {
		c.reset(ReasonProgram, true)
		return true
	}
	// fin before tail: a fin seen means the tail loaded after it is the
	// last. tail before recvHeadA, head before recvTailA: rx stores its
	// copies before the buffer's, so a cursor the program moved on the
	// strength of a stored value is never checked against an older copy.
	fin := c.tx.Fin.Load() != 0
	tail := c.tx.Tail.Load()
	rh := c.recvHeadA.Load()
	if tail < c.putTail || tail-rh > c.ring {
		c.reset(ReasonLocal, true)
		return true
	}
	did := false
	switch n := tail - c.putTail; {
	case n == 0:
	case n <= inlineMax && c.putTail == c.annTail && c.inlN == 0:
		// A small write with nothing before it unannounced: its bytes
		// ride in the CDC itself (wire.go, flag data).
		base := uint64(dring.DataOffset(int(c.ring), c.side))
		off := c.putTail & (c.ring - 1)
		k := copy(c.inl[:n], c.mem[base+off:base+c.ring])
		copy(c.inl[k:n], c.mem[base:])
		c.inlN = int(n)
		c.putTail = tail
		did = true
	default:
		if !p.put(c, tail) {
			return true
		}
		did = true
	}
	ann := c.putTail
	if !p.e.ordered {
		ann = c.landed()
	}
	head := c.rx.Head.Load()
	rt := c.recvTailA.Load()
	sh := c.sentHead.Load()
	if head < sh || head > rt {
		c.reset(ReasonLocal, true)
		return true
	}
	rdc := c.rx.RdClosed.Load() != 0
	// The writer is blocked, or about to be: it parked, or the ring is
	// full (it parks only then). The peer then updates at once.
	blocked := c.tx.ProdWait.Load() > 0 || tail-rh == c.ring
	finNow := fin && ann == tail && !c.finSent.Load()
	upd := head != sh && (head-sh >= c.thresh || c.peerBlocked.Load())
	upg := c.upgNow() // the upgrade word's bits (upgrade.go)
	if ann == c.annTail && !finNow && (!rdc || c.rdcSent) && !upd && (!blocked || c.blockedSent) && upg == c.upgSent {
		return did
	}
	var flags uint8
	if finNow || c.finSent.Load() {
		flags |= flagFin
	}
	if rdc {
		flags |= flagRdClosed
	}
	if blocked {
		flags |= flagBlocked
	}
	if upd && ann == c.annTail && !finNow {
		p.e.st.updates.Add(1)
	}
	// Published before the Send: the peer's answer is checked against
	// them (apply).
	c.sentTail.Store(ann)
	c.sentHead.Store(head)
	c.annTail, c.rdcSent, c.blockedSent, c.upgSent = ann, rdc, blocked, upg
	if rdc {
		c.rdcSentA.Store(true)
	}
	p.queue(c, flags)
	if finNow {
		c.finSent.Store(true)
		if c.recvFinA.Load() {
			c.finish()
		}
	}
	return true
}

// put posts PUTs of [c.putTail, tail) from the local buffer to the same
// offsets of the peer's: one per chunk, two at the ring's wrap. Without
// PutOrderer each is recorded as a flight first (its notification may
// come before Post returns). It reports false if c was reset.
func (p *pump) put(c *Conn, tail uint64) bool {
	e := p.e
	base := uint64(dring.DataOffset(int(c.ring), c.side))
	reqs := p.reqs[:0]
	notify := fabric.Notify(0)
	if !e.ordered {
		notify = fabric.NotifyRequester
	}
	pt := c.putTail
	for pt != tail {
		if !e.ordered && (c.flN == maxInflight || e.inflight.Load() >= maxInflightTotal) {
			e.capWait.Store(true) // rx wakes the pump at the next notification
			break
		}
		off := pt & (c.ring - 1)
		n := min(tail-pt, c.ring-off, c.putChunk)
		local := c.region.NLA + fabric.NLA(base+off)
		reqs = append(reqs, fabric.RMA{
			Op: fabric.OpPut, Peer: c.peer, Local: local, Remote: c.peerNLA + fabric.NLA(base+off),
			Len: uint32(n), Notify: notify,
		})
		if !e.ordered {
			e.inflight.Add(1)
			c.txMu.Lock()
			c.fl[(c.flHead+c.flN)%maxInflight] = flight{end: pt + n, last: fabric.LastFrame(local, uint32(n))}
			c.flN++
			c.txMu.Unlock()
		}
		pt += n
	}
	p.reqs = reqs
	if len(reqs) == 0 {
		return true
	}
	k, err := e.ep.Post(reqs)
	for _, r := range reqs[:k] {
		e.st.puts.Add(1)
		e.st.putBytes.Add(uint64(r.Len))
	}
	if err != nil {
		if !e.ordered {
			// No notification comes for reqs[k:].
			e.inflight.Add(-int64(len(reqs) - k))
			c.txMu.Lock()
			c.flN -= len(reqs) - k
			c.txMu.Unlock()
		}
		for i := range reqs[:k] {
			c.putTail += uint64(reqs[i].Len)
		}
		if !errors.Is(err, net.ErrClosed) {
			c.reset(ReasonFabric, true)
		}
		return false
	}
	c.putTail = pt
	return true
}

// landed returns the cursor below which every PUT of c landed (its
// requester notification came), dropping those flights.
func (c *Conn) landed() uint64 {
	c.txMu.Lock()
	for c.flN > 0 && c.fl[c.flHead].done {
		c.completed = c.fl[c.flHead].end
		c.flHead = (c.flHead + 1) % maxInflight
		c.flN--
	}
	if c.flN == 0 {
		c.completed = c.putTail
	}
	v := c.completed
	c.txMu.Unlock()
	return v
}

// queue adds c's next CDC to the batch.
func (p *pump) queue(c *Conn, flags uint8) {
	if len(p.out) == cap(p.out) {
		p.flush(p.e.ctx)
	}
	c.sendSeq++
	d := cdc{
		flags: flags, upg: uint8(c.upgSent), echo: uint8(c.upgSent >> 8),
		seq: c.sendSeq, dst: c.peerID, src: c.id, prod: c.annTail, cons: c.sentHead.Load(),
	}
	if c.inlN > 0 && flags&flagRst == 0 {
		d.data = c.inl[:c.inlN]
		p.e.st.inline.Add(1)
		p.e.st.inlineBytes.Add(uint64(c.inlN))
	}
	c.inlN = 0
	p.out = p.out[:len(p.out)+1]
	d.encode(&p.out[len(p.out)-1], c.peer)
	p.outConn = append(p.outConn, c)
}

// flush sends the batch. A node that is down has its connections reset;
// another failure resets the connection of the failed message; the rest
// of the batch is sent.
func (p *pump) flush(ctx context.Context) {
	e := p.e
	msgs := p.out
	for len(msgs) > 0 {
		n, err := e.ep.Send(ctx, msgs)
		e.st.cdcsSent.Add(uint64(n))
		if err == nil {
			break
		}
		c := p.outConn[len(p.out)-len(msgs)+n]
		switch {
		case errors.Is(err, fabric.ErrPeerDown), errors.Is(err, fabric.ErrUnknownNode):
			e.resetNode(c.peer.Node)
		case errors.Is(err, net.ErrClosed), ctx.Err() != nil:
			msgs = msgs[:0]
			continue
		default:
			c.reset(ReasonFabric, false)
		}
		msgs = msgs[n+1:]
	}
	p.out = p.out[:0]
	clear(p.outConn)
	p.outConn = p.outConn[:0]
}

// hasWork is service's question without its actions, asked after arming.
func (p *pump) hasWork(c *Conn) bool {
	if c.closing.Load() || c.rstPending.Load() {
		return true
	}
	if !c.started.Load() || c.dead.Load() {
		return false
	}
	if c.tx.Rst.Load() != 0 || c.rx.Rst.Load() != 0 || c.tx.Tail.Load() != c.putTail {
		return true
	}
	if c.tx.Fin.Load() != 0 && !c.finSent.Load() && c.putTail == c.annTail {
		return true
	}
	if c.rx.RdClosed.Load() != 0 && !c.rdcSent || c.upgNow() != c.upgSent {
		return true
	}
	head, sh := c.rx.Head.Load(), c.sentHead.Load()
	return head != sh && (head-sh >= c.thresh || c.peerBlocked.Load())
}

// park arms the hot connections, re-checks them and the kick queue, and
// waits on the bells; then it makes the connections whose bells rang hot.
func (p *pump) park() {
	e := p.e
	for i := 0; i < len(p.hot); i++ {
		c := p.hot[i]
		if !c.started.Load() || c.dead.Load() && !c.rstPending.Load() && !c.closing.Load() {
			// Silent until Start or Close kicks it.
			p.disarm(c)
			p.removeHot(c)
			i--
			continue
		}
		p.arm(c)
	}
	e.parked.Swap(true)
	busy := e.pending.Load() || e.stop.Load()
	for _, c := range p.hot {
		if busy {
			break
		}
		busy = p.hasWork(c)
	}
	if busy {
		e.parked.Swap(false)
		for _, c := range p.hot {
			p.disarm(c)
		}
		return
	}
	for _, c := range p.hot {
		c.hot = false // cold: armed, woken by its bells or a kick
	}
	clear(p.hot)
	p.hot = p.hot[:0]
	e.st.parks.Add(1)
	n, err := e.poll.Wait()
	e.parked.Swap(false)
	e.st.wakes.Add(1)
	if err != nil {
		if !e.stop.Load() {
			e.faults.Warn("extds direct across hosts: bells", "err", err)
			time.Sleep(time.Millisecond) // a broken epoll set: do not spin on it
		}
		return
	}
	for i := range n {
		d := e.poll.Data(i)
		if d == 0 {
			_, _ = e.bell.Drain()
			continue
		}
		slot := int(d) - 1
		e.mu.RLock()
		var c *Conn
		if slot < len(e.slots) {
			c = e.slots[slot]
		}
		e.mu.RUnlock()
		if c == nil || c.detachDone {
			continue
		}
		// Drain, then clear both rung flags that target side 1−S (the
		// program rings once per drain, docs/direct.md "Ringing and
		// parking with one bell"): direction S's data_rung (it wrote)
		// and direction 1−S's space_rung (it consumed). Swaps: ordered
		// before the service's loads of the cursors.
		_, eof, err := sys.DrainSocketBell(c.bell, p.buf[:])
		c.tx.DataRung.Swap(0)
		c.rx.SpaceRung.Swap(0)
		if (eof || err != nil) && !c.bellGone {
			c.bellGone = true // see the file comment
			_ = e.poll.Del(c.bell)
		}
		p.makeHot(c)
	}
}

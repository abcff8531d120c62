//go:build ofi && cgo

package ofi

// Endpoint pipeline (one per open VPID):
//
//	Send ──► pair (one per target Addr, pair.mu): first use sends pOpenQ
//	         and waits for pOpenA (credits, epoch); each message takes a
//	         credit, none left: block (SendBlocked) until pCredit, the
//	         target closing (pClosed: ErrPeerDown), the peer going down,
//	         ctx, or Close ──► NIC.transmit (send slot, fi_send)
//	progress ──► deliver: mailbox ring (endpoint.mu), keyed source account
//	Recv ──► copy out, count consumption per source; every credits/2
//	         consumed go back as one pCredit (credMu orders the returns)
//	notify, PollNotifications, Register's checks: the shared endpoint
//	      core (localq.Core: notification queue, overflow dropped and
//	      counted; closed flag and done channel)
//	Wait: drive progress (NIC.poll, progress.go) for waitSpin, checking
//	      the atomic lengths, then park in the core's waiter
//	      (localq.Waiter.Park); producers signal only a sleeping consumer.
//
// Loopback (a target on this node) takes the same path without libfabric:
// control packets are dispatched inline and messages go straight into the
// target mailbox.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/internal/localq"
)

type pairState uint8

const (
	psUnknown  pairState = iota // never asked, or reset (target closed, peer down)
	psQuerying                  // pOpenQ sent, waiting for pOpenA
	psOpen                      // credits and epoch valid
	psNotOpen                   // the target VPID is not open
)

// pair is the sender's state toward one target (node, VPID).
type pair struct {
	dst fabric.Addr

	mu      sync.Mutex
	state   pairState
	epoch   uint8
	credits int
	bundles bool          // the target takes pBundle packets (its pOpenA said so)
	ch      chan struct{} // non-nil while a sender waits; closed on change
}

func (p *pair) wakeLocked() {
	if p.ch != nil {
		close(p.ch)
		p.ch = nil
	}
}

// source is the receiver's account of one sender (node, VPID).
type source struct {
	addr     fabric.Addr
	consumed int  // received and freed, not yet returned; guarded by endpoint.mu
	queued   bool // on credDue; guarded by endpoint.mu
}

type slot struct {
	m   fabric.Message
	src *source
}

type creditDue struct {
	addr fabric.Addr
	n    int
}

type endpoint struct {
	localq.Core // Addr, PollNotifications; notifications, closed state

	nic   *NIC
	addr  fabric.Addr
	epoch uint8

	mu       sync.Mutex // mailbox and sources
	ring     []slot
	head     int
	cnt      int
	mbClosed bool
	grown    bool
	length   atomic.Int32
	srcs     map[fabric.Addr]*source
	credDue  []*source

	credMu  sync.Mutex // serialises credit returns so they leave in order
	credOut []creditDue

	pairsMu sync.RWMutex
	pairs   map[fabric.Addr]*pair

	spin waitBudget // Wait's spin on a provider with a wait fd
}

func newEndpoint(n *NIC, v fabric.VPID, epoch uint8) *endpoint {
	e := &endpoint{
		nic:   n,
		addr:  fabric.Addr{Node: n.id, VPID: v},
		epoch: epoch,
		ring:  make([]slot, n.cfg.MailboxSlots),
		srcs:  make(map[fabric.Addr]*source),
		pairs: make(map[fabric.Addr]*pair),
	}
	e.Core.Init(e.addr, "ofi", &n.ctr, &n.faults, &e.length, n.cfg.NotifyDepth, waitSpin)
	return e
}

// ---- VELO send ----

// sendMulticast sends m to m.Peer.VPID on every other node; membership is
// checked where it lands. Nodes without the VPID open, and nodes that go
// down meanwhile, are skipped.
func (e *endpoint) sendMulticast(ctx context.Context, m *fabric.Message) error {
	for _, p := range e.nic.peerList() {
		err := e.sendTo(ctx, fabric.Addr{Node: p.node, VPID: m.Peer.VPID}, m, true)
		switch {
		case err == nil, isErrPeerDown(err), isErrUnknown(err):
		default:
			return err
		}
	}
	e.nic.ctr.MulticastSent.Add(1)
	return nil
}

func (e *endpoint) sendTo(ctx context.Context, dst fabric.Addr, m *fabric.Message, mc bool) error {
	n := e.nic
	var p *peer
	if dst.Node != n.id {
		if p = n.peer(dst.Node); p == nil {
			return fmt.Errorf("ofi: velo send to %v: %w", dst, fabric.ErrUnknownNode)
		}
	}
	pr := e.pair(dst)
	epoch, err := e.acquire(ctx, pr, p)
	if err != nil {
		return err
	}
	h := header{
		typ:   pVELO,
		desc:  fabric.Descriptor{Node: n.id, VPID: e.addr.VPID, Tag: m.Tag, Len: m.Len},
		dst:   dst.VPID,
		epoch: epoch,
	}
	if mc {
		h.typ, h.group = pMcast, fabric.Group(m.Peer.Node)
	}
	if p == nil {
		t := n.eps[dst.VPID].Load()
		if t == nil || t.epoch != epoch {
			return fmt.Errorf("ofi: velo send to %v: vpid closed: %w", dst, fabric.ErrPeerDown)
		}
		t.deliver(h, n.id, m.Data[:m.Len])
		return nil
	}
	return n.transmit(ctx, e, p, h.encode(), m)
}

func (e *endpoint) pair(dst fabric.Addr) *pair {
	e.pairsMu.RLock()
	pr := e.pairs[dst]
	e.pairsMu.RUnlock()
	if pr != nil {
		return pr
	}
	e.pairsMu.Lock()
	defer e.pairsMu.Unlock()
	if pr = e.pairs[dst]; pr == nil {
		pr = &pair{dst: dst}
		e.pairs[dst] = pr
	}
	return pr
}

func (e *endpoint) lookupPair(dst fabric.Addr) *pair {
	e.pairsMu.RLock()
	defer e.pairsMu.RUnlock()
	return e.pairs[dst]
}

// acquire takes one credit toward pr.dst and returns the target's epoch.
func (e *endpoint) acquire(ctx context.Context, pr *pair, p *peer) (uint8, error) {
	counted := false
	for {
		if p != nil && !p.isUp.Load() {
			return 0, fmt.Errorf("ofi: velo send to %v: %w", pr.dst, fabric.ErrPeerDown)
		}
		pr.mu.Lock()
		waitCredits, query := false, false
		var openEpoch uint8
		switch pr.state {
		case psOpen:
			if pr.credits > 0 {
				pr.credits--
				ep := pr.epoch
				pr.mu.Unlock()
				return ep, nil
			}
			waitCredits, openEpoch = true, pr.epoch
		case psUnknown:
			pr.state, query = psQuerying, true
		case psNotOpen:
			pr.state = psUnknown
			pr.mu.Unlock()
			return 0, fmt.Errorf("ofi: velo send to %v: vpid not open: %w", pr.dst, fabric.ErrUnknownNode)
		}
		if pr.ch == nil {
			pr.ch = make(chan struct{})
		}
		ch := pr.ch
		pr.mu.Unlock()
		var down <-chan struct{}
		if p != nil {
			up, d := p.state()
			if !up {
				return 0, fmt.Errorf("ofi: velo send to %v: %w", pr.dst, fabric.ErrPeerDown)
			}
			down = d
		}
		if query {
			e.nic.sendCtl(pr.dst.Node, header{typ: pOpenQ, desc: fabric.Descriptor{VPID: e.addr.VPID}, dst: pr.dst.VPID}, nil)
		}
		if waitCredits && !counted {
			e.nic.ctr.SendBlocked.Add(1)
			counted = true
		}
		if p != nil && e.nic.spinUntil(func() bool { return localq.ClosedChan(ch) }) {
			// The answer or credits came while we drove progress.
		} else if err := e.block(ctx, pr, p, ch, down, waitCredits); err != nil {
			return 0, err
		}
		if waitCredits {
			pr.mu.Lock()
			gone := pr.state != psOpen || pr.epoch != openEpoch
			pr.mu.Unlock()
			if gone {
				return 0, fmt.Errorf("ofi: velo send to %v: vpid closed: %w", pr.dst, fabric.ErrPeerDown)
			}
		}
	}
}

// block parks a sender until ch closes (answer or credits), the peer goes
// down, ctx, or Close (localq's Core.ParkSender). A query (not
// waitCredits) to a remote peer is bounded by queryTimeout: a silent peer
// is an unreachable one.
func (e *endpoint) block(ctx context.Context, pr *pair, p *peer, ch, down <-chan struct{}, waitCredits bool) error {
	wait := ctx
	if !waitCredits && p != nil {
		// The timer exists only on the first send of a pair.
		var cancel context.CancelFunc
		wait, cancel = context.WithTimeout(ctx, queryTimeout)
		defer cancel()
	}
	err := e.ParkSender(wait, pr.dst, ch, down, nil, e.nic.done, fabric.ErrPeerDown)
	switch {
	case err == fabric.ErrPeerDown:
		return fmt.Errorf("ofi: velo send to %v: %w", pr.dst, fabric.ErrPeerDown)
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		// queryTimeout passed, not the caller's time.
		e.nic.peerDown(p, "no answer to a vpid open query")
		return fmt.Errorf("ofi: velo send to %v: no answer in %v: %w", pr.dst, queryTimeout, fabric.ErrPeerDown)
	}
	return err
}

// openAnswer applies a pOpenA from target dst.
func (e *endpoint) openAnswer(dst fabric.Addr, status uint8, epoch uint8, credits int, bundles bool) {
	pr := e.lookupPair(dst)
	if pr == nil {
		return
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.state != psQuerying {
		return // stale: reset meanwhile
	}
	if status == stOK {
		pr.state, pr.epoch, pr.credits, pr.bundles = psOpen, epoch, credits, bundles
	} else {
		pr.state = psNotOpen
	}
	pr.wakeLocked()
}

// credit applies a pCredit from target dst.
func (e *endpoint) credit(dst fabric.Addr, epoch uint8, k int) {
	pr := e.lookupPair(dst)
	if pr == nil {
		return
	}
	pr.mu.Lock()
	if pr.state == psOpen && pr.epoch == epoch {
		pr.credits += k
		pr.wakeLocked()
	}
	pr.mu.Unlock()
}

// targetClosed resets the pair toward dst after a pClosed: blocked
// senders get ErrPeerDown, the next Send asks again.
func (e *endpoint) targetClosed(dst fabric.Addr, epoch uint8) {
	pr := e.lookupPair(dst)
	if pr == nil {
		return
	}
	pr.mu.Lock()
	if pr.state != psOpen || pr.epoch == epoch {
		pr.state = psUnknown
		pr.credits = 0
		pr.wakeLocked()
	}
	pr.mu.Unlock()
}

// peerGone resets every pair toward node and forgets its sources.
func (e *endpoint) peerGone(node fabric.NodeID) {
	e.pairsMu.RLock()
	for dst, pr := range e.pairs {
		if dst.Node != node {
			continue
		}
		pr.mu.Lock()
		pr.state, pr.credits = psUnknown, 0
		pr.wakeLocked()
		pr.mu.Unlock()
	}
	e.pairsMu.RUnlock()
	e.mu.Lock()
	for a := range e.srcs {
		if a.Node == node {
			delete(e.srcs, a)
		}
	}
	e.mu.Unlock()
}

// transmit sends one VELO packet to p: with fi_inject from the inject
// scratch buffer when the packet fits the provider's inject size (the
// provider has copied it on return; no completion), else with fi_send
// from a send slot (the slot returns on its completion). A full provider
// queue (EAGAIN) is drained by driving progress from here.
func (n *NIC) transmit(ctx context.Context, e *endpoint, p *peer, hdr uint64, m *fabric.Message) error {
	return n.transmitPacket(ctx, e, p, hdr, m.Data[:m.Len])
}

// transmitPacket sends the packet hdr+body (at most recvSize bytes) to p,
// as transmit does.
func (n *NIC) transmitPacket(ctx context.Context, e *endpoint, p *peer, hdr uint64, body []byte) error {
	size := headerSize + len(body)
	if size <= n.inject {
		return n.transmitInline(e, p, hdr, body, size)
	}
	slot, err := n.takeSlot(ctx, e, p)
	if err != nil {
		return err
	}
	off := int(slot) * recvSize
	buf := n.tx.bytes()[off : off+recvSize]
	putHeader(buf, hdr)
	copy(buf[headerSize:], body)
	release := func() {
		n.txDests[slot].Store(nil)
		n.txFree <- slot
	}
	if !p.enter() {
		n.txFree <- slot
		return fmt.Errorf("ofi: velo send to node %d: %w", p.node, fabric.ErrPeerDown)
	}
	n.txDests[slot].Store(p)
	for {
		err = n.f.send(n.tx.at(off), size, n.txMR.desc, p.fa, mkctx(ctxSend, int(slot)))
		n.ringPeer(p) // sent, or the queue is full: either needs p's progress
		if err == nil {
			p.leave()
			n.awaitCompletion()
			return nil
		}
		if err := n.sendFailed(e, p, err); err != nil {
			release()
			return err
		}
	}
}

// transmitInline is transmitPacket's fi_inject path. The scratch buffer
// is shared by the NIC's senders under injMu, held only for the copy and
// the call: a send slot would cost two channel operations per message
// for a buffer the provider is done with on return.
func (n *NIC) transmitInline(e *endpoint, p *peer, hdr uint64, body []byte, size int) error {
	if !p.enter() {
		return fmt.Errorf("ofi: velo send to node %d: %w", p.node, fabric.ErrPeerDown)
	}
	for {
		n.injMu.Lock()
		buf := n.injScratch.bytes()[:size]
		putHeader(buf, hdr)
		copy(buf[headerSize:], body)
		err := n.f.inject(n.injScratch.p, size, p.fa)
		n.injMu.Unlock()
		n.ringPeer(p) // sent, or the queue is full: either needs p's progress
		if err == nil {
			p.leave()
			return nil
		}
		if err := n.sendFailed(e, p, err); err != nil {
			return err
		}
	}
}

// sendFailed handles a VELO send to p that failed with err: nil when the
// provider's queue was full and the caller should try again (progress was
// driven meanwhile); else the error for the caller, with p's enter
// released (and p marked down if the provider failed it).
func (n *NIC) sendFailed(e *endpoint, p *peer, err error) error {
	if !isAgain(err) || n.closed.Load() || e.Closed.Load() {
		p.leave()
		if e.Closed.Load() || n.closed.Load() {
			return e.ErrClosed("send")
		}
		n.peerDown(p, err.Error())
		return fmt.Errorf("ofi: velo send to node %d: %v: %w", p.node, err, fabric.ErrPeerDown)
	}
	// The provider's queue is full: progress drains it.
	n.spinStep()
	if !p.isUp.Load() {
		p.leave()
		return fmt.Errorf("ofi: velo send to node %d: %w", p.node, fabric.ErrPeerDown)
	}
	return nil
}

// takeSlot takes a free send slot. None free: slots return on send
// completions, so it drives progress for the spin budget, then parks
// until one returns, p goes down, ctx, or Close.
func (n *NIC) takeSlot(ctx context.Context, e *endpoint, p *peer) (int32, error) {
	select {
	case slot := <-n.txFree:
		return slot, nil
	default:
	}
	var slot int32
	if n.spinUntil(func() bool {
		select {
		case slot = <-n.txFree:
			return true
		default:
			return false
		}
	}) {
		return slot, nil
	}
	_, down := p.state()
	select {
	case slot = <-n.txFree:
		return slot, nil
	case <-down:
		return 0, fmt.Errorf("ofi: velo send to node %d: %w", p.node, fabric.ErrPeerDown)
	case <-e.Done:
		return 0, e.ErrClosed("send")
	case <-n.done:
		return 0, e.ErrClosed("send")
	case <-ctx.Done():
		return 0, fmt.Errorf("ofi: send: %w", ctx.Err())
	}
}

// ---- VELO receive ----

// openSource starts (or restarts) the credit account of sender src.
func (e *endpoint) openSource(src fabric.Addr) {
	e.mu.Lock()
	s := e.srcs[src]
	if s == nil {
		s = &source{addr: src}
		e.srcs[src] = s
	}
	s.consumed = 0
	e.mu.Unlock()
}

// deliver queues one message from (src, h.desc.VPID). The mailbox never
// drops: credits bound what senders have in flight, and should more
// senders than the mailbox was sized for be busy at once, it grows.
func (e *endpoint) deliver(h header, src fabric.NodeID, payload []byte) {
	from := fabric.Addr{Node: src, VPID: h.desc.VPID}
	s := e.lockSource(from, "velo message")
	if s == nil {
		return
	}
	if h.typ == pMcast && !e.nic.groups.Member(h.group) {
		// Not a member: consumed at once, so the sender's credit returns.
		e.consumeLocked(s)
		e.mu.Unlock()
		e.flushCredits()
		return
	}
	e.putLocked(s, from, h.typ == pMcast, h.desc.Tag, payload[:h.desc.Len])
	e.length.Store(int32(e.cnt))
	e.mu.Unlock()
	e.Signal()
}

// lockSource locks the mailbox for a message (what) from `from` and
// returns from's credit account with e.mu held; nil, unlocked, if the
// mailbox is closed or from has none (counted as corrupt: a sender
// that never opened the pair, or a forged source).
func (e *endpoint) lockSource(from fabric.Addr, what string) *source {
	e.mu.Lock()
	if e.mbClosed {
		e.mu.Unlock()
		return nil
	}
	s := e.srcs[from]
	if s == nil {
		e.mu.Unlock()
		e.nic.ctr.Corrupt.Add(1)
		e.nic.faults.Warn("ofi "+what+" without credit account dropped", "from", from, "vpid", e.addr.VPID)
		return nil
	}
	return s
}

// putLocked appends one message (payload at most a VELO payload) to the
// mailbox, growing it if full; e.mu held.
func (e *endpoint) putLocked(s *source, from fabric.Addr, mc bool, tag fabric.Tag, payload []byte) {
	if e.cnt == len(e.ring) {
		e.growLocked()
	}
	sl := &e.ring[(e.head+e.cnt)%len(e.ring)]
	sl.m.Peer, sl.m.MC, sl.m.Tag, sl.m.Len = from, mc, tag, uint8(len(payload))
	copy(sl.m.Data[:], payload)
	sl.src = s
	e.cnt++
}

func (e *endpoint) growLocked() {
	ring := make([]slot, 2*len(e.ring))
	for i := 0; i < e.cnt; i++ {
		ring[i] = e.ring[(e.head+i)%len(e.ring)]
	}
	if !e.grown {
		e.grown = true
		e.nic.log.Info("ofi mailbox grew: more busy senders than slots/credits", "vpid", e.addr.VPID, "slots", len(ring))
	}
	e.ring, e.head = ring, 0
}

func (e *endpoint) consumeLocked(s *source) {
	s.consumed++
	if s.consumed >= e.nic.cfg.Credits/2 && !s.queued {
		s.queued = true
		e.credDue = append(e.credDue, s)
	}
}

// Recv copies up to len(msgs) messages out of the mailbox and returns
// credits to their senders in batches of half a window. Never blocks.
func (e *endpoint) Recv(msgs []fabric.Message) (int, error) {
	e.mu.Lock()
	if e.mbClosed {
		e.mu.Unlock()
		return 0, e.ErrClosed("recv")
	}
	k := min(len(msgs), e.cnt)
	var bytes uint64
	for i := 0; i < k; i++ {
		sl := &e.ring[e.head]
		d := &msgs[i]
		d.Peer, d.MC, d.Tag, d.Len = sl.m.Peer, sl.m.MC, sl.m.Tag, sl.m.Len
		copy(d.Data[:sl.m.Len], sl.m.Data[:sl.m.Len])
		bytes += uint64(sl.m.Len)
		e.consumeLocked(sl.src)
		sl.src = nil
		e.head++
		if e.head == len(e.ring) {
			e.head = 0
		}
	}
	e.cnt -= k
	e.length.Store(int32(e.cnt))
	due := len(e.credDue) > 0
	e.mu.Unlock()
	e.CountRecv(k, bytes)
	if due {
		e.flushCredits()
	}
	return k, nil
}

// flushCredits sends the credits that fell due.
func (e *endpoint) flushCredits() {
	e.credMu.Lock()
	defer e.credMu.Unlock()
	e.mu.Lock()
	for _, s := range e.credDue {
		e.credOut = append(e.credOut, creditDue{s.addr, s.consumed})
		s.consumed, s.queued = 0, false
	}
	e.credDue = e.credDue[:0]
	e.mu.Unlock()
	var body [creditBody]byte
	for _, c := range e.credOut {
		putLe32(body[:], uint32(c.n))
		e.nic.sendCtl(c.addr.Node, header{typ: pCredit, desc: fabric.Descriptor{VPID: e.addr.VPID}, dst: c.addr.VPID, epoch: e.epoch}, body[:])
	}
	e.credOut = e.credOut[:0]
}

// ---- notifications ----

// Wait blocks until Recv or PollNotifications may have something, ctx is
// done or the endpoint closes. It first drives the NIC's progress itself
// for waitSpin (polling the CQ, so a busy exchange never parks), then
// parks until a producer signals it. On a provider with a wait fd the
// spin adapts between waitSpinMin and waitSpin (waitBudget) and the clock
// is read every step: each step is a system call there anyway.
func (e *endpoint) Wait(ctx context.Context) error {
	if e.Closed.Load() {
		return e.ErrClosed("wait")
	}
	if e.Ready() {
		return nil
	}
	n := e.nic
	budget, every := waitSpin, spinClockEvery
	if n.waitable {
		budget, every = e.spin.get(), 1
	}
	n.spinners.Add(1)
	start := time.Now()
	for i := 1; ; i++ {
		n.spinStep()
		if e.Ready() {
			n.unspin(true)
			if n.waitable {
				e.spin.hit(budget)
			}
			return nil
		}
		if e.Closed.Load() {
			n.unspin(false)
			return e.ErrClosed("wait")
		}
		if i%every == 0 && time.Since(start) > budget {
			break
		}
	}
	n.unspin(false)
	if n.waitable {
		e.spin.parked()
	}
	return e.WaitResult(ctx, e.W.Park(ctx))
}

// ---- close ----

// Close releases the VPID: its own blocked calls return net.ErrClosed,
// senders blocked on it get ErrPeerDown (pClosed), its regions are
// deregistered, and the VPID can be opened again. Idempotent.
func (e *endpoint) Close() error {
	if !e.Shut() {
		return nil
	}
	n := e.nic
	n.mu.Lock()
	n.eps[e.addr.VPID].CompareAndSwap(e, nil)
	n.mu.Unlock()

	e.mu.Lock()
	e.mbClosed = true
	e.cnt = 0
	e.length.Store(0)
	var nodes []fabric.NodeID
	for a := range e.srcs {
		if !containsNode(nodes, a.Node) {
			nodes = append(nodes, a.Node)
		}
	}
	clear(e.srcs)
	e.mu.Unlock()
	e.NQ.Close()

	n.deregisterAll(e)
	for _, node := range nodes {
		n.sendCtl(node, header{typ: pClosed, desc: fabric.Descriptor{VPID: e.addr.VPID}, epoch: e.epoch}, nil)
	}
	return nil
}

func containsNode(ns []fabric.NodeID, n fabric.NodeID) bool {
	for _, x := range ns {
		if x == n {
			return true
		}
	}
	return false
}

func isErrPeerDown(err error) bool { return err != nil && errorsIs(err, fabric.ErrPeerDown) }
func isErrUnknown(err error) bool  { return err != nil && errorsIs(err, fabric.ErrUnknownNode) }

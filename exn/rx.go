package exn

// Receive pipeline: one goroutine (rxLoop), NAPI style. A round:
//
//	Recv ≤ RxBudget messages ──┬─ eager fragment → reasm (per source,
//	                           │   unicast and multicast apart) → frame
//	                           └─ advert → per-source queue entry → GET
//	                              (or wait for a free rx buffer; on a
//	                              fabric.RemoteViewer the frame is read
//	                              in place and ready at once: view.go)
//	flushGets: the round's GETs go out in one Post
//	PollNotifications ≤ NotifyBudget
//	   completer (our GET done)      → queue entry ready
//	   requester error (GET failed)  → queue entry failed, buffer freed
//	   responder (our slot was read) → tx slot freed (wakes Transmit)
//	drain every source touched this round: pop ready/failed entries off
//	   the head of its queue into the delivery batch; stop at a GET in
//	   flight — so frames reach the Link in the order the source sent them
//	flush the batch: Observer, Link.DeliverFrames, release buffers and
//	   end views (the sender's responder notification), post GETs for
//	   adverts waiting for a buffer (FIFO across sources, one Post)
//	nothing done → ep.Wait(tick) (spins, for rxWaitSpin where the fabric
//	   lets us choose, then sleeps until a message, a notification or the
//	   next housekeeping tick, if the ticker runs: see needTicks)
//
// A unicast eager frame of a source with an empty queue skips the queue.
// Multicast frames skip it always: they are not ordered against unicast
// by the fabric either.
//
// Housekeeping (each tick, on this goroutine; housekeep.go): reclaim tx
// slots of adverts armed longer than AdvertTimeout; drop partial and
// queued frames of sources that are no longer alive, take back their
// grants (push.go) and forget idle dead sources.
//
// All state here is owned by rxLoop; only counters are shared.

import (
	"cmp"
	"errors"
	"net"
	"time"

	"github.com/exn-project/exn/fabric"
)

const (
	// maxSourceQueue bounds one source's in-order queue (frames behind a
	// GET in flight, adverts waiting for a buffer). It exceeds the
	// default TxSlots so a sender's every outstanding advert fits, with
	// room for the eager frames between them.
	maxSourceQueue = 256
	// deliverBatch is the most frames handed to the Link at once.
	deliverBatch = 64
	// rxWaitSpin is how long the receive loop's Wait spins before it
	// parks, on an endpoint that lets its consumer choose
	// (fabric.WaitSpinner: fabric/shm, whose own budget is 5 µs): not at
	// all. The loop's messages come from other nodes' TAP readers, paced
	// by the traffic through exn0 (a TCP ping-pong's frames come tens of
	// µs apart), so a spin seldom catches one, and on a host with few
	// CPUs it holds a CPU the frame's producers need: the sending
	// application and the kernel's TCP in the other node's TAP. Measured
	// on shm (docs/wakeup.md, "The spin budgets"): sockperf 64 B p50 over
	// exn0 37.6–39.4 µs parking at once against 41.7–47.3 µs spinning
	// 5 µs first, in four alternated rounds.
	rxWaitSpin = 0
)

type qstate uint8

const (
	qWaiting qstate = iota // advert waiting for an rx buffer
	qPending               // GET in flight
	qReady                 // frame complete, waiting for its turn
	qFailed                // dropped; skipped when it reaches the head
)

// qent is one frame in a source's in-order queue.
type qent struct {
	state qstate
	proto Proto
	buf   *frameBuf         // eager frame, else nil
	n     int32             // eager frame length
	slot  int32             // rx buffer of a rendezvous frame, else -1
	adv   advert            // the advert: while waiting, and a viewed frame's offload
	view  fabric.RemoteView // a rendezvous frame taken in place (view.go)
}

// source is the receive state of one peer node.
type source struct {
	node   fabric.NodeID
	uc, mc reasm

	q       []qent // ring, allocated on first use
	qhead   uint64 // absolute position of the head
	qlen    int
	waiting int // entries in qWaiting

	seq   uint16 // next expected advert sequence
	seqOK bool
	dirty bool // on rx.dirty

	// Grants (push.go): buffers granted (idle or busy), the idle ones
	// still to be named in a tagGrant, whether it is on rx.gdirty, and
	// whether it was forgotten (its grants are not renewed).
	granted    int
	regrants   []int32
	gdirty     bool
	gone       bool
	wantGrants bool // on rx.wantGrants
}

func (s *source) at(abs uint64) *qent { return &s.q[abs%uint64(len(s.q))] }

// rxSlot is one registered receive buffer.
type rxSlot struct {
	src  *source // nil when free
	abs  uint64  // its entry's queue position
	len  uint32
	busy bool
	off  Offload // from an offload advert
	// grantee is the source this buffer is granted to (push.go): only
	// it may push into it, and it returns to that source once free.
	grantee *source
}

// release is what to give back once a delivered frame's batch is done:
// a pool buffer, an rx buffer (slot >= 0) or a view (view.go).
type release struct {
	buf  *frameBuf
	slot int32
	view fabric.RemoteView
}

type rxState struct {
	region   fabric.Region
	slotSize int
	slots    []rxSlot
	free     []int32

	pool    *bufPool
	viewer  fabric.RemoteViewer // nil: rendezvous frames by GET (view.go)
	sources map[fabric.NodeID]*source
	last    *source // lookup cache

	waitq      []*source // one entry per waiting advert, FIFO from wqHead
	wqHead     int
	dirty      []*source
	batch      [][]byte
	offs       []Offload // batch[i]'s offload metadata (zero: complete)
	nOff       int       // frames in batch with metadata
	rel        []release
	msgs       []fabric.Message
	notes      []fabric.Notification
	reqs       []fabric.RMA // GETs of this round not yet posted (flushGets)
	reqSlot    []int32      // reqs[i]'s rx buffer
	gdirty     []*source    // sources with grants to send (flushGrants)
	wantGrants []*source    // sources maybeGrant could not serve yet (retryGrants)
	lastTick   uint64
}

func (r *rxState) init(ep fabric.Endpoint, cfg *Config, maxFrame, slotMax int) error {
	r.slotSize = pushHdrLen + (slotMax+63)&^63 // push header, then the frame (push.go)
	reg, err := ep.Register(cfg.RxSlots * r.slotSize)
	if err != nil {
		return err
	}
	r.region = reg
	r.slots = make([]rxSlot, cfg.RxSlots)
	r.free = make([]int32, 0, cfg.RxSlots)
	r.reqs = make([]fabric.RMA, 0, cfg.RxSlots)
	r.reqSlot = make([]int32, 0, cfg.RxSlots)
	for i := cfg.RxSlots - 1; i >= 0; i-- {
		r.free = append(r.free, int32(i))
	}
	r.pool = newBufPool(min(max(cfg.EagerThreshold, minSmallBuf), maxFrame), maxFrame)
	r.viewer, _ = ep.(fabric.RemoteViewer)
	if ws, ok := ep.(fabric.WaitSpinner); ok {
		ws.SetWaitSpin(rxWaitSpin)
	}
	r.sources = make(map[fabric.NodeID]*source)
	r.batch = make([][]byte, 0, deliverBatch)
	r.offs = make([]Offload, 0, deliverBatch)
	r.rel = make([]release, 0, deliverBatch)
	r.msgs = make([]fabric.Message, cfg.RxBudget)
	r.notes = make([]fabric.Notification, cfg.NotifyBudget)
	r.dirty = make([]*source, 0, 16)
	return nil
}

// nla is the address of rx buffer i's frame, which a GET or a push
// writes; a push writes the buffer's push header in front of it.
func (r *rxState) nla(i int32) fabric.NLA {
	return r.region.NLA + fabric.NLA(int(i)*r.slotSize+pushHdrLen)
}

// frame is the first n bytes of rx buffer i's frame; hdr its push header.
func (r *rxState) frame(i int32, n uint32) []byte {
	return r.region.Buf[int(i)*r.slotSize+pushHdrLen:][:n]
}
func (r *rxState) hdr(i int32) []byte { return r.region.Buf[int(i)*r.slotSize:][:pushHdrLen] }

// index maps a local address to the rx buffer containing it, or -1.
func (r *rxState) index(a fabric.NLA) int32 {
	if a.Region() != r.region.NLA.Region() {
		return -1
	}
	i := a.Offset() / uint64(r.slotSize)
	if i >= uint64(len(r.slots)) {
		return -1
	}
	return int32(i)
}

func (e *Engine) rxLoop() {
	defer e.wg.Done()
	defer e.endViews()
	rx := &e.rx
	for !e.closed.Load() {
		// A failing Recv or PollNotifications returns nothing; the
		// round ends with the first error.
		n, rerr := e.ep.Recv(rx.msgs)
		for i := range rx.msgs[:n] {
			e.handleMsg(&rx.msgs[i])
		}
		e.flushGets()
		m, nerr := e.ep.PollNotifications(rx.notes)
		for i := range rx.notes[:m] {
			e.handleNote(&rx.notes[i])
		}
		if err := cmp.Or(rerr, nerr); err != nil {
			e.rxFailed(err)
			return
		}
		e.finishRound()
		if len(rx.wantGrants) > 0 {
			e.retryGrants()
		}
		if len(rx.gdirty) > 0 {
			e.flushGrants()
		}
		t := e.tick.Load()
		if t.gen != rx.lastTick {
			rx.lastTick = t.gen
			e.housekeep()
			e.finishRound()
			if !e.needTicks() {
				e.tickWanted.Store(false)
			}
		}
		if n == 0 && m == 0 {
			if !e.tickWanted.Load() && e.needTicks() {
				e.wantTicks()
			}
			if err := e.ep.Wait(t); errors.Is(err, net.ErrClosed) {
				e.rxFailed(err)
				return
			}
		}
	}
}

// needTicks says whether housekeeping has anything to watch: an advert
// of ours armed or one of a peer's waiting for a buffer (their timeouts),
// or a source with a partial frame or queued entries (dropped if it
// dies). Only rxLoop calls it; it walks the sources (one per peer node
// that ever sent), and only before a Wait or after a tick.
func (e *Engine) needTicks() bool {
	if e.ctr.outstandingAdverts.Load() > 0 || e.ctr.waitingAdverts.Load() > 0 {
		return true
	}
	for _, src := range e.rx.sources {
		if src.qlen > 0 || src.uc.buf != nil || src.mc.buf != nil {
			return true
		}
	}
	return false
}

// rxFailed ends the receive loop because the endpoint failed under it
// (closed by someone else). Transmit then fails with net.ErrClosed too.
func (e *Engine) rxFailed(err error) {
	if !e.closed.Load() {
		e.log.Error("exn: receive loop stopped", "err", err)
	}
}

func (e *Engine) source(node fabric.NodeID) *source {
	rx := &e.rx
	if rx.last != nil && rx.last.node == node {
		return rx.last
	}
	s := rx.sources[node]
	if s == nil {
		s = &source{node: node}
		rx.sources[node] = s
	}
	rx.last = s
	return s
}

func (e *Engine) handleMsg(m *fabric.Message) {
	node := m.Peer.Node
	switch {
	case node == e.self:
		e.drop(DropSelfEcho, node)
		return
	case m.Peer.VPID != fabric.EthVPID:
		e.drop(DropBadSource, node)
		return
	}
	switch {
	case m.Tag&tagEager != 0:
		src := e.source(node)
		r := &src.uc
		if m.MC {
			r = &src.mc
		}
		buf, n, reason, truncated := r.feed(e.rx.pool, m.Tag, m.Payload(), e.maxFrame)
		if truncated {
			e.drop(DropTruncated, node)
		}
		if reason != DropNone {
			e.drop(reason, node)
		}
		if buf != nil {
			e.eagerDone(src, buf, int(n), m.MC)
		}
	case m.Tag == tagAdvert && !m.MC:
		a, reason := decodeAdvert(m.Payload(), e.maxFrame)
		e.handleAdvert(e.source(node), a, reason)
	case m.Tag == tagAdvertX && !m.MC && e.caps != 0:
		a, reason := decodeAdvertX(m.Payload(), e.maxFrame)
		if reason == DropNone && a.off.needs()&e.caps != a.off.needs() {
			reason = DropOffloadForged // a capability we did not announce
		}
		e.handleAdvert(e.source(node), a, reason)
	case m.Tag == tagAdvertX:
		e.drop(DropOffloadForged, node) // multicast, or we announced none
	case m.Tag == tagPushed && !m.MC:
		a, reason := decodePushed(m.Payload(), e.maxFrame, false)
		e.handlePushed(e.source(node), a, reason)
	case m.Tag == tagPushedX && !m.MC && e.caps != 0:
		a, reason := decodePushed(m.Payload(), e.maxFrame, true)
		if reason == DropNone && a.off.needs()&e.caps != a.off.needs() {
			reason = DropOffloadForged
		}
		e.handlePushed(e.source(node), a, reason)
	case m.Tag == tagPushedX || m.Tag == tagPushed:
		e.drop(DropPushForged, node) // multicast, or offload we did not announce
	case m.Tag == tagGrant && !m.MC:
		e.gotGrant(node, m.Payload())
	case m.Tag == tagHello && !m.MC:
		e.gotHello(node, m.Payload())
	case m.Tag == tagAdvert:
		e.drop(DropAdvertMalformed, node)
	case m.Tag == tagRefuse && !m.MC:
		e.refused(node, m.Payload())
	default:
		e.drop(DropBadTag, node)
	}
}

// dstOK checks a received frame's destination MAC: ours for unicast, a
// group address for multicast.
func (e *Engine) dstOK(f []byte, mc bool) bool {
	if mc {
		return isGroupMAC(f)
	}
	return [6]byte(f[:6]) == e.mac
}

func (e *Engine) eagerDone(src *source, buf *frameBuf, n int, mc bool) {
	f := buf.b[:n]
	if !e.dstOK(f, mc) {
		e.rx.pool.put(buf)
		e.drop(DropWrongDest, src.node)
		return
	}
	switch {
	case mc:
		e.deliver(f, release{buf: buf, slot: -1}, ProtoMulticast)
	case src.qlen == 0:
		e.deliver(f, release{buf: buf, slot: -1}, ProtoEager)
	default:
		ent := e.enqueue(src)
		if ent == nil {
			e.rx.pool.put(buf)
			return
		}
		*ent = qent{state: qReady, proto: ProtoEager, buf: buf, n: int32(n), slot: -1}
	}
}

// enqueue appends an entry to src's queue, or counts DropQueueFull and
// returns nil.
func (e *Engine) enqueue(src *source) *qent {
	if src.q == nil {
		src.q = make([]qent, maxSourceQueue)
	}
	if src.qlen == len(src.q) {
		e.drop(DropQueueFull, src.node)
		return nil
	}
	ent := src.at(src.qhead + uint64(src.qlen))
	src.qlen++
	return ent
}

func (e *Engine) handleAdvert(src *source, a advert, reason DropReason) {
	if reason != DropNone {
		e.drop(reason, src.node)
		return
	}
	if e.seqGap(src, a.seq) {
		e.releaseGrants(src) // a restarted source holds none
	}
	e.maybeGrant(src)
	ent := e.enqueue(src)
	if ent == nil {
		e.refuse(src.node, a) // the sender frees its slot now
		return
	}
	if e.rx.viewer != nil {
		e.viewAdvert(src, ent, a)
		return
	}
	abs := src.qhead + uint64(src.qlen) - 1
	*ent = qent{state: qWaiting, proto: ProtoRendezvous, slot: -1, adv: a}
	rx := &e.rx
	if len(rx.free) > 0 && rx.wqHead == len(rx.waitq) {
		e.postGet(src, abs)
		return
	}
	src.waiting++
	e.ctr.waitingAdverts.Add(1)
	rx.waitq = append(rx.waitq, src)
}

// seqGap checks an advert's or push's sequence number against src's
// and moves src's on. A gap means src restarted, perhaps as another
// version: its capability is forgotten (the next transmit says hello).
func (e *Engine) seqGap(src *source, seq uint16) bool {
	gap := src.seqOK && seq != src.seq
	if gap {
		e.ctr.advertSeqGaps.Add(1)
		e.forgetPeer(src.node)
	}
	src.seq, src.seqOK = seq+1, true
	return gap
}

// postGet assigns a free rx buffer (which the caller made sure exists)
// to the waiting entry at abs and queues its GET for flushGets: the GETs
// of one round go to the fabric in one Post, which a backend may carry
// in fewer operations (fabric/ofi merges up to four).
func (e *Engine) postGet(src *source, abs uint64) {
	rx := &e.rx
	ent := src.at(abs)
	slot := rx.free[len(rx.free)-1]
	rx.free = rx.free[:len(rx.free)-1]
	e.ctr.rxSlotsInUse.Add(1)
	rx.slots[slot] = rxSlot{src: src, abs: abs, len: ent.adv.len, busy: true, off: ent.adv.off}
	rx.reqs = append(rx.reqs, fabric.RMA{
		Op:     fabric.OpGet,
		Peer:   fabric.Addr{Node: src.node, VPID: fabric.EthVPID},
		Local:  rx.nla(slot),
		Remote: ent.adv.nla,
		Len:    ent.adv.len,
		Notify: fabric.NotifyCompleter | fabric.NotifyResponder,
	})
	rx.reqSlot = append(rx.reqSlot, slot)
	ent.state, ent.slot = qPending, slot
	e.ctr.pendingGets.Add(1)
}

// flushGets posts the GETs postGet queued. A request the fabric refuses
// (the endpoint closing) fails its entry and frees its buffer; the rest
// are still posted. Every caller of postGet calls it before the round's
// entries are looked at again (housekeep counts on a pending entry's
// notification).
func (e *Engine) flushGets() {
	rx := &e.rx
	reqs, slots := rx.reqs, rx.reqSlot
	for len(reqs) > 0 {
		k, err := e.ep.Post(reqs)
		if err == nil {
			break
		}
		slot := slots[k]
		s := &rx.slots[slot]
		src := s.src
		ent := src.at(s.abs)
		e.freeRxSlot(slot)
		ent.state, ent.slot = qFailed, -1
		e.ctr.pendingGets.Add(-1)
		e.markDirty(src)
		e.drop(DropGetPost, src.node)
		reqs, slots = reqs[k+1:], slots[k+1:]
	}
	rx.reqs, rx.reqSlot = rx.reqs[:0], rx.reqSlot[:0]
}

// freeRxSlot releases a busy rx buffer: back to its grantee (push.go)
// or to the free list.
func (e *Engine) freeRxSlot(slot int32) {
	e.ctr.rxSlotsInUse.Add(-1)
	if g := e.rx.slots[slot].grantee; g != nil {
		e.rx.slots[slot] = rxSlot{grantee: g}
		e.regrant(g, slot)
		return
	}
	e.rx.slots[slot] = rxSlot{}
	e.rx.free = append(e.rx.free, slot)
}

func (e *Engine) markDirty(src *source) {
	if !src.dirty {
		src.dirty = true
		e.rx.dirty = append(e.rx.dirty, src)
	}
}

var notifyDrop = [...]DropReason{
	fabric.NErrAccess:   DropGetAccess,
	fabric.NErrBounds:   DropGetBounds,
	fabric.NErrPeerDown: DropGetPeerDown,
}

// getDrop is the drop reason of a GET (or a view) that failed with ne.
func getDrop(ne fabric.NotifyErr) DropReason {
	if int(ne) < len(notifyDrop) && notifyDrop[ne] != DropNone {
		return notifyDrop[ne]
	}
	return DropGetPeerDown
}

func (e *Engine) handleNote(n *fabric.Notification) {
	rx := &e.rx
	switch {
	case n.Op == fabric.OpPut && n.Kind == fabric.KindRequester:
		e.pushDone(n) // a push of ours, done or failed (push.go)
	case n.Err != fabric.NErrNone:
		// A failed GET of ours: Local is the buffer start as posted.
		slot := rx.index(n.Local)
		if slot < 0 || !rx.slots[slot].busy || rx.nla(slot) != n.Local || rx.slots[slot].src.node != n.Peer.Node {
			e.ctr.unmatchedNotify.Add(1)
			return
		}
		e.getDone(slot, getDrop(n.Err))
	case n.Kind == fabric.KindCompleter && n.Op == fabric.OpGet:
		slot := rx.index(n.Local)
		if slot < 0 || !rx.slots[slot].busy {
			e.ctr.unmatchedNotify.Add(1)
			return
		}
		s := &rx.slots[slot]
		if fabric.LastFrame(rx.nla(slot), s.len) != n.Local || n.Len != s.len || n.Peer.Node != s.src.node {
			e.getDone(slot, DropGetMismatch)
			return
		}
		e.getDone(slot, DropNone)
	case n.Kind == fabric.KindResponder && n.Op == fabric.OpGet:
		e.responderDone(n)
	default:
		e.ctr.unmatchedNotify.Add(1)
	}
}

// getDone finishes the GET into slot (landed).
func (e *Engine) getDone(slot int32, reason DropReason) {
	e.ctr.pendingGets.Add(-1)
	e.landed(slot, reason)
}

// landed finishes a frame that arrived in rx buffer slot by GET or push:
// its entry becomes ready, or failed (reason != DropNone, or the frame's
// destination or offload fields are wrong) with the buffer freed.
func (e *Engine) landed(slot int32, reason DropReason) {
	s := &e.rx.slots[slot]
	src := s.src
	ent := src.at(s.abs)
	if reason == DropNone {
		reason = e.pulledDrop(e.rx.frame(slot, s.len), &s.off)
	}
	if reason != DropNone {
		e.freeRxSlot(slot)
		ent.state, ent.slot = qFailed, -1
		e.drop(reason, src.node)
	} else {
		ent.state = qReady
	}
	e.markDirty(src)
}

// pulledDrop checks a rendezvous frame f that arrived with offload
// metadata off (by GET, push or view): our destination, and metadata
// that fits the frame. It returns the drop reason, or DropNone.
func (e *Engine) pulledDrop(f []byte, off *Offload) DropReason {
	switch {
	case !e.dstOK(f, false):
		return DropWrongDest
	case *off != (Offload{}) && !off.check(f, e.maxFrame, true):
		return DropOffloadForged
	}
	return DropNone
}

// responderDone frees the tx slot a peer has finished reading.
func (e *Engine) responderDone(n *fabric.Notification) {
	slot, start := e.tx.index(n.Local)
	switch {
	case slot < 0:
		e.ctr.unmatchedNotify.Add(1)
	case fabric.LastFrame(start, n.Len) != n.Local || !e.releaseTx(slot, n.Peer.Node, n.Len):
		e.ctr.lateResponders.Add(1)
	}
}

// releaseTx frees tx slot, busy with a frame of n bytes to node, and
// reports whether it did; a slot in any other state is left alone.
func (e *Engine) releaseTx(slot int32, node fabric.NodeID, n uint32) bool {
	s := &e.tx.slots[slot]
	for {
		w := s.state.Load()
		if w&slotBusy == 0 || wordNode(w) != node || wordLen(w) != n {
			return false
		}
		if s.state.CompareAndSwap(w, 0) {
			break
		}
		// The sender armed the slot between the load and the CAS (the
		// only change a busy slot sees off this goroutine): check again.
	}
	e.ctr.outstandingAdverts.Add(-1)
	e.tx.free <- slot
	return true
}

// refused frees the tx slot of an advert its receiver dropped. Only the
// node the slot was advertised to can refuse it, and only for the exact
// slot address and length; anything else is counted as a bad advert.
func (e *Engine) refused(node fabric.NodeID, p []byte) {
	a, reason := decodeAdvert(p, e.slotMax)
	if reason != DropNone {
		e.drop(reason, node)
		return
	}
	slot, start := e.tx.index(a.nla)
	if slot < 0 || start != a.nla || !e.releaseTx(slot, node, a.len) {
		e.drop(DropAdvertMalformed, node)
		return
	}
	e.ctr.advertsRefused.Add(1)
}

// finishRound drains the sources touched this round and flushes the
// delivery batch. Flushing frees buffers and may post waiting GETs, whose
// failures dirty more sources; loop until quiet.
func (e *Engine) finishRound() {
	rx := &e.rx
	for {
		for len(rx.dirty) > 0 {
			src := rx.dirty[len(rx.dirty)-1]
			rx.dirty = rx.dirty[:len(rx.dirty)-1]
			src.dirty = false
			e.drain(src)
		}
		e.flushDeliver()
		if len(rx.dirty) == 0 {
			return
		}
	}
}

// drain moves src's finished head entries into the delivery batch.
func (e *Engine) drain(src *source) {
	for src.qlen > 0 {
		ent := src.at(src.qhead)
		switch ent.state {
		case qReady:
			switch {
			case ent.buf != nil:
				e.deliver(ent.buf.b[:ent.n], release{buf: ent.buf, slot: -1}, ent.proto)
			case ent.view.Token != nil:
				e.deliverOff(ent.view.Buf, release{slot: -1, view: ent.view}, ent.proto, &ent.adv.off)
			default:
				s := &e.rx.slots[ent.slot]
				f := e.rx.frame(ent.slot, s.len)
				e.deliverOff(f, release{slot: ent.slot}, ent.proto, &s.off)
			}
		case qFailed:
		default:
			return
		}
		*ent = qent{}
		src.qhead++
		src.qlen--
	}
}

// deliver appends a complete frame to the delivery batch, flushing it
// when full.
func (e *Engine) deliver(f []byte, rel release, p Proto) { e.deliverOff(f, rel, p, &Offload{}) }

// deliverOff is deliver with the frame's offload metadata.
func (e *Engine) deliverOff(f []byte, rel release, p Proto, off *Offload) {
	rx := &e.rx
	e.ctr.rxFrames[p].Add(1)
	e.ctr.rxBytes[p].Add(uint64(len(f)))
	if *off != (Offload{}) {
		rx.nOff++
	}
	rx.offs = append(rx.offs, *off)
	rx.batch = append(rx.batch, f)
	rx.rel = append(rx.rel, rel)
	if len(rx.batch) >= deliverBatch {
		e.flushDeliver()
	}
}

// flushDeliver hands the batch to the Link, then releases its buffers and
// starts GETs for adverts that were waiting for one.
func (e *Engine) flushDeliver() {
	rx := &e.rx
	if len(rx.batch) == 0 {
		return
	}
	if o := e.cfg.Observer; o != nil {
		for _, f := range rx.batch {
			o.Observe(f)
		}
	}
	var err error
	if rx.nOff > 0 {
		e.ctr.rxOffloaded.Add(uint64(rx.nOff))
		err = e.olink.DeliverFramesOffload(rx.batch, rx.offs)
	} else {
		err = e.link.DeliverFrames(rx.batch)
	}
	if err != nil {
		e.ctr.linkErrors.Add(1)
		// DropNone's log slot rate-limits link errors.
		now, last := time.Now().UnixNano(), e.lastLog[DropNone].Load()
		if now-last >= int64(logInterval) && e.lastLog[DropNone].CompareAndSwap(last, now) {
			e.log.Warn("exn: link deliver failed", "err", err, "total", e.ctr.linkErrors.Load())
		}
	}
	for i := range rx.rel {
		r := &rx.rel[i]
		switch {
		case r.buf != nil:
			rx.pool.put(r.buf)
		case r.view.Token != nil:
			rx.viewer.EndView(&r.view, true)
		default:
			e.freeRxSlot(r.slot)
		}
	}
	clear(rx.batch)
	rx.batch, rx.rel, rx.offs, rx.nOff = rx.batch[:0], rx.rel[:0], rx.offs[:0], 0
	e.postWaiting()
}

// postWaiting starts GETs for waiting adverts, oldest first, while rx
// buffers are free.
func (e *Engine) postWaiting() {
	rx := &e.rx
	for len(rx.free) > 0 && rx.wqHead < len(rx.waitq) {
		src := rx.waitq[rx.wqHead]
		rx.waitq[rx.wqHead] = nil
		rx.wqHead++
		if src.waiting == 0 {
			continue // its adverts were dropped (peer died)
		}
		for abs := src.qhead; abs < src.qhead+uint64(src.qlen); abs++ {
			if src.at(abs).state == qWaiting {
				src.waiting--
				e.ctr.waitingAdverts.Add(-1)
				e.postGet(src, abs)
				break
			}
		}
	}
	if rx.wqHead == len(rx.waitq) {
		rx.waitq, rx.wqHead = rx.waitq[:0], 0
	}
	e.flushGets()
}

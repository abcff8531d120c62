package exn

// Transmit pipeline.
//
//	Transmit(frames) ── classify (size, destination MAC) ── drop+count
//	   │ eager / multicast: fragments into the caller's scratch batch
//	   │ rendezvous: take a tx slot (wait if none: back-pressure), copy
//	   │             the frame into it, mark it outstanding, add an advert
//	TransmitLent(frames in lent slots; zero-copy, lend.go)
//	   │ eager / multicast / dropped: fragments copied out, slot freed
//	   │ rendezvous: the frame's own slot becomes the advert's slot
//	   └─ flush: txMu held across ep.Send of the whole batch, so the
//	      messages of one frame stay contiguous per target even with
//	      concurrent callers; adverts get their per-receiver sequence
//	      number here. A failed send drops (and counts) the frames of the
//	      dead target and resends the rest.
//
// Tx slot life cycle (state word, atomic):
//
//	free (in tx.free) → filling (owned by one Transmit, state 0)
//	free → lent (Lend, state slotLent; the borrower may write the slot
//	  memory) → filling (TransmitLent, CAS lent → 0) or → free (Return,
//	  or TransmitLent of a frame that does not go by rendezvous)
//	  → busy (advert built, state = busy|gen|node|len)
//	  → armed (advert delivered, deadline set; CAS busy→busy|armed)
//	  → free, by exactly one of: the responder notification (rxLoop,
//	    CAS → 0), the advert timeout (rxLoop, armed only, CAS → 0), or a
//	    failed send of the advert (Transmit, CAS busy → 0). A responder
//	    notification or refusal can race the arming CAS (the GET may
//	    finish before Transmit returns from ep.Send): rxLoop then retries
//	    its CAS on the armed word instead of leaking the slot.
//
// Locks: txMu guards txSeq and the ordering of ep.Send calls; memMu
// (read) is held only while copying into slot memory; slot state needs no
// lock. Lent slots are counted in lent: Close waits for it to reach zero
// before it deregisters the pool (lend.go). The scratch batch belongs to
// one Transmit call.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/exn-project/exn/fabric"
)

const (
	// sendBatchMsgs is how many VELO messages one ep.Send carries at most
	// (unless one frame needs more): one NAPI budget, so a receiver
	// drains a batch per poll, and 8 KiB of scratch.
	sendBatchMsgs = 64

	slotBusy    = 1 << 63
	slotArmed   = 1 << 62
	slotLent    = 1 << 61 // lent to a caller (lend.go); never busy
	slotGenMask = 0xFFF
)

var errClosed = fmt.Errorf("exn: %w", net.ErrClosed)

type txSlot struct {
	state    atomic.Uint64
	deadline atomic.Int64 // unix nanos by Config.Now; valid while armed
	gen      uint64       // owned by whoever holds the slot
}

// txPool is the registered transmit memory, carved into slots of one max
// frame each. A slot begins with pushHdrLen bytes for the push header
// (push.go); its frame follows, so a push writes header and frame with
// one PUT.
type txPool struct {
	region   fabric.Region
	slotSize int
	slots    []txSlot
	free     chan int32 // the free slots; capacity len(slots), never blocks a release
}

func (p *txPool) init(ep fabric.Endpoint, n, maxFrame int) error {
	p.slotSize = pushHdrLen + (maxFrame+63)&^63
	r, err := ep.Register(n * p.slotSize)
	if err != nil {
		return fmt.Errorf("exn: register tx pool: %w", err)
	}
	p.region = r
	p.slots = make([]txSlot, n)
	p.free = make(chan int32, n)
	for i := range n {
		p.free <- int32(i)
	}
	return nil
}

// nla is the address of slot i's frame; hdrNLA that of its push header.
func (p *txPool) nla(i int32) fabric.NLA    { return p.hdrNLA(i) + pushHdrLen }
func (p *txPool) hdrNLA(i int32) fabric.NLA { return p.region.NLA + fabric.NLA(int(i)*p.slotSize) }

// buf is slot i's frame memory; hdr its push header.
func (p *txPool) buf(i int32) []byte {
	off := int(i) * p.slotSize
	return p.region.Buf[off+pushHdrLen : off+p.slotSize]
}
func (p *txPool) hdr(i int32) []byte {
	off := int(i) * p.slotSize
	return p.region.Buf[off : off+pushHdrLen]
}

// index maps a notification's local address to a slot and its start, or
// -1 if the address is not in the pool.
func (p *txPool) index(a fabric.NLA) (int32, fabric.NLA) {
	if a.Region() != p.region.NLA.Region() {
		return -1, 0
	}
	i := a.Offset() / uint64(p.slotSize)
	if i >= uint64(len(p.slots)) {
		return -1, 0
	}
	return int32(i), p.nla(int32(i))
}

func slotWord(gen uint64, node fabric.NodeID, n int) uint64 {
	return slotBusy | (gen&slotGenMask)<<48 | uint64(node)<<32 | uint64(n)
}

func wordNode(w uint64) fabric.NodeID { return fabric.NodeID(w >> 32) }
func wordLen(w uint64) uint32         { return uint32(w) }

type txMeta struct {
	frame int32  // index into the caller's frames
	slot  int32  // tx slot of an advert, else -1
	word  uint64 // the advert's slot state word
	size  int32  // frame length
	proto Proto
	end   bool // last message of its frame
	// A push's announcement: its grant, and whether flush posted its PUT.
	grant  fabric.NLA
	posted bool
}

// txScratch is one Transmit call's batch.
type txScratch struct {
	msgs []fabric.Message
	meta []txMeta
	seg  []byte       // one software-GSO segment (offload.go), made on first use
	puts []fabric.RMA // the batch's push PUTs, posted by flush before its Send
}

// Transmit sends Ethernet frames. The destination MAC picks the node; a
// multicast or broadcast MAC goes to every node (fabric.Broadcast). Frames
// up to EagerThreshold go as VELO fragments, larger unicast frames by
// rendezvous. Transmit copies the frames before it returns: the caller
// keeps ownership of frames and may reuse them at once.
//
// Bad frames (runt, oversize, foreign MAC, our own MAC, unknown or dead
// node) are dropped and counted in Stats, not returned as errors, so one
// bad frame never stalls the caller. Transmit blocks while the transmit
// pool is empty or a target mailbox is full (back-pressure), until ctx is
// done or the engine is closed (net.ErrClosed).
//
// It returns n, the number of frames consumed: frames[:n] were sent or
// dropped and counted; on error, frames[n:] were not touched. Safe for
// concurrent use; frames from one caller arrive in order, frames of
// concurrent callers interleave whole.
func (e *Engine) Transmit(ctx context.Context, frames [][]byte) (int, error) {
	if e.closed.Load() {
		return 0, errClosed
	}
	sc := e.scratch.Get().(*txScratch)
	defer e.scratch.Put(sc)
	for i, f := range frames {
		peer, proto, reason := e.classify(f, e.maxFrame)
		if reason != DropNone {
			node, _ := e.cfg.MACPrefix.Node(f)
			e.drop(reason, node)
			continue
		}
		if e.cfg.Observer != nil {
			e.cfg.Observer.Observe(f)
		}
		if proto != ProtoRendezvous {
			if err := e.addEager(ctx, sc, i, f, peer, proto); err != nil {
				return i, err
			}
			continue
		}
		if err := e.makeRoom(ctx, sc, 1); err != nil {
			return i, err
		}
		slot, err := e.acquire(ctx, sc)
		if err != nil {
			return i, err
		}
		if err := e.fill(slot, f); err != nil {
			e.tx.free <- slot
			e.abort(sc, 0)
			return i, err
		}
		e.addAdvert(sc, i, slot, peer, len(f), nil)
	}
	if err := e.flush(ctx, sc); err != nil {
		return len(frames), err
	}
	return len(frames), nil
}

// makeRoom flushes the batch if need (> 0) more messages would not fit
// (a frame that needs more than a whole batch goes alone).
func (e *Engine) makeRoom(ctx context.Context, sc *txScratch, need int) error {
	if need > 0 && len(sc.msgs) > 0 && len(sc.msgs)+need > sendBatchMsgs {
		return e.flush(ctx, sc)
	}
	return nil
}

// addEager adds frame i (f) to the batch as eager fragments, flushing
// first if they do not fit.
func (e *Engine) addEager(ctx context.Context, sc *txScratch, i int, f []byte, peer fabric.Addr, proto Proto) error {
	need := numFragments(len(f))
	if err := e.makeRoom(ctx, sc, need); err != nil {
		return err
	}
	e.appendFragments(sc, i, f, peer, proto, need)
	return nil
}

// appendFragments adds frame i (f) to the batch as its need eager
// fragments; the batch has room for them.
func (e *Engine) appendFragments(sc *txScratch, i int, f []byte, peer fabric.Addr, proto Proto, need int) {
	k := len(sc.msgs)
	sc.msgs = sc.msgs[:k+need]
	putFragments(sc.msgs[k:], f, peer, proto == ProtoMulticast)
	for j := range need {
		sc.meta = append(sc.meta, txMeta{frame: int32(i), slot: -1, size: int32(len(f)), proto: proto, end: j == need-1})
	}
}

// addAdvert marks slot, which holds frame i (n bytes) and is owned by the
// caller in state filling, outstanding and adds its advert to the batch:
// an offload advert with *off if off is not nil (the peer announced the
// capability it needs), else a plain one. The batch must have room for
// one message.
func (e *Engine) addAdvert(sc *txScratch, i int, slot int32, peer fabric.Addr, n int, off *Offload) {
	s := &e.tx.slots[slot]
	s.gen++
	w := slotWord(s.gen, peer.Node, n)
	s.state.Store(w)
	e.ctr.outstandingAdverts.Add(1)
	k := len(sc.msgs)
	sc.msgs = sc.msgs[:k+1]
	m := &sc.msgs[k]
	m.Peer, m.MC = peer, false
	a := advert{nla: e.tx.nla(slot), len: uint32(n)}
	if off != nil {
		a.off = *off
	}
	md := txMeta{frame: int32(i), slot: slot, word: w, size: int32(n), proto: ProtoRendezvous, end: true}
	switch g, stamp, ok := e.pushTo(sc, slot, peer, n); {
	case ok:
		a.nla, a.stamp, md.grant, md.proto = g, stamp, g, ProtoPush
		m.Tag = tagPushed
		if off != nil {
			m.Tag = tagPushedX
		}
		m.Len = a.encodePushed(m.Data[:], off != nil)
	case off != nil:
		m.Tag, m.Len = tagAdvertX, advertXLen
		a.encodeX(m.Data[:advertXLen])
	default:
		m.Tag, m.Len = tagAdvert, advertLen
		a.encode(m.Data[:advertLen])
	}
	sc.meta = append(sc.meta, md)
}

// classify picks the target and protocol of a frame no longer than limit,
// or a drop reason. The first unicast frame to a node of unknown offload
// capability says hello to it (caps.go).
func (e *Engine) classify(f []byte, limit int) (fabric.Addr, Proto, DropReason) {
	switch {
	case len(f) < EthHeaderLen:
		return fabric.Addr{}, 0, DropRunt
	case len(f) > limit:
		return fabric.Addr{}, 0, DropOversize
	case isGroupMAC(f):
		// RMA cannot multicast: every group frame goes eager.
		return fabric.Addr{Node: fabric.NodeID(fabric.Broadcast), VPID: fabric.EthVPID}, ProtoMulticast, DropNone
	}
	node, ok := e.cfg.MACPrefix.Node(f)
	switch {
	case !ok:
		return fabric.Addr{}, 0, DropForeignMAC
	case node == e.self:
		return fabric.Addr{}, 0, DropSelf
	}
	e.hello(node)
	switch {
	case len(f) <= e.cfg.EagerThreshold:
		return fabric.Addr{Node: node, VPID: fabric.EthVPID}, ProtoEager, DropNone
	}
	return fabric.Addr{Node: node, VPID: fabric.EthVPID}, ProtoRendezvous, DropNone
}

// acquire takes a free tx slot. If none is free it first flushes the
// batch (so frames already built are not held hostage) and then waits.
func (e *Engine) acquire(ctx context.Context, sc *txScratch) (int32, error) {
	select {
	case i := <-e.tx.free:
		return i, nil
	default:
	}
	if err := e.flush(ctx, sc); err != nil {
		return -1, err
	}
	e.ctr.txSlotWaits.Add(1)
	select {
	case i := <-e.tx.free:
		return i, nil
	case <-e.done:
		return -1, errClosed
	case <-ctx.Done():
		return -1, fmt.Errorf("exn: transmit: %w", ctx.Err())
	}
}

// fill copies f into slot memory, unless the engine is closing (the
// region may be going away).
func (e *Engine) fill(slot int32, f []byte) error {
	e.memMu.RLock()
	defer e.memMu.RUnlock()
	if e.closed.Load() {
		return errClosed
	}
	copy(e.tx.buf(slot), f)
	return nil
}

// flush sends the batch. On return the batch is empty: every message was
// delivered or its frame dropped and counted.
func (e *Engine) flush(ctx context.Context, sc *txScratch) error {
	if len(sc.msgs) == 0 {
		return nil
	}
	e.txMu.Lock()
	defer e.txMu.Unlock()
	if len(sc.puts) > 0 {
		// The pushes' PUTs go before their announcements (push.go).
		k, err := e.ep.Post(sc.puts)
		e.posted(sc, k)
		if err != nil {
			e.abort(sc, 0)
			if errors.Is(err, net.ErrClosed) {
				return errClosed
			}
			return fmt.Errorf("exn: transmit: push: %w", err)
		}
	}
	for k := range sc.meta {
		if md := &sc.meta[k]; md.slot >= 0 {
			node := wordNode(md.word)
			seq := e.txSeq[node]
			e.txSeq[node] = seq + 1
			a := &sc.msgs[k].Data
			a[12], a[13] = byte(seq), byte(seq>>8)
		}
	}
	for len(sc.msgs) > 0 {
		n, err := e.ep.Send(ctx, sc.msgs)
		e.sent(sc, n) // shifts the delivered messages out: msgs[0] failed
		if err == nil {
			break
		}
		var reason DropReason
		switch {
		case errors.Is(err, fabric.ErrPeerDown):
			reason = DropPeerDown
		case errors.Is(err, fabric.ErrUnknownNode):
			reason = DropUnknownNode
		default:
			e.abort(sc, 0)
			if errors.Is(err, net.ErrClosed) {
				return errClosed
			}
			return fmt.Errorf("exn: transmit: %w", err)
		}
		// Drop everything left for the failed target (msgs[0] at least,
		// so the loop makes progress), keep the rest.
		bad, badMC := sc.msgs[0].Peer, sc.msgs[0].MC
		j := 0
		for k := range sc.msgs {
			if sc.msgs[k].Peer == bad && sc.msgs[k].MC == badMC {
				e.dropMsg(&sc.meta[k], reason, bad.Node)
				continue
			}
			sc.msgs[j], sc.meta[j] = sc.msgs[k], sc.meta[k]
			j++
		}
		sc.msgs, sc.meta = sc.msgs[:j], sc.meta[:j]
	}
	sc.msgs, sc.meta = sc.msgs[:0], sc.meta[:0]
	return nil
}

// sent accounts for the first n messages of the batch, which the fabric
// delivered, and shifts them out of the batch.
func (e *Engine) sent(sc *txScratch, n int) {
	var deadline int64
	for k := range n {
		md := &sc.meta[k]
		if !md.end {
			continue
		}
		e.ctr.txFrames[md.proto].Add(1)
		e.ctr.txBytes[md.proto].Add(uint64(md.size))
		if md.slot >= 0 {
			if deadline == 0 {
				deadline = e.cfg.Now().Add(e.cfg.AdvertTimeout).UnixNano()
			}
			s := &e.tx.slots[md.slot]
			s.deadline.Store(deadline)
			s.state.CompareAndSwap(md.word, md.word|slotArmed)
			e.wantTicks() // its timeout must be watched
		}
	}
	if n == 0 {
		return
	}
	m := copy(sc.msgs, sc.msgs[n:])
	copy(sc.meta, sc.meta[n:])
	sc.msgs, sc.meta = sc.msgs[:m], sc.meta[:m]
}

// posted marks the first k PUTs of the batch's pushes posted and empties
// sc.puts (flush, txMu held).
func (e *Engine) posted(sc *txScratch, k int) {
	for j := range sc.meta {
		if md := &sc.meta[j]; md.grant != 0 && !md.posted && k > 0 {
			md.posted = true
			k--
		}
	}
	sc.puts = sc.puts[:0]
}

// dropMsg drops one unsent message: its frame is counted once (on its
// last message) and an advert's slot is freed. A push whose PUT was
// posted keeps its slot until the PUT's requester notification
// (pushDone); its grant goes back to the book either way (an unannounced
// buffer is the sender's to reuse: a PUT still in flight to it fails
// the next announcement's header check at worst).
func (e *Engine) dropMsg(md *txMeta, reason DropReason, node fabric.NodeID) {
	if md.grant != 0 {
		e.grants.giveBack(node, md.grant)
	}
	if md.slot >= 0 && !md.posted && e.tx.slots[md.slot].state.CompareAndSwap(md.word, 0) {
		e.ctr.outstandingAdverts.Add(-1)
		e.tx.free <- md.slot
	}
	if md.end {
		e.drop(reason, node)
	}
}

// abort drops messages [from:] of the batch (ctx done or closed) and
// empties it.
func (e *Engine) abort(sc *txScratch, from int) {
	for k := from; k < len(sc.msgs); k++ {
		e.dropMsg(&sc.meta[k], DropTxAborted, sc.msgs[k].Peer.Node)
	}
	sc.msgs, sc.meta, sc.puts = sc.msgs[:0], sc.meta[:0], sc.puts[:0]
}

package exn

// Receiver-granted PUT ("push"): a rendezvous frame without a GET.
//
//	receiver (rxLoop)                         sender
//	an advert or push from a source whose
//	  hello said it pushes (helloPush),
//	  Config.Push set: grant it free rx
//	  buffers (maybeGrant; tagGrant via the ──► rxLoop: grantBook[node]
//	  control goroutine)                        (a FIFO of buffer NLAs and
//	                                            the receiver's incarnation)
//	                                          Transmit, rendezvous frame,
//	                                          a grant in the book and
//	                                          pushing on (Config.Push and
//	                                          fabric.PutOrderer):
//	                                            push header into the tx
//	                                            slot, one PUT of header +
//	                                            frame to the grant (queued
//	                                            in the batch, posted by
//	                                            flush before its Send),
//	                                            tagPushed(X) in the batch
//	tagPushed(X) (handlePushed): buffer ◄──────   requester notification
//	  granted to that source and idle,            (rxLoop): slot free
//	  push header matching (magic, node,          (pushDone)
//	  stamp, length): ready in its queue
//	  place; anything else dropped and the
//	  buffer granted again
//	delivered ──► the same buffer granted
//	  to the same source again (regrant,
//	  one tagGrant per source per round)
//
// Why: on a fabric where the sender's progress must serve a GET
// (fabric/ofi over tcp), a GET costs the receiver a request and the
// sender a wake-up per operation; a push is one operation the sender
// starts itself and the announcement travels behind it
// (docs/ext-eth-engine.md, "Push").
//
// Safety. The sender PUTs only to the node it sends the frame to, so a
// grant can aim its data at nothing but the granting node's own memory.
// The receiver takes a pushed frame only from the source its buffer is
// granted to, only while the buffer is idle, and only when the buffer's
// push header, written by the same PUT, carries that source, the stamp
// and the length of the announcement: a PUT that never landed (a remote
// fault, a receiver that restarted under a sender's stale grants) leaves
// an older header and the frame is dropped (push-stale), never an old
// frame delivered. Every PUT into a buffer rewrites its header, so a
// stale write that lands between the PUT and the announcement it belongs
// to also fails the check.
//
// State: grants live in rxState (rxLoop only: rxSlot.grantee,
// source.granted/regrant) and in grantBook (its own mutex, a leaf lock:
// rxLoop adds, Transmit takes, flush gives back unsent ones).

import (
	"encoding/binary"
	"sync"

	"github.com/exn-project/exn/fabric"
)

const (
	// pushHdrLen is the push header in front of every rx buffer's and tx
	// slot's frame: 16 bytes used, the rest keeps frames 64-byte
	// aligned.
	pushHdrLen = 64
	// pushMagic opens a push header ("EXNP").
	pushMagic = 0x504e5845
	// maxGrantNLAs is the most buffers one tagGrant names (4 + 14·8 ≤
	// the VELO payload).
	maxGrantNLAs = 14
	// maxBookGrants bounds the grants a sender keeps per receiver; a
	// receiver that grants more loses the excess (it grants at most
	// pushGrants, a part of its RxSlots, at once anyway).
	maxBookGrants = 1024
)

// pushHdr writes the push header of a frame of n bytes, stamp stamp,
// from node into h (pushHdrLen bytes).
func pushHdr(h []byte, node fabric.NodeID, stamp, n uint32) {
	binary.LittleEndian.PutUint32(h[0:4], pushMagic)
	binary.LittleEndian.PutUint16(h[4:6], uint16(node))
	h[6], h[7] = 0, 0
	binary.LittleEndian.PutUint32(h[8:12], stamp)
	binary.LittleEndian.PutUint32(h[12:16], n)
}

// pushHdrOK reports whether h is the header of the announced push.
func pushHdrOK(h []byte, node fabric.NodeID, stamp, n uint32) bool {
	return binary.LittleEndian.Uint32(h[0:4]) == pushMagic &&
		binary.LittleEndian.Uint16(h[4:6]) == uint16(node) &&
		binary.LittleEndian.Uint32(h[8:12]) == stamp &&
		binary.LittleEndian.Uint32(h[12:16]) == n
}

// ---- sender: the grants received ----

// grantBook is what a sender holds of each receiver's grants.
type grantBook struct {
	mu sync.Mutex
	m  map[fabric.NodeID]*grants
}

type grants struct {
	inc  uint32 // the receiver's incarnation
	nlas []fabric.NLA
	head int
}

// take removes and returns the oldest grant of node.
func (b *grantBook) take(node fabric.NodeID) (fabric.NLA, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	g := b.m[node]
	if g == nil || g.head == len(g.nlas) {
		return 0, false
	}
	a := g.nlas[g.head]
	g.head++
	if g.head == len(g.nlas) {
		g.nlas, g.head = g.nlas[:0], 0
	}
	return a, true
}

// add records grants of node's incarnation inc; grants of an earlier
// incarnation are dropped first (the receiver restarted). It reports how
// many it kept.
func (b *grantBook) add(node fabric.NodeID, inc uint32, nlas []fabric.NLA) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = make(map[fabric.NodeID]*grants)
	}
	g := b.m[node]
	if g == nil {
		g = &grants{inc: inc}
		b.m[node] = g
	}
	if g.inc != inc {
		g.inc, g.nlas, g.head = inc, g.nlas[:0], 0
	}
	k := min(len(nlas), maxBookGrants-(len(g.nlas)-g.head))
	g.nlas = append(g.nlas, nlas[:k]...)
	return k
}

// held is how many grants of node the book holds.
func (b *grantBook) held(node fabric.NodeID) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if g := b.m[node]; g != nil {
		return len(g.nlas) - g.head
	}
	return 0
}

// giveBack returns a grant that was taken but not used (its frame was
// dropped before its PUT was posted).
func (b *grantBook) giveBack(node fabric.NodeID, nla fabric.NLA) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if g := b.m[node]; g != nil && len(g.nlas)-g.head < maxBookGrants {
		g.nlas = append(g.nlas, nla)
	}
}

// gotGrant records a tagGrant from node (rxLoop).
func (e *Engine) gotGrant(node fabric.NodeID, p []byte) {
	inc, nlas, ok := decodeGrant(p)
	if !ok || !e.push {
		e.drop(DropGrantMalformed, node)
		return
	}
	var buf [maxGrantNLAs]fabric.NLA
	n := len(nlas) / 8
	for i := range n {
		buf[i] = fabric.NLA(binary.LittleEndian.Uint64(nlas[8*i:]))
	}
	e.ctr.grantsRecv.Add(uint64(e.grants.add(node, inc, buf[:n])))
}

// pushTo prepares the push of the frame in tx slot (n bytes) to peer if
// a grant is at hand: its header written and its PUT queued in the
// batch. It returns the grant (the announcement's NLA) and the stamp.
func (e *Engine) pushTo(sc *txScratch, slot int32, peer fabric.Addr, n int) (fabric.NLA, uint32, bool) {
	if !e.push {
		return 0, 0, false
	}
	g, ok := e.grants.take(peer.Node)
	if !ok {
		return 0, 0, false
	}
	stamp := e.pushStamp.Add(1)
	pushHdr(e.tx.hdr(slot), e.self, stamp, uint32(n))
	sc.puts = append(sc.puts, fabric.RMA{
		Op: fabric.OpPut, Peer: peer,
		Local: e.tx.hdrNLA(slot), Remote: g - pushHdrLen, Len: uint32(pushHdrLen + n),
		Notify: fabric.NotifyRequester,
	})
	return g, stamp, true
}

// pushDone frees the tx slot of a push whose PUT completed, or failed
// (its frame is dropped: push-failed). Like responderDone it matches
// the slot's state word exactly (releaseTx).
func (e *Engine) pushDone(n *fabric.Notification) {
	slot, start := e.tx.index(n.Local)
	if slot < 0 || n.Len < pushHdrLen {
		e.ctr.unmatchedNotify.Add(1)
		return
	}
	// A completion names the PUT's last frame, an error its start.
	at := start - pushHdrLen
	if n.Err == fabric.NErrNone {
		at = fabric.LastFrame(at, n.Len)
	}
	if at != n.Local || !e.releaseTx(slot, n.Peer.Node, n.Len-pushHdrLen) {
		e.ctr.lateResponders.Add(1)
		return
	}
	if n.Err != fabric.NErrNone {
		e.drop(DropPushFailed, n.Peer.Node)
	}
}

// ---- receiver: the grants given ----

// pushGrants is how many rx buffers one source may hold as grants, and
// pushReserve how many stay free for GETs (other sources, and this one
// while its grants are in flight): three quarters and a quarter of the
// pool. With half as grants a stream over ofi:tcp found them all in
// flight for a fifth of its frames, which then went by GET
// (docs/fabric-ofi.md, "Push, and one P fewer").
func (e *Engine) pushGrants() int  { return e.cfg.RxSlots * 3 / 4 }
func (e *Engine) pushReserve() int { return e.cfg.RxSlots / 4 }

// maybeGrant tops up src's grants from the free buffers, if src pushes
// (rxLoop). While adverts wait for buffers, or too few are free, src is
// remembered and tried again after the round (retryGrants), when
// deliveries have freed buffers.
func (e *Engine) maybeGrant(src *source) {
	if e.grantTo(src) && !src.wantGrants {
		src.wantGrants = true
		e.rx.wantGrants = append(e.rx.wantGrants, src)
	}
}

// grantTo grants src what maybeGrant may, and reports whether src still
// wants grants that could not be given now.
func (e *Engine) grantTo(src *source) (wait bool) {
	rx := &e.rx
	if !e.cfg.Push || src.gone || e.peers[src.node].Load()&peerPushes == 0 || src.granted >= e.pushGrants() {
		return false
	}
	k := 0
	if rx.wqHead == len(rx.waitq) {
		k = min(e.pushGrants()-src.granted, len(rx.free)-e.pushReserve())
		if k <= 0 {
			e.reclaimDead()
			k = min(e.pushGrants()-src.granted, len(rx.free)-e.pushReserve())
		}
	}
	if k <= 0 {
		return true
	}
	for range k {
		slot := rx.free[len(rx.free)-1]
		rx.free = rx.free[:len(rx.free)-1]
		rx.slots[slot] = rxSlot{grantee: src}
		src.granted++
		e.regrant(src, slot)
	}
	return false
}

// retryGrants tries the sources maybeGrant could not serve again, once a
// round has freed buffers (rxLoop).
func (e *Engine) retryGrants() {
	rx := &e.rx
	keep := rx.wantGrants[:0]
	for _, src := range rx.wantGrants {
		if src.wantGrants = e.grantTo(src); src.wantGrants {
			keep = append(keep, src)
		}
	}
	clear(rx.wantGrants[len(keep):])
	rx.wantGrants = keep
}

// regrant queues slot, idle and granted to src, for src's next tagGrant.
func (e *Engine) regrant(src *source, slot int32) {
	src.regrants = append(src.regrants, slot)
	if !src.gdirty {
		src.gdirty = true
		e.rx.gdirty = append(e.rx.gdirty, src)
	}
}

// flushGrants hands the round's grants to the control goroutine; what
// does not fit its queue waits for the next round (rxLoop).
func (e *Engine) flushGrants() {
	rx := &e.rx
	keep := rx.gdirty[:0]
	for _, src := range rx.gdirty {
		sent := 0
		for sent < len(src.regrants) && !src.gone {
			k := min(len(src.regrants)-sent, maxGrantNLAs)
			c := ctlMsg{node: src.node, kind: tagGrant, ng: uint8(k)}
			for i, s := range src.regrants[sent : sent+k] {
				c.grants[i] = rx.nla(s)
			}
			if !e.queueCtl(c) {
				break
			}
			sent += k
		}
		if src.gone {
			sent = len(src.regrants)
		}
		// What is left moves to the front: the slice keeps its array.
		src.regrants = src.regrants[:copy(src.regrants, src.regrants[sent:])]
		if src.gdirty = len(src.regrants) > 0; src.gdirty {
			keep = append(keep, src)
		}
	}
	clear(rx.gdirty[len(keep):])
	rx.gdirty = keep
}

// releaseGrants takes back src's idle grants, and makes its busy ones
// return to the free list when released (the source is gone: dead or
// restarted, so it holds none of them any more).
func (e *Engine) releaseGrants(src *source) {
	rx := &e.rx
	if src.granted == 0 {
		return
	}
	for i := range rx.slots {
		s := &rx.slots[i]
		if s.grantee != src {
			continue
		}
		if s.busy {
			s.grantee = nil // freeRxSlot returns it to the free list
		} else {
			*s = rxSlot{}
			rx.free = append(rx.free, int32(i))
		}
		src.granted--
	}
	src.regrants = src.regrants[:0]
}

// reclaimDead releases the grants of sources the NIC says are down.
func (e *Engine) reclaimDead() {
	for node, src := range e.rx.sources {
		if src.granted > 0 && e.nic.Alive(node) != nil {
			e.releaseGrants(src)
		}
	}
}

// handlePushed takes the announcement of a frame src PUT into one of its
// grants (rxLoop).
func (e *Engine) handlePushed(src *source, a advert, reason DropReason) {
	rx := &e.rx
	if reason != DropNone {
		e.drop(reason, src.node)
		return
	}
	if e.seqGap(src, a.seq) {
		e.releaseGrants(src) // restarted: it holds none of them now
	}
	slot := rx.index(a.nla)
	if slot < 0 || rx.nla(slot) != a.nla || rx.slots[slot].grantee != src || rx.slots[slot].busy {
		// Not a buffer this source holds: forged, or a grant from
		// before our restart or its own. A source without grants
		// gets some.
		e.drop(DropPushForged, src.node)
		e.maybeGrant(src)
		return
	}
	if !pushHdrOK(rx.hdr(slot), src.node, a.stamp, a.len) {
		e.drop(DropPushStale, src.node)
		e.regrant(src, slot)
		return
	}
	ent := e.enqueue(src)
	if ent == nil {
		e.regrant(src, slot) // counted queue-full
		return
	}
	*ent = qent{state: qPending, proto: ProtoPush, slot: slot}
	rx.slots[slot] = rxSlot{src: src, abs: src.qhead + uint64(src.qlen) - 1, len: a.len, busy: true, off: a.off, grantee: src}
	e.ctr.rxSlotsInUse.Add(1)
	e.landed(slot, DropNone)
	e.maybeGrant(src)
}

//go:build ofi && cgo

package ofi

// RMA pipeline:
//
//	Register ──► mmap + fi_mr_reg (key = region index, or the provider's
//	             key under FI_MR_PROV_KEY) ──► region table (localq.Table)
//	RegisterBuffer ──► the same on the caller's buffer (pinned, and on
//	             release unpinned instead of unmapped)
//	Post ──► fabric.CheckRMA, local region/owner/bounds (ErrInvalid)
//	     ──► loopback: copy in Go under region references, notify
//	     ──► remote: region cache (rcMu) or one pRegQ/pRegA round trip;
//	         the target answers with a key only for a region that the
//	         named VPID owns; owner, bounds and liveness are checked here
//	         BEFORE anything is issued (error notification otherwise)
//	     ──► joins the operation this Post call is building (same op,
//	         peer, flags, local and remote region; up to n.merge), or
//	         issues that one and starts another in a fresh op slot
//	     ──► issue: one fi_readmsg / fi_writemsg(FI_DELIVERY_COMPLETE)
//	         with one iov entry per request
//	progress ──► rmaDone: requester/completer notifications here, one
//	             pNotify to the target with the completer (PUT) or
//	             responder (GET) notifications of every request of the
//	             operation, which it delivers only to the VPID named.
//	Deregister ──► unpublish, wait for own ops in flight, pInval to every
//	             node that got the key and wait for each one's pInvalAck
//	             (sent once none of its ops on the region is in flight:
//	             pins, rcMu), then fi_close(mr) and munmap (a caller's
//	             buffer: unpin) under progMu (so never during a progress
//	             step).
//
// Region indices are never reused in a NIC's life, and the requested MR
// key is the index, so a stale cached key cannot reach a later region.

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/internal/localq"
)

// region is registered memory.
type region struct {
	idx   uint32
	owner *endpoint
	mem   cmem
	size  int
	mr    mr

	dead     atomic.Bool
	inflight atomic.Int32
	handed   []fabric.NodeID // nodes given the key; guarded by nic.regs' lock
	waiting  []fabric.NodeID // nodes whose pInvalAck is due; guarded by nic.relMu
	acked    chan struct{}   // closed when waiting empties
}

// pin counts this node's RMA operations in flight to one remote region,
// and whether the target asked (pInval) to be told when they are done.
type pin struct {
	n      int
	ackDue bool
}

// remote region cache key.
type rkey struct {
	node fabric.NodeID
	idx  uint32
}

// remoteRegion is a cached (or pending) answer to a region query.
type remoteRegion struct {
	k      rkey
	cookie uint64
	done   chan struct{}
	ans    regAnswer // valid after done is closed
}

func (rr *remoteRegion) finish(a regAnswer) {
	rr.ans = a
	close(rr.done)
}

// rmaMerge is the most requests of one Post that one provider operation
// carries (fi_readmsg/fi_writemsg with one iov entry each): EXN_MAXIOV in
// cgo.h, the iov limit of tcp;ofi_rxm and shm in libfabric 1.17. On an
// fd provider each operation is a request, a response and a wake-up on
// each side; EXT-Eth posts the GETs of a receive round together, and one
// operation for up to four 64 KiB frames divides that cost by up to four
// (docs/fabric-ofi.md, "Several requests per operation"). Four responder
// notifications also fit one pNotify packet.
const rmaMerge = 4

// mergeLimit is RMAMerge bounded by the provider's iov limit and rmaMerge.
func (c *Config) mergeLimit(iov int) int {
	m := min(rmaMerge, iov)
	if c.RMAMerge > 0 {
		m = min(m, c.RMAMerge)
	}
	return max(m, 1)
}

// rmaPart is one request of an operation, with the references it holds
// until its completion: its local region (inflight) and its pin on the
// remote region.
type rmaPart struct {
	req    fabric.RMA
	local  *region
	remote rkey
}

// rmaOp is one RMA operation in flight: parts[:k], all of one endpoint,
// op, peer (node and VPID), local region and remote region.
type rmaOp struct {
	ep    *endpoint
	peer  *peer
	parts [rmaMerge]rmaPart
	k     int
}

// rmaBatch is an operation being built by one Post call: slot and
// op.parts[:op.k] are taken, nothing is issued yet.
type rmaBatch struct {
	slot int32
	op   *rmaOp
	key  uint64 // the remote region's key, as the first request resolved it
}

// Register allocates size bytes of page-aligned C memory (mmap), registers
// it with libfabric for remote read and write, and publishes it under a
// fresh region index.
func (e *endpoint) Register(size int) (fabric.Region, error) {
	return e.register(size, func() (cmem, error) { return mmapMem(size) })
}

// The suite's Buffer* cases skip an endpoint without the interface; this
// keeps the method from drifting out of it unnoticed.
var _ fabric.BufferRegistrar = (*endpoint)(nil)

// RegisterBuffer implements fabric.BufferRegistrar: fi_mr_reg on buf's
// own address, so RMA reads and writes buf itself. buf should be an mmap
// (of a /dev/shm file, a memfd, anonymous memory): libfabric keeps its
// address, and page-aligned memory outside the Go heap is what providers
// register best. Go memory is tolerated: it is pinned while registered.
// Deregister and Close close the MR (after the same waits as for
// Register's regions) and unpin, but never unmap buf.
func (e *endpoint) RegisterBuffer(buf []byte) (fabric.Region, error) {
	return e.register(len(buf), func() (cmem, error) { return callerMem(buf), nil })
}

// register is Register and RegisterBuffer: it checks size, reserves an
// index, gets the memory from get, registers it and publishes it.
func (e *endpoint) register(size int, get func() (cmem, error)) (fabric.Region, error) {
	n := e.nic
	if err := e.CheckRegister(size); err != nil {
		return fabric.Region{}, err
	}
	if e.Closed.Load() {
		return fabric.Region{}, e.ErrClosed("register")
	}
	n.regs.Lock()
	idx, ok := n.regs.ReserveLocked()
	n.regs.Unlock()
	if !ok {
		return fabric.Region{}, e.ErrExhausted()
	}
	m, err := get()
	if err != nil {
		return fabric.Region{}, fmt.Errorf("ofi: register %d bytes: %w", size, err)
	}
	r := &region{idx: idx, owner: e, mem: m, size: size}
	r.mr, err = n.f.mrReg(m, regionAccess, uint64(idx))
	if err != nil {
		m.free()
		n.faults.Warn("ofi memory registration failed", "size", size, "err", err)
		return fabric.Region{}, fmt.Errorf("ofi: register %d bytes: %w", size, err)
	}
	n.regs.Lock()
	if e.Closed.Load() {
		n.regs.Unlock()
		n.runJob(func() { r.mr.close(); m.free() })
		return fabric.Region{}, e.ErrClosed("register")
	}
	n.regs.PutLocked(idx, e, r, uint64(size))
	n.regs.Unlock()
	b := m.bytes()
	return fabric.Region{NLA: fabric.MakeNLA(idx, 0), Buf: b[:size:size]}, nil
}

// Deregister releases a region by its base NLA. Own requests in flight on
// it finish first; remote requests afterwards get an error notification.
func (e *endpoint) Deregister(base fabric.NLA) error {
	return localq.Deregister(&e.Core, &e.nic.regs, e, base, e.nic.release)
}

func (n *NIC) deregisterAll(e *endpoint) {
	for _, r := range n.regs.RemoveOwner(e) {
		n.release(r)
	}
}

// release retires an unpublished region.
func (n *NIC) release(r *region) {
	r.dead.Store(true)
	for r.inflight.Load() > 0 {
		// Own RMA in flight: it completes or fails soon, in the CQ.
		if !n.spinUntil(func() bool { return r.inflight.Load() == 0 }) {
			time.Sleep(50 * time.Microsecond) // deregistration only: the background goroutine progresses
		}
	}
	n.regs.Lock()
	handed := r.handed
	r.handed = nil
	n.regs.Unlock()
	n.awaitInvalAcks(r, handed)
	n.runJob(func() {
		if err := r.mr.close(); err != nil {
			n.log.Warn("ofi mr close failed", "region", r.idx, "err", err)
		}
		r.mem.free()
	})
}

// awaitInvalAcks tells every node given r's key that it is gone and waits
// until each has acknowledged that none of its RMA operations on r is in
// flight any more (or went down, or queryTimeout passed). Only then may
// the MR close: an operation reaching a closed MR makes providers fail
// it in ways exn cannot attribute (shm 1.17 reports an error completion
// without its context, tcp drops the connection), and the memory must
// not be unmapped under a transfer.
func (n *NIC) awaitInvalAcks(r *region, handed []fabric.NodeID) {
	if len(handed) == 0 {
		return
	}
	r.acked = make(chan struct{})
	n.relMu.Lock()
	r.waiting = slices.DeleteFunc(append([]fabric.NodeID(nil), handed...), func(node fabric.NodeID) bool { return n.Alive(node) != nil })
	if len(r.waiting) == 0 {
		close(r.acked)
	}
	n.releasing[r.idx] = r
	n.relMu.Unlock()
	var body [invalBody]byte
	putLe32(body[:], r.idx)
	for _, node := range handed {
		n.sendCtl(node, header{typ: pInval}, body[:])
	}
	if !n.spinUntil(func() bool { return localq.ClosedChan(r.acked) }) {
		t := time.NewTimer(queryTimeout)
		defer t.Stop()
	wait:
		for {
			select {
			case <-r.acked:
				break wait
			case <-n.done:
				break wait
			case <-t.C:
				n.log.Warn("ofi deregister: invalidate not acknowledged in time", "region", r.idx, "timeout", queryTimeout)
				break wait
			case <-n.downCh():
				// A peer went down: it acknowledges nothing any more.
			}
			n.relMu.Lock()
			r.waiting = slices.DeleteFunc(r.waiting, func(node fabric.NodeID) bool { return n.Alive(node) != nil })
			if len(r.waiting) == 0 && !localq.ClosedChan(r.acked) {
				close(r.acked)
			}
			n.relMu.Unlock()
		}
	}
	n.relMu.Lock()
	delete(n.releasing, r.idx)
	n.relMu.Unlock()
}

// invalAcked records node src's pInvalAck for region idx.
func (n *NIC) invalAcked(src fabric.NodeID, idx uint32) {
	n.relMu.Lock()
	defer n.relMu.Unlock()
	r := n.releasing[idx]
	if r == nil {
		return
	}
	r.waiting = slices.DeleteFunc(r.waiting, func(node fabric.NodeID) bool { return node == src })
	if len(r.waiting) == 0 && !localq.ClosedChan(r.acked) {
		close(r.acked)
	}
}

// downCh returns a channel closed when the peers' state changes: the
// first peer's down channel that is still open, or nil.
func (n *NIC) downCh() <-chan struct{} {
	for _, p := range n.peerList() {
		if up, d := p.state(); up {
			return d
		}
	}
	return nil
}

// pinRemote counts one RMA operation in flight to rr, if rr is still the
// cached (not invalidated) answer for its region; unpinRemote ends it.
func (n *NIC) pinRemote(rr *remoteRegion) bool {
	n.rcMu.Lock()
	defer n.rcMu.Unlock()
	if n.rcache[rr.k] != rr {
		return false // invalidated meanwhile: the target may have closed the MR
	}
	pn := n.pins[rr.k]
	if pn == nil {
		pn = &pin{}
		n.pins[rr.k] = pn
	}
	pn.n++
	return true
}

func (n *NIC) unpinRemote(k rkey) {
	n.rcMu.Lock()
	pn := n.pins[k]
	if pn == nil {
		n.rcMu.Unlock()
		return
	}
	pn.n--
	ack := pn.n == 0 && pn.ackDue
	if pn.n == 0 {
		delete(n.pins, k)
	}
	n.rcMu.Unlock()
	if ack {
		n.sendInvalAck(k)
	}
}

func (n *NIC) sendInvalAck(k rkey) {
	var body [invalBody]byte
	putLe32(body[:], k.idx)
	n.sendCtl(k.node, header{typ: pInvalAck}, body[:])
}

// localRegion returns e's region holding [a, a+len) with a reference
// taken, or nil.
func (n *NIC) localRegion(e *endpoint, a fabric.NLA, length uint32) *region {
	var r *region
	if e != nil {
		r, _ = n.regs.Check(e, a, uint64(length)) // nil unless owned and in bounds
	} else if r, _ = n.regs.Lookup(a.Region()); r != nil && !fabric.CheckRange(a, uint64(length), uint64(r.size)) {
		r = nil
	}
	if r == nil {
		return nil
	}
	r.inflight.Add(1)
	if r.dead.Load() {
		r.inflight.Add(-1)
		return nil
	}
	return r
}

// Post starts RMA requests in order (see fabric.Endpoint). A request to a
// region not yet seen costs one query round trip to the target first.
// Consecutive requests of one call that share the op, the peer, the
// notification flags, the local region and the remote region go to the
// provider as one operation of up to n.merge pieces; each keeps its own
// checks, notifications and errors, as if posted alone.
// PutsBeforeSends implements fabric.PutOrderer: true when the provider
// orders a send after a write (FI_ORDER_SAW, tcp;ofi_rxm). Post issues
// every remote request before it returns (a full provider queue is
// drained in place, a region query answered first), a loopback PUT is a
// copy, and Send goes to the same provider endpoint afterwards.
func (e *endpoint) PutsBeforeSends() bool { return e.nic.f.saw() }

func (e *endpoint) Post(reqs []fabric.RMA) (int, error) {
	var b rmaBatch
	k, err := e.Core.Post(reqs, func(r *fabric.RMA) error { return e.post(r, &b) })
	e.issue(&b)
	return k, err
}

// post checks r, resolves its remote region and adds it to the operation
// b is building, issuing b first when r cannot join it.
func (e *endpoint) post(r *fabric.RMA, b *rmaBatch) error {
	n := e.nic
	if err := fabric.CheckRMA(r); err != nil {
		return err
	}
	local := n.localRegion(e, r.Local, r.Len)
	if local == nil {
		return e.ErrNotLocal(r)
	}
	n.ctr.RMAPosted[r.Op].Add(1)
	if r.Peer.Node == n.id {
		defer local.inflight.Add(-1)
		e.issue(b) // keep the order of this call's requests
		e.loopback(r, local)
		return nil
	}
	p := n.peer(r.Peer.Node)
	if p == nil {
		local.inflight.Add(-1)
		e.issue(b)
		e.ErrorNotify(r, fabric.NErrPeerDown)
		return nil
	}
	ans, rr, nerr := e.resolve(p, r.Peer.VPID, r.Remote.Region())
	if nerr == fabric.NErrNone && !fabric.CheckRange(r.Remote, uint64(r.Len), ans.size) {
		nerr = fabric.NErrBounds
	}
	if nerr == fabric.NErrNone && !n.pinRemote(rr) {
		nerr = fabric.NErrAccess // deregistered while we asked
	}
	if nerr != fabric.NErrNone {
		local.inflight.Add(-1)
		e.issue(b)
		e.ErrorNotify(r, nerr)
		return nil
	}
	rk := rkey{r.Peer.Node, r.Remote.Region()}
	if b.op != nil {
		// Same op and flags means the same delivery-complete choice.
		first := &b.op.parts[0]
		if b.op.k == n.merge || b.op.peer != p || first.req.Op != r.Op || first.req.Peer != r.Peer || first.req.Notify != r.Notify ||
			first.local != local || first.remote != rk || b.key != ans.key {
			e.issue(b)
		}
	}
	if b.op == nil {
		select {
		case b.slot = <-n.opFree:
		case <-e.Done:
			local.inflight.Add(-1)
			n.unpinRemote(rk)
			return e.ErrClosed("post")
		case <-n.done:
			local.inflight.Add(-1)
			n.unpinRemote(rk)
			return e.ErrClosed("post")
		}
		b.op = &n.ops[b.slot]
		*b.op = rmaOp{ep: e, peer: p}
		b.key = ans.key
	}
	raddr := r.Remote.Offset()
	if n.virtAddr {
		raddr += ans.base
	}
	b.op.parts[b.op.k] = rmaPart{req: *r, local: local, remote: rk}
	n.vecs[b.slot].set(b.op.k, local.mem.at(int(r.Local.Offset())), raddr, int(r.Len))
	b.op.k++
	return nil
}

// issue hands the operation b built to the provider (or fails each of
// its requests with an error notification) and empties b.
func (e *endpoint) issue(b *rmaBatch) {
	op := b.op
	if op == nil {
		return
	}
	b.op = nil
	n, p, slot := e.nic, op.peer, b.slot
	if op.k > 1 {
		n.rmaMerged.Add(uint64(op.k - 1))
	}
	fail := func() {
		parts := op.parts
		k := op.k
		*op = rmaOp{}
		n.opFree <- slot
		for i := range parts[:k] {
			parts[i].local.inflight.Add(-1)
			n.unpinRemote(parts[i].remote)
			e.ErrorNotify(&parts[i].req, fabric.NErrPeerDown)
		}
	}
	if !p.enter() {
		fail()
		return
	}
	defer p.leave()
	for {
		first := &op.parts[0]
		err := n.f.rma(first.req.Op == fabric.OpPut, n.needDC(&first.req), &n.vecs[slot], op.k, first.local.mr.desc, p.fa, b.key, mkctx(ctxRMA, int(slot)))
		n.ringPeer(p) // a delivery-complete PUT, and a full queue, wait for the target's progress
		if err == nil {
			n.awaitCompletion()
			return
		}
		up, _ := p.state()
		if !isAgain(err) || !up || n.closed.Load() {
			if !isAgain(err) {
				n.faults.Warn("ofi rma issue failed", "op", first.req.Op, "peer", first.req.Peer, "requests", op.k, "err", err)
			}
			fail()
			return
		}
		// The provider's queue is full: progress drains it.
		n.spinStep()
	}
}

// needDC reports whether a write must be delivery-complete: only when a
// completer notification follows it (the notification must not overtake
// the data) and the provider does not order a send after a write
// (FI_ORDER_SAW). A requester notification means only that the local
// buffer was read (docs/fabric.md, Table 3.1), which transmit completion
// gives; on shm FI_DELIVERY_COMPLETE also makes every PUT wait for the
// target's progress. The target's key check is not what keeps a stale
// write out of a later region: the invalidate handshake (awaitInvalAcks)
// keeps the MR open until no write of ours to it is in flight.
func (n *NIC) needDC(r *fabric.RMA) bool {
	return r.Op == fabric.OpPut && r.Notify&fabric.NotifyCompleter != 0 && !n.f.saw()
}

// loopback runs a request to this node in Go: both regions referenced,
// copy (memmove semantics), notifications.
func (e *endpoint) loopback(r *fabric.RMA, local *region) {
	n := e.nic
	t := n.eps[r.Peer.VPID].Load()
	if t == nil {
		e.ErrorNotify(r, fabric.NErrPeerDown)
		return
	}
	rr, _ := n.regs.Lookup(r.Remote.Region())
	if rr == nil || rr.owner != t || r.Remote.Region() == 0 {
		e.ErrorNotify(r, fabric.NErrAccess)
		return
	}
	if !fabric.CheckRange(r.Remote, uint64(r.Len), uint64(rr.size)) {
		e.ErrorNotify(r, fabric.NErrBounds)
		return
	}
	rr.inflight.Add(1)
	defer rr.inflight.Add(-1)
	if rr.dead.Load() {
		e.ErrorNotify(r, fabric.NErrAccess)
		return
	}
	lo := local.mem.bytes()[r.Local.Offset():][:r.Len]
	ro := rr.mem.bytes()[r.Remote.Offset():][:r.Len]
	if r.Op == fabric.OpPut {
		copy(ro, lo)
	} else {
		copy(lo, ro)
	}
	n.ctr.RMABytes.Add(uint64(r.Len))
	e.NotifyDone(r, t.Notify)
}

// rmaDone finishes op slot i, each of its requests; fail is nil on
// success. The remote notifications of its requests (all to one VPID)
// travel in one pNotify packet.
func (n *NIC) rmaDone(i int, fail *cqErr) {
	op := &n.ops[i]
	e, p, k := op.ep, op.peer, op.k
	parts := op.parts
	*op = rmaOp{}
	n.opFree <- int32(i)
	if e == nil {
		return
	}
	nerr := fabric.NErrNone
	if fail != nil {
		r := &parts[0].req
		n.forget(parts[0].remote) // every part shares the remote region
		n.faults.Warn("ofi rma failed", "op", r.Op, "peer", r.Peer, "requests", k, "err", fail.detail)
		nerr = fabric.NErrAccess
		if up, _ := p.state(); !up || isConnErr(fail.code) {
			nerr = fabric.NErrPeerDown
		}
	}
	var body [rmaMerge * notifyBody]byte
	nb := 0
	for j := range parts[:k] {
		r := &parts[j].req
		parts[j].local.inflight.Add(-1)
		n.unpinRemote(parts[j].remote)
		if nerr != fabric.NErrNone {
			e.ErrorNotify(r, nerr)
			continue
		}
		n.ctr.RMABytes.Add(uint64(r.Len))
		e.NotifyDone(r, func(nt fabric.Notification) {
			nt.Encode(body[nb:])
			nb += notifyBody
		})
	}
	if nb > 0 {
		r := &parts[0].req
		n.sendCtl(r.Peer.Node, header{typ: pNotify, desc: fabric.Descriptor{VPID: e.addr.VPID}, dst: r.Peer.VPID}, body[:nb])
	}
}

// ---- remote region lookup ----

// resolve returns the target's answer for region idx of VPID v on p,
// from the cache or by one query round trip.
func (e *endpoint) resolve(p *peer, v fabric.VPID, idx uint32) (regAnswer, *remoteRegion, fabric.NotifyErr) {
	if idx == 0 {
		return regAnswer{}, nil, fabric.NErrAccess // NLA 0 is never valid
	}
	n := e.nic
	up, down := p.state()
	if !up {
		return regAnswer{}, nil, fabric.NErrPeerDown
	}
	k := rkey{p.node, idx}
	n.rcMu.Lock()
	rr := n.rcache[k]
	if rr == nil {
		n.cookie++
		rr = &remoteRegion{k: k, cookie: n.cookie, done: make(chan struct{})}
		n.rcache[k] = rr
		n.pending[rr.cookie] = rr
		var body [regQBody]byte
		putLe32(body[:], idx)
		putLe64(body[4:], rr.cookie)
		n.rcMu.Unlock()
		n.sendCtl(p.node, header{typ: pRegQ, desc: fabric.Descriptor{VPID: e.addr.VPID}, dst: v}, body[:])
	} else {
		n.rcMu.Unlock()
	}
	select {
	case <-rr.done:
	default:
		if n.spinUntil(func() bool { return localq.ClosedChan(rr.done) }) {
			break
		}
		t := time.NewTimer(queryTimeout)
		defer t.Stop()
		select {
		case <-rr.done:
		case <-down:
			return regAnswer{}, nil, fabric.NErrPeerDown
		case <-e.Done:
			return regAnswer{}, nil, fabric.NErrPeerDown
		case <-t.C:
			n.forget(k)
			n.peerDown(p, "no answer to a region query")
			return regAnswer{}, nil, fabric.NErrPeerDown
		}
	}
	a := rr.ans
	switch {
	case a.status == stNotOpen:
		return a, nil, fabric.NErrPeerDown
	case a.status != stOK:
		return a, nil, fabric.NErrAccess
	case a.owner != v:
		// Cached from a query by another VPID's requester: the region
		// belongs to someone else than the VPID addressed.
		return a, nil, fabric.NErrAccess
	}
	return a, rr, fabric.NErrNone
}

// handleRegQ answers a region query from (src, h.desc.VPID) about region
// idx of VPID h.dst. A key is handed out only for a live region owned by
// exactly the VPID the requester addressed, and the key covers exactly
// that region.
func (n *NIC) handleRegQ(h header, src fabric.NodeID, idx uint32, cookie uint64) {
	a := regAnswer{cookie: cookie, owner: h.dst}
	e := n.eps[h.dst].Load()
	n.regs.Lock()
	r, _ := n.regs.LookupLocked(idx)
	switch {
	case e == nil || e.Closed.Load():
		a.status = stNotOpen
	case r == nil || r.owner != e || r.dead.Load():
		a.status = stNoRegion
	default:
		a.status, a.key, a.size = stOK, r.mr.key, uint64(r.size)
		if n.virtAddr {
			a.base = r.mem.addr()
		}
		if !containsNode(r.handed, src) {
			r.handed = append(r.handed, src)
		}
	}
	n.regs.Unlock()
	var body [regABody]byte
	a.put(body[:])
	n.sendCtl(src, header{typ: pRegA, desc: fabric.Descriptor{VPID: h.dst}, dst: h.desc.VPID}, body[:])
}

func (n *NIC) handleRegA(src fabric.NodeID, a regAnswer) {
	n.rcMu.Lock()
	rr := n.pending[a.cookie]
	if rr == nil || rr.k.node != src {
		n.rcMu.Unlock()
		return
	}
	delete(n.pending, a.cookie)
	if a.status != stOK && n.rcache[rr.k] == rr {
		delete(n.rcache, rr.k) // negative answers are not cached
	}
	n.rcMu.Unlock()
	rr.finish(a)
}

// invalidate drops the cached key of region idx on node src and
// acknowledges once no operation of this node on it is in flight.
func (n *NIC) invalidate(src fabric.NodeID, idx uint32) {
	k := rkey{src, idx}
	n.forget(k)
	n.rcMu.Lock()
	pn := n.pins[k]
	if pn != nil {
		pn.ackDue = true
	}
	n.rcMu.Unlock()
	if pn == nil {
		n.sendInvalAck(k)
	}
}

func (n *NIC) forget(k rkey) {
	n.rcMu.Lock()
	if rr := n.rcache[k]; rr != nil {
		select {
		case <-rr.done:
			delete(n.rcache, k)
		default: // still pending: its answer decides
		}
	}
	n.rcMu.Unlock()
}

// dropRemote forgets everything cached about node's regions.
func (n *NIC) dropRemote(node fabric.NodeID) {
	n.rcMu.Lock()
	for k, rr := range n.rcache {
		if k.node != node {
			continue
		}
		delete(n.rcache, k)
		select {
		case <-rr.done:
		default:
			delete(n.pending, rr.cookie)
			rr.finish(regAnswer{status: stNotOpen})
		}
	}
	n.rcMu.Unlock()
}

// isConnErr reports libfabric error codes that mean the peer is
// unreachable rather than that access was refused.
func isConnErr(code int) bool {
	switch code {
	case fiECONNREFUSED, fiECONNRESET, fiEHOSTUNREACH, fiETIMEDOUT, fiEIO, fiENOTCONN, fiECONNABORTED, fiESHUTDOWN:
		return true
	}
	return false
}

var errorsIs = errors.Is

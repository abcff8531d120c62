package shm

// RMA pipeline. Post runs each request to completion in the caller:
//
//	CheckRMA → local region lookup (this node's table, under regMu read
//	lock; the region must belong to the posting VPID and hold the range)
//	→ remote resolve: the peer's region table entry is read as a seqlock
//	(word 0, size, word 0 again), its owner must be Peer.VPID and the
//	range must fit the size registered there — the only size trusted — and
//	the region file of exactly that generation is mapped (cached per peer,
//	replaced when the generation moves, so a stale mapping is never used
//	after a Deregister) → one copy between the two mappings → notifications
//	per Table 3.1, written with the publish-last protocol into the
//	requester's and the peer's queues.
//
// Both mappings are held by reference for the copy. A Deregister racing a
// copy already past its check lets that copy finish into (or out of) the
// old region's pages, which no one can reach afterwards: a new
// registration of the index gets a new file. No other VPID's memory is
// ever addressed.

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/sys"
)

// localRegion is one of this node's registered regions.
type localRegion struct {
	idx   uint32
	gen   uint32
	owner fabric.VPID
	size  uint64
	path  string
	m     *mapping
}

func (n *nicT) entryWords(b []byte, idx uint32) (w0, w1 *atomic.Uint64) {
	off := nOffRegions + int(idx-1)*regionEntrySize
	return u64(b, off), u64(b, off+8)
}

// Register implements fabric.Endpoint. The region is a file of its own,
// exn-F-n<N>.<I>-r<idx>.<gen>, mapped by the owner and, lazily, by peers.
func (e *endpoint) Register(size int) (fabric.Region, error) {
	if err := e.enter(); err != nil {
		return fabric.Region{}, err
	}
	defer e.leave()
	n := e.nic
	if size <= 0 || size > maxRegionBytes {
		return fabric.Region{}, n.ctr.CountErr(fmt.Errorf("shm: register %d bytes: want 1..%d: %w", size, maxRegionBytes, fabric.ErrInvalid))
	}
	n.regMu.Lock()
	defer n.regMu.Unlock()
	var idx uint32
	switch {
	case len(n.freeIdx) > 0:
		idx = n.freeIdx[len(n.freeIdx)-1]
		n.freeIdx = n.freeIdx[:len(n.freeIdx)-1]
	case n.nextIdx <= n.regHi:
		idx = n.nextIdx
		n.nextIdx++
	default:
		return fabric.Region{}, n.ctr.CountErr(fmt.Errorf("shm: register: all %d region indices in use: %w", n.regHi-n.regLo+1, fabric.ErrInvalid))
	}
	gen := n.gens[idx] + 1
	path := n.regionPath(n.node, n.inc, idx, gen)
	f, err := createFile(path, size)
	if err != nil {
		n.freeIdx = append(n.freeIdx, idx)
		return fabric.Region{}, fmt.Errorf("shm: register: %w", err)
	}
	b, err := sys.MapShared(f, size)
	f.Close()
	if err != nil {
		os.Remove(path)
		n.freeIdx = append(n.freeIdx, idx)
		return fabric.Region{}, fmt.Errorf("shm: register: %w", err)
	}
	n.gens[idx] = gen
	r := &localRegion{idx: idx, gen: gen, owner: e.addr.VPID, size: uint64(size), path: path, m: newMapping(b)}
	n.regions[idx] = r
	w0, w1 := n.entryWords(n.nodeMap.b, idx)
	w1.Store(uint64(size))
	w0.Store(encodeRegionEntry(regionEntry{Gen: gen, Valid: true, Owner: e.addr.VPID}))
	return fabric.Region{NLA: fabric.MakeNLA(idx, 0), Buf: b[:size:size]}, nil
}

// Deregister implements fabric.Endpoint. base must be a region's base NLA
// and the region must belong to this endpoint.
func (e *endpoint) Deregister(base fabric.NLA) error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.leave()
	n := e.nic
	n.regMu.Lock()
	defer n.regMu.Unlock()
	r := n.regions[base.Region()]
	if r == nil || r.owner != e.addr.VPID || base.Offset() != 0 {
		return n.ctr.CountErr(fmt.Errorf("shm: deregister %v: not a region of %v: %w", base, e.addr, fabric.ErrInvalid))
	}
	n.dropRegionLocked(r.idx, r)
	return nil
}

// dropRegionLocked unpublishes, unlinks and releases one region. regMu is
// held for writing.
func (n *nicT) dropRegionLocked(idx uint32, r *localRegion) {
	w0, _ := n.entryWords(n.nodeMap.b, idx)
	w0.Store(encodeRegionEntry(regionEntry{Gen: r.gen}))
	delete(n.regions, idx)
	os.Remove(r.path)
	if n.keepMaps {
		n.orphans = append(n.orphans, r.m) // released by Attached.Close
	} else {
		r.m.release()
	}
	n.freeIdx = append(n.freeIdx, idx)
}

// localBuf returns an acquired view of [a, a+l) in a region of this node
// registered to owner, or false.
func (n *nicT) localBuf(owner fabric.VPID, a fabric.NLA, l uint32) (*mapping, []byte, fabric.NotifyErr) {
	n.regMu.RLock()
	defer n.regMu.RUnlock()
	r := n.regions[a.Region()]
	switch {
	case r == nil || r.owner != owner:
		return nil, nil, fabric.NErrAccess
	case !fabric.CheckRange(a, uint64(l), r.size):
		return nil, nil, fabric.NErrBounds
	case !r.m.acquire():
		return nil, nil, fabric.NErrAccess
	}
	off := a.Offset()
	return r.m, r.m.b[off : off+uint64(l)], fabric.NErrNone
}

// remoteBuf resolves [a, a+l) in a region registered to peer on p.
func (n *nicT) remoteBuf(p *peer, owner fabric.VPID, a fabric.NLA, l uint32) (*mapping, []byte, fabric.NotifyErr) {
	if p.self {
		return n.localBuf(owner, a, l)
	}
	idx := a.Region()
	if idx == 0 || idx > maxTableRegions {
		return nil, nil, fabric.NErrAccess
	}
	if !p.m.acquire() {
		return nil, nil, fabric.NErrPeerDown
	}
	defer p.m.release()
	w0, w1 := n.entryWords(p.m.b, idx)
	var ent regionEntry
	for try := 0; ; try++ {
		x := w0.Load()
		size := w1.Load()
		if w0.Load() == x {
			var err error
			if ent, err = decodeRegionEntry(x, size); err != nil {
				n.ctr.Corrupt.Add(1)
				n.faults.Warn("shm: corrupt region entry", "peer", p.id, "region", idx, "err", err)
				return nil, nil, fabric.NErrAccess
			}
			break
		}
		if try > maxClaimRetries {
			return nil, nil, fabric.NErrAccess
		}
	}
	switch {
	case !ent.Valid || ent.Owner != owner:
		return nil, nil, fabric.NErrAccess
	case !fabric.CheckRange(a, uint64(l), ent.Size):
		return nil, nil, fabric.NErrBounds
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down.Load() {
		return nil, nil, fabric.NErrPeerDown
	}
	rr := p.regions[idx]
	if rr != nil && (rr.gen != ent.Gen || rr.size != ent.Size) {
		rr.m.release()
		delete(p.regions, idx)
		rr = nil
	}
	if rr == nil {
		m, err := n.mapRegion(p, idx, ent)
		if err != nil {
			n.faults.Warn("shm: map peer region", "peer", p.id, "region", idx, "err", err)
			return nil, nil, fabric.NErrAccess
		}
		rr = &remoteRegion{gen: ent.Gen, size: ent.Size, m: m}
		p.regions[idx] = rr
	}
	// Re-check the entry: a Deregister between the read and the mapping
	// must not let this request through.
	if w0.Load() != encodeRegionEntry(regionEntry{Gen: ent.Gen, Valid: true, Owner: owner}) {
		return nil, nil, fabric.NErrAccess
	}
	rr.m.acquire()
	off := a.Offset()
	return rr.m, rr.m.b[off : off+uint64(l)], fabric.NErrNone
}

func (n *nicT) mapRegion(p *peer, idx uint32, ent regionEntry) (*mapping, error) {
	f, err := os.OpenFile(n.regionPath(p.id, p.inc, idx, ent.Gen), os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sz, err := sys.FileSize(f)
	if err != nil {
		return nil, err
	}
	if uint64(sz) < ent.Size {
		n.ctr.Corrupt.Add(1)
		return nil, fmt.Errorf("region file %d bytes < registered %d: %w", sz, ent.Size, fabric.ErrInvalid)
	}
	b, err := sys.MapShared(f, int(ent.Size))
	if err != nil {
		return nil, err
	}
	return newMapping(b), nil
}

// Post implements fabric.Endpoint.
func (e *endpoint) Post(reqs []fabric.RMA) (int, error) {
	if err := e.enter(); err != nil {
		return 0, err
	}
	defer e.leave()
	n := e.nic
	for i := range reqs {
		r := &reqs[i]
		if err := fabric.CheckRMA(r); err != nil {
			return i, n.ctr.CountErr(err)
		}
		lm, lbuf, lerr := n.localBuf(e.addr.VPID, r.Local, r.Len)
		if lerr != fabric.NErrNone {
			return i, n.ctr.CountErr(fmt.Errorf("shm: rma local %v len %d: not in a region of %v (%v): %w", r.Local, r.Len, e.addr, lerr, fabric.ErrInvalid))
		}
		n.ctr.RMAPosted[r.Op].Add(1)
		e.do(r, lbuf)
		lm.release()
	}
	return len(reqs), nil
}

// do runs one checked request whose local buffer is lbuf.
func (e *endpoint) do(r *fabric.RMA, lbuf []byte) {
	n := e.nic
	fail := func(ne fabric.NotifyErr) {
		nt := fabric.Notification{Kind: fabric.KindRequester, Op: r.Op, Err: ne, Peer: r.Peer, Len: r.Len, Local: r.Local}
		e.v.pushNotify(&nt, n.node)
		e.v.ringDoorbell()
	}
	p, err := n.getPeer(r.Peer.Node)
	if err != nil {
		fail(fabric.NErrPeerDown)
		return
	}
	rm, rbuf, ne := n.remoteBuf(p, r.Peer.VPID, r.Remote, r.Len)
	if ne != fabric.NErrNone {
		fail(ne)
		return
	}
	if r.Op == fabric.OpPut {
		copy(rbuf, lbuf)
	} else {
		copy(lbuf, rbuf)
	}
	rm.release()
	n.ctr.RMABytes.Add(uint64(r.Len))

	localLast := fabric.LastFrame(r.Local, r.Len)
	var peerKind fabric.NotifyKind
	switch {
	case r.Op == fabric.OpPut && r.Notify&fabric.NotifyCompleter != 0:
		peerKind = fabric.KindCompleter
	case r.Op == fabric.OpGet && r.Notify&fabric.NotifyResponder != 0:
		peerKind = fabric.KindResponder
	}
	if peerKind != 0 {
		e.notifyPeer(p, r, peerKind)
	}
	own := false
	if r.Notify&fabric.NotifyRequester != 0 {
		nt := fabric.Notification{Kind: fabric.KindRequester, Op: r.Op, Peer: r.Peer, Len: r.Len, Local: localLast}
		e.v.pushNotify(&nt, n.node)
		own = true
	}
	if r.Op == fabric.OpGet && r.Notify&fabric.NotifyCompleter != 0 {
		nt := fabric.Notification{Kind: fabric.KindCompleter, Op: r.Op, Peer: r.Peer, Len: r.Len, Local: localLast}
		e.v.pushNotify(&nt, n.node)
		own = true
	}
	if own {
		e.v.ringDoorbell()
	}
}

// notifyPeer writes the notification of kind that r's peer asked for
// (completer of a PUT, responder of a GET) into its queue and rings its
// doorbell. A peer gone meanwhile gets nothing.
func (e *endpoint) notifyPeer(p *peer, r *fabric.RMA, kind fabric.NotifyKind) {
	n := e.nic
	vf, err := n.vpid(p, r.Peer.VPID)
	if err != nil {
		if !errors.Is(err, fabric.ErrUnknownNode) && !errors.Is(err, fabric.ErrPeerDown) {
			n.faults.Warn("shm: rma peer notification", "peer", r.Peer, "err", err)
		}
		return
	}
	nt := fabric.Notification{Kind: kind, Op: r.Op, Peer: e.addr, Len: r.Len, Local: fabric.LastFrame(r.Remote, r.Len)}
	vf.pushNotify(&nt, n.node)
	vf.ringDoorbell()
	vf.m.release()
}

// ViewRemote implements fabric.RemoteViewer: the checks of a GET's remote
// side (remoteBuf), and the peer's mapping held for the view instead of
// a copy out of it.
func (e *endpoint) ViewRemote(r *fabric.RMA, v *fabric.RemoteView) (fabric.NotifyErr, error) {
	*v = fabric.RemoteView{}
	if err := e.enter(); err != nil {
		return fabric.NErrNone, err
	}
	defer e.leave()
	n := e.nic
	if err := fabric.CheckRMA(r); err != nil {
		return fabric.NErrNone, n.ctr.CountErr(err)
	}
	if r.Op != fabric.OpGet {
		return fabric.NErrNone, n.ctr.CountErr(fmt.Errorf("shm: view: %v is not a get: %w", r.Op, fabric.ErrInvalid))
	}
	n.ctr.RMAPosted[fabric.OpGet].Add(1)
	p, err := n.getPeer(r.Peer.Node)
	if err != nil {
		return fabric.NErrPeerDown, nil
	}
	m, b, ne := n.remoteBuf(p, r.Peer.VPID, r.Remote, r.Len)
	if ne != fabric.NErrNone {
		return ne, nil
	}
	n.ctr.RMABytes.Add(uint64(r.Len))
	*v = fabric.RemoteView{Buf: b, Req: *r, Token: m}
	return fabric.NErrNone, nil
}

// EndView implements fabric.RemoteViewer. The mapping's reference goes
// whatever the endpoint's state; the responder notification only while
// the endpoint is open and the peer known.
func (e *endpoint) EndView(v *fabric.RemoteView, notify bool) {
	m, ok := v.Token.(*mapping)
	r := v.Req
	*v = fabric.RemoteView{}
	if !ok {
		return
	}
	m.release()
	if !notify || r.Notify&fabric.NotifyResponder == 0 || e.enter() != nil {
		return
	}
	defer e.leave()
	if p, err := e.nic.getPeer(r.Peer.Node); err == nil {
		e.notifyPeer(p, &r, fabric.KindResponder)
	}
}

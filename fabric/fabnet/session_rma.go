package fabnet

// Session RMA (see session.go for the whole pipeline):
//
//	requester: Post ──► alloc (pending slab, pmu) ──► PUT: bulk queued on
//	   the writer; GET: get-req frame ──► rxPutAck / rxGetData (data read
//	   straight into the local region) ──► complete: notifications.
//	responder: rxPutData (data read straight into the target region,
//	   acquired for each read) ──► put-ack; rxGetReq ──► GET response
//	   bulk on the writer ──► responder notification after its last
//	   chunk, or on rxGetDone when needGetDone.
//
// Locks: pmu guards the pending-RMA slab's free list, its growth and
// pdead (a leaf lock); wmu guards awaitDone; regions are acquired for one
// read or one writev at a time and acquires never block.

import (
	"bufio"
	"encoding/binary"
	"fmt"

	"github.com/exn-project/exn/fabric"
)

// rxGetDone writes the responder notification of a GET whose data the
// requester has received.
func (s *session) rxGetDone(body []byte) error {
	id := binary.LittleEndian.Uint64(body)
	s.wmu.Lock()
	b := s.awaitDone[id]
	delete(s.awaitDone, id)
	s.wmu.Unlock()
	if b == nil {
		return fmt.Errorf("get-done for unknown request %#x: %w", id, errProto)
	}
	b.ep.Notify(fabric.Notification{Kind: fabric.KindResponder, Op: fabric.OpGet, Peer: b.requester, Len: b.total, Local: fabric.LastFrame(b.src, b.total)})
	*b = bulk{}
	bulkPool.Put(b)
	return nil
}

// ---- pending RMA (requester side) ----

// alloc records a request and returns its wire ID; false if the session
// already died (the caller then notifies NErrPeerDown itself).
func (s *session) alloc(ep *endpoint, r *fabric.RMA, local *region) (uint64, bool) {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if s.pdead {
		return 0, false
	}
	var idx uint32
	if k := len(s.free); k > 0 {
		idx = s.free[k-1]
		s.free = s.free[:k-1]
	} else {
		idx = uint32(len(s.pend))
		s.pend = append(s.pend, &pending{idx: idx})
	}
	p := s.pend[idx]
	p.gen++
	p.used, p.ep, p.req, p.local, p.got, p.lerr = true, ep, *r, local, 0, fabric.NErrNone
	return uint64(p.gen)<<32 | uint64(idx), true
}

// lookup returns the pending request id names, or nil. Only the reader
// frees entries, so the pointer stays valid while the reader uses it.
func (s *session) lookup(id uint64, op fabric.Op) *pending {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	idx := uint32(id)
	if int(idx) >= len(s.pend) {
		return nil
	}
	p := s.pend[idx]
	if !p.used || p.gen != uint32(id>>32) || p.req.Op != op {
		return nil
	}
	return p
}

// complete frees p and writes its notifications.
func (s *session) complete(p *pending, nerr fabric.NotifyErr) {
	s.pmu.Lock()
	c := *p
	p.used, p.ep, p.local = false, nil, nil
	s.free = append(s.free, p.idx)
	s.pmu.Unlock()
	c.ep.complete(&c.req, nerr)
}

func (s *session) rxPutData(br *bufio.Reader, p prefix, body []byte) error {
	id := binary.LittleEndian.Uint64(body[0:])
	dst := fabric.NLA(binary.LittleEndian.Uint64(body[8:]))
	total := binary.LittleEndian.Uint32(body[16:])
	off := binary.LittleEndian.Uint32(body[20:])
	k := uint32(p.payloadLen())
	notify := fabric.Notify(p.flags >> flagShift)
	last, abort := p.flags&fLast != 0, p.flags&fAbort != 0
	switch {
	case total == 0 || total > fabric.MaxRMALen || off > total || k > total-off:
		return fmt.Errorf("put chunk %d+%d of %d: %w", off, k, total, errProto)
	case abort && (k != 0 || !last):
		return fmt.Errorf("put abort with data: %w", errProto)
	case !abort && last != (off+k == total):
		return fmt.Errorf("put chunk %d+%d of %d: last flag %v: %w", off, k, total, last, errProto)
	case notify&^(fabric.NotifyRequester|fabric.NotifyCompleter) != 0:
		return fmt.Errorf("put notify flags %#x: %w", notify, errProto)
	}
	ep, reg, nerr := s.n.remoteRegion(p.b, dst, uint64(total))
	if abort {
		if nerr == fabric.NErrNone {
			nerr = fabric.NErrAccess
		}
	} else if nerr == fabric.NErrNone && reg.acquire() {
		start := dst.Offset() + uint64(off)
		err := s.readFull(br, reg.buf[start:start+uint64(k)])
		reg.release()
		if err != nil {
			return err
		}
	} else {
		if nerr == fabric.NErrNone {
			nerr = fabric.NErrAccess // deregistered under us
		}
		if err := s.discard(br, int(k)); err != nil {
			return err
		}
	}
	if nerr != fabric.NErrNone {
		if s.putFail == nil {
			s.putFail = make(map[uint64]fabric.NotifyErr)
		}
		if _, ok := s.putFail[id]; !ok {
			if len(s.putFail) >= maxPutFail {
				return fmt.Errorf("too many failed puts in flight: %w", errProto)
			}
			s.putFail[id] = nerr
		}
	}
	if !last {
		return nil
	}
	if e, ok := s.putFail[id]; ok {
		nerr = e
		delete(s.putFail, id)
	}
	if nerr == fabric.NErrNone && notify&fabric.NotifyCompleter != 0 {
		ep.Notify(fabric.Notification{Kind: fabric.KindCompleter, Op: fabric.OpPut, Peer: fabric.Addr{Node: s.peer, VPID: p.a}, Len: total, Local: fabric.LastFrame(dst, total)})
	}
	var ack [8]byte
	binary.LittleEndian.PutUint64(ack[:], id)
	s.queueCtl(tPutAck, uint8(nerr)<<flagShift, p.b, p.a, ack[:])
	s.replyLater()
	return nil
}

func (s *session) rxPutAck(p prefix, body []byte) error {
	id := binary.LittleEndian.Uint64(body)
	nerr := fabric.NotifyErr(p.flags >> flagShift)
	pe := s.lookup(id, fabric.OpPut)
	if pe == nil || nerr > fabric.NErrPeerDown {
		return fmt.Errorf("put ack %#x err %d for no put: %w", id, nerr, errProto)
	}
	s.complete(pe, nerr)
	return nil
}

func (s *session) rxGetReq(p prefix, body []byte) error {
	id := binary.LittleEndian.Uint64(body[0:])
	src := fabric.NLA(binary.LittleEndian.Uint64(body[8:]))
	n := binary.LittleEndian.Uint32(body[16:])
	notify := fabric.Notify(p.flags >> flagShift)
	if n == 0 || n > fabric.MaxRMALen || notify&^(fabric.NotifyRequester|fabric.NotifyCompleter|fabric.NotifyResponder) != 0 || p.flags&0xF != 0 {
		return fmt.Errorf("get request len %d flags %#x: %w", n, p.flags, errProto)
	}
	ep, reg, nerr := s.n.remoteRegion(p.b, src, uint64(n))
	if nerr != fabric.NErrNone {
		var b [12]byte
		binary.LittleEndian.PutUint64(b[:], id)
		s.queueCtl(tGetData, fLast|uint8(nerr)<<flagShift, p.b, p.a, b[:])
		s.replyLater()
		return nil
	}
	b := bulkPool.Get().(*bulk)
	*b = bulk{reqID: id, reg: reg, src: src, total: n, notify: notify, a: p.b, b: p.a, ep: ep, requester: fabric.Addr{Node: s.peer, VPID: p.a}}
	if !s.queueBulk(b) {
		bulkPool.Put(b)
		return fmt.Errorf("more than %d rma transfers queued: %w", maxBulkQueue, errProto)
	}
	s.replyLater()
	return nil
}

func (s *session) rxGetData(br *bufio.Reader, p prefix, body []byte) error {
	id := binary.LittleEndian.Uint64(body[0:])
	off := binary.LittleEndian.Uint32(body[8:])
	k := uint32(p.payloadLen())
	nerr := fabric.NotifyErr(p.flags >> flagShift)
	last := p.flags&fLast != 0
	pe := s.lookup(id, fabric.OpGet)
	switch {
	case pe == nil:
		return fmt.Errorf("get data for unknown request %#x: %w", id, errProto)
	case nerr > fabric.NErrPeerDown || (nerr != fabric.NErrNone && (k != 0 || !last)):
		return fmt.Errorf("get data error %d with %d bytes: %w", nerr, k, errProto)
	case nerr == fabric.NErrNone && (off != pe.got || k > pe.req.Len-off || last != (off+k == pe.req.Len)):
		return fmt.Errorf("get data %d+%d of %d (have %d): %w", off, k, pe.req.Len, pe.got, errProto)
	}
	if k > 0 {
		if pe.lerr == fabric.NErrNone && pe.local.acquire() {
			start := pe.req.Local.Offset() + uint64(off)
			err := s.readFull(br, pe.local.buf[start:start+uint64(k)])
			pe.local.release()
			if err != nil {
				return err
			}
		} else {
			pe.lerr = fabric.NErrAccess // our region went away mid-transfer
			if err := s.discard(br, int(k)); err != nil {
				return err
			}
		}
		pe.got += k
	}
	if last {
		if nerr == fabric.NErrNone && needGetDone(pe.req.Notify) {
			s.queueCtl(tGetDone, 0, p.b, p.a, body[:8])
			s.replyLater()
		}
		if nerr == fabric.NErrNone {
			nerr = pe.lerr
		}
		s.complete(pe, nerr)
	}
	return nil
}

package fabnet

// Session writer (see session.go for the whole pipeline):
//
//	senders ──► queueCtl / queueVELO (s.ctl, or s.fenced behind the
//	   sender's own PUTs: fence.go) and queueBulk (s.bulk), under
//	   wmu, then kick ──► writeLoop: takeLocked moves all control frames
//	   and up to writeChunks RMA chunks (chunkLocked, round-robin over the
//	   head transfers) into s.out ──► writeOut: one writev (raw on a TCP
//	   socket, writeRaw) ──► finishOut releases regions and finished
//	   transfers, or dropOut after a failed write.
//	VELO senders flush instead of kick: while the writer is idle and no
//	   RMA transfer waits, the sender takes the batch and writes it with
//	   non-blocking writevs itself (writeOnce); what the socket does not
//	   take stays in s.out (outPending) for the writer goroutine, kicked.
//	   A request/answer exchange then costs no writer wake-up per message.
//
// Locks: wr (the writer's role: s.out and its buffers) is taken before
// wmu; wmu guards ctl, bulk and awaitDone; chunkLocked acquires regions
// with wmu held (region acquires never block).

import (
	"encoding/binary"
	"fmt"
	"net"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/sys"
)

// ---- writer side ----

// out is one batch being written: [ctl frames | chunk header | chunk
// data aliasing its region | ...] with up to writeChunks chunks. Writer
// goroutine only.
type out struct {
	bufs  net.Buffers
	nb    int64
	ctl   []byte // the control buffer taken, recycled as the next spare
	n     int    // chunks in items
	items [writeChunks]outChunk
}

// outChunk is one RMA chunk of a batch.
type outChunk struct {
	b    *bulk
	reg  *region // acquired for the write; nil if the transfer aborted
	done bool    // b's last frame: b is ours to finish and free
	// respond: a GET response whose responder notification is written
	// once this (its last) chunk has left.
	respond bool
}

// queueCtl queues a frame with a fixed body and no payload. The caller
// then kicks the writer, or (the reader) calls replyLater.
func (s *session) queueCtl(typ, flags uint8, a, b fabric.VPID, body []byte) {
	s.wmu.Lock()
	off := len(s.ctl)
	s.ctl = append(s.ctl, make([]byte, prefixSize)...)
	putPrefix(s.ctl[off:], len(body), typ, flags, a, b)
	s.ctl = append(s.ctl, body...)
	s.wmu.Unlock()
}

// queueVELO queues one VELO frame from local VPID a to the peer's VPID b;
// as queueCtl.
func (s *session) queueVELO(a fabric.VPID, m *fabric.Message) {
	d := fabric.Descriptor{VPID: m.Peer.VPID, Tag: m.Tag, Len: m.Len, MC: m.MC}
	if m.MC {
		d.Node = m.Peer.Node
	}
	s.wmu.Lock()
	q := &s.ctl
	fenced := s.mustFenceLocked(a)
	if fenced {
		q = &s.fenced
	}
	off := len(*q)
	*q = append(*q, make([]byte, prefixSize+8)...)
	putPrefix((*q)[off:], 8+int(m.Len), tVELO, 0, a, m.Peer.VPID)
	binary.LittleEndian.PutUint64((*q)[off+prefixSize:], d.Encode())
	*q = append(*q, m.Data[:m.Len]...)
	if fenced {
		s.fences = append(s.fences, fence{end: len(s.fenced), vpid: a, need: s.putSeq})
	}
	s.wmu.Unlock()
}

// queueBulk queues an RMA data transfer; as queueCtl. False if the
// session already holds maxBulkQueue transfers.
func (s *session) queueBulk(b *bulk) bool {
	s.wmu.Lock()
	if len(s.bulk) >= maxBulkQueue {
		s.wmu.Unlock()
		return false
	}
	s.bulk = append(s.bulk, b)
	if b.put {
		s.putQueuedLocked(b)
	}
	s.wmu.Unlock()
	return true
}

// kick wakes the writer goroutine; it never blocks.
func (s *session) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// replyLater is how the reader sends: the frames it queued wait until it
// is about to block on the socket (readFull), then one kick sends the
// replies to a whole burst of frames in one write.
func (s *session) replyLater() { s.replyDue = true }

// takeLocked moves the next batch (all queued control frames plus at
// most writeChunks chunks) into s.out. False if nothing is queued.
// Writer goroutine only, wmu held.
func (s *session) takeLocked() bool {
	if len(s.fences) > 0 {
		s.releaseFencedLocked()
	}
	if len(s.ctl) == 0 && len(s.bulk) == 0 {
		return false
	}
	o := &s.out
	o.ctl = s.ctl
	s.ctl = s.spare[:0]
	s.spare = nil
	bufs := s.iov[:0]
	if len(o.ctl) > 0 {
		bufs = append(bufs, o.ctl)
	}
	// One chunk of the head transfer at a time; an unfinished transfer
	// goes back to the tail at once, so transfers share the link
	// round-robin by chunk (a lone transfer gets every chunk).
	for o.n = 0; o.n < writeChunks && len(s.bulk) > 0; o.n++ {
		b := s.bulk[0]
		copy(s.bulk, s.bulk[1:])
		s.bulk[len(s.bulk)-1] = nil
		s.bulk = s.bulk[:len(s.bulk)-1]
		it := &o.items[o.n]
		h, data := s.chunkLocked(b, s.hdr[o.n][:], it)
		if !it.done {
			s.bulk = append(s.bulk, b)
		} else if b.put {
			s.putTakenLocked(b)
		}
		bufs = append(bufs, h)
		if len(data) > 0 {
			bufs = append(bufs, data)
		}
	}
	o.nb = 0
	for _, x := range bufs {
		o.nb += int64(len(x))
	}
	o.bufs = bufs
	return true
}

// finishOut releases a written batch: the regions, the finished
// transfers (after the responder notification of a GET response that
// is due now) and the control buffer (kept as the spare: the steady
// state allocates nothing).
func (s *session) finishOut() {
	o := &s.out
	clear(s.iov[:])
	o.bufs = nil
	for i := range o.items[:o.n] {
		it := &o.items[i]
		if it.reg != nil {
			it.reg.release()
		}
		if b := it.b; b != nil {
			if it.respond {
				b.ep.Notify(fabric.Notification{Kind: fabric.KindResponder, Op: fabric.OpGet, Peer: b.requester, Len: b.total, Local: fabric.LastFrame(b.src, b.total)})
			}
			*b = bulk{}
			bulkPool.Put(b)
		}
		*it = outChunk{}
	}
	o.n = 0
	if cap(o.ctl) > cap(s.spare) {
		s.spare = o.ctl[:0]
	}
	o.ctl = nil
}

// dropOut abandons s.out after a failed write (the session is dying):
// regions are released, finished transfers forgotten (cleanup fails
// their requests).
func (s *session) dropOut() {
	o := &s.out
	clear(s.iov[:])
	o.bufs = nil
	for i := range o.items[:o.n] {
		if r := o.items[i].reg; r != nil {
			r.release()
		}
		o.items[i] = outChunk{}
	}
	o.n = 0
	o.ctl = nil
}

// flush sends what a VELO sender queued: on the caller's goroutine when
// the writer is idle and no RMA transfer waits (see the head comment),
// else by kicking the writer. It never blocks on the socket. Frames
// other senders queue meanwhile need no look here: each of them kicks
// or flushes in turn.
func (s *session) flush() {
	if s.rc == nil || !s.wr.TryLock() {
		s.kick()
		return
	}
	if s.outPending {
		// The rest of an earlier flush's batch is still in s.out, for
		// the writer goroutine (kicked then): a new batch may neither
		// replace it nor go before it.
		s.wr.Unlock()
		s.kick()
		return
	}
	s.wmu.Lock()
	ok := len(s.bulk) == 0 && s.takeLocked()
	bulk := len(s.bulk) > 0
	s.wmu.Unlock()
	if !ok {
		s.wr.Unlock()
		if bulk {
			s.kick()
		}
		return
	}
	s.race.beforeWrite()
	s.werr, s.wdone = nil, false
	if err := s.rc.Control(s.onceFn); err != nil {
		s.werr = err
	}
	if err := s.werr; err != nil {
		s.dropOut()
		s.wr.Unlock()
		s.kill(fmt.Errorf("write: %w", err))
		return
	}
	done := s.wdone
	if done {
		s.wrote()
	} else {
		s.outPending = true
	}
	s.wr.Unlock()
	if !done {
		s.kick()
	}
}

// writeOnce is flush's RawConn.Control callback: writeRaw without the
// wait for writability; wdone says the batch is gone.
func (s *session) writeOnce(fd uintptr) { s.wdone = s.writeRaw(fd) && s.werr == nil }

// wrote counts and releases the batch just written (wr held).
func (s *session) wrote() {
	s.n.nctr.writes.Add(1)
	s.n.nctr.bytesOut.Add(uint64(s.out.nb))
	s.finishOut()
}

// writeLoop is the writer goroutine: woken by kick, it finishes a batch
// a flush began, then writes batches until the queue is empty. Each
// write has a deadline of DeadAfter, so a peer that stops reading cannot
// wedge it.
func (s *session) writeLoop() {
	for {
		select {
		case <-s.wake:
		case <-s.dead:
			return
		}
		if !s.writeRound() {
			return
		}
	}
}

// writeRound is one wake-up of the writer, holding wr; false once the
// session died.
func (s *session) writeRound() bool {
	s.wr.Lock()
	defer s.wr.Unlock()
	pending := s.outPending
	s.outPending = false
	for {
		if !pending {
			s.wmu.Lock()
			ok := s.takeLocked()
			s.wmu.Unlock()
			if !ok {
				return true
			}
		}
		pending = false
		s.conn.SetWriteDeadline(time.Now().Add(s.n.cfg.DeadAfter))
		s.race.beforeWrite()
		if err := s.writeOut(); err != nil {
			s.dropOut()
			s.kill(fmt.Errorf("write: %w", err))
			return false
		}
		s.wrote()
	}
}

// writeOut writes the batch in s.out.bufs, consuming it: with raw
// writevs on a socket (see session.rc), with conn's writev otherwise.
// The write deadline applies either way.
func (s *session) writeOut() error {
	if s.rc == nil {
		_, err := s.out.bufs.WriteTo(s.conn)
		return err
	}
	s.werr = nil
	err := s.rc.Write(s.writeFn)
	if err == nil {
		err = s.werr
	}
	return err
}

// writeRaw is writeOut's RawConn.Write callback: it writes until the
// batch is gone (true), the socket is full (false: the poller waits for
// writability and calls again) or an error (true, in s.werr).
func (s *session) writeRaw(fd uintptr) bool {
	for len(s.out.bufs) > 0 {
		n, err := s.wv.Write(int(fd), s.out.bufs)
		if err == sys.EAGAIN {
			return false
		}
		if err != nil {
			s.werr = fmt.Errorf("writev: %w", err)
			return true
		}
		consume(&s.out.bufs, n)
	}
	return true
}

// consume drops n written bytes from the front of *v.
func consume(v *net.Buffers, n int) {
	for len(*v) > 0 {
		l := len((*v)[0])
		if n < l {
			(*v)[0] = (*v)[0][n:]
			return
		}
		n -= l
		*v = (*v)[1:]
	}
}

// chunkLocked builds the next frame of b into hdr and fills it: the
// region (acquired until the write is done; wmu is held, and region
// acquires never block), whether this is b's last frame and whether a
// responder notification follows the write. It returns the frame header
// and the data, which aliases the region.
//
// A GET response whose responder notification must wait for the
// requester's get-done (needGetDone) goes into awaitDone here, before the
// frame leaves, so the get-done cannot overtake it; from then on the
// reader may finish and recycle b, so it.b stays nil and the caller must
// not touch b again.
func (s *session) chunkLocked(b *bulk, hdr []byte, it *outChunk) (h, data []byte) {
	*it = outChunk{}
	k := min(b.total-b.off, chunkSize)
	ok := b.reg.acquire()
	if ok {
		it.reg = b.reg
		start := b.src.Offset() + uint64(b.off)
		data = b.reg.buf[start : start+uint64(k)]
	}
	body := hdr[prefixSize:]
	if b.put {
		flags := uint8(b.notify) << flagShift
		if !ok {
			flags |= fLast | fAbort
			k = 0
			b.aborted = true
		} else if b.off+k == b.total {
			flags |= fLast
		}
		binary.LittleEndian.PutUint64(body[0:], b.reqID)
		binary.LittleEndian.PutUint64(body[8:], uint64(b.dst))
		binary.LittleEndian.PutUint32(body[16:], b.total)
		binary.LittleEndian.PutUint32(body[20:], b.off)
		putPrefix(hdr, 24+int(k), tPutData, flags, b.a, b.b)
		h = hdr[:prefixSize+24]
	} else {
		var flags uint8
		if !ok {
			flags = fLast | uint8(fabric.NErrAccess)<<flagShift
			k = 0
			b.aborted = true
		} else if b.off+k == b.total {
			flags = fLast
		}
		binary.LittleEndian.PutUint64(body[0:], b.reqID)
		binary.LittleEndian.PutUint32(body[8:], b.off)
		putPrefix(hdr, 12+int(k), tGetData, flags, b.a, b.b)
		h = hdr[:prefixSize+12]
	}
	b.off += k
	it.done = b.aborted || b.off == b.total
	if !it.done {
		return h, data
	}
	it.b = b
	if !b.put && !b.aborted && b.notify&fabric.NotifyResponder != 0 {
		if needGetDone(b.notify) {
			if s.awaitDone == nil {
				s.awaitDone = make(map[uint64]*bulk)
			}
			s.awaitDone[b.reqID] = b
			it.b = nil
		} else {
			it.respond = true
		}
	}
	return h, data
}

// needGetDone says whether a GET with these notification flags needs the
// get-done frame: only when the responder is notified and the requester
// is not. The responder notification means the responder's memory was
// read (Table 3.1), so it is written once the last chunk has left; but
// with no requester-side notification, it is the only event that says
// the GET is over, so then it also waits until the data has landed.
// Requester and responder decide this from the same flags (carried in
// the get-req), so they agree without a wire field.
func needGetDone(n fabric.Notify) bool {
	return n&fabric.NotifyResponder != 0 && n&(fabric.NotifyRequester|fabric.NotifyCompleter) == 0
}

package fabnet

// Session pipeline (one per connected peer, one TCP connection):
//
//	senders (Send, Post, the reader's replies, monitor heartbeats)
//	   │ queueCtl / queueVELO: encode into s.ctl (wmu)      queueBulk: s.bulk (wmu)
//	   │ then kick the writer: Send once per batch and node; the reader
//	   │ only when it is about to block on the socket (replyLater), so
//	   │ the replies to a burst of frames leave together
//	   ▼
//	writeLoop: swap s.ctl out, take up to writeChunks (8) chunks (64 KiB
//	   each) round-robin from the head transfers (an unfinished one goes
//	   back to the tail), then one writev of [ctl frames | chunk header |
//	   chunk data read straight from the registered region | ...]. Each
//	   region is acquired only for that writev; a GET response's responder
//	   notification is written after the writev of its last chunk (or, if
//	   needGetDone, when the requester's get-done arrives).
//	   On a TCP connection the writev is raw (sys.Writev through
//	   RawConn.Write; see writeOut), and so are the reader's reads
//	   (rawReader): no entersyscall, so sysmon never retakes the P of a
//	   long copy into or out of the socket.
//	readLoop: bufio reader (4 KiB) → decodePrefix (size checked before
//	   any read) → fixed header → dispatch. VELO lands in the target
//	   mailbox (credit checked), RMA data is read straight into the target
//	   region (acquired for that one read; only what the last 4 KiB read
//	   pulled in goes through the buffer), replies are queued to this
//	   session's writer. The reader never blocks on an application:
//	   credits guarantee mailbox room, notification queues drop on
//	   overflow, regions never block.
//	run: starts the writer, runs the reader, and on its exit kills the
//	   session, joins the writer, fails every outstanding RMA with
//	   NErrPeerDown and releases the credits the peer held.
//
// VELO flow control is credit based, per (peer node, target VPID): the
// receiver grants mailbox slots (grant frames), the sender spends one per
// message and asks for more (credit-req) at half its last grant. A sender
// without credits blocks; nothing is ever dropped for lack of room.
//
// Locks: wmu guards ctl, bulk and awaitDone; cmu guards tx and cwait (sender-side
// credit state); pmu guards the pending-RMA slab's free list, its growth
// and pdead. The reader alone touches putFail, rxMsg and the ackedClosed
// epochs. Lock order: endpoint mailbox mu → cmu → wmu → region mu
// (chunkLocked acquires regions; acquires never block); pmu is a leaf.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/sys"
)

const (
	// readBufSize is the reader's buffer. A read(2) into it fills it, so
	// whatever of an RMA chunk's payload follows the frame header in the
	// same read is copied twice (socket → buffer → region); only the rest
	// is read straight into the region (bufio reads spans of at least its
	// size directly). At 64 KiB nearly every chunk went through the buffer
	// (runtime.memmove 8 % of the receiving exnd in iperf3 over exn0); at
	// 4 KiB at most 4 KiB of a 64 KiB chunk does, and a burst of up to 30
	// VELO frames (136 B each) or 128 control frames still costs one read.
	readBufSize = 4 << 10
	// ctlInitial is the initial capacity of the control buffer and its
	// spare: a writer swaps the two, so queueing frames allocates only
	// when a batch outgrows every batch before it.
	ctlInitial = 16 << 10
	// writeChunks is the most RMA chunks one writev carries (with the
	// control frames queued meanwhile). A burst of GET requests (the
	// EXT-Eth engine keeps up to 64 frames in flight) is answered with
	// one writev per 512 KiB instead of per 64 KiB: each write on the
	// underlay costs a pass through its whole TCP stack. exnd CPU per GB
	// in iperf3 over exn0: 1 → 4 chunks −15 %, 4 → 8 −8 %, 8 → 16 −1.5 %
	// (within the noise, and it would double how long a VELO message
	// queued behind bulk data waits: at most eight chunks here).
	writeChunks = 8

	// maxBulkQueue bounds queued RMA transfers per session: the peer can
	// make us queue one per GET request it sends, so an endless stream of
	// requests is a protocol violation rather than unbounded memory.
	maxBulkQueue = 1 << 16
	// maxPutFail bounds PUT transfers with a failed chunk whose last chunk
	// has not arrived yet (a legitimate peer has at most its posted
	// transfers in that state).
	maxPutFail = 1 << 16
)

// txState is the sender side of one (peer, VPID) credit pair.
type txState struct {
	credits   int32
	lastGrant int32
	requested bool  // a credit-req is outstanding
	granted   bool  // some grant ever arrived (for SendBlocked)
	epoch     uint8 // closed frames seen for this VPID
	noVPID    uint32
	closedGen uint32
}

// pending is an RMA request this node posted to the peer.
type pending struct {
	idx   uint32
	gen   uint32
	used  bool
	ep    *endpoint
	req   fabric.RMA
	local *region
	got   uint32 // GET: bytes received so far (reader only)
	lerr  fabric.NotifyErr
}

// bulk is one queued RMA data transfer: PUT data (requester side) or a
// GET response (responder side).
type bulk struct {
	put        bool
	reqID      uint64
	reg        *region
	src        fabric.NLA // first byte to send (in reg)
	dst        fabric.NLA // PUT: remote start NLA, carried in frames
	total, off uint32
	notify     fabric.Notify
	a, b       fabric.VPID
	ep         *endpoint   // GET response: the responder, for its notification
	requester  fabric.Addr // GET response: who asked
	aborted    bool
}

var bulkPool = sync.Pool{New: func() any { return new(bulk) }}

type session struct {
	n    *NIC
	peer fabric.NodeID
	boot uint64
	conn net.Conn
	race raceSync
	// rc is conn's raw descriptor access when it has one (a TCP
	// connection; not net.Pipe in tests): the writer then writes each
	// batch with sys.Writev (raw writev, waiting for writability in the
	// netpoller on EAGAIN) instead of conn's writev. Writer only after
	// newSession.
	rc      syscall.RawConn
	wv      sys.Writev
	writeFn func(fd uintptr) bool // s.writeRaw, bound once (no allocation per batch)
	werr    error                 // writeRaw's error

	dead     chan struct{}
	deadFlag atomic.Bool
	killOnce sync.Once
	err      error // set once by kill, read after dead is closed

	framesIn   atomic.Uint64
	seenFrames uint64    // monitor only
	lastHeard  time.Time // monitor only

	wmu  sync.Mutex
	ctl  []byte  // encoded frames waiting for the writer
	bulk []*bulk // FIFO of data transfers
	// awaitDone holds GET responses whose last chunk was sent and whose
	// responder notification waits for the requester's get-done
	// (needGetDone), so the notification means the data has landed.
	awaitDone map[uint64]*bulk
	wake      chan struct{}

	// Writer goroutine only: the batch in flight, the spare control
	// buffer, writev's backing array (reused so writev does not
	// allocate) and the chunk headers.
	out   out
	spare []byte
	iov   [1 + 2*writeChunks][]byte
	hdr   [writeChunks][prefixSize + maxFixed]byte

	cmu   sync.Mutex
	tx    [256]txState
	cwait chan struct{} // made when a sender waits; closed on any credit event

	sentClosed  [256]atomic.Uint32 // closed frames sent per local VPID (low 8 bits on the wire)
	ackedClosed [256]uint8         // reader only: epoch of the peer's last credit-req

	pmu   sync.Mutex
	pend  []*pending
	free  []uint32
	pdead bool

	replyDue bool                        // reader only: queued frames wait for readFull
	putFail  map[uint64]fabric.NotifyErr // reader only
	rxMsg    fabric.Message              // reader only
	bodyBuf  [maxFixed]byte              // reader only
}

func newSession(n *NIC, c net.Conn, h hello) *session {
	s := &session{
		n: n, peer: h.node, boot: h.boot, conn: c, race: newRaceSync(c),
		dead:      make(chan struct{}),
		wake:      make(chan struct{}, 1),
		ctl:       make([]byte, 0, ctlInitial),
		spare:     make([]byte, 0, ctlInitial),
		lastHeard: n.cfg.Now(),
	}
	if sc, ok := c.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			s.rc, s.writeFn = rc, s.writeRaw
		}
	}
	return s
}

func (s *session) isDead() bool { return s.deadFlag.Load() }

// kill ends the session once: blocked senders wake (ErrPeerDown), the
// connection closes (the reader and writer return).
func (s *session) kill(err error) {
	s.killOnce.Do(func() {
		s.err = err
		s.deadFlag.Store(true)
		close(s.dead)
		s.conn.Close()
	})
}

func (s *session) run() {
	defer s.n.wg.Done()
	wdone := make(chan struct{})
	go func() {
		defer close(wdone)
		s.writeLoop()
	}()
	var src io.Reader = s.conn
	if s.rc != nil {
		src = newRawReader(s.rc)
	}
	err := s.readLoop(bufio.NewReaderSize(src, readBufSize))
	if errors.Is(err, errProto) {
		s.n.nctr.badFrames.Add(1)
		if errors.Is(err, errOversized) {
			s.n.nctr.oversized.Add(1)
		}
		s.n.ctr.Corrupt.Add(1)
		s.n.logFault("fabnet: peer broke the protocol, connection closed", "peer", s.peer, "err", err)
	}
	s.kill(err)
	<-wdone
	s.cleanup()
	s.race.release(s.conn)
	s.n.remove(s)
	s.n.nctr.sessionsDown.Add(1)
	s.n.cfg.Logger.Info("fabnet peer down", "node", s.n.id, "peer", s.peer, "err", s.err)
}

// cleanup runs after reader and writer stopped: outstanding RMA fails
// with NErrPeerDown, credits the peer held go back to the mailboxes.
func (s *session) cleanup() {
	s.pmu.Lock()
	s.pdead = true
	var fail []pending
	for _, p := range s.pend {
		if p.used {
			fail = append(fail, *p)
			p.used = false
		}
	}
	s.pmu.Unlock()
	for i := range fail {
		fail[i].ep.errorNotify(&fail[i].req, fabric.NErrPeerDown)
	}
	s.wmu.Lock()
	for _, b := range s.bulk {
		*b = bulk{}
		bulkPool.Put(b)
	}
	s.bulk = nil
	s.awaitDone = nil
	s.wmu.Unlock()
	for i := range s.n.eps {
		if ep := s.n.eps[i].Load(); ep != nil {
			ep.dropPeer(s)
		}
	}
}

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
	off := len(s.ctl)
	s.ctl = append(s.ctl, make([]byte, prefixSize+8)...)
	putPrefix(s.ctl[off:], 8+int(m.Len), tVELO, 0, a, m.Peer.VPID)
	binary.LittleEndian.PutUint64(s.ctl[off+prefixSize:], d.Encode())
	s.ctl = append(s.ctl, m.Data[:m.Len]...)
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
				b.ep.notify(fabric.Notification{Kind: fabric.KindResponder, Op: fabric.OpGet, Peer: b.requester, Len: b.total, Local: fabric.LastFrame(b.src, b.total)})
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

// writeLoop is the writer goroutine: woken by kick, it writes batches
// until the queue is empty. Each write has a deadline of DeadAfter, so a
// peer that stops reading cannot wedge it.
func (s *session) writeLoop() {
	for {
		select {
		case <-s.wake:
		case <-s.dead:
			return
		}
		for {
			s.wmu.Lock()
			ok := s.takeLocked()
			s.wmu.Unlock()
			if !ok {
				break
			}
			s.conn.SetWriteDeadline(time.Now().Add(s.n.cfg.DeadAfter))
			s.race.beforeWrite()
			if err := s.writeOut(); err != nil {
				s.dropOut()
				s.kill(fmt.Errorf("write: %w", err))
				return
			}
			s.n.nctr.writes.Add(1)
			s.n.nctr.bytesOut.Add(uint64(s.out.nb))
			s.finishOut()
		}
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

// rawReader reads a socket with raw read(2)s (sys.Read) through
// RawConn.Read, which waits for readability in the netpoller and honours
// the read deadline: the reader's copies, straight into regions for RMA
// chunks, then do not make sysmon retake its P (see sys.Writev). The
// reader goroutine only; it does not allocate per call.
type rawReader struct {
	rc  syscall.RawConn
	fn  func(fd uintptr) bool // r.read, bound once
	p   []byte
	n   int
	err error
}

func newRawReader(rc syscall.RawConn) *rawReader {
	r := &rawReader{rc: rc}
	r.fn = r.read
	return r
}

func (r *rawReader) read(fd uintptr) bool {
	n, err := sys.Read(int(fd), r.p)
	if err == sys.EAGAIN {
		return false
	}
	r.n, r.err = n, err
	return true
}

// Read implements io.Reader: io.EOF at the end of the stream.
func (r *rawReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r.p = p
	err := r.rc.Read(r.fn)
	r.p = nil
	switch {
	case err != nil:
		return 0, err
	case r.err != nil:
		return 0, fmt.Errorf("read: %w", r.err)
	case r.n == 0:
		return 0, io.EOF
	}
	return r.n, nil
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
	b.ep.notify(fabric.Notification{Kind: fabric.KindResponder, Op: fabric.OpGet, Peer: b.requester, Len: b.total, Local: fabric.LastFrame(b.src, b.total)})
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

// ---- reader ----

// readFull reads len(b) bytes. If that may block (not all of them are
// buffered), the replies the reader queued go out first: the reader never
// sleeps on the socket with frames of its own unsent.
func (s *session) readFull(br *bufio.Reader, b []byte) error {
	if s.replyDue && br.Buffered() < len(b) {
		s.replyDue = false
		s.kick()
	}
	if _, err := io.ReadFull(br, b); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	return nil
}

func (s *session) readLoop(br *bufio.Reader) error {
	var pb [prefixSize]byte
	for {
		if err := s.readFull(br, pb[:]); err != nil {
			return err
		}
		p, err := decodePrefix(pb[:])
		if err != nil {
			return err
		}
		body := s.bodyBuf[:fixedSize[p.typ]]
		if err := s.readFull(br, body); err != nil {
			return err
		}
		s.race.afterRead()
		s.framesIn.Add(1)
		s.n.nctr.framesIn.Add(1)
		if err := s.dispatch(br, p, body); err != nil {
			return err
		}
	}
}

func (s *session) dispatch(br *bufio.Reader, p prefix, body []byte) error {
	switch p.typ {
	case tHeartbeat:
		return nil
	case tVELO:
		return s.rxVELO(br, p, body)
	case tCreditReq:
		return s.rxCreditReq(p)
	case tGrant, tNoVPID, tClosed:
		return s.rxCredit(p, body)
	case tPutData:
		return s.rxPutData(br, p, body)
	case tPutAck:
		return s.rxPutAck(p, body)
	case tGetReq:
		return s.rxGetReq(p, body)
	case tGetData:
		return s.rxGetData(br, p, body)
	case tGetDone:
		return s.rxGetDone(body)
	}
	return fmt.Errorf("frame type %d: %w", p.typ, errProto)
}

func (s *session) rxVELO(br *bufio.Reader, p prefix, body []byte) error {
	d, err := fabric.DecodeDescriptor(binary.LittleEndian.Uint64(body))
	if err != nil {
		return fmt.Errorf("%w: %w", err, errProto)
	}
	if int(d.Len) != p.payloadLen() || d.VPID != p.b || (!d.MC && d.Node != 0) {
		return fmt.Errorf("velo descriptor %+v disagrees with frame: %w", d, errProto)
	}
	m := &s.rxMsg
	if err := s.readFull(br, m.Data[:d.Len]); err != nil {
		return err
	}
	m.Peer = fabric.Addr{Node: s.peer, VPID: p.a}
	m.MC, m.Tag, m.Len = d.MC, d.Tag, d.Len
	fenced := uint8(s.sentClosed[p.b].Load()) != s.ackedClosed[p.b]
	ep := s.n.eps[p.b].Load()
	if ep == nil {
		if fenced {
			s.n.nctr.staleVELO.Add(1)
			return nil
		}
		return fmt.Errorf("velo to vpid %d without credit: %w", p.b, errProto)
	}
	return ep.deliverRemote(s, m, fabric.Group(d.Node), fenced)
}

func (s *session) rxCreditReq(p prefix) error {
	v := p.b
	if p.flags != uint8(s.sentClosed[v].Load()) {
		return nil // sent before the peer saw our closed frame: it expects no answer
	}
	s.ackedClosed[v] = p.flags
	ep := s.n.eps[v].Load()
	if ep == nil || !ep.creditRequest(s) {
		s.queueCtl(tNoVPID, 0, 0, v, nil)
		s.replyLater()
	}
	return nil
}

// rxCredit handles the answers to our credit requests.
func (s *session) rxCredit(p prefix, body []byte) error {
	v := p.b
	s.cmu.Lock()
	t := &s.tx[v]
	switch p.typ {
	case tGrant:
		g := binary.LittleEndian.Uint32(body)
		if g == 0 || g > uint32(s.n.cfg.MailboxSlots) || !t.requested {
			s.cmu.Unlock()
			return fmt.Errorf("grant of %d for vpid %d (requested %v): %w", g, v, t.requested, errProto)
		}
		t.credits += int32(g)
		t.lastGrant = int32(g)
		t.granted = true
	case tNoVPID:
		if !t.requested {
			// Our request crossed the closed frame: already answered.
			s.cmu.Unlock()
			return nil
		}
		t.noVPID++
	case tClosed:
		t.credits = 0
		t.epoch++
		t.closedGen++
	}
	t.requested = false
	if s.cwait != nil {
		close(s.cwait)
		s.cwait = nil
	}
	s.cmu.Unlock()
	return nil
}

func (s *session) discard(br *bufio.Reader, n int) error {
	if s.replyDue && br.Buffered() < n {
		s.replyDue = false
		s.kick()
	}
	if _, err := br.Discard(n); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	return nil
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
		ep.notify(fabric.Notification{Kind: fabric.KindCompleter, Op: fabric.OpPut, Peer: fabric.Addr{Node: s.peer, VPID: p.a}, Len: total, Local: fabric.LastFrame(dst, total)})
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

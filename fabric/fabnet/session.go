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
// PUT order (fabric.PutOrderer): a VELO frame an endpoint sends after
// posting a PUT to the same peer is held (fence.go) until the PUT's last
// chunk has been taken into a batch, and then goes in a later batch: the
// stream carries it after the PUT's data, which the peer's reader places
// before it reads the next frame.
//
// Locks: wmu guards ctl, bulk, awaitDone and the fence state; cmu guards tx and cwait (sender-side
// credit state); pmu guards the pending-RMA slab's free list, its growth
// and pdead. The reader alone touches putFail, rxMsg and the ackedClosed
// epochs. Lock order: endpoint mailbox mu → cmu → wmu → region mu
// (chunkLocked acquires regions; acquires never block); pmu is a leaf.

import (
	"bufio"
	"errors"
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
	seq        uint64 // PUT: order among the session's PUTs (session.putSeq)
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
	onceFn  func(fd uintptr)      // s.writeOnce, bound once
	werr    error                 // writeRaw's and writeOnce's error
	wdone   bool                  // writeOnce wrote the whole batch

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
	// The PUT fence (fence.go): VELO frames an endpoint sent while a PUT
	// it posted earlier to this peer still had chunks to write wait in
	// fenced (encoded, in order; fences says where each ends, which VPID
	// sent it and which PUTs it waits for) until those PUTs' last chunks
	// were taken. putSeq numbers PUTs; openPuts counts each VPID's PUTs
	// with chunks left.
	fenced   []byte
	fences   []fence
	putSeq   uint64
	openPuts map[fabric.VPID]int
	// awaitDone holds GET responses whose last chunk was sent and whose
	// responder notification waits for the requester's get-done
	// (needGetDone), so the notification means the data has landed.
	awaitDone map[uint64]*bulk
	wake      chan struct{}

	// wr is the writer's role: the batch in flight, the spare control
	// buffer, writev's backing array (reused so writev does not
	// allocate) and the chunk headers are its holder's. The writer
	// goroutine holds it per round; a sender that finds it free writes
	// its control frames itself (flush). outPending: out holds the rest
	// of a batch such a sender began, for the writer goroutine.
	wr         sync.Mutex
	outPending bool
	out        out
	spare      []byte
	iov        [1 + 2*writeChunks][]byte
	hdr        [writeChunks][prefixSize + maxFixed]byte

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
			s.rc, s.writeFn, s.onceFn = rc, s.writeRaw, s.writeOnce
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
		s.n.faults.Warn("fabnet: peer broke the protocol, connection closed", "peer", s.peer, "err", err)
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
		fail[i].ep.ErrorNotify(&fail[i].req, fabric.NErrPeerDown)
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

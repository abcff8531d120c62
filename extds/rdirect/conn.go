package rdirect

// Conn: one direct connection's state across hosts, from this host.
//
// The local buffer is the program's (side S) and the engine's (side 1−S):
//
//	direction S   (program → peer): the program stores tail[S], fin[S];
//	              the engine stores head[S] and rd_closed[S] from the
//	              peer's CDCs, and arms cons_wait[S] when it parks.
//	direction 1−S (peer → program): the engine stores tail[1−S] and
//	              fin[1−S] from the peer's CDCs (after the peer's PUT of
//	              the bytes); the program stores head[1−S] and
//	              rd_closed[1−S]; the engine arms prod_wait[1−S] when it
//	              parks while the peer's writer is blocked.
//
// The engine keeps its own copies of what it stored and sent (recvTail,
// recvHead, sentTail, sentHead) and checks the buffer's values and the
// peer's against them: neither the program nor the peer is trusted.
// The header's upgrade word (upgW) both write, by CAS (upgrade.go).
//
// State and locks: rxMu guards the receive side (recvSeq, recvTail,
// recvHead, fins, early, gone) and the peer's address, fixed by Start;
// the pump owns the transmit side (putTail, annTail, sendSeq, upgSent,
// arming, hot); the flight ring (fabrics without PutOrderer) is under txMu,
// shared by the pump and rx. The atomics are what the other side reads.
// gone (set by Close under rxMu, after the pump let go of the Conn) means
// nobody touches the buffer or the bell any more.

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"

	"github.com/exn-project/exn/extds/dring"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/sys"
)

// Conn is one direct connection joined to its peer's copy. Its methods
// are safe for concurrent use.
type Conn struct {
	e        *Engine
	id       uint64
	side     int // the program's side S
	ring     uint64
	thresh   uint64 // window update threshold: ring/10
	putChunk uint64
	mem      []byte
	region   fabric.Region
	tx, rx   dring.Control  // directions S and 1−S
	upgW     *atomic.Uint32 // the upgrade word (upgrade.go)
	bell     int            // B_{1−S}: the engine parks on it and rings the program through it
	slot     int

	peer    fabric.Addr // fixed by Start (under rxMu, before started)
	peerID  uint64
	peerNLA fabric.NLA

	started     atomic.Bool
	dead        atomic.Bool // reset: nothing more moves
	rstPending  atomic.Bool // the peer must get rst (the pump sends it)
	closing     atomic.Bool
	queued      atomic.Bool // in the Engine's kick queue
	finSent     atomic.Bool
	rdcSentA    atomic.Bool // rd_closed went to the peer
	recvFinA    atomic.Bool
	peerBlocked atomic.Bool // the peer's latest CDC said its writer is blocked
	spaceArmed  atomic.Bool // prod_wait[1−S] is armed (the pump's, read by rx)
	sentTail    atomic.Uint64
	sentHead    atomic.Uint64
	recvTailA   atomic.Uint64 // copies of recvTail and recvHead for the pump,
	recvHeadA   atomic.Uint64 // stored before the buffer's
	detached    chan struct{} // closed by the pump when it let go (Close)
	done        chan struct{}
	doneOnce    sync.Once
	closeOnce   sync.Once
	closeErr    error

	rxMu         sync.Mutex
	gone         bool
	recvSeq      uint32
	recvTail     uint64
	recvHead     uint64
	recvFin      bool
	recvRdClosed bool
	early        early

	// The pump's.
	putTail     uint64 // bytes PUT (posted)
	annTail     uint64 // bytes announced in a CDC
	sendSeq     uint32
	upgSent     uint16 // upg and echo of the last CDC (upgNow)
	hot         bool   // in the pump's active list (disarmed)
	armedData   bool   // cons_wait[S] += 1 is ours
	armedSpace  bool   // prod_wait[1−S] += 1 is ours
	rdcSent     bool
	blockedSent bool
	detachDone  bool
	bellGone    bool            // the bell read end of file: out of the epoll set
	inlN        int             // bytes of inl the next CDC carries
	inl         [inlineMax]byte // a small write's bytes, copied out of the ring

	// PUTs awaiting their requester notification (without PutOrderer).
	txMu      sync.Mutex
	fl        [maxInflight]flight
	flHead    int
	flN       int
	completed uint64 // the announceable cursor: every PUT below it landed
}

// flight is one PUT awaiting its notification.
type flight struct {
	end  uint64     // the stream cursor after it
	last fabric.NLA // its notification's Local (fabric.LastFrame)
	done bool
}

// early is what arrived before Start: CDCs merged into one (their
// cursors are cumulative, their flags sticky but writer_blocked), checked
// in order, applied by Start.
type early struct {
	have  bool
	from  fabric.Addr
	c     cdc
	bad   Reason
	isBad bool
}

// Prepare makes a connection of the local buffer mem (a mapping of a
// whole buffer of layout version 3, already initialised by its creator;
// the caller owns the mapping and unmaps it only after Close), where the
// program is side side and the engine plays 1−side. bell is B_{1−side},
// the end of the connection's bell pair that the program's bell B_side
// is not (docs/direct.md, "One bell per side"): non-blocking, kept open
// by the caller until Close has returned, best out of Go's netpoller
// (dring.NewBells' are). It registers mem with the fabric (no copy) and
// watches the bell, one epoll registration. Nothing is sent before
// Start.
func (e *Engine) Prepare(mem []byte, side int, bell *os.File) (*Conn, error) {
	if side != 0 && side != 1 {
		return nil, fmt.Errorf("rdirect: side %d", side)
	}
	if bell == nil {
		return nil, errors.New("rdirect: no bell")
	}
	bfd, err := fdOf(bell)
	if err != nil {
		return nil, err
	}
	ring, err := dring.CheckMapped(mem)
	if err != nil {
		return nil, fmt.Errorf("rdirect: %w", err)
	}
	c := &Conn{
		e: e, side: side, ring: uint64(ring), thresh: uint64(ring) / 10, mem: mem, bell: bfd,
		putChunk: min(max(uint64(ring)/4, minPutChunk), fabric.MaxRMALen),
		detached: make(chan struct{}), done: make(chan struct{}),
	}
	if c.tx, err = dring.ControlOf(mem, side); err == nil {
		c.rx, err = dring.ControlOf(mem, 1-side)
	}
	if err == nil {
		c.upgW, err = dring.UpgradeWord(mem)
	}
	if err != nil {
		return nil, fmt.Errorf("rdirect: %w", err)
	}
	if c.region, err = e.reg.RegisterBuffer(mem); err != nil {
		return nil, fmt.Errorf("rdirect: register buffer: %w", err)
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		_ = e.ep.Deregister(c.region.NLA)
		return nil, errClosed("prepare")
	}
	c.id = e.nextID
	e.nextID++
	if e.nextID == 0 {
		e.nextID = 1
	}
	if n := len(e.free); n > 0 {
		c.slot = e.free[n-1]
		e.free = e.free[:n-1]
		e.slots[c.slot] = c
	} else {
		c.slot = len(e.slots)
		e.slots = append(e.slots, c)
	}
	e.conns[c.id] = c
	e.regions[c.region.NLA.Region()] = c
	e.mu.Unlock()
	if err := e.poll.Add(bfd, slotData(c.slot)); err != nil {
		c.unlist()
		return nil, fmt.Errorf("rdirect: %w", err)
	}
	return c, nil
}

// slotData is the epoll data of a connection's bell; 0 is the pump's
// own eventfd.
func slotData(slot int) uint32 { return uint32(slot + 1) }

// fdOf is f's descriptor, without touching its mode (sys.FileFD).
func fdOf(f *os.File) (int, error) {
	fd, err := sys.FileFD(f)
	if err != nil {
		return -1, fmt.Errorf("rdirect: bell: %w", err)
	}
	return fd, nil
}

// ringProgram writes one byte into B_{1−S}: the program's bell becomes
// readable. A program whose bell is gone (sys.ErrBellGone) is ignored:
// nobody is left to wake, and exnd ends the connection at the
// program's last close (E).
func (c *Conn) ringProgram() { _ = sys.RingSocketBell(c.bell) }

// Kick makes the engine look at the local buffer now: for a store in it
// that rang nothing (exnd's own fin, rd_closed or rst across hosts,
// where exnd holds no bell of the program's side). Safe from any
// goroutine; a no-op once the connection is closed.
func (c *Conn) Kick() {
	if !c.closing.Load() {
		c.e.kick(c)
	}
}

// unlist takes c out of the Engine's tables and deregisters its buffer.
func (c *Conn) unlist() error {
	e := c.e
	e.mu.Lock()
	delete(e.conns, c.id)
	delete(e.regions, c.region.NLA.Region())
	e.slots[c.slot] = nil
	e.free = append(e.free, c.slot)
	e.mu.Unlock()
	if e.epClosed.Load() {
		return nil // Engine.Close closed the endpoint: every region is released
	}
	// Deregister waits for RMA in flight on the buffer: once it returned
	// (or the endpoint closed) the caller may unmap it.
	err := e.ep.Deregister(c.region.NLA)
	if err != nil && (errors.Is(err, net.ErrClosed) || e.epClosed.Load()) {
		err = nil
	}
	return err
}

// LocalID is the connection's id on this node, for the peer's Start.
func (c *Conn) LocalID() uint64 { return c.id }

// LocalNLA is the NLA of the local buffer's base, for the peer's Start.
func (c *Conn) LocalNLA() fabric.NLA { return c.region.NLA }

// Ring is the ring size per direction.
func (c *Conn) Ring() int { return int(c.ring) }

// Done is closed when the connection has finished: fin went both ways
// (every byte of this side PUT and announced) or it was reset. Close
// resets a connection that has not finished.
func (c *Conn) Done() <-chan struct{} { return c.done }

func (c *Conn) finish() { c.doneOnce.Do(func() { close(c.done) }) }

// Start joins the connection to the peer's (node, its LocalID, its
// LocalNLA) and starts moving bytes. It is called once.
func (c *Conn) Start(peer fabric.NodeID, peerID uint64, peerNLA fabric.NLA) error {
	if peerID == 0 || peerNLA == 0 {
		return fmt.Errorf("rdirect: start: peer id %d, nla %v: %w", peerID, peerNLA, fabric.ErrInvalid)
	}
	c.rxMu.Lock()
	if c.gone || c.closing.Load() {
		c.rxMu.Unlock()
		return errClosed("start")
	}
	if c.started.Load() {
		c.rxMu.Unlock()
		return errors.New("rdirect: start: already started")
	}
	c.peer = fabric.Addr{Node: peer, VPID: VPID}
	c.peerID, c.peerNLA = peerID, peerNLA
	c.e.mu.RLock()
	closed := c.e.closed
	c.started.Store(!closed)
	c.e.mu.RUnlock()
	if closed {
		c.rxMu.Unlock()
		return errClosed("start")
	}
	if ea := c.early; ea.have {
		c.early = early{}
		switch {
		case ea.from != c.peer || ea.c.src != peerID:
			c.e.st.foreign.Add(1)
		case ea.isBad:
			c.resetLocked(ea.bad, true)
		default:
			c.recvSeq = ea.c.seq - 1
			c.applyLocked(&ea.c)
		}
	}
	c.rxMu.Unlock()
	c.e.kick(c)
	select {
	case c.e.liveKick <- struct{}{}:
	default:
	}
	return nil
}

// Reset resets the connection: rst in the local buffer (both directions,
// the program rung) and to the peer.
func (c *Conn) Reset() { c.reset(ReasonUser, true) }

// reset is Reset for reason r; tell sends rst to the peer.
func (c *Conn) reset(r Reason, tell bool) {
	c.rxMu.Lock()
	c.resetLocked(r, tell)
	c.rxMu.Unlock()
}

func (c *Conn) resetLocked(r Reason, tell bool) {
	if c.gone || c.dead.Swap(true) {
		return
	}
	e := c.e
	e.st.resets[r].Add(1)
	c.tx.Rst.Swap(1)
	c.rx.Rst.Swap(1)
	c.upgW.Or(dring.UpgGone) // a shim waiting for a grant stops (upgrade.go)
	c.ringProgram()
	c.finish()
	if r.violation() || r == ReasonLocal || r == ReasonFabric {
		e.faults.Warn("extds direct across hosts: connection reset", "id", c.id, "peer", c.peer.Node, "reason", r.String())
	} else {
		e.log.Debug("extds direct across hosts: connection reset", "id", c.id, "peer", c.peer.Node, "reason", r.String())
	}
	if tell {
		c.rstPending.Store(true)
		e.kick(c)
	}
}

// finished reports whether the connection ended cleanly or was reset.
func (c *Conn) finished() bool {
	return c.dead.Load() || (c.finSent.Load() && c.recvFinA.Load())
}

// Close forgets the connection and deregisters its buffer; it never
// unmaps it (the caller owns the mapping and may unmap it once Close
// returned). A connection that has not finished (Done) is reset first.
// Idempotent.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		if !c.finished() {
			c.reset(ReasonClose, true)
		}
		c.closing.Store(true)
		c.e.kick(c)
		select {
		case <-c.detached:
		case <-c.e.pumpDone:
			// The pump is gone (its Engine closed): nobody else uses
			// the pump's fields of c now.
			c.e.p.disarm(c)
		}
		c.rxMu.Lock()
		c.gone = true
		c.rxMu.Unlock()
		c.closeErr = c.unlist()
	})
	return c.closeErr
}

// from reports whether a message from a comes from c's peer.
func (c *Conn) from(a fabric.Addr) bool { return c.started.Load() && a == c.peer }

// receive handles a decoded CDC d for c from a (rx, or FuzzCDC). It holds
// rxMu.
func (c *Conn) receive(a fabric.Addr, d *cdc) {
	c.rxMu.Lock()
	defer c.rxMu.Unlock()
	e := c.e
	switch {
	case c.gone:
		e.st.unknown.Add(1)
	case !c.started.Load():
		c.mergeEarly(a, d)
	case a != c.peer || d.src != c.peerID:
		e.st.foreign.Add(1)
	case c.dead.Load():
		e.st.late.Add(1)
	case d.seq != c.recvSeq+1:
		c.resetLocked(ReasonSeq, true)
	default:
		c.applyLocked(d)
	}
}

// mergeEarly folds a CDC that arrived before Start into c.early, with the
// checks apply makes that need no state of Start's.
func (c *Conn) mergeEarly(a fabric.Addr, d *cdc) {
	ea := &c.early
	if !ea.have {
		*ea = early{have: true, from: a, c: cdc{src: d.src, dst: d.dst}}
	} else if a != ea.from || d.src != ea.c.src {
		c.e.st.foreign.Add(1)
		return
	}
	if ea.isBad {
		return
	}
	var bad Reason
	switch {
	case d.seq != ea.c.seq+1:
		bad = ReasonSeq
	case d.prod < ea.c.prod:
		bad = ReasonTailBack
	case d.prod > c.ring: // nothing was sent yet: the window is the ring
		bad = ReasonWindow
	case ea.c.flags&flagFin != 0 && d.prod != ea.c.prod:
		bad = ReasonAfterFin
	case d.cons < ea.c.cons:
		bad = ReasonHeadBack
	case d.cons > 0: // nothing was sent yet
		bad = ReasonHeadAhead
	case len(d.data) > 0 && d.prod-uint64(len(d.data)) != ea.c.prod:
		bad = ReasonData
	default:
		if len(d.data) > 0 {
			c.place(ea.c.prod, d.data) // published by Start's apply
		}
		ea.c.seq, ea.c.prod, ea.c.cons = d.seq, d.prod, d.cons
		ea.c.flags = ea.c.flags&(flagFin|flagRdClosed|flagRst) | d.flags
		ea.c.upg |= d.upg // the word's bits only accrue
		ea.c.echo |= d.echo
		return
	}
	ea.bad, ea.isBad = bad, true
}

// applyLocked checks the cursors of d, the next CDC of c's peer, and
// stores them in the local buffer as the peer side would, ringing the
// program where it parked; so for the upgrade word's bits
// (upgrade.go). Any violation resets c.
func (c *Conn) applyLocked(d *cdc) {
	e := c.e
	if d.flags&flagRst != 0 {
		c.recvSeq = d.seq
		c.resetLocked(ReasonPeerReset, false)
		return
	}
	sentHead, sentTail := c.sentHead.Load(), c.sentTail.Load()
	var bad Reason
	switch {
	case d.prod < c.recvTail:
		bad = ReasonTailBack
	case d.prod-sentHead > c.ring: // sentHead ≤ recvTail ≤ d.prod
		bad = ReasonWindow
	case c.recvFin && d.prod != c.recvTail:
		bad = ReasonAfterFin
	case d.cons < c.recvHead:
		bad = ReasonHeadBack
	case d.cons > sentTail:
		bad = ReasonHeadAhead
	case len(d.data) > 0 && d.prod-uint64(len(d.data)) != c.recvTail:
		bad = ReasonData
	case c.forgedGrant(d.echo):
		bad = ReasonUpgrade
	default:
		bad = NumReasons
	}
	if bad != NumReasons {
		c.resetLocked(bad, true)
		return
	}
	if len(d.data) > 0 {
		c.place(c.recvTail, d.data) // before the tail that publishes it
	}
	c.recvSeq = d.seq
	rang := store(&c.recvTail, &c.recvTailA, c.rx.Tail, d.prod)
	newFin := d.flags&flagFin != 0 && !c.recvFin
	if newFin {
		c.recvFin = true
		c.rx.Fin.Swap(1)
		rang = true
	}
	// One bell for the program's readers and writers: one ring for
	// either.
	ring := rang && c.rx.ConsWait.Load() > 0
	space := store(&c.recvHead, &c.recvHeadA, c.tx.Head, d.cons)
	if d.flags&flagRdClosed != 0 && !c.recvRdClosed {
		c.recvRdClosed = true
		c.tx.RdClosed.Swap(1)
		space = true
	}
	upg := c.upgradeLocked(d.upg, d.echo)
	if ring || space && c.tx.ProdWait.Load() > 0 || upg {
		c.ringProgram()
	}
	blocked := d.flags&flagBlocked != 0
	c.peerBlocked.Store(blocked)
	if blocked {
		e.st.peerBlocked.Add(1)
	}
	if newFin {
		c.recvFinA.Store(true)
		if c.finSent.Load() {
			c.finish()
		}
	}
	// The pump acts on a window update due now, or arms prod_wait[1−S]
	// so that the program's next read rings it.
	// A read side the program closed is told the peer now that it sends
	// (TCP answers data after the reader's close with a reset). A
	// changed upgrade word goes back to the peer.
	if upg {
		e.kick(c)
	} else if head, sh := c.rx.Head.Load(), c.sentHead.Load(); head != sh && (head-sh >= c.thresh || blocked) ||
		blocked && !c.spaceArmed.Load() || c.rx.RdClosed.Load() != 0 && !c.rdcSentA.Load() {
		e.kick(c)
	}
}

// place copies a CDC's own bytes, which start at stream position pos,
// into the inbound ring (direction 1−S), wrapping at its end. The caller
// checked that they lie inside the window (apply, mergeEarly) and holds
// rxMu; the tail that publishes them is stored after.
func (c *Conn) place(pos uint64, b []byte) {
	base := uint64(dring.DataOffset(int(c.ring), 1-c.side))
	off := pos & (c.ring - 1)
	n := copy(c.mem[base+off:base+c.ring], b)
	copy(c.mem[base:], b[n:])
}

// store publishes a cursor v from the peer that differs from the engine's
// own copy: own, the pump's copy (stored first: see service) and then the
// buffer's word (a Swap: docs/direct.md's Dekker pair with the waiter
// count loaded after). It reports whether anything moved.
func store(own *uint64, pumps, word *atomic.Uint64, v uint64) bool {
	if v == *own {
		return false
	}
	*own = v
	pumps.Store(v)
	word.Swap(v)
	return true
}

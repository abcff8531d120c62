package exn

// Engine lifecycle, counters and logging. The pipelines are in tx.go
// (Transmit → VELO fragments or advert) and rx.go (the NAPI receive loop).
//
// Goroutines, all owned by the Engine and joined by Close:
//
//	rxLoop   the only consumer of the endpoint: Recv, PollNotifications,
//	         reassembly, GETs, in-order delivery, housekeeping.
//	refuser  sends control messages: refusals (rx.go) for adverts rxLoop
//	         dropped, and hellos (caps.go). It is apart from rxLoop so the
//	         receive loop never blocks on a peer's full mailbox (two
//	         receive loops refusing to each other could otherwise
//	         deadlock).
//	ticker   while housekeeping has work (an advert armed or waiting, a
//	         partial frame, a non-empty source queue: needTicks), every
//	         housekeepingInterval swaps in a fresh tick context and fires
//	         the old one, which wakes rxLoop from ep.Wait so it runs
//	         housekeeping (advert timeouts, dead sources) without a
//	         per-Wait timer allocation. With nothing to keep it stops, so
//	         an idle engine has no timer (docs/wakeup.md); rxLoop (before
//	         it waits) and an advert being armed start it again
//	         (wantTicks), rxLoop stops it after a tick that left nothing.
//
// Callers' goroutines run Transmit.
//
// Close order: mark closed and close done (new Transmits fail, slot waiters
// wake); take memMu for writing once (no Transmit is still copying into
// registered memory); wait until no slot is lent (lend.go: no borrower is
// still filling registered memory); stop the ticker, which fires the last tick and wakes
// rxLoop; join both; then close the endpoint, which makes Transmits blocked
// in ep.Send return net.ErrClosed and releases the registered regions.

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/vnet"
)

const (
	// housekeepingInterval is how often (wall clock) the receive loop
	// checks advert deadlines and dead sources while there is anything to
	// check. It bounds how late an expired advert is reclaimed beyond
	// AdvertTimeout and how long a dead source's partial frames are held.
	housekeepingInterval = 100 * time.Millisecond

	// refusalQueue bounds refusals waiting to be sent. A refusal that
	// does not fit is counted (RefusalsLost) and the sender falls back to
	// its advert timeout, so the bound costs latency, never a slot.
	refusalQueue = 64

	// liveAdvertFactor: an expired advert to a peer that is still up is
	// reclaimed only after liveAdvertFactor × AdvertTimeout. A live peer
	// either pulls (responder notification) or refuses; reclaiming early
	// would let a slow but live receiver GET a slot already reused for
	// another frame. The hard limit still bounds a slot lost to a refusal
	// that never arrived.
	liveAdvertFactor = 8
	// logInterval is the least time between two log lines for one drop
	// reason; the counters always count.
	logInterval = time.Second
)

// Engine is one node's EXT-Eth engine. Its methods are safe for
// concurrent use.
type Engine struct {
	cfg      Config
	nic      fabric.NIC
	ep       fabric.Endpoint
	link     Link
	self     fabric.NodeID
	mac      [6]byte
	maxFrame int
	log      *slog.Logger
	ctr      counters
	lastLog  [NumDropReasons]atomic.Int64

	// Transmit side (tx.go).
	txMu  sync.Mutex               // serialises ep.Send; guards txSeq
	txSeq map[fabric.NodeID]uint16 // next advert sequence per receiver
	tx    txPool                   // slot states are atomic; free is a channel
	memMu sync.RWMutex             // R: copying into tx slots; W: Close barrier
	// Lent slots (lend.go): Close waits on lendCond for lent == 0.
	lendMu   sync.Mutex
	lendCond sync.Cond    // L is &lendMu
	lent     atomic.Int64 // slots lent and not yet returned or transmitted; changed under lendMu
	scratch  sync.Pool    // *txScratch
	msgCap   int          // scratch capacity in messages

	// Receive side (rx.go); touched only by rxLoop.
	rx rxState

	closed atomic.Bool
	done   chan struct{}
	// ctlq carries refusals and hellos to the refuser goroutine;
	// refuseCtx ends its blocked sends at Close.
	ctlq         chan ctlMsg
	refuseCtx    context.Context
	refuseCancel context.CancelFunc
	tick         atomic.Pointer[tickCtx]
	// tickWanted says the ticker should run; tickKick (capacity 1) starts
	// a stopped ticker. See wantTicks.
	tickWanted atomic.Bool
	tickKick   chan struct{}
	wg         sync.WaitGroup

	// Offload (offload.go, caps.go): caps is what this engine takes
	// (Config.Offload, 0 without an OffloadLink); peers is one word per
	// node ID; slotMax is the largest frame a slot holds.
	caps    uint8
	olink   OffloadLink
	peers   []atomic.Uint32
	slotMax int

	// Push (push.go): push is whether this engine pushes (Config.Push
	// and an endpoint that orders PUTs before sends); grants what its
	// receivers granted; pushStamp numbers its pushes; inc is this
	// engine's incarnation, named in its grants.
	push      bool
	grants    grantBook
	pushStamp atomic.Uint32
	inc       uint32
}

// New starts an engine on ep, which must be VPID fabric.EthVPID opened on
// nic. The engine takes ownership of ep: it is the endpoint's only
// receiver, and Close closes it. link receives the frames that arrive.
// New registers TxSlots and RxSlots max-frame buffers with ep.
func New(nic fabric.NIC, ep fabric.Endpoint, link Link, cfg Config) (*Engine, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	switch {
	case nic == nil || ep == nil || link == nil:
		return nil, fmt.Errorf("exn: new: nil nic, endpoint or link: %w", errConfig)
	case ep.Addr().VPID != fabric.EthVPID || ep.Addr().Node != nic.Node():
		return nil, fmt.Errorf("exn: new: endpoint %v is not %d:%d: %w", ep.Addr(), nic.Node(), fabric.EthVPID, errConfig)
	}
	e := &Engine{
		cfg:      cfg,
		nic:      nic,
		ep:       ep,
		link:     link,
		self:     nic.Node(),
		maxFrame: cfg.MTU + EthHeaderLen,
		log:      cfg.Logger,
		txSeq:    make(map[fabric.NodeID]uint16),
		done:     make(chan struct{}),
		ctlq:     make(chan ctlMsg, refusalQueue),
		peers:    make([]atomic.Uint32, 1<<16),
		tickKick: make(chan struct{}, 1),
	}
	e.lendCond.L = &e.lendMu
	e.slotMax = e.maxFrame
	if o, ok := ep.(fabric.PutOrderer); ok && cfg.Push {
		e.push = o.PutsBeforeSends()
	}
	e.inc = rand.Uint32()
	if cfg.Offload != 0 {
		ol, ok := link.(OffloadLink)
		if !ok {
			return nil, fmt.Errorf("exn: new: Offload %#x needs an OffloadLink: %w", cfg.Offload, errConfig)
		}
		e.caps, e.olink = cfg.Offload&capAll, ol
		e.slotMax = max(e.maxFrame, vnet.MaxGSOFrame)
	}
	e.refuseCtx, e.refuseCancel = context.WithCancel(context.Background())
	copy(e.mac[:], cfg.MACPrefix.MAC(e.self))
	e.msgCap = max(sendBatchMsgs, numFragments(e.maxFrame))
	e.scratch.New = func() any {
		return &txScratch{
			msgs: make([]fabric.Message, 0, e.msgCap),
			meta: make([]txMeta, 0, e.msgCap),
		}
	}
	if err := e.tx.init(ep, cfg.TxSlots, e.slotMax); err != nil {
		return nil, err
	}
	if err := e.rx.init(ep, &cfg, e.maxFrame, e.slotMax); err != nil {
		ep.Deregister(e.tx.region.NLA)
		return nil, err
	}
	e.tick.Store(newTick(0))
	e.wg.Add(3)
	go e.refuser()
	go e.rxLoop()
	go e.ticker()
	return e, nil
}

// Pushes reports whether this engine pushes rendezvous frames into its
// peers' grants (Config.Push on an endpoint that orders PUTs before
// sends, push.go).
func (e *Engine) Pushes() bool { return e.push }

// MAC returns this node's MAC address (a fresh copy).
func (e *Engine) MAC() net.HardwareAddr { return append(net.HardwareAddr(nil), e.mac[:]...) }

// Stats returns a snapshot of the counters. It takes no locks.
func (e *Engine) Stats() Stats {
	s := e.ctr.snapshot()
	// Lent slots are empty buffers a borrower holds, not frames in
	// flight; the two loads are not one snapshot, so clamp.
	s.TxSlotsLent = int(e.lent.Load())
	s.TxSlotsInUse = max(0, e.cfg.TxSlots-len(e.tx.free)-s.TxSlotsLent)
	return s
}

// Close stops the receive loop, closes the endpoint (releasing the
// registered pools) and makes blocked Transmit and Lend calls return
// net.ErrClosed. Before it releases the pools it waits until every buffer
// lent by Lend has come back (Return or TransmitLent): a borrower must be
// stopped before or during Close (see Lend). It is idempotent and returns
// after every goroutine the engine started has exited.
func (e *Engine) Close() error {
	if e.closed.Swap(true) {
		return nil
	}
	close(e.done)
	e.refuseCancel()
	e.memMu.Lock()
	e.memMu.Unlock() //nolint:staticcheck // a barrier: no copy into tx slots is in flight
	e.lendMu.Lock()
	for e.lent.Load() > 0 {
		e.lendCond.Wait() // lent slots may still be being filled
	}
	e.lendMu.Unlock()
	e.wg.Wait()
	if err := e.ep.Close(); err != nil {
		return fmt.Errorf("exn: close: %w", err)
	}
	return nil
}

// drop counts a drop and logs it at most once per logInterval per reason.
func (e *Engine) drop(r DropReason, node fabric.NodeID) {
	total := e.ctr.drops[r].Add(1)
	now := time.Now().UnixNano()
	last := e.lastLog[r].Load()
	if now-last < int64(logInterval) || !e.lastLog[r].CompareAndSwap(last, now) {
		return
	}
	e.log.LogAttrs(context.Background(), slog.LevelWarn, "exn: dropped",
		slog.String("reason", r.String()), slog.Int("node", int(node)), slog.Uint64("total", total))
}

// tickCtx is a context that is done when the ticker fires it. A fresh
// one per interval costs two allocations per housekeepingInterval
// instead of a timer per ep.Wait.
type tickCtx struct {
	gen  uint64
	done chan struct{}
}

func newTick(gen uint64) *tickCtx { return &tickCtx{gen: gen, done: make(chan struct{})} }

func (t *tickCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (t *tickCtx) Done() <-chan struct{}       { return t.done }
func (t *tickCtx) Value(any) any               { return nil }
func (t *tickCtx) Err() error {
	select {
	case <-t.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// ticker fires tick contexts every housekeepingInterval while tickWanted
// holds, and sleeps on tickKick otherwise.
func (e *Engine) ticker() {
	defer e.wg.Done()
	for {
		select {
		case <-e.done:
			close(e.tick.Load().done) // the last tick stays fired
			return
		case <-e.tickKick:
		}
		t := time.NewTicker(housekeepingInterval)
		for running := true; running; {
			select {
			case <-e.done:
				t.Stop()
				close(e.tick.Load().done)
				return
			case <-t.C:
				old := e.tick.Load()
				e.tick.Store(newTick(old.gen + 1))
				close(old.done)
				// rxLoop clears tickWanted after a tick that left
				// nothing to keep; a wantTicks since then set it again
				// (and its kick restarts us if we stop anyway).
				running = e.tickWanted.Load()
			}
		}
		t.Stop()
	}
}

// wantTicks makes sure the ticker runs. It is cheap when it already does
// (one atomic load), so the transmit path calls it for every armed advert.
func (e *Engine) wantTicks() {
	if e.tickWanted.Load() || !e.tickWanted.CompareAndSwap(false, true) {
		return
	}
	select {
	case e.tickKick <- struct{}{}:
	default: // a kick is pending already
	}
}

// ctlMsg is a control message for the refuser goroutine: a refusal (an
// advert rxLoop dropped, sent back to its sender) or a hello.
type ctlMsg struct {
	node  fabric.NodeID
	kind  fabric.Tag // tagRefuse or tagHello
	flags uint8      // hello flags
	adv   advert     // refusal
	// grant: ng buffer NLAs (push.go)
	grants [maxGrantNLAs]fabric.NLA
	ng     uint8
}

// queueCtl queues a control message without blocking; false if the queue
// is full.
func (e *Engine) queueCtl(c ctlMsg) bool {
	select {
	case e.ctlq <- c:
		return true
	default:
		return false
	}
}

// refuse queues a refusal without blocking the receive loop.
func (e *Engine) refuse(node fabric.NodeID, a advert) {
	if !e.queueCtl(ctlMsg{node: node, kind: tagRefuse, adv: a}) {
		e.ctr.refusalsLost.Add(1)
	}
}

// refuser sends queued control messages until Close.
func (e *Engine) refuser() {
	defer e.wg.Done()
	msg := make([]fabric.Message, 1)
	for {
		select {
		case <-e.done:
			return
		case r := <-e.ctlq:
			m := &msg[0]
			*m = fabric.Message{Peer: fabric.Addr{Node: r.node, VPID: fabric.EthVPID}, Tag: r.kind}
			if r.kind == tagGrant {
				m.Len = grantHdr + 8*r.ng
				binary.LittleEndian.PutUint32(m.Data[:grantHdr], e.inc)
				for i, a := range r.grants[:r.ng] {
					binary.LittleEndian.PutUint64(m.Data[grantHdr+8*i:], uint64(a))
				}
				if _, err := e.ep.Send(e.refuseCtx, msg); err == nil {
					e.ctr.grantsSent.Add(uint64(r.ng))
				}
				continue
			}
			if r.kind == tagHello {
				flags := r.flags
				if e.push {
					flags |= helloPush
				}
				m.Len = helloLen
				m.Data[0], m.Data[1], m.Data[2] = helloVersion, e.caps, flags
				if _, err := e.ep.Send(e.refuseCtx, msg); err != nil && r.flags&helloReply != 0 {
					e.peers[r.node].And(^uint32(peerHelloSent)) // say it again next time
				}
				continue
			}
			m.Len = advertLen
			r.adv.encode(m.Data[:advertLen])
			if _, err := e.ep.Send(e.refuseCtx, msg); err != nil {
				e.ctr.refusalsLost.Add(1)
				continue
			}
			e.ctr.refusalsSent.Add(1)
		}
	}
}

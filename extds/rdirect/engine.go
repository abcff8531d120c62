package rdirect

// Engine: one fabric endpoint (VPID) and the goroutines that join the
// local copies of direct connections' buffers to their peers' copies.
//
//	program writes direction S ──► tail[S] (local buffer)
//	   pump: PUT new bytes local buffer ──► peer buffer (same offsets),
//	         then a CDC (prod = tail) ─────────────► peer rx: checks,
//	                                                 stores tail[S], fin,
//	                                                 rings its program
//	peer program consumes ──► head[S] (peer buffer)
//	   peer pump: CDC (cons = head), batched ──────► rx: checks, stores
//	                                                 head[S], rings
//
// Goroutines, each started by New and stopped and waited for by Close:
// rx (rx.go: Recv CDCs, PollNotifications, park in ep.Wait), pump
// (pump.go: PUTs and CDCs, spin Config.Spin, then park on an epoll set of
// the connections' bells, B_{1−S} of each, which the programs ring
// through theirs, itself parked in Go's netpoller), and,
// with Config.Liveness, liveness (peer nodes going down).
//
// Locks (outer first): Conn.rxMu → Engine.mu → Engine.kmu; Conn.txMu is
// a leaf. No lock is held across a fabric call that may block (Send).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/ratelog"
	"github.com/exn-project/exn/internal/sys"
)

// VPID is the fabric VPID an Engine's endpoint uses on every node: 0 is
// EXT-Eth's, 1 fabric ping's, 16..31 EXT-DS's virtual devices, 32 and up
// leased to attached processes; 2 was free.
const VPID fabric.VPID = 2

// SpinBudget is how long the pump polls its active connections after its
// last work before it parks. Not dring.SpinBudget's 20 µs: measured
// (BenchmarkSpin, 2 vCPUs, both nodes in one process; docs/direct.md,
// "The engine's park and wake"), a spinning pump holds a CPU the reply's
// path needs: a 64-byte ping-pong took 26–29 µs with no spin, 32–36 µs
// with 5 µs and 88–92 µs with 20 µs, while 64-byte writes streamed back
// to back woke the pump (and rang a bell in the program) once per
// 780–4000 writes with no spin and once per 1900–8000 with 5 µs.
const SpinBudget = 5 * time.Microsecond

// DefaultLivenessPeriod is how often Config.Liveness is polled while
// connections are started, when it cannot announce changes
// (fabric.PeerWatcher): the fabrics' own idle liveness period, as
// extds/shimsrv's direct connections use.
const DefaultLivenessPeriod = time.Second

const (
	// maxInflight bounds one connection's PUTs awaiting their requester
	// notification (fabrics without fabric.PutOrderer).
	maxInflight = 32
	// maxInflightTotal bounds them over the Engine, well below the
	// notification queue's depth (fabric.DefaultNotifyDepth): the fabric
	// drops notifications that find the queue full.
	maxInflightTotal = 1024
	// minPutChunk and the ring's quarter bound one PUT, so that without
	// PutOrderer a large write is announced in pieces as they land.
	minPutChunk = 64 << 10
	// maxBatch is the most CDCs one Send carries.
	maxBatch = 64
	// maxEvents is the most ready bells one wake-up handles at once.
	maxEvents = 128
)

// Liveness is a node's view of the other nodes (fabric.NIC has it). If
// it is also a fabric.PeerWatcher, the Engine checks at each change of
// the peer set, with no timer.
type Liveness interface {
	Alive(n fabric.NodeID) error
}

// Config configures an Engine. The zero value works.
type Config struct {
	// Logger gets resets and faults (rate-limited); nil discards.
	Logger *slog.Logger
	// Spin is how long the pump spins before it parks; 0 is SpinBudget,
	// a negative value parks at once.
	Spin time.Duration
	// Liveness, if set, lets the Engine reset the connections of a peer
	// node the fabric declares down while nothing is sent to it.
	// Without it, a dead peer is found by the next Send or PUT to it.
	Liveness Liveness
	// LivenessPeriod is the poll period of a Liveness that is not a
	// fabric.PeerWatcher; 0 is DefaultLivenessPeriod.
	LivenessPeriod time.Duration
}

// Reason says why a connection was reset.
type Reason uint8

const (
	ReasonMalformed Reason = iota // an undecodable CDC from the connection's peer
	ReasonSeq                     // a CDC whose sequence number is not the next (replay, loss)
	ReasonTailBack                // the peer's producer cursor went backwards
	ReasonWindow                  // the peer's producer cursor ran past the window it was given
	ReasonAfterFin                // the peer's producer cursor moved after its fin
	ReasonHeadBack                // the peer's consumer cursor went backwards
	ReasonHeadAhead               // the peer's consumer cursor passed what was sent
	ReasonData                    // a CDC's own bytes do not start where the stream is
	ReasonUpgrade                 // a CDC granted the program a move it never asked for (upgrade.go)
	ReasonLocal                   // the local buffer's cursors broke the invariants
	ReasonFabric                  // a PUT's error notification, or a failed Post or Send
	ReasonPeerDown                // the peer node is down
	ReasonPeerReset               // the peer sent rst
	ReasonProgram                 // rst stored in the local buffer (the program, or exnd)
	ReasonUser                    // Conn.Reset
	ReasonClose                   // Conn.Close before the connection finished, or Engine.Close
	NumReasons
)

var reasonNames = [NumReasons]string{
	"malformed", "seq", "tail-back", "window", "after-fin", "head-back", "head-ahead",
	"data", "upgrade", "local", "fabric", "peer-down", "peer-reset", "program", "user", "close",
}

func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// violation reports whether r is a check of a peer's CDC that failed.
func (r Reason) violation() bool { return r <= ReasonUpgrade }

// Stats are an Engine's counters since New.
type Stats struct {
	CDCsSent, CDCsRecv  uint64
	Updates             uint64 // CDCs sent for a consumer cursor (window update) alone
	PeerBlocked         uint64 // CDCs received saying the peer's writer is blocked
	Puts, PutBytes      uint64
	Inline, InlineBytes uint64 // CDCs that carried the stream's bytes themselves, and those bytes
	Wakes, Parks        uint64 // the pump's
	Unknown             uint64 // CDCs naming no connection here (dropped)
	Foreign             uint64 // CDCs naming a connection from another sender (dropped)
	Late                uint64 // CDCs for a connection already reset (dropped)
	Resets              [NumReasons]uint64
	Conns               int // prepared and not closed
}

type counters struct {
	cdcsSent, cdcsRecv, updates, peerBlocked atomic.Uint64
	puts, putBytes, wakes, parks             atomic.Uint64
	inline, inlineBytes                      atomic.Uint64
	unknown, foreign, late                   atomic.Uint64
	resets                                   [NumReasons]atomic.Uint64
}

// Engine moves the bytes of direct connections across hosts. Its methods
// are safe for concurrent use.
type Engine struct {
	ep      fabric.Endpoint
	reg     fabric.BufferRegistrar
	ordered bool // fabric.PutOrderer says true: a CDC may follow its PUTs at once
	spin    time.Duration
	cfg     Config
	log     *slog.Logger
	faults  ratelog.Faults
	ctx     context.Context
	cancel  context.CancelFunc
	poll    *sys.Epoll
	bell    *sys.Eventfd // the pump's own bell: kicks while it is parked
	p       *pump

	mu      sync.RWMutex
	conns   map[uint64]*Conn // by LocalID
	regions map[uint32]*Conn // by region index
	slots   []*Conn          // by epoll slot
	free    []int
	closed  bool
	nextID  uint64

	kmu     sync.Mutex
	kq      []*Conn
	pending atomic.Bool // kq or a stop waits for the pump
	parked  atomic.Bool
	stop    atomic.Bool

	epClosed atomic.Bool // ep.Close returned: no region is left

	inflight atomic.Int64
	capWait  atomic.Bool

	liveKick  chan struct{}
	pumpDone  chan struct{}
	closeOnce sync.Once
	closeErr  error
	wg        sync.WaitGroup
	st        counters
}

// New starts an Engine on ep, which it owns from here (Close closes it;
// on error New closes it too). ep must implement fabric.BufferRegistrar;
// otherwise the error wraps errors.ErrUnsupported.
func New(ep fabric.Endpoint, cfg Config) (*Engine, error) {
	reg, ok := ep.(fabric.BufferRegistrar)
	if !ok {
		ep.Close()
		return nil, fmt.Errorf("rdirect: endpoint %T cannot register a caller's buffer: %w", ep, errors.ErrUnsupported)
	}
	e := &Engine{
		ep: ep, reg: reg, cfg: cfg, log: cfg.Logger,
		conns: map[uint64]*Conn{}, regions: map[uint32]*Conn{},
		nextID:   rand.Uint64()>>1 | 1, // a restarted exnd's ids do not meet its predecessor's
		liveKick: make(chan struct{}, 1),
		pumpDone: make(chan struct{}),
	}
	if e.log == nil {
		e.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	e.faults.Init(e.log, 0, "node", ep.Addr().Node)
	if o, ok := ep.(fabric.PutOrderer); ok {
		e.ordered = o.PutsBeforeSends()
	}
	switch {
	case cfg.Spin == 0:
		e.spin = SpinBudget
	case cfg.Spin > 0:
		e.spin = cfg.Spin
	}
	var err error
	if e.poll, err = sys.NewEpoll(maxEvents); err != nil {
		ep.Close()
		return nil, fmt.Errorf("rdirect: %w", err)
	}
	if e.bell, err = sys.NewEventfd(); err == nil {
		err = e.poll.Add(e.bell.FD(), 0)
	}
	if err != nil {
		e.poll.Close()
		if e.bell != nil {
			e.bell.Close()
		}
		ep.Close()
		return nil, fmt.Errorf("rdirect: %w", err)
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.p = newPump(e)
	e.wg.Add(2)
	go e.rxLoop()
	go func() {
		defer e.wg.Done()
		defer close(e.pumpDone)
		e.p.run()
	}()
	if cfg.Liveness != nil {
		e.wg.Add(1)
		go e.liveness()
	}
	return e, nil
}

// Addr is the Engine's fabric address.
func (e *Engine) Addr() fabric.Addr { return e.ep.Addr() }

// Stats returns a snapshot of the counters.
func (e *Engine) Stats() Stats {
	s := Stats{
		CDCsSent: e.st.cdcsSent.Load(), CDCsRecv: e.st.cdcsRecv.Load(),
		Updates: e.st.updates.Load(), PeerBlocked: e.st.peerBlocked.Load(),
		Puts: e.st.puts.Load(), PutBytes: e.st.putBytes.Load(), Inline: e.st.inline.Load(), InlineBytes: e.st.inlineBytes.Load(),
		Wakes: e.st.wakes.Load(), Parks: e.st.parks.Load(),
		Unknown: e.st.unknown.Load(), Foreign: e.st.foreign.Load(), Late: e.st.late.Load(),
	}
	for i := range s.Resets {
		s.Resets[i] = e.st.resets[i].Load()
	}
	e.mu.RLock()
	s.Conns = len(e.conns)
	e.mu.RUnlock()
	return s
}

// kick queues c for the pump and wakes it if it is parked. Safe from any
// goroutine; it does not allocate once the queue has grown.
func (e *Engine) kick(c *Conn) {
	if c.queued.Swap(true) {
		return
	}
	e.kmu.Lock()
	e.kq = append(e.kq, c)
	e.kmu.Unlock()
	e.wake()
}

// wake makes a parked pump look at its queue (the Dekker pair with park:
// pending is stored before parked is loaded, parked before pending).
func (e *Engine) wake() {
	e.pending.Swap(true)
	if e.parked.Load() {
		_ = e.bell.Signal()
	}
}

// lookup returns the connection with LocalID id, or nil.
func (e *Engine) lookup(id uint64) *Conn {
	e.mu.RLock()
	c := e.conns[id]
	e.mu.RUnlock()
	return c
}

// resetNode resets every started connection to node, which is down:
// nothing is sent to it.
func (e *Engine) resetNode(node fabric.NodeID) {
	var cs []*Conn
	e.mu.RLock()
	for _, c := range e.conns {
		if c.started.Load() && c.peer.Node == node && !c.dead.Load() {
			cs = append(cs, c)
		}
	}
	e.mu.RUnlock()
	for _, c := range cs {
		c.reset(ReasonPeerDown, false)
	}
}

// liveness resets the connections of peer nodes the fabric declares
// down: at each change of the peer set (fabric.PeerWatcher, no timer),
// or polled every LivenessPeriod while connections are started.
func (e *Engine) liveness() {
	defer e.wg.Done()
	pw, watch := e.cfg.Liveness.(fabric.PeerWatcher)
	period := e.cfg.LivenessPeriod
	if period <= 0 {
		period = DefaultLivenessPeriod
	}
	var timer *time.Timer
	if !watch {
		timer = time.NewTimer(period)
		timer.Stop()
		defer timer.Stop()
	}
	var nodes []fabric.NodeID
	for {
		var changed <-chan struct{}
		var tick <-chan time.Time
		if watch {
			changed = pw.PeersChanged() // before the check: no change is missed
		}
		nodes = nodes[:0]
		e.mu.RLock()
		for _, c := range e.conns {
			if c.started.Load() && !c.dead.Load() {
				nodes = append(nodes, c.peer.Node)
			}
		}
		e.mu.RUnlock()
		for i, n := range nodes {
			if !seen(nodes[:i], n) && e.cfg.Liveness.Alive(n) != nil {
				e.resetNode(n)
			}
		}
		if !watch && len(nodes) > 0 {
			timer.Reset(period)
			tick = timer.C
		}
		select {
		case <-e.ctx.Done():
			return
		case <-changed:
		case <-tick:
		case <-e.liveKick:
			if timer != nil {
				timer.Stop()
			}
		}
	}
}

func seen(ns []fabric.NodeID, n fabric.NodeID) bool {
	for _, x := range ns {
		if x == n {
			return true
		}
	}
	return false
}

// Close resets the open connections (their peers get rst), stops and
// waits for the goroutines and closes the endpoint, which releases every
// registered buffer: the caller may unmap them once Close returned. A
// Conn's methods then return net.ErrClosed, except Close. Idempotent.
func (e *Engine) Close() error {
	e.closeOnce.Do(func() {
		e.mu.Lock()
		e.closed = true
		cs := make([]*Conn, 0, len(e.conns))
		for _, c := range e.conns {
			cs = append(cs, c)
		}
		e.mu.Unlock()
		for _, c := range cs {
			c.reset(ReasonClose, true)
		}
		e.stop.Swap(true)
		e.wake()
		select {
		case <-e.pumpDone: // it sent the rsts (bounded: pump.final)
		case <-time.After(2 * time.Second):
		}
		e.cancel()
		errs := []error{e.ep.Close()}
		e.epClosed.Store(true)
		e.wg.Wait()
		errs = append(errs, e.poll.Close(), e.bell.Close())
		e.closeErr = errors.Join(errs...)
	})
	return e.closeErr
}

// errClosed is the error of a call on a closed Engine or Conn.
func errClosed(op string) error {
	return &net.OpError{Op: op, Net: "extds-rdirect", Err: net.ErrClosed}
}

// ResetsByReason is Resets keyed by each reason's name, every reason
// present (for the "stats" operation and metrics).
func (s Stats) ResetsByReason() map[string]uint64 {
	m := make(map[string]uint64, NumReasons)
	for r := range NumReasons {
		m[r.String()] = s.Resets[r]
	}
	return m
}

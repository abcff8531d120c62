package agree

// The Agent: its state, what it needs from the Device (Host), the rx
// loop's entry (Handle), and how it asks a peer (ask).
//
// Locks (each file repeats the part it uses): claims.mu guards the claim
// table (claim.go, claimdirect.go, hold.go); pmu guards ports, probes and
// nextTok (probe.go); negMu guards the client's caches, neg and held.
// All three are leaf locks except that claims.mu may be held while
// taking pmu (onClaim); nothing is sent or waited for under any of them,
// and the Host is called under one only to Queue and Warn, which take no
// Device lock.

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exn-project/exn/extds/internal/wire"
	"github.com/exn-project/exn/fabric"
)

// Host is what the Agent needs from the Device: its virtual devices
// (vdevs, 0..15, the low 4 bits of a port) and its log. The Agent names a
// vdev by its index and never holds a Device lock.
type Host interface {
	// Open opens vdev v if it is not open yet (its rx loop then hands
	// this node's messages to Handle). Its error is the Device's:
	// net.ErrClosed once closed, or the endpoint's.
	Open(v int) error
	// Closed reports whether the Device was closed.
	Closed() bool
	// Send sends fm from vdev v (open) at once, bounded by ctx only.
	Send(ctx context.Context, v int, fm *[1]fabric.Message) error
	// Queue hands c to the control sender, to go from vdev v. It never
	// blocks (a full queue is the Device's counted drop): the rx loop
	// and callers under a leaf lock use it.
	Queue(v int, c wire.Ctl)
	// Warn logs, rate-limited with the Device's other per-message lines.
	Warn(msg string, args ...any)
}

// Resolver maps a peer IP to its fabric node (extds.Resolver).
type Resolver interface {
	Resolve(ip netip.Addr) (node fabric.NodeID, ok bool)
}

// Config is the Device's settings the Agent uses; fixed once New has it.
type Config struct {
	// Resolver checks that a CLAIM's client IP is on the CLAIM's source
	// node (nil: not checked).
	Resolver Resolver
	// ProbeBase is the first VPID of the block peers' questions go to.
	ProbeBase fabric.VPID
	// ProbeTimeout and ClaimTimeout bound a client's wait for
	// PROBE_REPLY and CLAIM_REPLY.
	ProbeTimeout, ClaimTimeout time.Duration
	// HandshakeTimeout bounds the acceptor's wait for COMMIT.
	HandshakeTimeout time.Duration
	// SendTimeout bounds one Send of a message whose sender waits on its
	// effect (CLAIM_DIRECT, COMMIT).
	SendTimeout time.Duration
	// NegativeTTL is how long an address stays in the negative cache.
	NegativeTTL time.Duration
	// PortHook, if set, also announces a port registered by
	// RegisterPort elsewhere; its unregister runs with the port's.
	PortHook func(port uint16) (unregister func(), err error)
}

// Agent is a node's side of the out-of-band agreement: the ports it
// serves, the claims of its acceptors, its holds, its questions to
// peers (probes, claims) waiting for their answers, and the client's
// caches. Its methods are safe for concurrent use.
type Agent struct {
	host Host
	cfg  Config
	ctx  context.Context // the Device's: done once it closes
	ctr  counters

	claims claimTable // claim.go

	pmu     sync.RWMutex
	ports   map[uint16]int // registered listener ports → registrations
	probes  map[uint32]*probeWait
	nextTok uint32

	negMu sync.Mutex
	neg   map[string]time.Time // address → until: no EXT-DS there
	held  heldPeers            // server → until: on hold (hold.go)
}

// New returns the Agent of a Device; ctx ends when the Device closes.
func New(host Host, cfg Config, ctx context.Context) *Agent {
	a := &Agent{host: host, cfg: cfg, ctx: ctx,
		ports: make(map[uint16]int), probes: make(map[uint32]*probeWait),
		neg: make(map[string]time.Time), held: make(heldPeers)}
	a.claims.init()
	return a
}

// counters is the atomic block behind Stats.
type counters struct {
	probes, probeTimeouts atomic.Uint64
	probesServed          atomic.Uint64
	directAgreed          atomic.Uint64
	handshakeErr          atomic.Uint64
	drops                 atomic.Uint64
}

// Stats is a snapshot of the Agent's counters; the Device's Stats
// include them.
type Stats struct {
	Probes          uint64 // PROBEs and CLAIMs sent
	ProbeTimeouts   uint64 // of those, unanswered
	ProbesServed    uint64 // PROBEs and CLAIMs from peers answered
	DirectAgreed    uint64 // direct connections committed (accepting side)
	HandshakeErrors uint64 // direct agreements that failed after an answer
	Drops           uint64 // messages that matched nothing (the Device's "probe" drops)
}

// Stats returns a snapshot of the counters.
func (a *Agent) Stats() Stats {
	c := &a.ctr
	return Stats{
		Probes: c.probes.Load(), ProbeTimeouts: c.probeTimeouts.Load(), ProbesServed: c.probesServed.Load(),
		DirectAgreed: c.directAgreed.Load(), HandshakeErrors: c.handshakeErr.Load(), Drops: c.drops.Load(),
	}
}

// drop counts and logs (rate-limited) a message that matches nothing.
func (a *Agent) drop(args ...any) {
	a.ctr.drops.Add(1)
	a.host.Warn("extds: drop probe", args...)
}

// handlers holds, by tag, the handler of a message addressed to the node
// rather than to a connection; nil for every other tag. Method
// expressions: nothing is allocated per message.
var handlers = [256]func(*Agent, int, fabric.Addr, *wire.Msg){
	wire.TagProbe:        (*Agent).onProbe,
	wire.TagProbeRep:     (*Agent).onProbeReply,
	wire.TagClaim:        (*Agent).onClaim,
	wire.TagClaimRep:     (*Agent).onClaimReply,
	wire.TagClaimDirect:  (*Agent).onClaimDirect,
	wire.TagCommit:       (*Agent).onCommit,
	wire.TagClaimRDirect: (*Agent).onClaimRDirect,
	wire.TagCommitR:      (*Agent).onCommitR,
}

// Handles reports whether a message with tag is the Agent's (Handle).
func Handles(tag fabric.Tag) bool { return handlers[tag] != nil }

// Handle handles m (Handles(m.Tag)), which vdev v received from the
// fabric address from. It runs on the rx loop and never blocks.
func (a *Agent) Handle(v int, from fabric.Addr, m *wire.Msg) { handlers[m.Tag](a, v, from, m) }

// askTarget returns the vdev a question about port is sent from (that of
// localPort, the asker's side of the shadow connection), opened, and the
// address it goes to: VPID ProbeBase + (port & 0xF) on node.
func (a *Agent) askTarget(node fabric.NodeID, localPort, port uint16) (int, fabric.Addr, error) {
	v := int(localPort & 0xF)
	if err := a.host.Open(v); err != nil {
		return 0, fabric.Addr{}, err
	}
	return v, fabric.Addr{Node: node, VPID: a.cfg.ProbeBase + fabric.VPID(port&0xF)}, nil
}

// askResult says how a question to a peer's Device ended.
type askResult uint8

const (
	askAnswered askResult = iota // the answer came
	askUnsent                    // the Send failed: unknown node or vdev, peer down, mailbox stuck
	askTimeout                   // no answer in time (counted)
)

// ask sends the question fm (a PROBE or a CLAIM) from vdev v and waits at
// most timeout for the answer the rx loop puts on ch. err is non-nil only
// when ctx ended or the Device closed; otherwise res says whether ans is
// an answer. No lock is held.
func ask[T any](ctx context.Context, a *Agent, v int, timeout time.Duration, fm *[1]fabric.Message, ch <-chan T) (ans T, res askResult, err error) {
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	a.ctr.probes.Add(1)
	if err := a.host.Send(actx, v, fm); err != nil {
		if ctx.Err() != nil {
			return ans, 0, ctx.Err()
		}
		if errors.Is(err, net.ErrClosed) {
			return ans, 0, err
		}
		return ans, askUnsent, nil
	}
	select {
	case ans = <-ch:
		return ans, askAnswered, nil
	case <-actx.Done():
		if ctx.Err() != nil {
			return ans, 0, ctx.Err()
		}
		a.ctr.probeTimeouts.Add(1)
		return ans, askTimeout, nil
	case <-a.ctx.Done():
		return ans, 0, net.ErrClosed
	}
}

// sendNow sends fm from vdev v at once, on the caller's goroutine,
// bounded by SendTimeout and ctx: a message whose sender waits on its
// effect (the control sender's queue is for the rx loop's answers).
func (a *Agent) sendNow(ctx context.Context, v int, fm *[1]fabric.Message) error {
	sctx, cancel := context.WithTimeout(ctx, a.cfg.SendTimeout)
	defer cancel()
	return a.host.Send(sctx, v, fm)
}

// FreeID returns the next ID after *next that is neither 0 nor in use in
// m, and leaves it in *next. IDs count up and skip live ones, so a stale
// ID (of a connection, probe or claim) comes back only after 2^32
// others. The Device numbers its connections with it too.
func FreeID[V any](next *uint32, m map[uint32]V) uint32 {
	for {
		*next++
		if _, used := m[*next]; *next != 0 && !used {
			return *next
		}
	}
}

// dropWait removes the waiter filed under tok (by FreeID) from m, which
// mu guards: what an asker does once its question is answered or given
// up.
func dropWait[V any](mu sync.Locker, m map[uint32]V, tok uint32) {
	mu.Lock()
	delete(m, tok)
	mu.Unlock()
}

// uncount returns the unregister of one counted registration of port in
// ports (guarded by mu): it takes the registration back, the port's entry
// with the last one, then runs after. It is idempotent.
func uncount(mu sync.Locker, ports map[uint16]int, port uint16, after func()) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			mu.Lock()
			if ports[port]--; ports[port] <= 0 {
				delete(ports, port)
			}
			mu.Unlock()
			after()
		})
	}
}

// timeLeft is the time from now until m[k]; 0 if there is no entry, and
// an entry that has passed is deleted. The caller guards m.
func timeLeft[K comparable](m map[K]time.Time, k K, now time.Time) time.Duration {
	until, ok := m[k]
	if !ok {
		return 0
	}
	if left := until.Sub(now); left > 0 {
		return left
	}
	delete(m, k)
	return 0
}

// TupleKey is a TCP connection as the server sees it: its local
// (listening) address and the client's address (extds.TupleKey).
type TupleKey struct {
	Local, Remote netip.AddrPort
}

func normAP(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

// norm is k with IPv4-mapped addresses unmapped, as the table keys it.
func (k TupleKey) norm() TupleKey { return TupleKey{normAP(k.Local), normAP(k.Remote)} }

// DirectInfo names a direct connection's shared buffer (extds.DirectInfo).
type DirectInfo struct {
	Node  fabric.NodeID
	Token uint32
	ID    uint64
	Ring  uint32
	// Across hosts (issue #38; CLAIM_RDIRECT, COMMIT_R): each node has
	// its own copy of the buffer, joined by exnd's engine
	// (extds/rdirect). ID is then the accepting exnd's engine connection
	// and NLA its buffer's base; ClientID and ClientNLA are the
	// connecting exnd's, which its open hook fills in and its COMMIT_R
	// carries.
	Remote     bool
	NLA        fabric.NLA
	ClientID   uint64
	ClientNLA  fabric.NLA
	ClientNode fabric.NodeID // the acceptor's result only: the node the COMMIT_R came from
}

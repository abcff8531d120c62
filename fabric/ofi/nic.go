//go:build ofi && cgo

package ofi

// NIC pipeline (one libfabric RDM endpoint per node, VPIDs demultiplexed
// in software):
//
//	Send ──► pair credits (pair.mu) ──► send slot (txFree) ──► fi_send
//	Recv ◄── mailbox (endpoint.mu) ◄── progress: rx completion, header
//	         check against FI_SOURCE (receive.go), repost the receive slot
//	Post ──► region checks, remote region lookup (rcMu, one pRegQ round
//	         trip per new region) ──► op slot (opFree) ──► fi_read/fi_write
//	         progress: RMA completion ──► local notifications (endpoint
//	         notification queue) and pNotify to the peer for remote ones
//	control packets (credits, queries, notifications, hello/bye) are
//	queued on ctlQ (ctlMu) by any goroutine and sent only by progress.
//
// One goroutine, progress, owns the completion queue, the control send
// slots and every MR close; it is started by Open and joined by Close.
// Locks: n.mu (Open/Close, epochs), peersMu (peer table), regs (region
// table, localq.Table), rcMu (remote region cache), ctlMu (control queue), per-endpoint
// mu (mailbox, sources) and the core's NotifyQueue lock (notifications), per-pair mu (credits).
// No lock is held across a libfabric call that can block, and none while a
// caller waits.

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/internal/localq"
	"github.com/exn-project/exn/fabric/members"
	"github.com/exn-project/exn/internal/ratelog"
)

// Sizes of the libfabric objects and progress loop.
const (
	// cqBatchSize is how many completions a progress step reads per cgo
	// call: the NAPI budget of docs/design.md ("EXT-Eth").
	cqBatchSize = 64
	// ctlSlots is the number of control send buffers. Control traffic is
	// a few packets per credit window or RMA, so this rarely fills; when
	// it does, packets wait on ctlQ, nothing is dropped.
	ctlSlots = 256
	// rmaSlots bounds RMA operations in flight per node: twice the
	// notification depth, so a protocol that keeps its outstanding
	// requests below the depth (as the contract asks) never waits here.
	rmaSlots = 2 * fabric.DefaultNotifyDepth
	// avSize is the address vector's initial size hint.
	avSize = 256
	// byeTimeout bounds how long Close waits to flush its goodbyes.
	byeTimeout = 200 * time.Millisecond
	// queryTimeout bounds a VPID open query or a remote region query. A
	// live peer answers from its progress goroutine in microseconds, so
	// silence this long means it is unreachable (some providers, e.g.
	// tcp;ofi_rxm, keep retrying a refused connection instead of failing
	// the send): the peer is marked down.
	queryTimeout = 3 * time.Second
)

// NIC is one node's libfabric NIC. Open returns it as a fabric.NIC; tests
// and tools that exchange addresses themselves use Name and AddPeer.
type NIC struct {
	cfg Config
	log *slog.Logger
	id  fabric.NodeID
	f   *fab
	ctr fabric.Counters

	virtAddr bool // remote addresses are virtual addresses (FI_MR_VIRT_ADDR)
	provKey  bool // the provider picks MR keys (FI_MR_PROV_KEY)

	rx       cmem // RecvSlots receive buffers
	rxMR     mr
	tx       cmem // SendSlots VELO send buffers
	txMR     mr
	txFree   chan int32
	ctl      cmem // ctlSlots control send buffers
	ctlMR    mr
	ctlFree  []int32 // progMu
	ctlDests []*peer // destination of each busy control slot; progMu
	txDests  []atomic.Pointer[peer]

	eps   localq.Endpoints[endpoint]
	mu    sync.Mutex // Open, Close, epoch
	epoch uint8

	groups localq.Groups // multicast membership

	// Membership (members.go) under LivenessSWIM; nil otherwise. Set by
	// open.
	members      *members.Members
	mtransport   *members.Transport
	declaredDead atomic.Uint64
	fromDead     atomic.Uint64 // packets dropped from a node declared dead

	peersMu sync.RWMutex
	peers   map[fabric.NodeID]*peer
	byFI    map[uint64]*peer

	regs localq.Table[*endpoint, *region] // by NLA region index

	rcMu    sync.Mutex
	rcache  map[rkey]*remoteRegion
	pending map[uint64]*remoteRegion // by cookie
	cookie  uint64
	pins    map[rkey]*pin // own RMA in flight per remote region

	relMu     sync.Mutex
	releasing map[uint32]*region // deregistered, waiting for pInvalAck

	ops    []rmaOp
	vecs   []rmaVec // ops[i]'s piece list, in C memory
	merge  int      // most requests per RMA operation (Config.RMAMerge, the provider's iov limits)
	opFree chan int32

	progMu sync.Mutex // whoever holds it progresses: the CQ, batch, ctlFree, ctlDests, jobs
	batch  *cqBatch   // guarded by progMu

	repostErrs uint64     // the provider's deferred-repost failures seen so far; under progMu
	ctlMu      sync.Mutex // ctlQ, jobs, ctlScratch; inside progMu, never around it
	ctlQ       []ctlPkt
	ctlScratch cmem // inject buffer of sendCtl
	injMu      sync.Mutex
	injScratch cmem // inject buffer of VELO sends (transmitInline), under injMu
	inject     int  // largest fi_inject packet (tx_attr->inject_size)
	jobs       []func()
	ctlPending atomic.Bool // ctlQ or jobs non-empty
	ctlIdle    atomic.Bool // no control packet queued or in a send slot

	spinners atomic.Int32    // callers polling the CQ in a spin
	bgParked atomic.Bool     // the background goroutine is (about to be) parked
	kicked   atomic.Bool     // work for the background goroutine
	bgWake   chan struct{}   // capacity 1: wakes a parked background goroutine
	waitFile *os.File        // dup of the CQ wait fd in the netpoller, or nil
	waitRC   syscall.RawConn // waitFile's handle, or nil
	waitable bool            // waitRC was set at Open; never changes (Close clears waitRC)
	// bell is the host bell (hostbell.go) of a provider without a wait
	// object on one host (shm), or nil. Set at Open, closed by freeAll.
	bell                           *ownBell
	bellRings, bellFailed, bgWakes atomic.Uint64
	waitBroken                     atomic.Bool   // the CQ wait fd never arms: park on the timer (progress.go, unarmedFor)
	rmaMerged                      atomic.Uint64 // requests that rode in another's operation
	bundles                        atomic.Uint64 // pBundle packets sent
	retiredMu                      sync.Mutex
	retired                        []*peerBell  // forgotten peer bells, closed by freeAll
	fence                          atomic.Int32 // awaitCompletion's barrier

	done   chan struct{} // closed by Close
	closed atomic.Bool
	wg     sync.WaitGroup

	faults ratelog.Faults // per-message faults, rate-limited (localq.FaultLogInterval)
}

// peer is another node in the address vector.
type peer struct {
	node fabric.NodeID
	fa   uint64

	// busy counts libfabric calls addressed to this peer in progress.
	// peerDown waits for it to drain, so after a goodbye is acknowledged
	// no call touches the peer (the shm provider maps peers in the same
	// process by pointer: a send after the peer closed would fault).
	busy  atomic.Int32
	idle  chan struct{} // (1) a call that leaves p down with busy at 0 signals peerDown's wait
	acked atomic.Bool   // acknowledged our goodbye

	bell      atomic.Pointer[peerBell] // its host bell, opened on first use (hostbell.go)
	bellRetry atomic.Int64             // no new attempt to open it before this (Unix ns)
	fence     atomic.Int32             // ringPeer's barrier

	// isUp is whether the peer is up: loaded without the mutex on every
	// send and receive; written only under mu, with down.
	isUp atomic.Bool
	// deadByMembership: membership declared it dead (members.go); its
	// packets do not bring it back until membership sees it alive.
	deadByMembership atomic.Bool
	mu               sync.Mutex
	down             chan struct{} // closed when the peer goes down; replaced when it returns
}

// enter marks a libfabric call to p in progress; it fails if p is down.
// Every successful enter is paired with leave. The increment of busy and
// the load of isUp, against peerDown's store of isUp and load of busy,
// are a Dekker pair: either enter sees the peer down or peerDown waits
// for the call.
func (p *peer) enter() bool {
	p.busy.Add(1)
	if !p.isUp.Load() {
		p.leave()
		return false
	}
	return true
}

// leave ends a call that enter counted. The last one out of a peer that
// is down wakes peerDown's wait (a token left when nobody waits is
// harmless: the wait re-checks busy).
func (p *peer) leave() {
	if p.busy.Add(-1) == 0 && !p.isUp.Load() {
		select {
		case p.idle <- struct{}{}:
		default:
		}
	}
}

// awaitIdle waits until no call counted by enter is in progress; p is
// already marked down, so none starts.
func (p *peer) awaitIdle() {
	for p.busy.Load() > 0 {
		<-p.idle
	}
}

func (p *peer) state() (up bool, down <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.isUp.Load(), p.down
}

// ctlPkt is one queued control packet.
type ctlPkt struct {
	dst  fabric.NodeID
	hdr  uint64
	n    uint8
	body [bodyMax]byte
}

// Open opens node cfg.Node's NIC on libfabric provider cfg.Provider. It
// fails with a message naming the cause when the provider is missing or
// lacks what the fabric needs (RDM endpoints, FI_RMA, FI_SOURCE, ordered
// sends). libfabric's own environment (FI_PROVIDER, FI_LOG_LEVEL,
// FI_TCP_IFACE, FI_SHM_*, ...) applies as usual.
func Open(cfg Config) (fabric.NIC, error) { return localq.AsNIC(open(cfg)) }

func open(cfg Config) (*NIC, error) {
	if cfg.Provider == "" {
		return nil, fmt.Errorf("ofi: no provider named (want e.g. tcp, shm, verbs): %w", fabric.ErrInvalid)
	}
	cfg.setDefaults()
	node, svc, err := bindAddr(&cfg)
	if err != nil {
		return nil, err
	}
	// Only SAS is required. Asking for SAW as well makes shm pick its
	// fully ordered mode, whose GETs wait for the target's progress (1.3
	// ms instead of 3 µs here); where the chosen provider reports SAW
	// anyway (tcp), writes skip FI_DELIVERY_COMPLETE.
	in, err := getinfo(cfg.Provider, node, svc, capMsg|capRMA|capSource, true, orderSAS)
	if errors.Is(err, errors.ErrUnsupported) {
		return nil, err // a provider exn cannot park on: getinfo says which and why
	}
	if err != nil {
		return nil, diagnose(cfg.Provider, node, svc, err)
	}
	f, err := openFab(in, 4*cfg.RecvSlots, avSize)
	if err != nil {
		return nil, fmt.Errorf("ofi %s: %w", cfg.Provider, err)
	}
	n := &NIC{
		cfg: cfg, log: cfg.Logger.With("fabric", "ofi:"+cfg.Provider, "node", cfg.Node), id: cfg.Node, f: f,
		virtAddr:  f.mrMode()&mrVirtAddr != 0,
		provKey:   f.mrMode()&mrProvKey != 0,
		peers:     make(map[fabric.NodeID]*peer),
		byFI:      make(map[uint64]*peer),
		rcache:    make(map[rkey]*remoteRegion),
		pending:   make(map[uint64]*remoteRegion),
		pins:      make(map[rkey]*pin),
		releasing: make(map[uint32]*region),
		done:      make(chan struct{}),
		bgWake:    make(chan struct{}, 1),
		inject:    f.injectSize(),
		merge:     cfg.mergeLimit(f.iovLimit()),
	}
	n.groups.Init("ofi", &n.ctr, &n.closed)
	n.faults.Init(n.log, localq.FaultLogInterval)
	n.regs.Init()
	if err := n.setupBuffers(); err != nil {
		n.freeAll()
		return nil, fmt.Errorf("ofi %s: %w", cfg.Provider, err)
	}
	for _, p := range cfg.Peers {
		if p.Node == cfg.Node {
			continue
		}
		fa, err := insertPeer(f, p.Addr)
		if err != nil {
			n.freeAll()
			return nil, fmt.Errorf("ofi %s: peer %d at %s: %w", cfg.Provider, p.Node, p.Addr, err)
		}
		n.addPeer(p.Node, fa)
	}
	n.openWaitFile()
	if !n.waitable && f.provider() == "shm" {
		if err := n.openBell(); err != nil {
			n.freeAll()
			return nil, fmt.Errorf("ofi %s: %w", cfg.Provider, err)
		}
	}
	n.ctlIdle.Store(true)
	n.wg.Add(1)
	go n.background()
	if cfg.Liveness == LivenessSWIM {
		if err := n.startMembers(); err != nil {
			n.Close()
			return nil, err
		}
	}
	for _, p := range n.peerList() {
		n.sendCtl(p.node, header{typ: pHello}, nil)
	}
	n.log.Debug("ofi nic open", "provider", f.provider(), "mr_mode", f.mrMode(), "cq_wait_fd", n.waitRC != nil, "order_saw", f.saw(), "inject", n.inject)
	return n, nil
}

// bindAddr returns the local node/service to bind: cfg.Bind, else this
// node's line of the peers file, else none (the provider picks).
func bindAddr(cfg *Config) (string, string, error) {
	if cfg.Bind != "" {
		h, p := splitHostPort(cfg.Bind)
		return h, p, nil
	}
	for _, p := range cfg.Peers {
		if p.Node == cfg.Node {
			h, port := splitHostPort(p.Addr)
			return h, port, nil
		}
	}
	return "", "", nil
}

// insertPeer inserts a peers-file address into the address vector:
// fi_av_insertsvc(host, port), or on a provider without it whose
// addresses are strings (shm), the string address the peer's own bind of
// the same line gives it (its fi_getname): "fi_ns://HOST:PORT".
func insertPeer(f *fab, addr string) (uint64, error) {
	host, port := splitHostPort(addr)
	fa, err := f.avInsertSvc(host, port)
	if err == nil || f.addrFormat() != addrFormatStr {
		return fa, err
	}
	return f.avInsert(append([]byte("fi_ns://"+host+":"+port), 0))
}

func splitHostPort(a string) (string, string) {
	if h, p, err := net.SplitHostPort(a); err == nil {
		return h, p
	}
	return strings.Trim(a, "[]"), strconv.Itoa(DefaultPort)
}

// diagnose turns a failed fi_getinfo into the reason, asking libfabric
// again with fewer requirements.
func diagnose(prov, node, svc string, cause error) error {
	probe := func(caps uint64, rdm, order bool) bool {
		lvl := orderNone
		if order {
			lvl = orderSAS
		}
		in, err := getinfo(prov, node, svc, caps, rdm, lvl)
		in.free()
		return err == nil
	}
	available := func() []string {
		var names []string
		if all, err := getinfo("", "", "", 0, false, orderNone); err == nil {
			for _, e := range all.entries() {
				if !slices.Contains(names, e.prov) {
					names = append(names, e.prov)
				}
			}
			all.free()
		}
		return names
	}
	return explain(prov, cause, probe, available)
}

func (n *NIC) setupBuffers() error {
	var err error
	mrLocalNeeded := n.f.mrMode()&mrLocal != 0
	alloc := func(slots, size int) (cmem, mr, error) {
		m, err := mmapMem(slots * size)
		if err != nil {
			return cmem{}, mr{}, err
		}
		if !mrLocalNeeded {
			return m, mr{}, nil
		}
		r, err := n.f.mrReg(m, bufAccess, n.bufKey())
		if err != nil {
			m.free()
			return cmem{}, mr{}, fmt.Errorf("register buffers: %w", err)
		}
		return m, r, nil
	}
	if n.rx, n.rxMR, err = alloc(n.cfg.RecvSlots, recvSize); err != nil {
		return err
	}
	if n.tx, n.txMR, err = alloc(n.cfg.SendSlots, recvSize); err != nil {
		return err
	}
	if n.ctl, n.ctlMR, err = alloc(ctlSlots, packetSize); err != nil {
		return err
	}
	// fi_inject copies the buffer before it returns, so it needs no
	// registration even under FI_MR_LOCAL.
	if n.ctlScratch, err = mmapMem(packetSize); err != nil {
		return err
	}
	if n.injScratch, err = mmapMem(recvSize); err != nil {
		return err
	}
	if n.batch, err = newCQBatch(cqBatchSize); err != nil {
		return err
	}
	n.txFree = make(chan int32, n.cfg.SendSlots)
	for i := range n.cfg.SendSlots {
		n.txFree <- int32(i)
	}
	n.txDests = make([]atomic.Pointer[peer], n.cfg.SendSlots)
	n.ctlFree = make([]int32, 0, ctlSlots)
	for i := ctlSlots - 1; i >= 0; i-- {
		n.ctlFree = append(n.ctlFree, int32(i))
	}
	n.ctlDests = make([]*peer, ctlSlots)
	n.ops = make([]rmaOp, rmaSlots)
	n.vecs = newRMAVecs(rmaSlots)
	n.opFree = make(chan int32, rmaSlots)
	for i := range rmaSlots {
		n.opFree <- int32(i)
	}
	for i := range n.cfg.RecvSlots {
		if err := n.f.postRecv(n.rx.at(i*recvSize), recvSize, n.rxMR.desc, mkctx(ctxRecv, i)); err != nil {
			return fmt.Errorf("post receive %d: %w", i, err)
		}
	}
	return nil
}

// bufKey is the requested key of a buffer pool registration: above every
// region index, so it never collides with a region key.
func (n *NIC) bufKey() uint64 {
	n.regs.Lock()
	defer n.regs.Unlock()
	return uint64(n.regs.BumpLocked()) | 1<<62
}

func (n *NIC) freeAll() {
	if n.f != nil {
		n.f.close() // closes the endpoint first: no more DMA into any buffer
		n.f = nil
	}
	for _, m := range []mr{n.rxMR, n.txMR, n.ctlMR} {
		m.close()
	}
	n.rx.free()
	n.tx.free()
	n.ctl.free()
	n.ctlScratch.free()
	n.injScratch.free()
	if n.batch != nil {
		n.batch.free()
		n.batch = nil
	}
	freeRMAVecs(n.vecs)
	n.vecs = nil
	if n.waitFile != nil {
		n.waitFile.Close()
		n.waitFile, n.waitRC = nil, nil
	}
	n.closeBells()
}

// Name returns this NIC's libfabric address (fi_getname), for an
// in-process or out-of-band address exchange with AddPeer.
func (n *NIC) Name() ([]byte, error) {
	if n.closed.Load() {
		return nil, fmt.Errorf("ofi: name: %w", net.ErrClosed)
	}
	return n.f.name()
}

// AddPeer inserts node's libfabric address (its Name) into the address
// vector and marks it up.
func (n *NIC) AddPeer(node fabric.NodeID, name []byte) error {
	if n.closed.Load() {
		return fmt.Errorf("ofi: add peer: %w", net.ErrClosed)
	}
	if node == n.id {
		return fmt.Errorf("ofi: add peer %d: that is this node: %w", node, fabric.ErrInvalid)
	}
	fa, err := n.f.avInsert(name)
	if err != nil {
		return fmt.Errorf("ofi: add peer %d: %w", node, err)
	}
	n.addPeer(node, fa)
	return nil
}

func (n *NIC) addPeer(node fabric.NodeID, fa uint64) {
	p := &peer{node: node, fa: fa, down: make(chan struct{}), idle: make(chan struct{}, 1)}
	p.isUp.Store(true)
	n.peersMu.Lock()
	if old := n.peers[node]; old != nil {
		delete(n.byFI, old.fa)
	}
	n.peers[node] = p
	n.byFI[fa] = p
	n.peersMu.Unlock()
}

func (n *NIC) peer(node fabric.NodeID) *peer {
	n.peersMu.RLock()
	p := n.peers[node]
	n.peersMu.RUnlock()
	return p
}

func (n *NIC) peerList() []*peer {
	n.peersMu.RLock()
	defer n.peersMu.RUnlock()
	out := make([]*peer, 0, len(n.peers))
	for _, p := range n.peers {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *peer) int { return int(a.node) - int(b.node) })
	return out
}

// peerDown marks p down: its blocked senders, pending queries and cached
// regions are released. Idempotent.
func (n *NIC) peerDown(p *peer, why string) {
	p.mu.Lock()
	if !p.isUp.Load() {
		p.mu.Unlock()
		return
	}
	p.isUp.Store(false)
	close(p.down)
	p.mu.Unlock()
	p.awaitIdle() // a send to p is in its libfabric call: it is short
	if why == whyGoodbye {
		n.log.Debug("ofi peer down", "peer", p.node, "why", why)
	} else {
		n.log.Warn("ofi peer down", "peer", p.node, "why", why)
	}
	n.forgetBell(p)
	n.dropRemote(p.node)
	n.eps.Each(func(e *endpoint) { e.peerGone(p.node) })
}

// whyGoodbye is the peerDown reason of an orderly close.
const whyGoodbye = "goodbye"

// peerUp revives a peer that was down (it restarted and spoke again).
func (n *NIC) peerUp(p *peer) {
	p.mu.Lock()
	if p.isUp.Load() {
		p.mu.Unlock()
		return
	}
	p.isUp.Store(true)
	p.deadByMembership.Store(false)
	p.down = make(chan struct{})
	p.mu.Unlock()
	n.forgetBell(p)
	n.dropRemote(p.node)
	n.log.Info("ofi peer up", "peer", p.node)
}

func (n *NIC) Node() fabric.NodeID { return n.id }

// Open claims VPID v on this node.
func (n *NIC) Open(v fabric.VPID) (fabric.Endpoint, error) {
	return localq.Open(&n.eps, &n.mu, &n.closed, &n.ctr, "ofi", n.id, v, func() *endpoint {
		n.epoch = (n.epoch + 1) & epochMask // under n.mu
		return newEndpoint(n, v, n.epoch)
	})
}

// Join makes this node a member of g. Membership is checked where a
// multicast lands (senders fan out to every node), so it takes effect at
// once for every sender.
func (n *NIC) Join(g fabric.Group) error { return n.groups.Join(g) }

// Leave removes this node from g; Broadcast cannot be left.
func (n *NIC) Leave(g fabric.Group) error { return n.groups.Leave(g) }

// Peers lists the peers currently up.
func (n *NIC) Peers() []fabric.NodeID {
	var out []fabric.NodeID
	for _, p := range n.peerList() {
		if up, _ := p.state(); up {
			out = append(out, p.node)
		}
	}
	return out
}

// Alive reports nil for an up peer, ErrPeerDown for one that went down,
// ErrUnknownNode for a node not in the address vector.
func (n *NIC) Alive(id fabric.NodeID) error {
	if id == n.id {
		return localq.SelfAlive("ofi", &n.closed)
	}
	p := n.peer(id)
	if p == nil {
		return fmt.Errorf("ofi: node %d: %w", id, fabric.ErrUnknownNode)
	}
	if up, _ := p.state(); !up {
		return fmt.Errorf("ofi: node %d: %w", id, fabric.ErrPeerDown)
	}
	return nil
}

func (n *NIC) Stats() fabric.Stats { return n.ctr.Snapshot() }

// Close takes the node down: every endpoint closes (its regions are
// deregistered), peers get a goodbye, the progress goroutine stops and
// the libfabric objects and buffers are released. Idempotent.
func (n *NIC) Close() error {
	if !localq.Shut(&n.mu, &n.closed, nil) {
		return nil
	}
	if n.members != nil {
		// Peers mark us left at once instead of probing us dead; this
		// also shuts the membership transport down.
		n.members.Leave(leaveTimeout)
	}
	n.eps.Each(func(e *endpoint) { e.Close() })
	var told []*peer
	for _, p := range n.peerList() {
		if up, _ := p.state(); up {
			told = append(told, p)
			n.sendCtl(p.node, header{typ: pBye}, nil)
		}
	}
	n.awaitByeAcks(told, byeTimeout)
	close(n.done)
	n.kick()
	n.wg.Wait()
	// Pending region queries and blocked callers see done; free the rest.
	n.rcMu.Lock()
	for _, rr := range n.pending {
		rr.finish(regAnswer{status: stNotOpen})
	}
	clear(n.pending)
	n.rcMu.Unlock()
	n.freeAll()
	return nil
}

// awaitByeAcks waits until every peer told goodbye acknowledged it (or
// went down), then for the control queue to drain, or d.
func (n *NIC) awaitByeAcks(told []*peer, d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		acked := true
		for _, p := range told {
			if up, _ := p.state(); up && !p.acked.Load() {
				acked = false
				break
			}
		}
		n.ctlMu.Lock()
		q := len(n.ctlQ)
		n.ctlMu.Unlock()
		if acked && q == 0 && n.ctlIdle.Load() {
			return
		}
		// Drive progress ourselves: the acknowledgements arrive in the CQ.
		if !n.poll() {
			time.Sleep(100 * time.Microsecond) // Close only: peers answer from their own progress
		}
	}
	n.log.Warn("ofi close: peers did not acknowledge goodbye in time", "timeout", d)
}

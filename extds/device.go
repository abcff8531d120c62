package extds

// The receive pipeline.
//
// Stages, per virtual device (one fabric endpoint, VPID base+vdev):
//
//  1. rx loop (vdev.run, one goroutine per opened vdev): Recv up to
//     rxBudget VELO messages, then PollNotifications up to rxBudget; when
//     both are empty, Wait (the endpoint spins briefly, then sleeps).
//     A Read or a Write waiting for credits first polls the vdev itself
//     for connSpinBudget before it parks (Conn.spinWaitLocked):
//     vdev.poll, the same Recv + dispatch, under vdev.rxMu, which the rx
//     loop holds for its polls too, so messages keep their order.
//  2. demux (Device.dispatch): decode the payload (no allocation), find the
//     connection by the receiver-assigned ID in Device.conns, check that the
//     fabric-filled source is that connection's peer; notifications are
//     matched by the region index of their local NLA (Device.regions).
//  3. per-connection handling (Conn.onMsg / Conn.onNotify, under Conn.mu):
//     queue a receive segment, return credits to the writer, wake readers or
//     writers. The rx loop never blocks on a Send: anything it must say to a
//     peer (a RESET after a protocol violation) goes to the control sender.
//  4. control sender (Device.ctrlLoop, one goroutine): sends queued RESETs
//     with a bounded timeout.
//  5. housekeeping (Device.tickLoop, one goroutine): every tick it checks
//     each peer node's liveness, and releases closed connections whose
//     drain (linger in the background) has run out. With no connection
//     it stops its ticker and sleeps until register adds one (connAdded),
//     so an idle Device has no timer.
//
// Locks: vdev.rxMu is taken with no Conn lock held (a spinning waiter
// holds only its rmu or wmu, which no handler takes) and is held while
// dispatching, i.e. while taking Conn.mu and Device.mu.
// Device.mu guards conns, regions, vdevs and closed; it is never
// held while calling into a Conn that takes Conn.mu (snapshot, then call).
// Conn.mu guards one connection's protocol state (see conn.go). Order:
// Conn.mu may be held while taking Device.mu (release), never the reverse.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/exn-project/exn/fabric"
)

// Tunables, with why.
const (
	// rxBudget is the NAPI budget: messages (and, separately, notifications)
	// taken per poll. 64 as in EXT-Eth: one poll then costs at most ~8 KiB
	// of copying before the loop looks at the other queue.
	rxBudget = 64
	// ctrlQueue bounds RESETs waiting for the control sender. A RESET is
	// only sent on a protocol violation or to a peer writing into a closed
	// conn; 256 outstanding means something is flooding us, and dropping
	// (counted) is better than blocking the rx loop.
	ctrlQueue = 256
	// ctrlSendTimeout bounds one control Send: a peer whose mailbox stays
	// full that long is treated as gone.
	ctrlSendTimeout = time.Second
	// NumVDevs is the size of the reserved VPID block (equation 5.3).
	NumVDevs = 16
	// DefaultBaseVPID is the first VPID of the EXT-DS block: above EXT-Eth's
	// VPID 0, leaving 1..15 for other node services.
	DefaultBaseVPID fabric.VPID = 16
	// DefaultRingSize is each connection's RMA receive ring. The sender
	// mirrors it, so a connection registers 2 MiB (plus the 64 KiB eager
	// buffer); on shm the pages are touched only as data flows. With
	// RMA_AVAIL at 1/4 that is 256 KiB per credit message. Between two
	// processes on shm, 1 MiB streamed 16 KiB..1 MiB writes 1.05–1.6×
	// faster than 512 KiB and about 2× faster than 256 KiB; 2 MiB was
	// slower again (0.4–0.6× of 1 MiB: the rings and mirrors no longer
	// fit the caches). docs/extds.md, "Numbers".
	DefaultRingSize = 1 << 20
	// DefaultEagerWindow is the receive buffer for VELO data per
	// connection: 64 KiB = 565 fragments, about half a default mem mailbox,
	// so eager data alone never fills the vdev's mailbox for long.
	DefaultEagerWindow = 64 << 10
	// DefaultThreshold is the eager/rendezvous switch. A write of up to 480
	// bytes is at most five VELO fragments; above that one PUT plus one
	// RMA_INFO (two operations and a notification) is cheaper than the
	// fragment train. Same value as EXT-Eth (§5.4.6.2). See docs/extds.md
	// for the measurement.
	DefaultThreshold = 480
	// DefaultZCopyThreshold: WriteBuffer below this uses BCopy; the
	// rendezvous round trip of ZCopy only pays off for large transfers.
	DefaultZCopyThreshold = 64 << 10
	// zcChunk is the receiver's ZCopy sink region: one GET or PUT moves at
	// most this much, so a huge write does not pin a huge sink.
	zcChunk = 1 << 20
	// DefaultTick is the housekeeping period: peer-death detection for idle
	// connections is bounded by it.
	DefaultTick = 200 * time.Millisecond
	// DefaultDrainTimeout bounds how long a closed connection keeps its
	// ring waiting for the peer to read outstanding data.
	DefaultDrainTimeout = 30 * time.Second
	// DefaultProbeTimeout bounds the wait for a listener probe's answer.
	// The peer's rx loop answers within microseconds when it has a CPU,
	// but on a loaded 2-vCPU host a probe went unanswered for more than
	// 50 ms (TestNetperfShim under the race tests: the connection fell
	// back and the address was then cached as plain TCP for negativeTTL).
	// A probe that gets no answer (a node without EXT-DS on that vdev)
	// costs this once per address and negativeTTL. No answer = no
	// listener: the connection stays plain TCP.
	DefaultProbeTimeout = 250 * time.Millisecond
	// noConnLimit is the most NOCONN replies a Device sends per second.
	// One reply is enough to fail the sender's connection; the limit only
	// matters under a flood of forged or stale data messages.
	noConnLimit = 256
	// DefaultShadowGrace: after the shadow TCP conn breaks, how long a
	// connection waits for the fabric SHUTDOWN that normally precedes it.
	DefaultShadowGrace = time.Second
)

// Attachment is what a Device needs from the fabric: fabric.NIC satisfies
// it. exnd will later hand app processes an Attachment that obtains their
// endpoints over its control socket.
type Attachment interface {
	Node() fabric.NodeID
	Open(v fabric.VPID) (fabric.Endpoint, error)
	Alive(n fabric.NodeID) error
}

// Resolver maps a peer IP to its fabric node (exnd's neighbour table:
// IP → MAC → node). ok is false for a peer not on the fabric.
type Resolver interface {
	Resolve(ip netip.Addr) (node fabric.NodeID, ok bool)
}

// ResolverFunc adapts a function, e.g. around arp.Table.Lookup:
//
//	extds.ResolverFunc(func(ip netip.Addr) (fabric.NodeID, bool) {
//		e, ok := tbl.Lookup(ip)
//		return e.Node, ok
//	})
type ResolverFunc func(ip netip.Addr) (fabric.NodeID, bool)

func (f ResolverFunc) Resolve(ip netip.Addr) (fabric.NodeID, bool) { return f(ip) }

// StaticResolver is a fixed IP → node map.
type StaticResolver map[netip.Addr]fabric.NodeID

func (s StaticResolver) Resolve(ip netip.Addr) (fabric.NodeID, bool) {
	n, ok := s[ip.Unmap()]
	return n, ok
}

type config struct {
	base           fabric.VPID
	ringSize       int
	eagerWin       int
	threshold      int
	zcThreshold    int
	zcMode         ZCopyMode
	tick           time.Duration
	drainTimeout   time.Duration
	shadowGrace    time.Duration
	keepShadow     bool
	resolver       Resolver
	log            *slog.Logger
	handshakeTO    time.Duration
	peekTO         time.Duration
	negativeTTL    time.Duration
	probeTO        time.Duration
	claimTO        time.Duration
	lazyOpen       bool
	creditFraction int
	// probeBase is the first VPID of the block that answers listener
	// probes on peer nodes (0: base). An attached process (AttachDevice)
	// has a VPID block of its own but probes exnd's (see attach.go).
	probeBase fabric.VPID
	// portHook, if set, also announces a registered port elsewhere (an
	// attached process tells exnd); its unregister runs with the port's.
	portHook func(port uint16) (unregister func(), err error)
	// onClose runs at the end of Close (an attached process detaches).
	onClose func() error
}

// Option configures a Device.
type Option func(*config)

// WithBaseVPID sets the first VPID of the 16-VPID EXT-DS block.
func WithBaseVPID(v fabric.VPID) Option { return func(c *config) { c.base = v } }

// WithRingSize sets the per-connection RMA ring (minimum 4 KiB, maximum 64
// MiB).
func WithRingSize(n int) Option { return func(c *config) { c.ringSize = n } }

// WithEagerWindow sets the per-connection VELO receive buffer.
func WithEagerWindow(n int) Option { return func(c *config) { c.eagerWin = n } }

// WithThreshold sets the BCopy eager/rendezvous threshold in bytes.
func WithThreshold(n int) Option { return func(c *config) { c.threshold = n } }

// WithZCopy sets the ZCopy mode and the smallest WriteBuffer that uses it.
func WithZCopy(m ZCopyMode, threshold int) Option {
	return func(c *config) { c.zcMode, c.zcThreshold = m, threshold }
}

// WithResolver sets the resolver Dial uses to decide whether a peer is on
// the fabric.
func WithResolver(r Resolver) Option { return func(c *config) { c.resolver = r } }

// WithLogger sets the logger (rate-limited for per-message events).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// WithTick sets the housekeeping period (peer-death detection bound).
func WithTick(d time.Duration) Option { return func(c *config) { c.tick = d } }

// WithDrainTimeout bounds background draining after Close.
func WithDrainTimeout(d time.Duration) Option { return func(c *config) { c.drainTimeout = d } }

// WithShadow says whether the shadow TCP connection stays open after the
// handshake as a liveness aid (default true). Closing it saves one fd and
// one goroutine per connection; peer death is then detected by fabric
// liveness alone.
func WithShadow(keep bool) Option { return func(c *config) { c.keepShadow = keep } }

// WithHandshakeTimeout bounds the client's wait for the server's reply
// and the server's wait for the rest of a hello; WithPeekTimeout bounds
// the server's wait for the first bytes of a client (see docs/extds.md
// for the trade-off).
func WithHandshakeTimeout(d time.Duration) Option { return func(c *config) { c.handshakeTO = d } }

// WithPeekTimeout: see WithHandshakeTimeout.
func WithPeekTimeout(d time.Duration) Option { return func(c *config) { c.peekTO = d } }

// WithProbeTimeout bounds the client's wait for the answer to a listener
// probe (default DefaultProbeTimeout); no answer means no listener.
func WithProbeTimeout(d time.Duration) Option { return func(c *config) { c.probeTO = d } }

// WithEagerOpen opens all 16 endpoints in NewDevice instead of on first use.
func WithEagerOpen() Option { return func(c *config) { c.lazyOpen = false } }

// Device is one node's EXT-DS attachment: the 16 virtual-device endpoints
// of the reserved VPID block, their rx loops, and the connection table.
// Connections of every port share it. Close tears everything down.
type Device struct {
	att   Attachment
	cfg   config
	ctr   counters
	rlog  rateLog
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup
	ctrlq chan ctrlReq

	// connAdded (capacity 1) wakes a tickLoop that stopped its ticker
	// because there was no connection.
	connAdded chan struct{}

	mu      sync.RWMutex
	vdevs   [NumVDevs]*vdev
	conns   map[uint32]*Conn
	regions map[uint32]*Conn  // region index → owning conn (rings, sinks, buffers)
	byPeer  map[peerKey]*Conn // (peer address, peer's conn ID) → conn, for NOCONN
	ports   map[uint16]int    // registered listener ports → registrations
	probes  map[uint32]*probeWait
	nextID  uint32
	nextTok uint32
	closed  bool

	noConnRL rateLimit

	negMu sync.Mutex
	neg   map[string]time.Time // address → until: no EXT-DS there

	claims claimTable // out-of-band agreement (claim.go)
}

type vdev struct {
	dev *Device
	idx int
	ep  fabric.Endpoint

	// rxMu serialises receiving and dispatching: the rx loop holds it
	// for one poll, and so does a spinning reader that polls the
	// endpoint itself (Conn.spinRead), so messages of one connection are
	// still handled in order. Guards msgs, notes and m.
	rxMu  sync.Mutex
	msgs  []fabric.Message
	notes []fabric.Notification
	m     msg
}

type ctrlReq struct {
	vd     *vdev
	peer   fabric.Addr
	conn   uint32
	tag    fabric.Tag
	port   uint16 // PROBE_REPLY, CLAIM_REPLY
	status uint8  // PROBE_REPLY, CLAIM_REPLY
	reason uint8  // CLAIM_REPLY
}

// peerKey names a connection from its peer's side: the peer's endpoint
// address and the connection ID the peer assigned.
type peerKey struct {
	addr fabric.Addr
	id   uint32
}

// probeWait is one listener probe waiting for its answer.
type probeWait struct {
	vd   *vdev
	peer fabric.Addr
	port uint16
	ch   chan bool // cap 1
}

// NewDevice attaches EXT-DS to a fabric NIC. Endpoints are opened on first
// use of their vdev unless WithEagerOpen is given.
func NewDevice(att Attachment, opts ...Option) (*Device, error) {
	cfg := config{
		base: DefaultBaseVPID, ringSize: DefaultRingSize, eagerWin: DefaultEagerWindow,
		threshold: DefaultThreshold, zcThreshold: DefaultZCopyThreshold, zcMode: ZCopyRead,
		tick: DefaultTick, drainTimeout: DefaultDrainTimeout, shadowGrace: DefaultShadowGrace,
		keepShadow: true, handshakeTO: DefaultHandshakeTimeout, peekTO: 200 * time.Millisecond,
		negativeTTL: time.Minute, lazyOpen: true, creditFraction: 4, probeTO: DefaultProbeTimeout, claimTO: DefaultClaimTimeout,
	}
	for _, o := range opts {
		o(&cfg)
	}
	switch {
	case att == nil:
		return nil, errors.New("extds: nil attachment")
	case int(cfg.base)+NumVDevs > 256:
		return nil, fmt.Errorf("extds: vpid block %d+%d exceeds 255", cfg.base, NumVDevs)
	case cfg.base <= fabric.EthVPID:
		return nil, fmt.Errorf("extds: vpid block overlaps EXT-Eth vpid %d", fabric.EthVPID)
	case cfg.ringSize < minRingSize || cfg.ringSize > maxRingSize:
		return nil, fmt.Errorf("extds: ring size %d not in %d..%d", cfg.ringSize, minRingSize, maxRingSize)
	case cfg.eagerWin < minEagerWin || cfg.eagerWin > maxEagerWin:
		return nil, fmt.Errorf("extds: eager window %d not in %d..%d", cfg.eagerWin, minEagerWin, maxEagerWin)
	case cfg.threshold < 0 || cfg.tick <= 0:
		return nil, errors.New("extds: bad threshold or tick")
	case cfg.probeTO <= 0:
		return nil, errors.New("extds: probe timeout must be positive")
	case cfg.claimTO <= 0:
		return nil, errors.New("extds: claim timeout must be positive")
	}
	if cfg.log == nil {
		cfg.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	d := &Device{
		att: att, cfg: cfg, ctrlq: make(chan ctrlReq, ctrlQueue),
		conns: make(map[uint32]*Conn), connAdded: make(chan struct{}, 1), regions: make(map[uint32]*Conn), neg: make(map[string]time.Time),
		byPeer: make(map[peerKey]*Conn), ports: make(map[uint16]int), probes: make(map[uint32]*probeWait),
	}
	d.claims.init()
	d.rlog.log = cfg.log
	d.ctx, d.stop = context.WithCancel(context.Background())
	if !cfg.lazyOpen {
		for i := 0; i < NumVDevs; i++ {
			if _, err := d.vdev(i); err != nil {
				d.Close()
				return nil, err
			}
		}
	}
	d.wg.Add(2)
	go d.ctrlLoop()
	go d.tickLoop()
	return d, nil
}

// Node returns the fabric node this device is attached to.
func (d *Device) Node() fabric.NodeID { return d.att.Node() }

// Stats returns a snapshot of the counters.
func (d *Device) Stats() Stats { return d.ctr.snapshot() }

// VPID returns the VPID serving port (equation 5.3).
func (d *Device) VPID(port uint16) fabric.VPID { return d.cfg.base + fabric.VPID(port&0xF) }

// vdev returns the virtual device idx, opening its endpoint and starting
// its rx loop on first use.
func (d *Device) vdev(idx int) (*vdev, error) {
	d.mu.RLock()
	v, closed := d.vdevs[idx], d.closed
	d.mu.RUnlock()
	if v != nil {
		return v, nil
	}
	if closed {
		return nil, net.ErrClosed
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, net.ErrClosed
	}
	if v := d.vdevs[idx]; v != nil {
		return v, nil
	}
	ep, err := d.att.Open(d.cfg.base + fabric.VPID(idx))
	if err != nil {
		return nil, fmt.Errorf("extds: open vdev %d: %w", idx, err)
	}
	v = &vdev{dev: d, idx: idx, ep: ep,
		msgs: make([]fabric.Message, rxBudget), notes: make([]fabric.Notification, rxBudget)}
	d.vdevs[idx] = v
	d.wg.Add(1)
	go v.run()
	return v, nil
}

// run is the NAPI-style rx loop of one virtual device.
func (v *vdev) run() {
	d := v.dev
	defer d.wg.Done()
	for {
		v.rxMu.Lock()
		got, err := v.poll()
		v.rxMu.Unlock()
		if err == nil && !got {
			err = v.ep.Wait(d.ctx)
		}
		if err != nil {
			if d.ctx.Err() == nil {
				d.rlog.warn("extds: vdev rx loop stopped", "vdev", v.idx, "err", err)
				d.failVdev(v, fmt.Errorf("fabric endpoint: %w", err))
			}
			return
		}
	}
}

// poll receives and dispatches one budget of messages and notifications;
// got says whether there was any. v.rxMu must be held.
func (v *vdev) poll() (got bool, err error) {
	d := v.dev
	n, err := v.ep.Recv(v.msgs)
	for i := 0; i < n; i++ {
		d.dispatch(v, &v.msgs[i], &v.m)
	}
	k, err2 := v.ep.PollNotifications(v.notes)
	for i := 0; i < k; i++ {
		d.notify(v, &v.notes[i])
	}
	if err == nil {
		err = err2
	}
	return n > 0 || k > 0, err
}

func (d *Device) drop(r DropReason, args ...any) {
	d.ctr.drops[r].Add(1)
	d.rlog.warn("extds: drop "+r.String(), args...)
}

// dispatch decodes one VELO message and hands it to its connection.
func (d *Device) dispatch(v *vdev, fm *fabric.Message, m *msg) {
	if err := decodeMsg(fm.Tag, fm.Payload(), m); err != nil {
		d.drop(DropMalformed, "from", fm.Peer, "tag", fm.Tag, "len", fm.Len, "err", err)
		return
	}
	switch m.tag {
	case TagProbe:
		d.onProbe(v, fm.Peer, m)
		return
	case TagProbeRep:
		d.onProbeReply(v, fm.Peer, m)
		return
	case TagClaim:
		d.onClaim(v, fm.Peer, m)
		return
	case TagClaimRep:
		d.onClaimReply(v, fm.Peer, m)
		return
	case TagNoConn:
		d.onNoConn(v, fm.Peer, m)
		return
	}
	d.mu.RLock()
	c := d.conns[m.conn]
	d.mu.RUnlock()
	if c == nil {
		switch m.tag {
		case TagReset, TagRMAAvail, TagShutdown, TagZCDone:
			// Late control for a connection already released: normal
			// after a close, counted but not logged.
			d.ctr.drops[DropUnknownConn].Add(1)
		default:
			// Data (or a ZCopy step) for a connection we do not know:
			// tell the sender, or a writer waiting for credits from a
			// connection released here would wait forever.
			d.drop(DropUnknownConn, "from", fm.Peer, "conn", m.conn, "tag", m.tag)
			d.noConn(v, fm.Peer, m.conn)
		}
		return
	}
	if c.vd != v || !c.peerIs(fm.Peer) {
		d.drop(DropPeerMismatch, "from", fm.Peer, "conn", m.conn, "tag", m.tag)
		return
	}
	c.onMsg(m)
}

// notify hands an RMA notification to the conn owning its local region.
func (d *Device) notify(v *vdev, n *fabric.Notification) {
	d.mu.RLock()
	c := d.regions[n.Local.Region()]
	d.mu.RUnlock()
	if c == nil || c.vd != v {
		d.drop(DropNotify, "kind", n.Kind, "op", n.Op, "local", n.Local, "peer", n.Peer)
		return
	}
	c.onNotify(n)
}

// noConn answers data for the unknown connection ID id with NOCONN,
// rate-limited.
func (d *Device) noConn(v *vdev, peer fabric.Addr, id uint32) {
	if !d.noConnRL.allow(noConnLimit) {
		d.ctr.noConnLimit.Add(1)
		return
	}
	d.sendCtl(v, peer, id, TagNoConn)
}

// onNoConn fails the connection whose peer (the source) no longer knows
// the ID it was sent to. The ID is the peer's: look it up by (source,
// peer ID), which only the real peer can match since the fabric fills in
// the source.
func (d *Device) onNoConn(v *vdev, from fabric.Addr, m *msg) {
	d.mu.RLock()
	c := d.byPeer[peerKey{from, m.conn}]
	d.mu.RUnlock()
	if c == nil || c.vd != v {
		// Both sides already released, or a forgery: counted, not logged.
		d.ctr.drops[DropUnknownConn].Add(1)
		return
	}
	d.ctr.resetsRecv.Add(1)
	c.fail(fmt.Errorf("peer has no such connection: %w", errReset), false)
}

// onProbe answers a peer's listener probe for a port served by vdev v.
func (d *Device) onProbe(v *vdev, from fabric.Addr, m *msg) {
	port := uint16(m.a)
	if int(port&0xF) != v.idx {
		d.drop(DropProbe, "from", from, "port", port, "vdev", v.idx, "why", "probe on the wrong vdev")
		return
	}
	d.mu.RLock()
	n := d.ports[port]
	d.mu.RUnlock()
	var st uint8
	if n > 0 {
		st = 1
	}
	d.ctr.probesServed.Add(1)
	select {
	case d.ctrlq <- ctrlReq{vd: v, peer: from, conn: m.conn, tag: TagProbeRep, port: port, status: st}:
	default:
		d.ctr.drops[DropCtrlQueue].Add(1)
	}
}

// onProbeReply hands an answer to the probe waiting for it.
func (d *Device) onProbeReply(v *vdev, from fabric.Addr, m *msg) {
	d.mu.RLock()
	pw := d.probes[m.conn]
	d.mu.RUnlock()
	if pw == nil || pw.vd != v || pw.peer != from || pw.port != uint16(m.a) {
		d.drop(DropProbe, "from", from, "token", m.conn, "port", m.a, "why", "reply matches no probe")
		return
	}
	select {
	case pw.ch <- m.b == 1:
	default:
		d.drop(DropProbe, "from", from, "token", m.conn, "why", "duplicate reply")
	}
}

// RegisterPort says an EXT-DS listener for TCP port is served on this
// node, so a peer's probe for it is answered "yes" (Listen and NewListener
// do this themselves; exnd's shim server calls it for shimmed apps). It
// opens the port's vdev, which must be open to receive probes and
// connections. Registrations are counted: the port is unlisted when every
// registration's unregister has run. unregister is idempotent.
func (d *Device) RegisterPort(port uint16) (unregister func(), err error) {
	if _, err := d.vdev(int(port & 0xF)); err != nil {
		return func() {}, err
	}
	hookUnreg := func() {}
	if d.cfg.portHook != nil {
		u, err := d.cfg.portHook(port)
		if err != nil {
			return func() {}, err
		}
		hookUnreg = u
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		hookUnreg()
		return func() {}, net.ErrClosed
	}
	d.ports[port]++
	d.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			d.mu.Lock()
			if d.ports[port]--; d.ports[port] <= 0 {
				delete(d.ports, port)
			}
			d.mu.Unlock()
			hookUnreg()
		})
	}, nil
}

// Listening reports whether port is registered (RegisterPort).
func (d *Device) Listening(port uint16) bool {
	d.mu.RLock()
	auto := d.ports[port] > 0
	d.mu.RUnlock()
	return auto || d.claimListening(port)
}

// Probe asks node's Device whether an EXT-DS listener is registered for
// TCP port. It sends one PROBE from the vdev of localPort (the prober's
// side of the shadow connection) to VPID base + (port & 0xF) on node —
// the prober's own base, or, in a process attached through exnd
// (AttachDevice), exnd's block, which answers for the node's attached
// listeners too — and waits at most the probe timeout;
// a node whose vdev for port is not open, or no answer in time, is
// "no". The error is non-nil only when ctx ends or the Device is closed.
func (d *Device) Probe(ctx context.Context, node fabric.NodeID, localPort, port uint16) (bool, error) {
	v, err := d.vdev(int(localPort & 0xF))
	if err != nil {
		return false, err
	}
	pbase := d.cfg.probeBase
	if pbase == 0 {
		pbase = d.cfg.base
	}
	pw := &probeWait{vd: v, peer: fabric.Addr{Node: node, VPID: pbase + fabric.VPID(port&0xF)}, port: port, ch: make(chan bool, 1)}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return false, net.ErrClosed
	}
	for {
		d.nextTok++
		if d.nextTok != 0 && d.probes[d.nextTok] == nil {
			break
		}
	}
	tok := d.nextTok
	d.probes[tok] = pw
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		delete(d.probes, tok)
		d.mu.Unlock()
	}()
	pctx, cancel := context.WithTimeout(ctx, d.cfg.probeTO)
	defer cancel()
	var fm [1]fabric.Message
	encProbe(&fm[0], pw.peer, TagProbe, tok, port, 0)
	d.ctr.probes.Add(1)
	if _, err := v.ep.Send(pctx, fm[:]); err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		if errors.Is(err, net.ErrClosed) {
			return false, err
		}
		return false, nil // unknown node or vdev, peer down, mailbox stuck: no
	}
	select {
	case ok := <-pw.ch:
		return ok, nil
	case <-pctx.Done():
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		d.ctr.probeTimeouts.Add(1)
		return false, nil
	case <-d.ctx.Done():
		return false, net.ErrClosed
	}
}

// sendCtl queues a control message for the control sender; it never
// blocks (a full queue is a counted drop).
func (d *Device) sendCtl(v *vdev, peer fabric.Addr, conn uint32, tag fabric.Tag) {
	select {
	case d.ctrlq <- ctrlReq{vd: v, peer: peer, conn: conn, tag: tag}:
	default:
		d.ctr.drops[DropCtrlQueue].Add(1)
	}
}

func (d *Device) ctrlLoop() {
	defer d.wg.Done()
	var fm [1]fabric.Message
	for {
		select {
		case <-d.ctx.Done():
			return
		case r := <-d.ctrlq:
			switch r.tag {
			case TagProbeRep:
				encProbe(&fm[0], r.peer, r.tag, r.conn, r.port, r.status)
			case TagClaimRep:
				encClaimRep(&fm[0], r.peer, r.conn, r.port, r.status, r.reason)
			default:
				encCtl(&fm[0], r.peer, r.tag, r.conn)
			}
			ctx, cancel := context.WithTimeout(d.ctx, ctrlSendTimeout)
			if _, err := r.vd.ep.Send(ctx, fm[:]); err == nil {
				switch r.tag {
				case TagReset:
					d.ctr.resetsSent.Add(1)
				case TagNoConn:
					d.ctr.noConnSent.Add(1)
				}
			}
			cancel()
		}
	}
}

func (d *Device) tickLoop() {
	defer d.wg.Done()
	t := time.NewTicker(d.cfg.tick)
	defer t.Stop()
	var snap []*Conn
	down := make(map[fabric.NodeID]error)
	for {
		select {
		case <-d.ctx.Done():
			return
		case now := <-t.C:
			d.sweepClaims(now)
			snap = d.snapshot(snap[:0])
			if len(snap) == 0 {
				// Idle: no timer until a connection is registered.
				t.Stop()
				select {
				case <-d.ctx.Done():
					return
				case <-d.connAdded:
				}
				t.Reset(d.cfg.tick)
				continue
			}
			clear(down)
			for _, c := range snap {
				node, ok := c.peerNode()
				if !ok {
					continue
				}
				err, seen := down[node]
				if !seen {
					err = d.att.Alive(node)
					down[node] = err
				}
				if err != nil {
					d.ctr.peerDown.Add(1)
					c.fail(fmt.Errorf("peer node %d: %w", node, fabric.ErrPeerDown), false)
					continue
				}
				c.tick(now)
			}
			clear(snap)
		}
	}
}

func (d *Device) snapshot(buf []*Conn) []*Conn {
	d.mu.RLock()
	for _, c := range d.conns {
		buf = append(buf, c)
	}
	d.mu.RUnlock()
	return buf
}

func (d *Device) failVdev(v *vdev, err error) {
	for _, c := range d.snapshot(nil) {
		if c.vd == v {
			c.fail(err, false)
		}
	}
}

// register adds c under a fresh connection ID. IDs count up from 1 and
// skip 0 and live IDs, so a stale ID is reused only after 2^32 conns.
func (d *Device) register(c *Conn) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return net.ErrClosed
	}
	for {
		d.nextID++
		if d.nextID != 0 && d.conns[d.nextID] == nil {
			break
		}
	}
	c.id = d.nextID
	d.conns[c.id] = c
	if len(d.conns) == 1 {
		select {
		case d.connAdded <- struct{}{}:
		default:
		}
	}
	return nil
}

func (d *Device) addRegion(idx uint32, c *Conn) {
	d.mu.Lock()
	d.regions[idx] = c
	d.mu.Unlock()
}

func (d *Device) delRegion(idx uint32) {
	d.mu.Lock()
	delete(d.regions, idx)
	d.mu.Unlock()
}

func (d *Device) unregister(c *Conn) {
	d.mu.Lock()
	if d.conns[c.id] == c {
		delete(d.conns, c.id)
	}
	d.mu.Unlock()
}

func (d *Device) negative(addr string) bool {
	d.negMu.Lock()
	defer d.negMu.Unlock()
	until, ok := d.neg[addr]
	if ok && time.Now().After(until) {
		delete(d.neg, addr)
		return false
	}
	return ok
}

func (d *Device) setNegative(addr string) {
	d.negMu.Lock()
	if len(d.neg) > 4096 { // bound the cache; forget everything rather than grow
		clear(d.neg)
	}
	d.neg[addr] = time.Now().Add(d.cfg.negativeTTL)
	d.negMu.Unlock()
}

// closePinWait bounds how long Close waits for a ReadFrom in its source's
// Read, or a WriteTo in its destination's Write, to leave the connection's
// ring before the endpoints (and, on shm, the rings' mappings) go: long
// enough for a caller that closes its socket along with the Device, short
// enough that a source that never returns does not hang Close.
const closePinWait = time.Second

// closePinPoll is the poll period of that wait.
const closePinPoll = time.Millisecond

// waitUnpinned waits, up to closePinWait, until no connection of conns
// has a ring pinned (see Conn.txPin).
func (d *Device) waitUnpinned(conns []*Conn) {
	deadline := time.Now().Add(closePinWait)
	for _, c := range conns {
		for {
			c.mu.Lock()
			pinned := c.txPin || c.rxPin
			c.mu.Unlock()
			if !pinned || time.Now().After(deadline) {
				break
			}
			time.Sleep(closePinPoll)
		}
	}
}

// Close aborts every connection (peers get RESET, best effort), closes the
// endpoints and joins all goroutines. It is idempotent. A ReadFrom or
// WriteTo still inside its source's Read or destination's Write delays
// it by up to closePinWait.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	conns := d.snapshot(nil)
	for _, c := range conns {
		c.abort(net.ErrClosed, true)
	}
	d.waitUnpinned(conns)
	d.stop()
	d.mu.Lock()
	vds := d.vdevs
	d.mu.Unlock()
	var errs []error
	for _, v := range vds {
		if v != nil {
			if err := v.ep.Close(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	d.wg.Wait()
	if d.cfg.onClose != nil {
		if err := d.cfg.onClose(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

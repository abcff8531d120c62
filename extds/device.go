package extds

// The receive pipeline.
//
// Stages, per virtual device (one fabric endpoint, VPID base+vdev):
//
//  1. rx loop (vdev.run, one goroutine per opened vdev): Recv up to
//     rxBudget VELO messages, then PollNotifications up to rxBudget; when
//     both are empty, Wait (the endpoint spins briefly, then sleeps).
//     A Read or a Write waiting for credits first polls the vdev itself
//     for its learned spin budget (spin.go) before it parks (Conn.spinWaitLocked):
//     vdev.poll, the same Recv + dispatch, under vdev.rxMu, which the rx
//     loop holds for its polls too, so messages keep their order.
//  2. demux (Device.dispatch): decode the payload (no allocation), hand a
//     message for the node itself to the Agent (agreement.go) or NOCONN's
//     handler, find the connection by the receiver-assigned ID in
//     Device.conns, check that the fabric-filled source is that
//     connection's peer; notifications are matched by the region index
//     of their local NLA (Device.regions).
//  3. per-connection handling (Conn.onMsg / Conn.onNotify, under Conn.mu):
//     queue a receive segment, return credits to the writer, wake readers or
//     writers. The rx loop never blocks on a Send: anything it must say to a
//     peer (a RESET after a protocol violation) goes to the control sender.
//  4. control sender (Device.ctrlLoop, one goroutine): sends queued RESETs,
//     NOCONNs and the Agent's answers with a bounded timeout.
//  5. housekeeping (Device.tickLoop, one goroutine): every tick it sweeps
//     the Agent's claims, checks each peer node's liveness, and releases
//     closed connections whose drain (linger in the background) has run
//     out. With no connection it stops its ticker and sleeps until
//     register adds one (connAdded), so an idle Device has no timer.
//
// Locks: vdev.rxMu is taken with no Conn lock held (a spinning waiter
// holds only its rmu or wmu, which no handler takes) and is held while
// dispatching, i.e. while taking Conn.mu and Device.mu.
// Device.mu guards conns, regions, byPeer, nextID, vdevs and closed; it
// is never held while calling into a Conn that takes Conn.mu (snapshot,
// then call), nor into the Agent, which may take it (agreement.go).
// Conn.mu guards one connection's protocol state (see conn.go). Order:
// Conn.mu may be held while taking Device.mu (release), never the reverse.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/exn-project/exn/extds/internal/agree"
	"github.com/exn-project/exn/extds/internal/wire"
	"github.com/exn-project/exn/fabric"
)

// Device is one node's EXT-DS attachment: the 16 virtual-device endpoints
// of the reserved VPID block, their rx loops, and the connection table;
// its Agent (internal/agree) does the out-of-band agreement with other
// nodes. Connections of every port share it. Close tears everything down.
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
	nextID  uint32
	closed  bool

	noConnRL rateLimit

	// agree is the out-of-band agreement: claims, direct agreements,
	// listener probes and ports, holds, the client's caches
	// (agreement.go). Set once, before any rx loop runs.
	agree *agree.Agent
}

type vdev struct {
	dev *Device
	idx int
	ep  fabric.Endpoint
	// colocated: its peers are goroutines of this process
	// (fabric.Colocated), which a Conn's spin can starve (spin.go).
	colocated bool

	// rxMu serialises receiving and dispatching: the rx loop holds it
	// for one poll, and so does a spinning reader that polls the
	// endpoint itself (Conn.spinRead), so messages of one connection are
	// still handled in order. Guards msgs, notes and m.
	rxMu  sync.Mutex
	msgs  []fabric.Message
	notes []fabric.Notification
	m     wire.Msg
}

// ctrlReq is a message for the control sender: ctl, from vdev vd (open).
type ctrlReq struct {
	vd  int
	ctl wire.Ctl
}

// peerKey names a connection from its peer's side: the peer's endpoint
// address and the connection ID the peer assigned.
type peerKey struct {
	addr fabric.Addr
	id   uint32
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
	case cfg.ringSize < wire.MinRingSize || cfg.ringSize > wire.MaxRingSize:
		return nil, fmt.Errorf("extds: ring size %d not in %d..%d", cfg.ringSize, wire.MinRingSize, wire.MaxRingSize)
	case cfg.eagerWin < wire.MinEagerWin || cfg.eagerWin > wire.MaxEagerWin:
		return nil, fmt.Errorf("extds: eager window %d not in %d..%d", cfg.eagerWin, wire.MinEagerWin, wire.MaxEagerWin)
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
		conns: make(map[uint32]*Conn), connAdded: make(chan struct{}, 1), regions: make(map[uint32]*Conn),
		byPeer: make(map[peerKey]*Conn),
	}
	d.rlog.log = cfg.log
	d.ctx, d.stop = context.WithCancel(context.Background())
	d.agree = d.newAgent()
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
func (d *Device) Stats() Stats { return d.ctr.snapshot(d.agree.Stats()) }

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
	co, _ := ep.(fabric.Colocated)
	v = &vdev{dev: d, idx: idx, ep: ep, colocated: co != nil && co.PeersInProcess(),
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
func (d *Device) dispatch(v *vdev, fm *fabric.Message, m *wire.Msg) {
	if err := wire.Decode(fm.Tag, fm.Payload(), m); err != nil {
		d.drop(DropMalformed, "from", fm.Peer, "tag", fm.Tag, "len", fm.Len, "err", err)
		return
	}
	switch {
	case agree.Handles(m.Tag):
		d.agree.Handle(v.idx, fm.Peer, m) // addressed to the node
		return
	case m.Tag == TagNoConn:
		d.onNoConn(v, fm.Peer, m)
		return
	}
	d.mu.RLock()
	c := d.conns[m.Conn]
	d.mu.RUnlock()
	if c == nil {
		switch m.Tag {
		case TagReset, TagRMAAvail, TagShutdown, TagZCDone:
			// Late control for a connection already released: normal
			// after a close, counted but not logged.
			d.ctr.drops[DropUnknownConn].Add(1)
		default:
			// Data (or a ZCopy step) for a connection we do not know:
			// tell the sender, or a writer waiting for credits from a
			// connection released here would wait forever.
			d.drop(DropUnknownConn, "from", fm.Peer, "conn", m.Conn, "tag", m.Tag)
			d.noConn(v, fm.Peer, m.Conn)
		}
		return
	}
	if c.vd != v || !c.peerIs(fm.Peer) {
		d.drop(DropPeerMismatch, "from", fm.Peer, "conn", m.Conn, "tag", m.Tag)
		return
	}
	c.onMsg(m)
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
func (d *Device) onNoConn(v *vdev, from fabric.Addr, m *wire.Msg) {
	d.mu.RLock()
	c := d.byPeer[peerKey{from, m.Conn}]
	d.mu.RUnlock()
	if c == nil || c.vd != v {
		// Both sides already released, or a forgery: counted, not logged.
		d.ctr.drops[DropUnknownConn].Add(1)
		return
	}
	d.ctr.resetsRecv.Add(1)
	c.fail(fmt.Errorf("peer has no such connection: %w", errReset), false)
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

// sendCtl queues a control message for the control sender.
func (d *Device) sendCtl(v *vdev, peer fabric.Addr, conn uint32, tag fabric.Tag) {
	d.queueCtl(ctrlReq{vd: v.idx, ctl: wire.Ctl{Peer: peer, Conn: conn, Tag: tag}})
}

// queueCtl hands r to the control sender; it never blocks (a full queue
// is a counted drop), so the rx loop and callers under a leaf lock may
// use it.
func (d *Device) queueCtl(r ctrlReq) {
	select {
	case d.ctrlq <- r:
	default:
		d.ctr.drops[DropCtrlQueue].Add(1)
	}
}

// sendNow sends fm from v at once, bounded by ctrlSendTimeout and ctx:
// the control sender's Send. (The Agent's messages whose sender waits
// on their effect are sent the same way, from its caller's goroutine,
// with agree.Config.SendTimeout = ctrlSendTimeout.)
func (v *vdev) sendNow(ctx context.Context, fm *[1]fabric.Message) error {
	sctx, cancel := context.WithTimeout(ctx, ctrlSendTimeout)
	defer cancel()
	_, err := v.ep.Send(sctx, fm[:])
	return err
}

func (d *Device) ctrlLoop() {
	defer d.wg.Done()
	var fm [1]fabric.Message
	for {
		select {
		case <-d.ctx.Done():
			return
		case r := <-d.ctrlq:
			d.mu.RLock()
			vd := d.vdevs[r.vd]
			d.mu.RUnlock()
			r.ctl.Encode(&fm[0])
			if err := vd.sendNow(d.ctx, &fm); err == nil {
				switch r.ctl.Tag {
				case TagReset:
					d.ctr.resetsSent.Add(1)
				case TagNoConn:
					d.ctr.noConnSent.Add(1)
				}
			}
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
			d.agree.Sweep(now)
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
	c.id = agree.FreeID(&d.nextID, d.conns)
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

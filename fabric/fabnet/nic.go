package fabnet

// NIC structure and connection management:
//
//	acceptLoop ──► handshake (≤ maxHandshakes at once) ──► install ──► session.run
//	dialLoop (one per higher-ID peer) ──► dial + handshake ──► install ──► session.run
//	liveness, one of (Config.Liveness):
//	  swim (default; swim.go): membership by SWIM over UDP on the fabric
//	         address; a node it declares dead loses its session
//	  heartbeat: monitor, every Heartbeat, queues a heartbeat on every
//	         session and kills those silent for DeadAfter (by the
//	         injected clock)
//	every change of the session table closes PeersChanged's channel
//
// Tie rule: only the lower node ID dials, so two nodes never race two
// connections. A new session from a node replaces its old one (the peer
// restarted, or our side of a half-open connection had not noticed yet):
// the old one is killed first, which is "peer down" for everything bound
// to it.
//
// Locks: n.mu serialises Open/Close of VPIDs, session install/removal
// and NIC close; the session table itself is a copy-on-write map read
// without locks on every Send and Post. n.regs (localq.Table) guards the region table.
// Every goroutine is started with n.wg.Add under n.mu (or by a goroutine
// that n.wg already counts) and Close waits for all of them.

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/internal/localq"
	"github.com/exn-project/exn/fabric/members"
	"github.com/exn-project/exn/internal/ratelog"
	"github.com/exn-project/exn/internal/sys"
)

// NIC is one node's emulated NIC on a TCP fabric. It implements
// fabric.NIC; NetStats adds the transport counters.
type NIC struct {
	cfg  Config
	id   fabric.NodeID
	boot uint64
	ln   net.Listener
	ctr  fabric.Counters
	nctr netCounters

	eps    localq.Endpoints[endpoint] // open VPIDs; written under mu
	groups localq.Groups              // multicast membership

	sessions atomic.Pointer[map[fabric.NodeID]*session] // copy-on-write; replaced under mu

	mu     sync.Mutex
	closed atomic.Bool
	down   chan struct{}   // closed by Close
	life   context.Context // cancelled by Close: aborts dials and handshakes
	cancel context.CancelFunc
	wg     sync.WaitGroup
	hsSem  chan struct{} // handshake slots

	regs localq.Table[*endpoint, *region] // by NLA region index

	// Under LivenessSWIM (swim.go); nil otherwise. Set by open before
	// any session.
	swim    *members.Transport
	members *members.Members
	// alive[id] is signalled when membership finds node id alive: its
	// dialLoop or askLoop waits for that (fixed after open).
	alive map[fabric.NodeID]chan struct{}
	// changed is closed and replaced at each change of the session
	// table and of membership (PeersChanged); guarded by mu.
	changed chan struct{}
	// links has one entry per other peer under lazy sessions (lazy.go);
	// nil under eager ones. Fixed after open.
	links map[fabric.NodeID]*link

	faults ratelog.Faults // peer-triggerable faults, one line per localq.FaultLogInterval
}

// Open starts node cfg.Node: it listens, dials every peer with a higher
// node ID (retrying with backoff for the NIC's lifetime) and accepts the
// others. It returns at once; peers appear in Peers as their connections
// come up.
func Open(cfg Config) (fabric.NIC, error) { return localq.AsNIC(open(cfg)) }

func open(cfg Config) (*NIC, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	for id, a := range cfg.Peers {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("fabnet: peer %d address %q: %w", id, a, fabric.ErrInvalid)
		}
	}
	ln := cfg.Listener
	if ln == nil {
		addr := cfg.Listen
		if addr == "" {
			addr = cfg.Peers[cfg.Node]
		}
		if addr == "" {
			return nil, fmt.Errorf("fabnet: node %d: no listen address: %w", cfg.Node, fabric.ErrInvalid)
		}
		var err error
		ln, err = net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("fabnet: listen: %w", err)
		}
	}
	var b [8]byte
	_, _ = crand.Read(b[:])
	n := &NIC{
		cfg: cfg, id: cfg.Node, boot: binary.LittleEndian.Uint64(b[:]) | 1, ln: ln,
		down:  make(chan struct{}),
		hsSem: make(chan struct{}, maxHandshakes),
	}
	n.life, n.cancel = context.WithCancel(context.Background())
	n.groups.Init("fabnet", &n.ctr, &n.closed)
	n.regs.Init()
	n.faults.Init(cfg.Logger, localq.FaultLogInterval, "node", n.id)
	n.sessions.Store(&map[fabric.NodeID]*session{})
	n.changed = make(chan struct{})
	if cfg.Liveness == LivenessSWIM {
		n.alive = make(map[fabric.NodeID]chan struct{})
		for id := range cfg.Peers {
			if id != n.id {
				n.alive[id] = make(chan struct{}, 1)
			}
		}
		if cfg.Sessions == SessionsLazy {
			n.initLinks()
		}
		if err := n.startSWIM(); err != nil {
			n.cancel()
			ln.Close()
			return nil, err
		}
	} else {
		n.wg.Add(1)
		go n.monitor()
	}
	n.wg.Add(1)
	go n.acceptLoop()
	if n.links == nil {
		for id, addr := range cfg.Peers {
			if id > n.id {
				n.wg.Add(1)
				go n.dialLoop(id, addr, n.alive[id])
			}
		}
	}
	cfg.Logger.Debug("fabnet node up", "node", n.id, "listen", ln.Addr().String())
	return n, nil
}

// Addr returns the listening address (useful with ":0").
func (n *NIC) Addr() net.Addr { return n.ln.Addr() }

func (n *NIC) Node() fabric.NodeID { return n.id }

func (n *NIC) session(id fabric.NodeID) *session { return (*n.sessions.Load())[id] }

// ---- connection management ----

func (n *NIC) acceptLoop() {
	defer n.wg.Done()
	for {
		c, err := n.ln.Accept()
		if err != nil {
			if n.closed.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			n.faults.Warn("fabnet accept", "err", err)
			select {
			case <-time.After(backoffMin):
			case <-n.down:
				return
			}
			continue
		}
		select {
		case n.hsSem <- struct{}{}:
		default:
			n.nctr.handshakeRejected.Add(1)
			n.faults.Warn("fabnet: too many handshakes, connection refused", "remote", c.RemoteAddr().String())
			c.Close()
			continue
		}
		n.mu.Lock()
		if n.closed.Load() {
			n.mu.Unlock()
			c.Close()
			<-n.hsSem
			return
		}
		n.wg.Add(1)
		n.mu.Unlock()
		go func() {
			defer n.wg.Done()
			h, err := n.acceptHandshake(c)
			<-n.hsSem
			if errors.Is(err, errSWIMStream) {
				n.swim.Accept(c)
				return
			}
			if err != nil {
				n.nctr.handshakeRejected.Add(1)
				n.ctr.Corrupt.Add(1)
				n.faults.Warn("fabnet: connection refused", "remote", c.RemoteAddr().String(), "err", err)
				c.Close()
				return
			}
			n.install(c, h)
		}()
	}
}

// acceptHandshake reads the dialer's hello, checks it against the peers
// table and answers with ours.
func (n *NIC) acceptHandshake(c net.Conn) (hello, error) {
	stop := context.AfterFunc(n.life, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	var b [helloSize]byte
	if _, err := io.ReadFull(c, b[:len(swimMagic)]); err != nil {
		return hello{}, fmt.Errorf("read hello: %w", err)
	}
	if string(b[:len(swimMagic)]) == swimMagic && n.swim != nil {
		c.SetDeadline(time.Time{})
		return hello{}, errSWIMStream
	}
	if _, err := io.ReadFull(c, b[len(swimMagic):]); err != nil {
		return hello{}, fmt.Errorf("read hello: %w", err)
	}
	h, err := decodeHello(b[:])
	if errors.Is(err, errBadVersion) {
		// Tell the dialer our version so its log names the mismatch.
		hello{version: protoVersion, node: n.id, boot: n.boot}.encode(b[:])
		c.Write(b[:])
	}
	if err != nil {
		return hello{}, err
	}
	if err := n.checkPeer(h.node, c.RemoteAddr()); err != nil {
		return hello{}, err
	}
	if h.node > n.id {
		return hello{}, fmt.Errorf("node %d dialled node %d: the lower id dials: %w", h.node, n.id, errProto)
	}
	hello{version: protoVersion, node: n.id, boot: n.boot}.encode(b[:])
	if _, err := c.Write(b[:]); err != nil {
		return hello{}, fmt.Errorf("write hello: %w", err)
	}
	c.SetDeadline(time.Time{})
	return h, nil
}

// errWrongNode: the hello names a node the peers table does not allow
// from that address.
var errWrongNode = errors.New("wrong node")

// errSWIMStream: the connection is a membership stream, not a session.
var errSWIMStream = errors.New("membership stream")

// checkPeer checks that node is a peer and, if its peers entry is an IP
// literal, that the connection comes from that IP.
func (n *NIC) checkPeer(node fabric.NodeID, remote net.Addr) error {
	if node == n.id {
		return fmt.Errorf("hello from our own node id %d: %w", node, errWrongNode)
	}
	addr, ok := n.cfg.Peers[node]
	if !ok {
		return fmt.Errorf("node %d not in peers: %w", node, errWrongNode)
	}
	host, _, _ := net.SplitHostPort(addr)
	want, err := netip.ParseAddr(host)
	if err != nil || want.IsUnspecified() {
		return nil // a host name: nothing to compare without a lookup
	}
	ta, ok := remote.(*net.TCPAddr)
	if !ok {
		return nil
	}
	got, _ := netip.AddrFromSlice(ta.IP)
	if got.Unmap() != want.Unmap() {
		return fmt.Errorf("node %d connected from %v, peers says %v: %w", node, got, want, errWrongNode)
	}
	return nil
}

// dialLoop keeps a session to peer id up for the NIC's lifetime.
func (n *NIC) dialLoop(id fabric.NodeID, addr string, alive <-chan struct{}) {
	defer n.wg.Done()
	backoff := backoffMin
	d := net.Dialer{Timeout: dialTimeout}
	ctx := n.life
	for !n.closed.Load() {
		// Under membership liveness a node it does not know alive (not
		// joined yet, or declared dead) is not dialled: no session to a
		// dead node comes back until membership sees the node again.
		if n.members != nil && !n.awaitAlive(id, alive) {
			return
		}
		n.nctr.dials.Add(1)
		c, err := d.DialContext(ctx, "tcp", addr)
		var h hello
		if err == nil {
			h, err = n.dialHandshake(ctx, c, id)
			if err != nil {
				c.Close()
				n.nctr.handshakeRejected.Add(1)
			}
		}
		if err != nil {
			n.nctr.dialErrors.Add(1)
			if n.closed.Load() {
				return
			}
			n.cfg.Logger.Debug("fabnet dial", "peer", id, "addr", addr, "err", err)
			select {
			case <-time.After(backoff):
			case <-n.down:
				return
			}
			backoff = min(2*backoff, backoffMax)
			continue
		}
		s := n.install(c, h)
		if s == nil {
			return
		}
		backoff = backoffMin
		select {
		case <-s.dead:
		case <-n.down:
			return
		}
	}
}

// awaitAlive waits until membership knows node id alive (alive is its
// signal, memberChanged); false if the NIC closed first.
func (n *NIC) awaitAlive(id fabric.NodeID, alive <-chan struct{}) bool {
	for !n.members.Alive(id) {
		select {
		case <-alive:
		case <-n.down:
			return false
		}
	}
	return true
}

func (n *NIC) dialHandshake(ctx context.Context, c net.Conn, want fabric.NodeID) (hello, error) {
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	var b [helloSize]byte
	hello{version: protoVersion, node: n.id, boot: n.boot}.encode(b[:])
	if _, err := c.Write(b[:]); err != nil {
		return hello{}, fmt.Errorf("write hello: %w", err)
	}
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return hello{}, fmt.Errorf("read hello: %w", err)
	}
	h, err := decodeHello(b[:])
	if err != nil {
		return hello{}, err
	}
	if h.node != want {
		return hello{}, fmt.Errorf("dialled node %d, hello says %d: %w", want, h.node, errWrongNode)
	}
	c.SetDeadline(time.Time{})
	return h, nil
}

// install makes c the session to h.node, replacing (killing) an older
// one, and starts it. It returns nil if the NIC is closed.
func (n *NIC) install(c net.Conn, h hello) *session {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true) // the writer coalesces; Nagle would only add latency
		if n.swim != nil {
			// No heartbeat watches this session: its own unacknowledged
			// data does (swim.go).
			if rc, err := tc.SyscallConn(); err == nil {
				rc.Control(func(fd uintptr) { sys.SetTCPUserTimeout(int(fd), sessionUserTimeout) })
			}
		}
	}
	n.mu.Lock()
	if n.closed.Load() {
		n.mu.Unlock()
		c.Close()
		return nil
	}
	old := n.session(h.node)
	s := newSession(n, c, h)
	n.replaceLocked(h.node, s)
	if l := n.links[h.node]; l != nil {
		// After the table, under mu: whoever sees wasUp also sees the
		// session (sessionTo looks again then; TestLazyFirstSends), and
		// reachable sees the live session in between.
		l.wasUp.Store(true)
	}
	n.wg.Add(1)
	n.mu.Unlock()
	n.activate(h.node) // lazy sessions: its keeper brings it back if it ends
	if old != nil {
		old.kill(fmt.Errorf("replaced by a new connection (incarnation %#x): %w", h.boot, fabric.ErrPeerDown))
	}
	n.nctr.sessionsUp.Add(1)
	n.cfg.Logger.Info("fabnet peer up", "node", n.id, "peer", h.node, "remote", c.RemoteAddr().String())
	go s.run()
	return s
}

// replaceLocked publishes a session table with node → s (s nil: removed).
func (n *NIC) replaceLocked(node fabric.NodeID, s *session) {
	old := *n.sessions.Load()
	m := make(map[fabric.NodeID]*session, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	if s == nil {
		delete(m, node)
	} else {
		m[node] = s
	}
	n.sessions.Store(&m)
	n.announceLocked()
}

// announceLocked closes PeersChanged's channel and makes the next one.
func (n *NIC) announceLocked() {
	close(n.changed)
	n.changed = make(chan struct{})
}

// PeersChanged implements fabric.PeerWatcher: the channel closes at the
// next change of the session table (a session up, replaced or gone) or
// of membership (a node found alive or dead).
func (n *NIC) PeersChanged() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.changed
}

// remove takes s off the table if it is still the current session.
func (n *NIC) remove(s *session) {
	n.mu.Lock()
	if n.session(s.peer) == s {
		n.replaceLocked(s.peer, nil)
	}
	n.mu.Unlock()
}

// monitor sends heartbeats and expires silent sessions.
func (n *NIC) monitor() {
	defer n.wg.Done()
	t := time.NewTicker(n.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-n.down:
			return
		}
		n.tick()
	}
}

// tick is one monitor round: it is separate so tests can drive it.
func (n *NIC) tick() {
	now := n.cfg.Now()
	for _, s := range *n.sessions.Load() {
		if f := s.framesIn.Load(); f != s.seenFrames {
			s.seenFrames = f
			s.lastHeard = now
		} else if now.Sub(s.lastHeard) > n.cfg.DeadAfter {
			n.nctr.heartbeatTimeouts.Add(1)
			s.kill(fmt.Errorf("silent for %v: %w", now.Sub(s.lastHeard).Round(time.Millisecond), fabric.ErrPeerDown))
			continue
		}
		s.queueCtl(tHeartbeat, 0, 0, 0, nil)
		s.kick()
	}
}

// ---- fabric.NIC ----

func (n *NIC) Open(v fabric.VPID) (fabric.Endpoint, error) {
	return localq.Open(&n.eps, &n.mu, &n.closed, &n.ctr, "fabnet", n.id, v, func() *endpoint { return newEndpoint(n, v) })
}

// Join adds this node to group g. Membership is checked by the receiving
// node when a multicast frame arrives, so a Join is effective for every
// frame that arrives after it returns.
func (n *NIC) Join(g fabric.Group) error { return n.groups.Join(g) }

func (n *NIC) Leave(g fabric.Group) error { return n.groups.Leave(g) }

// Peers lists the nodes with a live session, sorted; under lazy
// sessions also the nodes membership knows alive that have had no
// session yet (they get one when used).
func (n *NIC) Peers() []fabric.NodeID {
	if n.links != nil {
		var out []fabric.NodeID
		for id := range n.links {
			if n.reachable(id) {
				out = append(out, id)
			}
		}
		slices.Sort(out)
		return out
	}
	m := *n.sessions.Load()
	out := make([]fabric.NodeID, 0, len(m))
	for id, s := range m {
		if !s.isDead() {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// Alive reports nil for a node with a live session (and this node),
// ErrPeerDown for a node of the peers table without one (never connected
// yet, or gone), ErrUnknownNode for any other node. Under lazy sessions
// a node that has had no session yet is alive when membership says so.
func (n *NIC) Alive(id fabric.NodeID) error {
	if id == n.id {
		return localq.SelfAlive("fabnet", &n.closed)
	}
	_, err := n.lookup(id)
	if err != nil && n.links != nil && n.reachable(id) {
		return nil
	}
	return err
}

// lookup returns the live session to id or the error its callers get.
func (n *NIC) lookup(id fabric.NodeID) (*session, error) {
	if s := n.session(id); s != nil && !s.isDead() {
		return s, nil
	}
	if _, ok := n.cfg.Peers[id]; ok {
		return nil, fmt.Errorf("fabnet: node %d: %w", id, fabric.ErrPeerDown)
	}
	return nil, fmt.Errorf("fabnet: node %d: %w", id, fabric.ErrUnknownNode)
}

func (n *NIC) Stats() fabric.Stats { return n.ctr.Snapshot() }

// Close shuts the node down: every session is closed (peers see the
// connection drop and mark this node down at once), every endpoint is
// closed, and every goroutine is joined.
func (n *NIC) Close() error {
	if !localq.Shut(&n.mu, &n.closed, func() { close(n.down); n.cancel() }) {
		return nil
	}
	if n.members != nil {
		// Peers mark us left at once instead of probing us dead; this
		// also shuts the membership transport down.
		n.members.Leave(leaveTimeout)
	}
	n.ln.Close()
	for _, s := range *n.sessions.Load() {
		s.kill(fmt.Errorf("nic closed: %w", net.ErrClosed))
	}
	n.eps.Each(func(ep *endpoint) { ep.Close() })
	n.wg.Wait()
	n.cfg.Logger.Debug("fabnet node down", "node", n.id)
	return nil
}

// ---- regions ----

// region is registered memory. Users (RMA copies, socket reads and writes
// into buf) acquire it; kill marks it dead — later acquires fail at once,
// they never block — and waits for the current users to finish. So no
// byte moves into or out of a region after Deregister returns, and no
// network goroutine ever blocks on a region lock.
type region struct {
	idx   uint32
	owner *endpoint
	buf   []byte

	mu      sync.Mutex
	dead    bool          // guarded by mu
	users   int           // guarded by mu
	drained chan struct{} // guarded by mu; closed when users drop to 0 after kill
}

func (r *region) acquire() bool {
	r.mu.Lock()
	ok := !r.dead
	if ok {
		r.users++
	}
	r.mu.Unlock()
	return ok
}

func (r *region) release() {
	r.mu.Lock()
	r.users--
	if r.users == 0 && r.drained != nil {
		close(r.drained)
		r.drained = nil
	}
	r.mu.Unlock()
}

func (r *region) kill() {
	r.mu.Lock()
	r.dead = true
	if r.users == 0 {
		r.mu.Unlock()
		return
	}
	ch := make(chan struct{})
	r.drained = ch
	r.mu.Unlock()
	<-ch
}

func (n *NIC) lookupRegion(idx uint32) *region {
	r, _ := n.regs.Lookup(idx)
	return r
}

// remoteRegion resolves an RMA target on this node for VPID v: the
// endpoint must be open, the region registered to it, and
// [nla, nla+length) inside it.
func (n *NIC) remoteRegion(v fabric.VPID, nla fabric.NLA, length uint64) (*endpoint, *region, fabric.NotifyErr) {
	ep := n.eps[v].Load()
	if ep == nil || ep.Closed.Load() {
		return nil, nil, fabric.NErrPeerDown
	}
	r, nerr := n.regs.Check(ep, nla, length)
	if nerr != fabric.NErrNone {
		return ep, nil, nerr
	}
	return ep, r, fabric.NErrNone
}

package fabnet

// Membership liveness (Config.Liveness = LivenessSWIM, the default; issue
// #36, docs/membership.md): instead of a heartbeat on every session, each
// node runs SWIM (fabric/members, hashicorp/memberlist) over
// members.Transport (fabric/members/transport.go) on its own fabric
// address:
//
//	packets: one UDP socket on the listener's own IP and port; the
//	   Transport checks the sender's IP against the peers table and
//	   offers lazy sessions' own datagrams to rxDatagram (lazy.go) before
//	   memberlist sees the rest
//	streams (joins and anti-entropy, and memberlist's TCP fallback probe):
//	   TCP to the peer's fabric port, first 4 bytes swimMagic;
//	   acceptHandshake sees the magic instead of a hello and hands the
//	   connection to the Transport (Accept)
//	members.OnChange(node, dead) ──► the session to node is killed (as a
//	   heartbeat timeout was): everything bound to it gets ErrPeerDown;
//	   the dialLoop of a higher-ID node dials only while membership
//	   knows it alive (OnChange(node, alive) wakes it)
//	joinLoop: members.JoinLoop through the peers of the table
//
// An idle session then carries nothing: the cost of liveness per node is
// SWIM's, the same at any cluster size. A session with data in flight is
// watched by its own traffic too: TCP_USER_TIMEOUT (sessionUserTimeout)
// aborts it when what it sent stays unacknowledged, and its writes have
// the DeadAfter deadline as before.
//
// Locks: none of its own. The Transport's goroutines are its own
// (stopped by Shutdown, which memberlist's Shutdown calls from
// Members.Close or Leave); joinLoop is counted in n.wg.

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/members"
)

const (
	// swimMagic opens a membership stream on the fabric port, where a
	// session's hello says "EXNF".
	swimMagic = "EXNM"
	// metaLazy, in the first byte of a node's membership metadata: it
	// makes sessions on first use, so it sends and takes dial requests
	// and multicast datagrams (lazy.go). A node without it (eager, or an
	// exnd from before lazy sessions) is dialled by lazy lower nodes as
	// soon as membership sees it.
	metaLazy = 1 << 0
	// leaveTimeout bounds how long Close waits for its leave to spread.
	leaveTimeout = 250 * time.Millisecond
	// sessionUserTimeout is the session sockets' TCP_USER_TIMEOUT: data
	// unacknowledged this long aborts the connection (a peer host that
	// vanished while we were sending to it).
	sessionUserTimeout = 5 * time.Second
)

// startSWIM opens the UDP socket on the listener's address, starts
// membership and the join loop. Called by open before any session.
func (n *NIC) startSWIM() error {
	la, ok := n.ln.Addr().(*net.TCPAddr)
	if !ok {
		return fmt.Errorf("fabnet: swim liveness needs a TCP listener, not %T: %w", n.ln.Addr(), fabric.ErrInvalid)
	}
	adv, err := n.advertised(la)
	if err != nil {
		return err
	}
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: la.IP, Port: la.Port, Zone: la.Zone})
	if err != nil {
		return fmt.Errorf("fabnet: swim socket: %w", err)
	}
	addrs := make([]string, 0, len(n.cfg.Peers))
	for _, a := range n.cfg.Peers {
		addrs = append(addrs, a)
	}
	tc := members.TransportConfig{UDP: udp, Advertise: adv, Peers: addrs, StreamMagic: swimMagic, Logger: n.cfg.Logger}
	if n.links != nil {
		var m fabric.Message // the reader's scratch for rxDatagram
		tc.Intercept = func(b []byte, from netip.AddrPort) bool { return n.rxDatagram(b, from, &m) }
	}
	t, err := members.NewTransport(tc)
	if err != nil {
		udp.Close()
		return err
	}
	n.swim = t
	var meta byte
	if n.links != nil {
		meta |= metaLazy
	}
	m, err := members.New(members.Config{
		Node: n.id, Transport: t, Profile: n.cfg.SWIM, Logger: n.cfg.Logger,
		OnChange: n.memberChanged, Meta: []byte{meta},
	})
	if err != nil {
		t.Shutdown()
		return err
	}
	n.members = m
	// After n.members: a dial request the reader takes starts a keeper
	// that asks membership (lazy.go).
	t.Start()
	n.wg.Add(1)
	go n.joinLoop()
	return nil
}

// advertised is the address the other nodes reach this one at: the
// listener's, or, where it listens on every address, this node's entry
// in the peers table.
func (n *NIC) advertised(la *net.TCPAddr) (netip.AddrPort, error) {
	if ip, ok := netip.AddrFromSlice(la.IP); ok && !ip.IsUnspecified() {
		return netip.AddrPortFrom(ip.Unmap(), uint16(la.Port)), nil
	}
	own, ok := n.cfg.Peers[n.id]
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("fabnet: node %d listens on %v and has no peers entry to advertise: %w", n.id, la, fabric.ErrInvalid)
	}
	ua, err := net.ResolveUDPAddr("udp", own)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("fabnet: node %d address %q: %w", n.id, own, err)
	}
	ap := ua.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), uint16(la.Port)), nil
}

// memberChanged is members.Config.OnChange: a node SWIM declared dead (or
// that left) is counted (SWIMDown) and loses its session, if it has one,
// at once.
func (n *NIC) memberChanged(node fabric.NodeID, alive bool) {
	if node == n.id {
		return
	}
	n.mu.Lock()
	if !n.closed.Load() {
		n.announceLocked() // Peers and Alive follow membership (lazy.go)
	}
	n.mu.Unlock()
	if alive {
		select {
		case n.alive[node] <- struct{}{}: // its dialLoop or askLoop may go on
		default:
		}
		if node > n.id && !n.peerLazy(node) {
			// It will never ask us to dial (eager, or an exnd from
			// before lazy sessions): dial it now, as eager nodes do.
			n.activate(node)
		}
		return
	}
	n.nctr.swimDown.Add(1)
	if s := n.session(node); s != nil && !s.isDead() {
		s.kill(fmt.Errorf("declared dead by membership: %w", fabric.ErrPeerDown))
	}
}

// joinLoop joins the cluster through the peers of the table.
func (n *NIC) joinLoop() {
	defer n.wg.Done()
	var seeds []string
	for id, a := range n.cfg.Peers {
		if id != n.id {
			seeds = append(seeds, a)
		}
	}
	n.members.JoinLoop(seeds, n.down)
}

// peerLazy says whether node advertised metaLazy.
func (n *NIC) peerLazy(node fabric.NodeID) bool {
	b, ok := n.members.Meta(node)
	return ok && len(b) > 0 && b[0]&metaLazy != 0
}

package fabnet

// Membership liveness (Config.Liveness = LivenessSWIM, the default; issue
// #36, docs/membership.md): instead of a heartbeat on every session, each
// node runs SWIM (fabric/members, hashicorp/memberlist) over this
// transport:
//
//	packets: one UDP socket on the listener's own IP and port ──► readLoop
//	   (the sender's IP checked against the peers table) ──► packets chan
//	   ──► memberlist;  memberlist WriteTo ──► sendto
//	streams (joins and anti-entropy, and memberlist's TCP fallback probe):
//	   DialTimeout ──► TCP to the peer's fabric port, first 4 bytes
//	   swimMagic; acceptHandshake sees the magic instead of a hello and
//	   hands the connection (peer IP checked) to the streams chan
//	members.OnChange(node, dead) ──► the session to node is killed (as a
//	   heartbeat timeout was): everything bound to it gets ErrPeerDown;
//	   the dialLoop of a higher-ID node dials only while membership
//	   knows it alive (OnChange(node, alive) wakes it)
//	joinLoop: until some peer answered, Join through up to joinSeeds
//	   random peers of the table, backing off from backoffMin to
//	   joinBackoffMax
//
// An idle session then carries nothing: the cost of liveness per node is
// SWIM's, the same at any cluster size. A session with data in flight is
// watched by its own traffic too: TCP_USER_TIMEOUT (sessionUserTimeout)
// aborts it when what it sent stays unacknowledged, and its writes have
// the DeadAfter deadline as before.
//
// Locks: none of its own; the transport's channels are its interface to
// memberlist. readLoop and joinLoop are counted in n.wg and stop when the
// NIC closes (the UDP socket is closed by Shutdown, called by
// memberlist's own Shutdown from Members.Close).

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/members"
)

const (
	// swimMagic opens a membership stream on the fabric port, where a
	// session's hello says "EXNF".
	swimMagic = "EXNM"
	// swimQueue bounds received packets memberlist has not taken yet;
	// past it they are dropped (UDP would drop them too) and counted.
	swimQueue = 1024
	// swimPacketMax is the largest datagram read (memberlist sends at
	// most its UDPBufferSize, 1400 bytes).
	swimPacketMax = 64 << 10
	// joinSeeds is how many random peers one join attempt asks: any one
	// that answers is enough, and asking all would cost a full-state
	// exchange with each.
	joinSeeds = 3
	// joinBackoffMax bounds the wait between join attempts while no peer
	// answered (the first node up waits for the others).
	joinBackoffMax = 5 * time.Second
	// leaveTimeout bounds how long Close waits for its leave to spread.
	leaveTimeout = 250 * time.Millisecond
	// sessionUserTimeout is the session sockets' TCP_USER_TIMEOUT: data
	// unacknowledged this long aborts the connection (a peer host that
	// vanished while we were sending to it).
	sessionUserTimeout = 5 * time.Second
)

// swimTransport is memberlist.Transport over the fabric's own address.
type swimTransport struct {
	n       *NIC
	udp     *net.UDPConn
	adv     netip.AddrPort
	allowed map[netip.Addr]bool // peers' IPs; nil: some entry is a name, nothing checked
	packets chan *memberlist.Packet
	streams chan net.Conn
	once    sync.Once
}

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
	t := &swimTransport{
		n: n, udp: udp, adv: adv, allowed: peerIPs(n.cfg.Peers),
		packets: make(chan *memberlist.Packet, swimQueue),
		streams: make(chan net.Conn, maxHandshakes),
	}
	n.swim = t
	m, err := members.New(members.Config{
		Node: n.id, Transport: t, Profile: n.cfg.SWIM, Logger: n.cfg.Logger,
		OnChange: n.memberChanged,
	})
	if err != nil {
		t.Shutdown()
		return err
	}
	n.members = m
	// After n.members: a dial request the reader takes starts a keeper
	// that asks membership (lazy.go).
	n.wg.Add(1)
	go t.readLoop()
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

// peerIPs is the set of the peers' IP literals, or nil when an entry is
// a host name (whose address would need a lookup).
func peerIPs(peers map[fabric.NodeID]string) map[netip.Addr]bool {
	m := make(map[netip.Addr]bool, len(peers))
	for _, a := range peers {
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			return nil
		}
		ip, err := netip.ParseAddr(host)
		if err != nil {
			return nil
		}
		m[ip.Unmap()] = true
	}
	return m
}

// fromPeer says whether a packet or stream from ip may be a peer's.
func (t *swimTransport) fromPeer(ip netip.Addr) bool {
	return t.allowed == nil || t.allowed[ip.Unmap()]
}

func (t *swimTransport) readLoop() {
	defer t.n.wg.Done()
	buf := make([]byte, swimPacketMax)
	var m fabric.Message // rxDatagram's scratch
	for {
		k, from, err := t.udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			t.n.faults.Warn("fabnet: swim read", "err", err)
			continue
		}
		now := time.Now()
		if !t.fromPeer(from.Addr()) {
			t.n.nctr.swimForeign.Add(1)
			continue
		}
		if t.n.links != nil && t.n.rxDatagram(buf[:k], from, &m) {
			continue
		}
		t.n.nctr.swimIn.Add(1)
		p := &memberlist.Packet{Buf: slices.Clone(buf[:k]), From: net.UDPAddrFromAddrPort(from), Timestamp: now}
		select {
		case t.packets <- p:
		default:
			t.n.nctr.swimDropped.Add(1)
		}
	}
}

func (t *swimTransport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	return net.IP(t.adv.Addr().AsSlice()), int(t.adv.Port()), nil
}

func (t *swimTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return time.Time{}, fmt.Errorf("fabnet: swim address %q: %w", addr, err)
	}
	t.n.nctr.swimOut.Add(1)
	_, err = t.udp.WriteToUDPAddrPort(b, ap)
	return time.Now(), err
}

func (t *swimTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *swimTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	c.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte(swimMagic)); err != nil {
		c.Close()
		return nil, err
	}
	c.SetWriteDeadline(time.Time{})
	t.n.nctr.swimStreams.Add(1)
	return c, nil
}

// accept takes a connection whose first bytes were swimMagic.
func (t *swimTransport) accept(c net.Conn) {
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(ta.IP); ok && !t.fromPeer(ip) {
			t.n.nctr.swimForeign.Add(1)
			c.Close()
			return
		}
	}
	select {
	case t.streams <- c:
		t.n.nctr.swimStreams.Add(1)
	default:
		t.n.nctr.swimDropped.Add(1)
		c.Close()
	}
}

func (t *swimTransport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown closes the UDP socket (readLoop returns) and any stream not
// taken yet.
func (t *swimTransport) Shutdown() error {
	var err error
	t.once.Do(func() {
		err = t.udp.Close()
		for {
			select {
			case c := <-t.streams:
				c.Close()
			default:
				return
			}
		}
	})
	return err
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
		return
	}
	n.nctr.swimDown.Add(1)
	if s := n.session(node); s != nil && !s.isDead() {
		s.kill(fmt.Errorf("declared dead by membership: %w", fabric.ErrPeerDown))
	}
}

// joinLoop joins the cluster through random peers until one answers.
func (n *NIC) joinLoop() {
	defer n.wg.Done()
	var seeds []string
	for id, a := range n.cfg.Peers {
		if id != n.id {
			seeds = append(seeds, a)
		}
	}
	if len(seeds) == 0 {
		return
	}
	backoff := backoffMin
	for {
		rand.Shuffle(len(seeds), func(i, j int) { seeds[i], seeds[j] = seeds[j], seeds[i] })
		if k, err := n.members.Join(seeds[:min(joinSeeds, len(seeds))]); err == nil && k > 0 {
			return
		}
		// Somebody may have joined through us meanwhile.
		if len(n.members.Peers()) > 0 {
			return
		}
		select {
		case <-time.After(backoff):
		case <-n.down:
			return
		}
		backoff = min(2*backoff, joinBackoffMax)
	}
}

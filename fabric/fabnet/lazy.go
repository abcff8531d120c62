package fabnet

// Sessions on first use (Config.Sessions = SessionsLazy, the default
// under membership liveness; issue #36, docs/fabric-net.md "Sessions on
// first use"). A node holds sessions only to the peers it talks to:
//
//	n.links: one link per other peer of the table, fixed after open
//	activate(id), once per peer for the NIC's lifetime, starts its keeper:
//	   id > n.id: dialLoop (nic.go), which dials while membership knows
//	              id alive and keeps the session up
//	   id < n.id: askLoop, which, while membership knows id alive and no
//	              session is up, sends id a dial request datagram on the
//	              membership socket (backoff as a dial's) and otherwise
//	              waits for the session's end; the tie rule stays "only the
//	              lower ID dials"
//	activation comes from: a Send or Post to the peer (sessionTo), a
//	   session installed either way (install), a dial request from a
//	   higher peer (readLoop ──► rxDialRequest)
//	sessionTo: a peer alive by membership that has had no session since
//	   this NIC opened is "connecting": the caller waits (at most
//	   connectWait, its ctx, Close) for the session. A peer whose session
//	   was up and is gone is down at once, as with eager sessions, until
//	   its keeper brings a new one.
//	multicast (sendMulticast): nodes with a session get it on the
//	   session, with a credit; members alive without one get one
//	   datagram each (mcDatagram), which the receiver puts into the
//	   VPID's mailbox if a slot is free and drops (counted) otherwise —
//	   so an ARP broadcast reaches every node without making 1,000
//	   sessions. Multicast is not ordered against unicast in any
//	   backend; datagrams of one sender arrive in send order on a LAN,
//	   and a lost fragment makes the receiver's reassembly drop the
//	   frame (exn/rx.go), as a full mailbox does elsewhere.
//
// Datagrams (after a 4-byte magic that no memberlist message starts
// with: memberlist's first byte is a message type below 'E'):
//
//	dial request "EXND": 4..5 node (LE, the asker)  6..7 zero
//	multicast    "EXNV": 4..5 node (LE, the sender)  6 sender VPID
//	                     7 target VPID  8..15 descriptor word (MC, group
//	                     in Node)  16.. payload (descriptor's Len bytes)
//
// Both are checked before use: the size, the magic, the node (a peer of
// the table, not this node; a dial request only from a higher one) and
// the source IP against that node's entry; a multicast descriptor must
// be MC, agree with the target VPID and the payload's length. Refused
// datagrams are counted (NetStats.BadDatagrams, SWIMForeign) and the
// reader goes on.
//
// Locks: link.active is set under n.mu (activate), so each keeper starts
// once and is counted in n.wg; link.wasUp is set under n.mu by install.
// The rest is read without locks.

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/exn-project/exn/fabric"
)

const (
	dialReqMagic = "EXND"
	dialReqSize  = 8
	mcastMagic   = "EXNV"
	mcastHeader  = 16
)

// link is this node's state for one other peer of the table.
type link struct {
	id fabric.NodeID
	// udp is the peer's membership socket (its fabric address), when its
	// entry is an IP literal; otherwise resolved per datagram.
	udp    netip.AddrPort
	active atomic.Bool // its keeper runs (set once, under n.mu)
	wasUp  atomic.Bool // a session to it was up since open (under n.mu)
}

// initLinks makes n.links for lazy sessions. Called by open.
func (n *NIC) initLinks() {
	n.links = make(map[fabric.NodeID]*link, len(n.cfg.Peers))
	for id, a := range n.cfg.Peers {
		if id == n.id {
			continue
		}
		l := &link{id: id}
		if ap, err := netip.ParseAddrPort(a); err == nil {
			l.udp = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		}
		n.links[id] = l
	}
}

// activate starts id's keeper unless it runs already; a no-op for eager
// sessions, unknown nodes and a closed NIC.
func (n *NIC) activate(id fabric.NodeID) {
	l := n.links[id]
	if l == nil || l.active.Load() {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed.Load() || l.active.Load() {
		return
	}
	l.active.Store(true)
	n.nctr.activated.Add(1)
	n.wg.Add(1)
	if id > n.id {
		go n.dialLoop(id, n.cfg.Peers[id], n.alive[id])
	} else {
		go n.askLoop(l, n.alive[id])
	}
}

// reachable is Alive's and Peers' answer: a live session, or, for a
// peer that has had none since open, membership's word.
func (n *NIC) reachable(id fabric.NodeID) bool {
	if s := n.session(id); s != nil && !s.isDead() {
		return true
	}
	l := n.links[id]
	return l != nil && !l.wasUp.Load() && n.members.Alive(id)
}

// sessionTo returns the live session to id. Under lazy sessions, for a
// peer alive by membership that has had no session yet, it starts one
// and waits for it: at most connectWait, ctx (nil: none) and Close. The
// path with a session takes no lock.
func (n *NIC) sessionTo(ctx context.Context, id fabric.NodeID) (*session, error) {
	s, err := n.lookup(id)
	if l := n.links[id]; err != nil && l != nil {
		return n.awaitSession(ctx, l, err)
	}
	return s, err
}

// awaitSession is sessionTo without a live session; err is lookup's.
func (n *NIC) awaitSession(ctx context.Context, l *link, err error) (*session, error) {
	var done <-chan struct{}
	if ctx != nil {
		done = ctx.Done()
	}
	var t *time.Timer
	for {
		// Install publishes the session before it sets wasUp, so a
		// peer that was (or just came) up is decided by one more look.
		if l.wasUp.Load() {
			return n.lookup(l.id)
		}
		if !n.members.Alive(l.id) {
			return nil, err
		}
		if t == nil {
			n.activate(l.id)
			n.nctr.connectWaits.Add(1)
			t = time.NewTimer(connectWait)
			defer t.Stop()
		}
		ch := n.PeersChanged() // before the look: no change is missed
		var s *session
		if s, err = n.lookup(l.id); err == nil {
			return s, nil
		}
		select {
		case <-ch:
		case <-done:
			return nil, ctx.Err()
		case <-t.C:
			n.nctr.connectTimeouts.Add(1)
			return nil, fmt.Errorf("fabnet: node %d: no session within %v: %w", l.id, connectWait, fabric.ErrPeerDown)
		case <-n.down:
			return nil, fmt.Errorf("fabnet: node %d: %w", l.id, net.ErrClosed)
		}
	}
}

// askLoop keeps a session from lower peer l up for the NIC's lifetime:
// while membership knows it alive and no session is up, it asks it to
// dial, with a dial's backoff; while one is up, it waits for its end.
func (n *NIC) askLoop(l *link, alive <-chan struct{}) {
	defer n.wg.Done()
	backoff := backoffMin
	for !n.closed.Load() {
		if !n.awaitAlive(l.id, alive) {
			return
		}
		ch := n.PeersChanged()
		if s := n.session(l.id); s != nil && !s.isDead() {
			backoff = backoffMin
			select {
			case <-s.dead:
			case <-n.down:
				return
			}
			continue
		}
		n.askDial(l)
		t := time.NewTimer(backoff)
		select {
		case <-ch:
		case <-t.C:
			backoff = min(2*backoff, backoffMax)
		case <-n.down:
			t.Stop()
			return
		}
		t.Stop()
	}
}

// askDial sends l a dial request.
func (n *NIC) askDial(l *link) {
	var b [dialReqSize]byte
	copy(b[:], dialReqMagic)
	binary.LittleEndian.PutUint16(b[4:6], uint16(n.id))
	// Counted before it leaves: the session it brings may be up before
	// this goroutine runs again.
	n.nctr.dialAsks.Add(1)
	n.sendDatagram(l, b[:])
}

// sendDatagram sends b to l's membership socket; a failure is logged
// (rate-limited) and the datagram is lost, as on a full network.
func (n *NIC) sendDatagram(l *link, b []byte) {
	to := l.udp
	if !to.IsValid() {
		ua, err := net.ResolveUDPAddr("udp", n.cfg.Peers[l.id])
		if err != nil {
			n.faults.Warn("fabnet: peer address", "peer", l.id, "err", err)
			return
		}
		to = ua.AddrPort()
	}
	if err := n.swim.WriteToAddrPort(b, to); err != nil {
		n.faults.Warn("fabnet: datagram to peer", "peer", l.id, "err", err)
	}
}

// sendMulticastDatagrams sends m (from VPID a) to every member alive
// without a live session in sessions.
func (n *NIC) sendMulticastDatagrams(a fabric.VPID, m *fabric.Message, sessions map[fabric.NodeID]*session) {
	var b [mcastHeader + fabric.MaxVELOPayload]byte
	copy(b[:], mcastMagic)
	binary.LittleEndian.PutUint16(b[4:6], uint16(n.id))
	b[6], b[7] = byte(a), byte(m.Peer.VPID)
	d := fabric.Descriptor{Node: m.Peer.Node, VPID: m.Peer.VPID, Tag: m.Tag, Len: m.Len, MC: true}
	binary.LittleEndian.PutUint64(b[8:16], d.Encode())
	k := mcastHeader + copy(b[mcastHeader:], m.Data[:m.Len])
	for id, l := range n.links {
		if s := sessions[id]; s != nil && !s.isDead() {
			continue
		}
		if !n.members.Alive(id) {
			continue
		}
		n.nctr.mcastOut.Add(1) // before it leaves, as dialAsks
		n.sendDatagram(l, b[:k])
	}
}

// rxDatagram takes a datagram with one of this file's magics; false if
// b has neither (it is memberlist's). from is the sender's address;
// m is the reader's scratch message.
func (n *NIC) rxDatagram(b []byte, from netip.AddrPort, m *fabric.Message) bool {
	if len(b) < 4 {
		return false
	}
	switch string(b[:4]) {
	case dialReqMagic:
		n.rxDialRequest(b, from)
	case mcastMagic:
		n.rxMulticast(b, from, m)
	default:
		return false
	}
	return true
}

// datagramPeer checks a datagram's node field: a peer of the table, not
// this node, sending from its entry's IP.
func (n *NIC) datagramPeer(b []byte, from netip.AddrPort) (fabric.NodeID, bool) {
	id := fabric.NodeID(binary.LittleEndian.Uint16(b[4:6]))
	l := n.links[id]
	if l == nil {
		n.nctr.badDatagrams.Add(1)
		n.faults.Warn("fabnet: datagram from a node not in the peers table", "node", id, "remote", from.String())
		return 0, false
	}
	// l.udp is the entry parsed once (initLinks); an entry that is a
	// host name or unspecified is not compared, as checkPeer does for
	// connections.
	if want := l.udp.Addr(); l.udp.IsValid() && !want.IsUnspecified() && from.Addr().Unmap() != want {
		n.nctr.datagramForeign.Add(1)
		n.faults.Warn("fabnet: datagram refused", "node", id, "remote", from.String(), "peers says", want.String())
		return 0, false
	}
	return id, true
}

func (n *NIC) rxDialRequest(b []byte, from netip.AddrPort) {
	if len(b) != dialReqSize || b[6] != 0 || b[7] != 0 {
		n.nctr.badDatagrams.Add(1)
		n.faults.Warn("fabnet: malformed dial request", "remote", from.String(), "len", len(b))
		return
	}
	id, ok := n.datagramPeer(b, from)
	if !ok {
		return
	}
	if id < n.id {
		n.nctr.badDatagrams.Add(1)
		n.faults.Warn("fabnet: dial request from a lower node (it dials itself)", "node", id)
		return
	}
	n.nctr.dialAsked.Add(1)
	n.activate(id)
}

func (n *NIC) rxMulticast(b []byte, from netip.AddrPort, m *fabric.Message) {
	if len(b) < mcastHeader || len(b) > mcastHeader+fabric.MaxVELOPayload {
		n.nctr.badDatagrams.Add(1)
		n.faults.Warn("fabnet: multicast datagram of bad size", "remote", from.String(), "len", len(b))
		return
	}
	d, err := fabric.DecodeDescriptor(binary.LittleEndian.Uint64(b[8:16]))
	v := fabric.VPID(b[7])
	if err != nil || !d.MC || d.VPID != v || int(d.Len) != len(b)-mcastHeader {
		n.nctr.badDatagrams.Add(1)
		n.faults.Warn("fabnet: multicast datagram with a bad descriptor", "remote", from.String(), "err", err)
		return
	}
	id, ok := n.datagramPeer(b, from)
	if !ok {
		return
	}
	n.nctr.mcastIn.Add(1)
	ep := n.eps[v].Load()
	if ep == nil || !n.groups.Member(fabric.Group(d.Node)) {
		return // as on a session: not open, or not a member
	}
	m.Peer = fabric.Addr{Node: id, VPID: fabric.VPID(b[6])}
	m.MC, m.Tag, m.Len = true, d.Tag, d.Len
	copy(m.Data[:d.Len], b[mcastHeader:])
	mb := &ep.mb
	mb.Mu.Lock()
	if mb.ClosedLocked() || !mb.roomLocked() {
		mb.Mu.Unlock()
		n.nctr.mcastDropped.Add(1)
		return
	}
	mb.PutLocked(m.Peer, m)
	mb.Mu.Unlock()
	ep.Signal()
}

package node

import (
	"errors"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	"github.com/exn-project/exn/fabric"
)

// watchPeers resets, every period, the TCP connections whose peer the
// fabric reports down. It runs until Close.
func (n *Node) watchPeers(period time.Duration) {
	defer n.wg.Done()
	t := time.NewTicker(period)
	defer t.Stop()
	known := map[tcpip.Address]fabric.NodeID{}
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		n.resetDeadPeers(known)
	}
}

// ResetDeadPeers aborts (with a reset) every TCP connection whose remote
// address belongs to a node the fabric reports down, and returns how many
// it aborted. The node does this by itself every Config.PeerCheck; a
// caller that learns of a death some other way may call it directly.
func (n *Node) ResetDeadPeers() int {
	if n.isClosed() {
		return 0
	}
	return n.resetDeadPeers(map[tcpip.Address]fabric.NodeID{})
}

// PeerResets is how many connections were reset because their peer died.
func (n *Node) PeerResets() uint64 { return n.peerResets.Load() }

// resetDeadPeers does ResetDeadPeers with known, the addresses already
// mapped to nodes (neighbour entries of a dead peer may expire before the
// check sees them, so the mapping is remembered across checks).
func (n *Node) resetDeadPeers(known map[tcpip.Address]fabric.NodeID) int {
	type conn struct {
		ep   *tcp.Endpoint
		addr tcpip.Address
	}
	var conns []conn
	for _, te := range n.stack.RegisteredEndpoints() {
		ep, ok := te.(*tcp.Endpoint)
		if !ok {
			continue
		}
		switch tcp.EndpointState(ep.State()) {
		case tcp.StateEstablished, tcp.StateSynSent, tcp.StateSynRecv, tcp.StateFinWait1,
			tcp.StateFinWait2, tcp.StateCloseWait, tcp.StateLastAck, tcp.StateClosing:
		default:
			continue // listening, closed, or in TIME_WAIT: nothing to reset
		}
		ra, err := ep.GetRemoteAddress()
		if err != nil || ra.Addr.BitLen() == 0 {
			continue // listener or unconnected
		}
		conns = append(conns, conn{ep, ra.Addr})
	}
	if len(conns) == 0 {
		clear(known)
		return 0
	}
	n.learnNeighbors(known)
	down := map[fabric.NodeID]bool{}
	aborted := 0
	for _, c := range conns {
		id, ok := known[c.addr]
		if !ok {
			continue
		}
		dead, checked := down[id]
		if !checked {
			err := n.nic.Alive(id)
			dead = errors.Is(err, fabric.ErrPeerDown) || errors.Is(err, fabric.ErrUnknownNode)
			down[id] = dead
		}
		if dead {
			// Counted before the abort: its error wakes the
			// connection's reader, which may read the count at once.
			n.peerResets.Add(1)
			c.ep.Abort()
			aborted++
		}
	}
	if aborted > 0 {
		n.log.Info("reset connections to dead peers", "conns", aborted)
	}
	// Forget addresses no connection uses any more.
	used := make(map[tcpip.Address]bool, len(conns))
	for _, c := range conns {
		used[c.addr] = true
	}
	for a := range known {
		if !used[a] {
			delete(known, a)
		}
	}
	return aborted
}

// learnNeighbors adds the stack's neighbour entries whose link address is
// a fabric MAC to known.
func (n *Node) learnNeighbors(known map[tcpip.Address]fabric.NodeID) {
	var prefix fabric.MACPrefix
	copy(prefix[:], n.mac[:4])
	for _, proto := range []tcpip.NetworkProtocolNumber{ipv4.ProtocolNumber, ipv6.ProtocolNumber} {
		entries, err := n.stack.Neighbors(nicID, proto)
		if err != nil {
			continue
		}
		for _, e := range entries {
			if id, ok := prefix.Node([]byte(e.LinkAddr)); ok {
				known[e.Addr] = id
			}
		}
	}
}

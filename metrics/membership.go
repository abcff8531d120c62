package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/exn-project/exn/fabric"
)

// MembershipStats are the net fabric's membership counters under its
// swim liveness (fabric/fabnet NetStats; docs/membership.md).
type MembershipStats struct {
	DatagramsIn, DatagramsOut, Streams uint64
	Foreign, Dropped, DeclaredDead     uint64
	Members                            int
	// Lazy sessions (fabnet.NetStats; docs/fabric-net.md "Sessions on
	// first use").
	Sessions                       int
	Activated, ConnectTimeouts     uint64
	DialAsks, DialAsked            uint64
	MulticastOut, MulticastIn      uint64
	MulticastDropped, BadDatagrams uint64
}

// Membership returns a collector for the net fabric's membership
// (subsystem "membership"), labelled with the node ID. stats is called
// once per scrape.
func Membership(node fabric.NodeID, stats func() MembershipStats) prometheus.Collector {
	type S = MembershipStats
	b := nodeBuilder[S]("membership", node)
	b.counterDir("datagrams_total", "Membership (SWIM) datagrams by direction.", txRx, func(s *S) uint64 { return s.DatagramsOut }, func(s *S) uint64 { return s.DatagramsIn })
	b.counter("streams_total", "Membership streams opened either way (joins, anti-entropy, fallback probes).", func(s *S) uint64 { return s.Streams })
	b.counter("foreign_total", "Membership datagrams and streams refused for coming from outside the peers table.", func(s *S) uint64 { return s.Foreign })
	b.counter("dropped_total", "Membership datagrams and streams dropped because the earlier ones were not taken yet.", func(s *S) uint64 { return s.Dropped })
	b.counter("declared_dead_total", "Nodes membership declared dead or saw leave (a session to one ends at once).", func(s *S) uint64 { return s.DeclaredDead })
	b.gauge("members", "Nodes membership knows alive, this one included.", func(s *S) float64 { return float64(s.Members) })
	b.gauge("sessions", "Fabric sessions up now (lazy sessions: only to the peers this node talks to).", func(s *S) float64 { return float64(s.Sessions) })
	b.counter("peers_activated_total", "Peers whose session was first needed (a send, a post, a session either way, a dial request).", func(s *S) uint64 { return s.Activated })
	b.counter("connect_timeouts_total", "Sends and posts that gave up waiting for a first session.", func(s *S) uint64 { return s.ConnectTimeouts })
	b.counterDir("dial_requests_total", "Dial requests: tx asked a lower node to dial, rx was asked by a higher one.", txRx, func(s *S) uint64 { return s.DialAsks }, func(s *S) uint64 { return s.DialAsked })
	b.counterDir("multicast_datagrams_total", "Multicast copies carried by datagram to and from members without a session.", txRx, func(s *S) uint64 { return s.MulticastOut }, func(s *S) uint64 { return s.MulticastIn })
	b.counter("multicast_dropped_total", "Multicast datagrams dropped on a full mailbox.", func(s *S) uint64 { return s.MulticastDropped })
	b.counter("bad_datagrams_total", "Dial requests and multicast datagrams refused as malformed or from a node that may not send them.", func(s *S) uint64 { return s.BadDatagrams })
	return b.collector(stats)
}

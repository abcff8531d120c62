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
	b.counter("declared_dead_total", "Sessions ended because membership declared their node dead.", func(s *S) uint64 { return s.DeclaredDead })
	b.gauge("members", "Nodes membership knows alive, this one included.", func(s *S) float64 { return float64(s.Members) })
	return b.collector(stats)
}

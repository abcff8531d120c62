package metrics

import (
	"github.com/exn-project/exn/arp"
	"github.com/exn-project/exn/fabric"
	"github.com/prometheus/client_golang/prometheus"
)

// Neighbors returns a collector for the neighbour table (subsystem
// "neighbor"), labelled with the node ID. stats is called once per scrape
// (arp.Table.Stats fits).
func Neighbors(node fabric.NodeID, stats func() arp.Stats) prometheus.Collector {
	type S = arp.Stats
	b := nodeBuilder[S]("neighbor", node)
	b.gauge("entries", "Entries in the neighbour table (IP to MAC to node), learned and static.", func(s *S) float64 { return float64(s.Entries) })
	b.counter("observed_frames_total", "ARP and NDP frames examined.", func(s *S) uint64 { return s.Observed })
	b.counter("learned_total", "New entries learned from ARP/NDP.", func(s *S) uint64 { return s.Learned })
	b.counter("updated_total", "Learned entries whose MAC changed.", func(s *S) uint64 { return s.Updated })
	b.counter("refreshed_total", "Observations confirming an existing entry.", func(s *S) uint64 { return s.Refreshed })
	b.counter("conflicts_total", "Observations of an IP with a MAC other than its entry's.", func(s *S) uint64 { return s.Conflicts })
	b.counter("foreign_total", "Announcements with a MAC outside the fabric prefix (not learned).", func(s *S) uint64 { return s.Foreign })
	b.counter("malformed_total", "ARP/NDP frames that did not parse.", func(s *S) uint64 { return s.Malformed })
	b.counter("full_total", "New entries refused because the table was full.", func(s *S) uint64 { return s.Full })
	return b.collector(stats)
}

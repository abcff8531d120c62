package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/exn-project/exn/extds/rdirect"
	"github.com/exn-project/exn/fabric"
)

// DirectRemote returns a collector for the engine that joins the two
// copies of each direct connection across hosts (extds/rdirect,
// docs/direct.md "Across hosts"), subsystem "direct_remote", labelled
// with the node ID. stats is called once per scrape (rdirect.Engine.Stats
// fits).
func DirectRemote(node fabric.NodeID, stats func() rdirect.Stats) prometheus.Collector {
	type S = rdirect.Stats
	b := nodeBuilder[S]("direct_remote", node)
	b.counterDir("cdcs_total", "Cursor messages (CDC) sent (tx) and received (rx).", txRx, func(s *S) uint64 { return s.CDCsSent }, func(s *S) uint64 { return s.CDCsRecv })
	b.counter("window_updates_total", "CDCs sent for a consumer cursor alone (a window update).", func(s *S) uint64 { return s.Updates })
	b.counter("puts_total", "RMA PUTs of stream bytes into peers' buffers.", func(s *S) uint64 { return s.Puts })
	b.counter("put_bytes_total", "Stream bytes moved by RMA PUT.", func(s *S) uint64 { return s.PutBytes })
	b.counter("inline_total", "CDCs that carried a small write's bytes themselves.", func(s *S) uint64 { return s.Inline })
	b.counter("inline_bytes_total", "Stream bytes carried inside CDCs.", func(s *S) uint64 { return s.InlineBytes })
	b.counter("wakes_total", "Times the engine's pump woke from its park.", func(s *S) uint64 { return s.Wakes })
	b.counter("parks_total", "Times the engine's pump parked (nothing to do after its spin).", func(s *S) uint64 { return s.Parks })
	b.counterMap("dropped_total", "CDCs dropped, by reason: unknown (no such connection), foreign (another sender's), late (connection already reset).", "reason", func(s *S) map[string]uint64 {
		return map[string]uint64{"unknown": s.Unknown, "foreign": s.Foreign, "late": s.Late}
	})
	b.counterMap("resets_total", "Connections reset, by reason (a peer's CDC that broke a rule, a fabric fault, a dead peer, the program, a close).", "reason", func(s *S) map[string]uint64 { return s.ResetsByReason() })
	b.gauge("connections", "Connections the engine holds now.", func(s *S) float64 { return float64(s.Conns) })
	return b.collector(stats)
}

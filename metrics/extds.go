package metrics

import (
	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/fabric"
	"github.com/prometheus/client_golang/prometheus"
)

// EXTDS returns a collector for an EXT-DS device's counters, labelled with
// the node ID. stats is called once per scrape (extds.Device.Stats fits).
func EXTDS(node fabric.NodeID, stats func() extds.Stats) prometheus.Collector {
	type S = extds.Stats
	b := nodeBuilder[S]("extds", node)
	b.counterVec("connections_total", "Connections established, by mode: extds (over the fabric) or tcp (fallback).", "mode", []labelled[S, uint64]{
		{"extds", func(s *S) uint64 { return s.ConnsEXTDS }},
		{"tcp", func(s *S) uint64 { return s.ConnsTCP }},
	})
	b.gauge("active_connections", "EXT-DS connections currently open.", func(s *S) float64 { return float64(s.Active) })
	b.counterMap("fallbacks_total", "Connections that fell back to plain TCP, by reason.", "reason", func(s *S) map[string]uint64 { return s.Fallbacks })
	b.counterVec("tx_bytes_total", "Payload bytes sent, by path: velo (eager), rma (ring PUT), zcopy.", "path", []labelled[S, uint64]{
		{"velo", func(s *S) uint64 { return s.TxVELOBytes }},
		{"rma", func(s *S) uint64 { return s.TxRMABytes }},
		{"zcopy", func(s *S) uint64 { return s.TxZCopyBytes }},
	})
	b.counter("rx_bytes_total", "Payload bytes delivered to readers.", func(s *S) uint64 { return s.RxBytes })
	b.counterVec("messages_total", "Data transfers sent, by kind: VELO messages and RMA PUTs.", "kind", []labelled[S, uint64]{
		{"velo", func(s *S) uint64 { return s.VELOMsgs }},
		{"rma_put", func(s *S) uint64 { return s.RMAPuts }},
	})
	b.counter("ring_full_fallbacks_total", "Large-write chunks sent by VELO because the receiver's ring was full.", func(s *S) uint64 { return s.RingFullFallbacks })
	b.counter("credit_messages_total", "RMA_AVAIL credit messages sent.", func(s *S) uint64 { return s.CreditMsgs })
	b.counter("credit_bytes_total", "Bytes of credit returned by RMA_AVAIL messages.", func(s *S) uint64 { return s.CreditBytes })
	b.counter("credit_waits_total", "Writes that blocked waiting for credits.", func(s *S) uint64 { return s.CreditWaits })
	b.counterDir("resets_total", "Connection resets, by direction.", txRx, func(s *S) uint64 { return s.ResetsSent }, func(s *S) uint64 { return s.ResetsRecv })
	b.counter("peer_down_total", "Connections ended because the peer node went down.", func(s *S) uint64 { return s.PeerDown })
	b.counterMap("drops_total", "Incoming messages or notifications dropped, by reason.", "reason", func(s *S) map[string]uint64 { return s.Drops })
	b.counter("handshake_errors_total", "Shadow-connection handshakes that failed.", func(s *S) uint64 { return s.HandshakeErrors })
	b.counterVec("zcopy_transfers_total", "ZCopy transfers, by mode: read (receiver GET) or write (sender PUT).", "mode", []labelled[S, uint64]{
		{"read", func(s *S) uint64 { return s.ZCopyReads }},
		{"write", func(s *S) uint64 { return s.ZCopyWrites }},
	})
	b.counter("linger_expired_total", "Graceful closes whose linger time ran out.", func(s *S) uint64 { return s.LingerExpired })
	b.counter("reaped_total", "Closed connections released by the drain timeout.", func(s *S) uint64 { return s.Reaped })
	b.counter("shadow_lost_total", "Connections whose shadow TCP connection was lost.", func(s *S) uint64 { return s.ShadowLost })
	b.counter("notification_errors_total", "RMA error notifications.", func(s *S) uint64 { return s.NotifyErrors })
	return b.collector(stats)
}

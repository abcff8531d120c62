package metrics

import (
	"github.com/exn-project/exn/exn"
	"github.com/exn-project/exn/fabric"
	"github.com/prometheus/client_golang/prometheus"
)

// Engine returns a collector for the EXT-Eth engine's counters (subsystem
// "eth"), labelled with the node ID. stats is called once per scrape
// (exn.Engine.Stats fits).
func Engine(node fabric.NodeID, stats func() exn.Stats) prometheus.Collector {
	type S = exn.Stats
	b := nodeBuilder[S]("eth", node)
	dirs := []string{"tx", "rx"}
	protos := make([]string, exn.NumProtos)
	for p := range exn.NumProtos {
		protos[p] = p.String()
	}
	b.counterGrid("frames_total", "Ethernet frames carried over the fabric, by direction and protocol (eager, rendezvous, multicast).",
		[2]string{"direction", "proto"}, dirs, protos, func(s *S, d, p int) uint64 {
			if d == 0 {
				return s.TxFrames[p]
			}
			return s.RxFrames[p]
		})
	b.counterGrid("bytes_total", "Ethernet frame bytes carried over the fabric, by direction and protocol.",
		[2]string{"direction", "proto"}, dirs, protos, func(s *S, d, p int) uint64 {
			if d == 0 {
				return s.TxBytes[p]
			}
			return s.RxBytes[p]
		})
	drops := make([]labelled[S, uint64], 0, exn.NumDropReasons-1)
	for r := exn.DropNone + 1; r < exn.NumDropReasons; r++ {
		drops = append(drops, labelled[S, uint64]{r.String(), func(s *S) uint64 { return s.Drops[r] }})
	}
	b.counterVec("drops_total", "Frames and messages dropped by the engine, by reason.", "reason", drops)
	b.gaugeVec("slots_in_use", "Registered frame buffers in use: tx (advertised, not yet pulled) and rx (GET in flight or awaiting delivery).", "direction", []labelled[S, float64]{
		{"tx", func(s *S) float64 { return float64(s.TxSlotsInUse) }},
		{"rx", func(s *S) float64 { return float64(s.RxSlotsInUse) }},
	})
	b.gauge("outstanding_adverts", "Rendezvous adverts sent and not yet pulled by the receiver.", func(s *S) float64 { return float64(s.OutstandingAdverts) })
	b.gauge("pending_gets", "RMA GETs posted for received adverts and not yet complete.", func(s *S) float64 { return float64(s.PendingGets) })
	b.gauge("waiting_adverts", "Received adverts queued for a free receive buffer.", func(s *S) float64 { return float64(s.WaitingAdverts) })
	b.counter("advert_timeouts_total", "Transmit slots reclaimed because their advert was never pulled.", func(s *S) uint64 { return s.AdvertTimeouts })
	b.counter("adverts_refused_total", "Transmit slots freed by a receiver's refusal of the advert.", func(s *S) uint64 { return s.AdvertsRefused })
	b.counterVec("refusals_total", "Advert refusals this receiver sent back, by outcome.", "outcome", []labelled[S, uint64]{
		{"sent", func(s *S) uint64 { return s.RefusalsSent }},
		{"lost", func(s *S) uint64 { return s.RefusalsLost }},
	})
	b.counterVec("unmatched_notifications_total", "RMA notifications that matched no transfer, by kind.", "kind", []labelled[S, uint64]{
		{"late_responder", func(s *S) uint64 { return s.LateResponders }},
		{"unmatched", func(s *S) uint64 { return s.UnmatchedNotify }},
	})
	b.counter("advert_sequence_gaps_total", "Advert sequence discontinuities (a peer restarted).", func(s *S) uint64 { return s.AdvertSeqGaps })
	b.counter("tx_slot_waits_total", "Transmits that waited for a free rendezvous slot (back-pressure on the TAP).", func(s *S) uint64 { return s.TxSlotWaits })
	b.counter("hellos_total", "Offload capability hellos received from peers.", func(s *S) uint64 { return s.Hellos })
	b.counterDir("offload_frames_total", "Frames carried with their offload metadata (checksum offload, TSO/USO super-frames), by direction.", txRx, func(s *S) uint64 { return s.TxOffloaded }, func(s *S) uint64 { return s.RxOffloaded })
	b.counter("tx_csum_software_total", "Frames whose partial checksum was completed in software for a peer without checksum offload.", func(s *S) uint64 { return s.TxCsumSW })
	b.counter("tx_gso_split_total", "Super-frames segmented in software for a peer that cannot take them.", func(s *S) uint64 { return s.TxGSOSplit })
	b.counter("tx_gso_segments_total", "Segments the software segmentation made.", func(s *S) uint64 { return s.TxGSOSegs })
	b.counter("link_errors_total", "Errors delivering received frames to the link (TAP or netstack).", func(s *S) uint64 { return s.LinkErrors })
	return b.collector(stats)
}

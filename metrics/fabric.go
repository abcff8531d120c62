package metrics

import (
	"strconv"

	"github.com/exn-project/exn/fabric"
	"github.com/prometheus/client_golang/prometheus"
)

// Fabric returns a collector for one NIC's counters, labelled with its
// node ID. stats is called once per scrape (fabric.NIC.Stats fits).
func Fabric(node fabric.NodeID, stats func() fabric.Stats) prometheus.Collector {
	type S = fabric.Stats
	b := nodeBuilder[S]("fabric", node)
	b.counterDir("velo_messages_total", "VELO messages by direction.", txRx, func(s *S) uint64 { return s.VELOSent }, func(s *S) uint64 { return s.VELORecv })
	b.counterDir("velo_bytes_total", "VELO payload bytes by direction.", txRx, func(s *S) uint64 { return s.VELOSentBytes }, func(s *S) uint64 { return s.VELORecvBytes })
	b.counter("velo_multicast_messages_total", "VELO multicast messages sent.", func(s *S) uint64 { return s.MulticastSent })
	b.counter("velo_send_blocked_total", "VELO sends that waited on a full mailbox (back-pressure).", func(s *S) uint64 { return s.SendBlocked })
	b.counterVec("rma_requests_total", "RMA requests posted by operation.", "op", []labelled[S, uint64]{
		{"put", func(s *S) uint64 { return s.RMAPut }},
		{"get", func(s *S) uint64 { return s.RMAGet }},
	})
	b.counter("rma_bytes_total", "Bytes moved by RMA requests posted here.", func(s *S) uint64 { return s.RMABytes })
	b.counterVec("notifications_total", "RMA notifications written, by kind.", "kind", []labelled[S, uint64]{
		{"requester", func(s *S) uint64 { return s.NotifyRequester }},
		{"completer", func(s *S) uint64 { return s.NotifyCompleter }},
		{"responder", func(s *S) uint64 { return s.NotifyResponder }},
	})
	b.counterVec("notification_errors_total", "RMA error notifications, by error.", "error", []labelled[S, uint64]{
		{"access", func(s *S) uint64 { return s.NotifyErrAccess }},
		{"bounds", func(s *S) uint64 { return s.NotifyErrBounds }},
		{"peer_down", func(s *S) uint64 { return s.NotifyErrPeerDown }},
	})
	b.counterVec("errors_total", "Requests refused or input dropped by the NIC, by reason.", "reason", []labelled[S, uint64]{
		{"invalid", func(s *S) uint64 { return s.Invalid }},
		{"peer_down", func(s *S) uint64 { return s.PeerDown }},
		{"unknown_node", func(s *S) uint64 { return s.UnknownNode }},
		{"in_use", func(s *S) uint64 { return s.InUse }},
		{"corrupt", func(s *S) uint64 { return s.Corrupt }},
		{"notify_overflow", func(s *S) uint64 { return s.NotifyOverflow }},
	})
	return b.collector(stats)
}

// PingRTTBuckets are the bounds of exn_fabric_ping_rtt_seconds: 1 µs to
// about 65 ms, doubling.
var PingRTTBuckets = prometheus.ExponentialBuckets(1e-6, 2, 17)

// PingRTT returns the histogram of fabric ping round-trip times (exnctl
// ping), labelled with the node ID. The caller observes into it and
// registers it.
func PingRTT(node fabric.NodeID) prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace:   Namespace,
		Subsystem:   "fabric",
		Name:        "ping_rtt_seconds",
		Help:        "Round-trip time of fabric pings (VELO ping-pong to a node's management VPID).",
		Buckets:     PingRTTBuckets,
		ConstLabels: prometheus.Labels{"node": strconv.Itoa(int(node))},
	})
}

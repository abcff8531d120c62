package metrics

// The collectors of the layers, one function each (subsystem in
// parentheses): the fabric (fabric), the EXT-Eth engine (exn), the TAP
// (tap), the neighbour table (neighbor), EXT-DS and the shim server
// (extds, shim), the control socket (control). Each lists its metrics
// on the builder of metrics.go; layers_test.go checks them together.

import (
	"strconv"

	"github.com/exn-project/exn/arp"
	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/exn"
	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/extds/rdirect"
	"github.com/exn-project/exn/extds/shimsrv"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/tap"
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
	b.counterDir("push_grants_total", "Receive buffers granted for receiver-granted PUT: tx granted to peers, rx granted by peers.", txRx, func(s *S) uint64 { return s.GrantsSent }, func(s *S) uint64 { return s.GrantsRecv })
	b.counter("rx_in_place_total", "Rendezvous frames written to the link straight from the sender's memory, with no GET copy (fabric/shm).", func(s *S) uint64 { return s.RxViewed })
	b.counter("tx_csum_software_total", "Frames whose partial checksum was completed in software for a peer without checksum offload.", func(s *S) uint64 { return s.TxCsumSW })
	b.counter("tx_gso_split_total", "Super-frames segmented in software for a peer that cannot take them.", func(s *S) uint64 { return s.TxGSOSplit })
	b.counter("tx_gso_segments_total", "Segments the software segmentation made.", func(s *S) uint64 { return s.TxGSOSegs })
	b.counter("link_errors_total", "Errors delivering received frames to the link (TAP or netstack).", func(s *S) uint64 { return s.LinkErrors })
	return b.collector(stats)
}

// TAP returns a collector for a TAP device's counters, labelled with the
// node ID and interface name. rx is host to fabric (frames exnd read), tx
// fabric to host (frames exnd wrote). stats is called once per scrape
// (tap.TAP.Stats fits).
func TAP(node fabric.NodeID, ifname string, stats func() tap.Stats) prometheus.Collector {
	type S = tap.Stats
	b := nodeBuilder[S]("tap", node, "ifname", ifname)
	b.counterDir("frames_total", "Frames read from (rx) and written to (tx) the TAP.", rxTx, func(s *S) uint64 { return s.RxFrames }, func(s *S) uint64 { return s.TxFrames })
	b.counterDir("bytes_total", "Frame bytes read from (rx) and written to (tx) the TAP.", rxTx, func(s *S) uint64 { return s.RxBytes }, func(s *S) uint64 { return s.TxBytes })
	b.counterDir("errors_total", "TAP read errors (rx) and frames the kernel refused (tx).", rxTx, func(s *S) uint64 { return s.RxErrors }, func(s *S) uint64 { return s.TxErrors })
	b.counter("short_buffer_drops_total", "Frames dropped because they were longer than the read buffer.", func(s *S) uint64 { return s.ShortBuffer })
	b.counter("bad_vnet_drops_total", "Frames dropped because their virtio-net header was short or not understood.", func(s *S) uint64 { return s.BadVnet })
	b.counter("gso_drops_total", "Super-frames dropped by a read without virtio-net headers.", func(s *S) uint64 { return s.GSODropped })
	return b.collector(stats)
}

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
	b.counter("direct_agreements_total", "Direct connections agreed over the fabric (CLAIM_DIRECT and COMMIT), counted where accepted.", func(s *S) uint64 { return s.DirectAgreed })
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

// Control returns a collector for exnd's control socket counters
// (control.Server.Stats): connections, requests, and refusals by reason.
func Control(node fabric.NodeID, stats func() control.ServerStats) prometheus.Collector {
	type S = control.ServerStats
	b := nodeBuilder[S]("control", node)
	b.counter("connections_total", "Control socket connections accepted.", func(s *S) uint64 { return s.Accepted })
	b.gauge("active_connections", "Control socket connections open now.", func(s *S) float64 { return float64(s.Active) })
	b.counter("requests_total", "Control request lines answered.", func(s *S) uint64 { return s.Requests })
	b.counterMap("refused_total", "Control connections or requests refused, by reason (unauthorized, oversized, truncated, idle, too_many_conns, too_many_fds, bad_request, failed, no_peer_cred).", "reason", func(s *S) map[string]uint64 { return s.Refused })
	return b.collector(stats)
}

// Shim returns a collector for exnd's shim server (libextds.so) counters:
// connections switched onto EXT-DS, fallbacks to plain TCP and refusals,
// each by reason.
func Shim(node fabric.NodeID, stats func() shimsrv.Stats) prometheus.Collector {
	type S = shimsrv.Stats
	b := nodeBuilder[S]("shim", node)
	b.counter("switched_total", "Shimmed connections spliced onto EXT-DS.", func(s *S) uint64 { return s.Switched })
	b.counterMap("fallbacks_total", "Shimmed connections left as plain TCP, by reason (the decline codes of docs/extds.md).", "reason", func(s *S) map[string]uint64 { return s.Fallbacks })
	b.counterMap("refused_total", "Shim requests refused, by reason (not_owner, not_listening, bad_request, ...).", "reason", func(s *S) map[string]uint64 { return s.Refused })
	b.counter("errors_total", "shim-connect/shim-accept operations that failed.", func(s *S) uint64 { return s.Errors })
	b.gauge("active_connections", "Switched shim connections open now.", func(s *S) float64 { return float64(s.Active) })
	b.gauge("listeners", "Listener registrations.", func(s *S) float64 { return float64(s.Listens) })
	b.counterDir("bytes_total", "Bytes spliced, by direction: in (fabric to application), out.", inOut, func(s *S) uint64 { return s.BytesIn }, func(s *S) uint64 { return s.BytesOut })
	b.counter("relayed_total", "Shimmed connections whose bytes exnd relays (no direct connection: a net or ofi fabric, a peer or program that did not ask for one, EXTDS_DIRECT=0). Included in switched_total.", func(s *S) uint64 { return s.Switched - s.DirectConns })
	b.counter("direct_total", "Shimmed connections made direct: the programs move the bytes through a shared buffer, exnd is not in the data path (docs/direct.md). Included in switched_total.", func(s *S) uint64 { return s.DirectConns })
	b.gauge("direct_active_connections", "Direct connections open now.", func(s *S) float64 { return float64(s.DirectActive) })
	b.counter("short_holds_total", "Listener ports put on hold because their connections were too short to gain from EXT-DS (their connections stay plain TCP for --extds-short-hold).", func(s *S) uint64 { return s.Holds })
	b.counter("direct_relays_total", "Direct connections handed to exnd's relay (a program exec'd with one open).", func(s *S) uint64 { return s.DirectRelays })
	b.counter("direct_ring_reclaims_total", "Idle direct rings whose pages went back to /dev/shm (docs/direct.md, \"Rings that shrink when idle\").", func(s *S) uint64 { return s.DirectReclaims })
	b.counterDir("direct_bytes_total", "Bytes the programs moved over direct connections, by direction (read from the buffers' cursors; included in bytes_total).", inOut, func(s *S) uint64 { return s.DirectBytesIn }, func(s *S) uint64 { return s.DirectBytesOut })
	return b.collector(stats)
}

// AttachStats are exnd's kernel-bypass lease counters (extds-attach and
// friends; cmd/exnd's attach service converts its own into these).
type AttachStats struct {
	Attached, Detached, Reclaimed, Expired, Refused, Listens uint64
	Leases                                                   int
}

// Attach returns a collector for exnd's kernel-bypass lease service.
func Attach(node fabric.NodeID, stats func() AttachStats) prometheus.Collector {
	type S = AttachStats
	b := nodeBuilder[S]("attach", node)
	b.counter("granted_total", "VPID leases granted (extds-attach).", func(s *S) uint64 { return s.Attached })
	b.counter("detached_total", "Leases given back (extds-detach).", func(s *S) uint64 { return s.Detached })
	b.counter("reclaimed_total", "Leases ended because the holder let go or died.", func(s *S) uint64 { return s.Reclaimed })
	b.counter("expired_total", "Leases never attached (the caller died, or the grace passed).", func(s *S) uint64 { return s.Expired })
	b.counter("refused_total", "Lease requests refused: bad arguments, another process's or user's lease, no block free; listings that withheld other users' leases.", func(s *S) uint64 { return s.Refused })
	b.counter("listens_total", "extds-listen registrations.", func(s *S) uint64 { return s.Listens })
	b.gauge("leases", "Leases held now.", func(s *S) float64 { return float64(s.Leases) })
	return b.collector(stats)
}

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

package metrics

import (
	"strings"
	"testing"

	"github.com/exn-project/exn/arp"
	"github.com/exn-project/exn/exn"
	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/extds/rdirect"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/tap"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// check registers cs, scrapes them over HTTP, lints the result and
// requires every line of want in it.
func check(t *testing.T, want []string, cs ...prometheus.Collector) *prometheus.Registry {
	t.Helper()
	reg, err := NewRegistry(cs...)
	if err != nil {
		t.Fatal(err)
	}
	text := scrape(t, reg)
	lint(t, text)
	for _, w := range want {
		if !strings.Contains(text, w+"\n") {
			t.Errorf("scrape lacks %q", w)
		}
	}
	if t.Failed() {
		t.Logf("scrape:\n%s", text)
	}
	return reg
}

func TestEngineCollector(t *testing.T) {
	var s exn.Stats
	s.TxFrames[exn.ProtoEager] = 4
	s.TxBytes[exn.ProtoEager] = 400
	s.RxFrames[exn.ProtoRendezvous] = 2
	s.RxBytes[exn.ProtoRendezvous] = 130000
	s.TxFrames[exn.ProtoMulticast] = 1
	s.Drops[exn.DropForeignMAC] = 3
	s.Drops[exn.DropGetPeerDown] = 1
	s.TxSlotsInUse, s.RxSlotsInUse = 5, 6
	s.OutstandingAdverts, s.PendingGets, s.WaitingAdverts = 7, 8, 9
	s.AdvertTimeouts, s.AdvertsRefused, s.RefusalsSent, s.RefusalsLost = 10, 11, 12, 13
	s.LateResponders, s.UnmatchedNotify, s.TxSlotWaits = 14, 15, 16
	s.Hellos, s.TxOffloaded, s.RxOffloaded, s.TxCsumSW, s.TxGSOSplit, s.TxGSOSegs = 17, 18, 19, 20, 21, 22
	s.RxViewed = 23
	reg := check(t, []string{
		`exn_eth_frames_total{direction="tx",node="3",proto="eager"} 4`,
		`exn_eth_bytes_total{direction="tx",node="3",proto="eager"} 400`,
		`exn_eth_frames_total{direction="rx",node="3",proto="rendezvous"} 2`,
		`exn_eth_bytes_total{direction="rx",node="3",proto="rendezvous"} 130000`,
		`exn_eth_frames_total{direction="tx",node="3",proto="multicast"} 1`,
		`exn_eth_drops_total{node="3",reason="foreign-mac"} 3`,
		`exn_eth_drops_total{node="3",reason="get-peer-down"} 1`,
		`exn_eth_drops_total{node="3",reason="runt"} 0`,
		`exn_eth_slots_in_use{direction="tx",node="3"} 5`,
		`exn_eth_slots_in_use{direction="rx",node="3"} 6`,
		`exn_eth_outstanding_adverts{node="3"} 7`,
		`exn_eth_pending_gets{node="3"} 8`,
		`exn_eth_waiting_adverts{node="3"} 9`,
		`exn_eth_advert_timeouts_total{node="3"} 10`,
		`exn_eth_adverts_refused_total{node="3"} 11`,
		`exn_eth_refusals_total{node="3",outcome="sent"} 12`,
		`exn_eth_refusals_total{node="3",outcome="lost"} 13`,
		`exn_eth_unmatched_notifications_total{kind="late_responder",node="3"} 14`,
		`exn_eth_tx_slot_waits_total{node="3"} 16`,
		`exn_eth_hellos_total{node="3"} 17`,
		`exn_eth_offload_frames_total{direction="tx",node="3"} 18`,
		`exn_eth_offload_frames_total{direction="rx",node="3"} 19`,
		`exn_eth_tx_csum_software_total{node="3"} 20`,
		`exn_eth_tx_gso_split_total{node="3"} 21`,
		`exn_eth_tx_gso_segments_total{node="3"} 22`,
		`exn_eth_rx_in_place_total{node="3"} 23`,
	}, Engine(3, func() exn.Stats { return s }))
	// Every reason but "none" is a series, and no other.
	if n, err := testutil.GatherAndCount(reg, "exn_eth_drops_total"); err != nil || n != int(exn.NumDropReasons)-1 {
		t.Errorf("drops series = %d, %v; want %d", n, err, exn.NumDropReasons-1)
	}
	if n, err := testutil.GatherAndCount(reg, "exn_eth_frames_total"); err != nil || n != 2*int(exn.NumProtos) {
		t.Errorf("frames series = %d, %v; want %d", n, err, 2*exn.NumProtos)
	}
}

func TestTAPCollector(t *testing.T) {
	var c tap.Counters
	c.RxFrames.Add(2)
	c.RxBytes.Add(200)
	c.TxFrames.Add(3)
	c.TxBytes.Add(300)
	c.TxErrors.Add(1)
	c.ShortBuffer.Add(4)
	c.BadVnet.Add(5)
	c.GSODropped.Add(6)
	check(t, []string{
		`exn_tap_frames_total{direction="rx",ifname="exn0",node="1"} 2`,
		`exn_tap_bytes_total{direction="rx",ifname="exn0",node="1"} 200`,
		`exn_tap_frames_total{direction="tx",ifname="exn0",node="1"} 3`,
		`exn_tap_bytes_total{direction="tx",ifname="exn0",node="1"} 300`,
		`exn_tap_errors_total{direction="tx",ifname="exn0",node="1"} 1`,
		`exn_tap_errors_total{direction="rx",ifname="exn0",node="1"} 0`,
		`exn_tap_short_buffer_drops_total{ifname="exn0",node="1"} 4`,
		`exn_tap_bad_vnet_drops_total{ifname="exn0",node="1"} 5`,
		`exn_tap_gso_drops_total{ifname="exn0",node="1"} 6`,
	}, TAP(1, "exn0", c.Snapshot))
}

func TestNeighborsCollector(t *testing.T) {
	s := arp.Stats{Observed: 9, Learned: 2, Updated: 1, Refreshed: 5, Conflicts: 3, Foreign: 6, Malformed: 4, Full: 7, Entries: 2}
	check(t, []string{
		`exn_neighbor_entries{node="2"} 2`,
		`exn_neighbor_observed_frames_total{node="2"} 9`,
		`exn_neighbor_learned_total{node="2"} 2`,
		`exn_neighbor_updated_total{node="2"} 1`,
		`exn_neighbor_refreshed_total{node="2"} 5`,
		`exn_neighbor_conflicts_total{node="2"} 3`,
		`exn_neighbor_foreign_total{node="2"} 6`,
		`exn_neighbor_malformed_total{node="2"} 4`,
		`exn_neighbor_full_total{node="2"} 7`,
	}, Neighbors(2, func() arp.Stats { return s }))
}

func TestEXTDSCollector(t *testing.T) {
	s := extds.Stats{
		ConnsEXTDS: 3, ConnsTCP: 1, Active: 2,
		Fallbacks:   map[string]uint64{"handshake": 1, "no_route": 0},
		TxVELOBytes: 100, TxRMABytes: 1 << 20, TxZCopyBytes: 8 << 20, RxBytes: 42,
		Drops:      map[string]uint64{"malformed": 5, "unknown_conn": 0},
		ResetsSent: 1, ResetsRecv: 2, ZCopyReads: 3, ZCopyWrites: 4,
	}
	reg := check(t, []string{
		`exn_extds_connections_total{mode="extds",node="4"} 3`,
		`exn_extds_connections_total{mode="tcp",node="4"} 1`,
		`exn_extds_active_connections{node="4"} 2`,
		`exn_extds_fallbacks_total{node="4",reason="handshake"} 1`,
		`exn_extds_fallbacks_total{node="4",reason="no_route"} 0`,
		`exn_extds_tx_bytes_total{node="4",path="velo"} 100`,
		`exn_extds_tx_bytes_total{node="4",path="rma"} 1.048576e+06`,
		`exn_extds_tx_bytes_total{node="4",path="zcopy"} 8.388608e+06`,
		`exn_extds_rx_bytes_total{node="4"} 42`,
		`exn_extds_drops_total{node="4",reason="malformed"} 5`,
		`exn_extds_resets_total{direction="rx",node="4"} 2`,
		`exn_extds_zcopy_transfers_total{mode="write",node="4"} 4`,
	}, EXTDS(4, func() extds.Stats { return s }))
	if n, err := testutil.GatherAndCount(reg, "exn_extds_fallbacks_total"); err != nil || n != 2 {
		t.Errorf("fallback series = %d, %v; want 2", n, err)
	}
}

// TestEXTDSCollectorZeroStats checks that an empty snapshot (nil maps)
// still scrapes and lints.
func TestEXTDSCollectorZeroStats(t *testing.T) {
	check(t, []string{`exn_extds_active_connections{node="0"} 0`}, EXTDS(0, func() extds.Stats { return extds.Stats{} }))
}

func TestPingRTT(t *testing.T) {
	h := PingRTT(5)
	h.Observe(3e-6)
	h.Observe(40e-6)
	check(t, []string{
		`exn_fabric_ping_rtt_seconds_count{node="5"} 2`,
		`exn_fabric_ping_rtt_seconds_bucket{node="5",le="4e-06"} 1`,
		`exn_fabric_ping_rtt_seconds_bucket{node="5",le="+Inf"} 2`,
	}, h)
}

// TestAllLayersTogether registers every layer's collector for one node in
// one registry, as exnd does: names must not collide.
func TestAllLayersTogether(t *testing.T) {
	var tc tap.Counters
	var fc fabric.Counters
	check(t, nil,
		Fabric(1, fc.Snapshot),
		Engine(1, func() exn.Stats { return exn.Stats{} }),
		TAP(1, "exn0", tc.Snapshot),
		Neighbors(1, func() arp.Stats { return arp.Stats{} }),
		EXTDS(1, func() extds.Stats { return extds.Stats{} }),
		PingRTT(1),
	)
}

func TestDirectRemoteCollector(t *testing.T) {
	s := rdirect.Stats{CDCsSent: 1, CDCsRecv: 2, Updates: 3, Puts: 4, PutBytes: 5, Inline: 6, InlineBytes: 7,
		Wakes: 8, Parks: 9, Unknown: 10, Foreign: 11, Late: 12, Conns: 13}
	s.Resets[rdirect.ReasonSeq] = 14
	s.Resets[rdirect.ReasonPeerDown] = 15
	reg := check(t, []string{
		`exn_direct_remote_cdcs_total{direction="tx",node="4"} 1`,
		`exn_direct_remote_cdcs_total{direction="rx",node="4"} 2`,
		`exn_direct_remote_window_updates_total{node="4"} 3`,
		`exn_direct_remote_puts_total{node="4"} 4`,
		`exn_direct_remote_put_bytes_total{node="4"} 5`,
		`exn_direct_remote_inline_total{node="4"} 6`,
		`exn_direct_remote_inline_bytes_total{node="4"} 7`,
		`exn_direct_remote_wakes_total{node="4"} 8`,
		`exn_direct_remote_parks_total{node="4"} 9`,
		`exn_direct_remote_dropped_total{node="4",reason="unknown"} 10`,
		`exn_direct_remote_dropped_total{node="4",reason="foreign"} 11`,
		`exn_direct_remote_dropped_total{node="4",reason="late"} 12`,
		`exn_direct_remote_connections{node="4"} 13`,
		`exn_direct_remote_resets_total{node="4",reason="seq"} 14`,
		`exn_direct_remote_resets_total{node="4",reason="peer-down"} 15`,
		`exn_direct_remote_resets_total{node="4",reason="close"} 0`,
	}, DirectRemote(4, func() rdirect.Stats { return s }))
	// Every reason is a series, and no other.
	if n, err := testutil.GatherAndCount(reg, "exn_direct_remote_resets_total"); err != nil || n != int(rdirect.NumReasons) {
		t.Errorf("resets series = %d, %v; want %d", n, err, rdirect.NumReasons)
	}
}

package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/exn-project/exn/extds/rdirect"
)

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

package integration

import (
	"math"
	"testing"

	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

// TestNetperfShimShortHold: netperf and netserver under libextds.so on
// two shm nodes, exnd with its default hold for short connections
// (docs/shim.md, "Short connections"). TCP_CRR opens a connection per
// transaction to one data port: the first ones are set up over EXT-DS,
// then the server's exnd holds the port, and the rest are plain TCP
// without asking either exnd. TCP_RR afterwards (a new data port, one
// long connection) is EXT-DS again. Nothing here depends on speed: the
// counts are what the hold must do at any rate.
func TestNetperfShimShortHold(t *testing.T) {
	testenv.RequirePrivileged(t, "ip", "ss", "ping", "gcc")
	_, netserver := nstest.Netperf(t)
	c := shmShimCluster(t, nstest.Build(t), 64, "--metrics", netperfMetrics)
	nodes := c.nodes
	var b0, b1 extdsCounts
	before := func(t *testing.T) { b0, b1 = scrapeEXTDS(t, nodes[0]), scrapeEXTDS(t, nodes[1]) }
	after := func(t *testing.T, r nstest.NetperfResult) {
		a0, a1 := scrapeEXTDS(t, nodes[0]), scrapeEXTDS(t, nodes[1])
		conns := [2]float64{a0.conns - b0.conns, a1.conns - b1.conns}
		holds := a1.holds - b1.holds
		herr := a0.handshakeErrs + a1.handshakeErrs - b0.handshakeErrs - b1.handshakeErrs
		t.Logf("%s: %.0f trans/s; EXT-DS connections node 1 %.0f, node 2 %.0f; holds %.0f; client fallbacks: %s; server fallbacks: %s",
			r.Test, r.TransRate, conns[0], conns[1], holds, fallbackDelta(b0, a0), fallbackDelta(b1, a1))
		if herr != 0 {
			t.Errorf("%s: %.0f handshake errors", r.Test, herr)
		}
		switch r.Test {
		case "TCP_CRR":
			total := math.Floor(0.95 * r.TransRate * r.Elapsed)
			if holds < 1 {
				t.Errorf("TCP_CRR: the server's exnd never held the port (%.0f connections)", total)
			}
			// The control connection and the connections that taught
			// the hold are EXT-DS; at most half of them all.
			if conns[1] < 2 || conns[1] > total/2 {
				t.Errorf("TCP_CRR: %.0f of %.0f connections EXT-DS on the server, want from 2 to half", conns[1], total)
			}
			// The client's exnd learns the hold from the server's
			// decline (short_lived); at a hold's edge a client may skip
			// asking while the server's shim asks, and its exnd sees
			// the plain request (plain_client).
			for _, d := range []struct {
				node   int
				before extdsCounts
				after  extdsCounts
			}{{1, b0, a0}, {2, b1, a1}} {
				for reason, v := range d.after.byReason {
					if v > d.before.byReason[reason] && reason != "short_lived" && reason != "plain_client" {
						t.Errorf("TCP_CRR: node %d: fallbacks with reason %s", d.node, reason)
					}
				}
			}
			if a0.byReason["short_lived"] <= b0.byReason["short_lived"] {
				t.Error("TCP_CRR: the client's exnd counted no short_lived fallback")
			}
		case "TCP_RR":
			fb := a0.fallbacks + a1.fallbacks - b0.fallbacks - b1.fallbacks
			if conns[0] < 2 || conns[1] < 2 || fb != 0 {
				t.Errorf("TCP_RR after TCP_CRR: EXT-DS connections %.0f/%.0f (want 2 each), %.0f fallbacks (want 0)", conns[0], conns[1], fb)
			}
		}
	}
	port := nstest.Port()
	s := nstest.StartNetserver(t, nodes[1].NS, netserver, c.env(1), port)
	netperfTests(t, nodes[0].NS, nodes[1].IP.String(), port, c.env(0), []string{"TCP_CRR", "TCP_RR"}, before, after, s.Output)
}

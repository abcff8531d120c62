package integration

import (
	"math"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

// Issue #15: unmodified netperf against netserver (built from
// ../shared/tools/netperf by `make netperf`), every test of
// nstest.NetperfTests, over exn0 on the shm and net fabrics and through
// libextds.so at both ends. Each run lasts netperfSecs (netperf -l) and
// must give a sane result (nstest.NetperfResult.Sane: one result line, no
// error, non-zero throughput, ordered latency percentiles); nothing
// depends on how fast it was. netserver runs in the foreground (-D) and
// forks a child per test; both are killed by the server's process group
// at cleanup.

const netperfSecs = 2

// netperfRuns runs every test from cli against netserver on srv (at ip),
// both with their env, fails t on an insane result, and calls each (if
// not nil) around every run: before(test) then after(test, result).
func netperfRuns(t *testing.T, srv, cli *nstest.Netns, ip string, srvEnv, cliEnv []string,
	before func(t *testing.T), after func(t *testing.T, r nstest.NetperfResult)) {
	t.Helper()
	netperf, netserver := nstest.Netperf(t)
	port := nstest.Port()
	s := nstest.StartNetserver(t, srv, netserver, srvEnv, port)
	for _, test := range nstest.NetperfTests {
		t.Run(test, func(t *testing.T) {
			if before != nil {
				before(t)
			}
			r, err := nstest.RunNetperf(cli, cliEnv, netperf, ip, port, netperfSecs, test)
			if err == nil {
				err = r.Sane()
			}
			if err != nil {
				t.Fatalf("%v\nnetserver: %s", err, tailStr(s.Output()))
			}
			if r.RR() {
				t.Logf("%s: %.0f %s, latency p50 %.0f p90 %.0f p99 %.0f mean %.1f us", test, r.Throughput, r.Unit, r.P50, r.P90, r.P99, r.Mean)
			} else {
				t.Logf("%s: %.0f %s", test, r.Throughput, r.Unit)
			}
			if after != nil {
				after(t, r)
			}
		})
	}
	if s.Exited() {
		t.Errorf("netserver exited during the tests: %v\n%s", s.Wait(0), tailStr(s.Output()))
	}
}

// TestNetperfShm: netperf over exn0 between two nodes on the shm fabric.
func TestNetperfShm(t *testing.T) {
	testenv.RequirePrivileged(t, "ip", "ss", "ping")
	nstest.Netperf(t)
	nodes, _ := startCluster(t, 60, 2)
	if _, err := nstest.Ping(nodes[0].NS, nodes[1].IP.String(), 1, 56, ""); err != nil {
		t.Fatal(err)
	}
	netperfRuns(t, nodes[1].NS, nodes[0].NS, nodes[1].IP.String(), nil, nil, nil, nil)
}

// TestNetperfNet: netperf over exn0 between two nodes on the net fabric
// (joined only by an underlay bridge).
func TestNetperfNet(t *testing.T) {
	testenv.RequirePrivileged(t, "ip", "ss", "ping")
	nstest.Netperf(t)
	c := nstest.StartNetCluster(t, nstest.Build(t), 61, []int{1, 2})
	a, b := c.Nodes[0], c.Nodes[1]
	if _, err := nstest.Ping(a.NS, b.IP.String(), 1, 56, ""); err != nil {
		t.Fatal(err)
	}
	netperfRuns(t, b.NS, a.NS, b.IP.String(), nil, nil, nil, nil)
}

// netperfMetrics is the exnd metrics address of every node of
// TestNetperfShim (one per namespace, so no clash).
const netperfMetrics = "127.0.0.1:9464"

// extdsCounts are one node's EXT-DS counters from its Prometheus metrics.
type extdsCounts struct {
	conns, fallbacks, rxBytes, handshakeErrs float64
}

func scrapeEXTDS(t *testing.T, n *nstest.Node) extdsCounts {
	t.Helper()
	fams := scrape(t, n, netperfMetrics)
	var fb float64
	if f := fams["exn_extds_fallbacks_total"]; f != nil {
		fb = sumSeries(f)
	}
	return extdsCounts{
		conns:         sample(t, fams, "exn_extds_connections_total", "mode=extds"),
		fallbacks:     fb + sample(t, fams, "exn_extds_connections_total", "mode=tcp"),
		rxBytes:       sample(t, fams, "exn_extds_rx_bytes_total"),
		handshakeErrs: sample(t, fams, "exn_extds_handshake_errors_total"),
	}
}

func sumSeries(f *dto.MetricFamily) float64 {
	var s float64
	for _, m := range f.GetMetric() {
		s += m.GetCounter().GetValue()
	}
	return s
}

// TestNetperfShim: netperf and netserver both under libextds.so
// (EXTDS_CONTROL at each node's exnd), two nodes on shm. netserver forks
// a child per test that inherits the switched control connection and
// listens for the data connection itself; TCP_CRR opens and closes a
// connection per transaction. exnd's Prometheus metrics, scraped over
// HTTP in each namespace, must count every TCP connection netperf made as
// an EXT-DS connection on both nodes (the control connection, and the
// data connection or, for TCP_CRR, one per transaction), none as a
// fallback, and for the bulk tests the payload as EXT-DS bytes.
func TestNetperfShim(t *testing.T) {
	testenv.RequirePrivileged(t, "ip", "ss", "ping", "gcc")
	nstest.Netperf(t)
	exnd := nstest.Build(t)
	fab := nstest.ShmFabric(t)
	var nodes [2]*nstest.Node
	for i := range nodes {
		nodes[i] = nstest.StartNode(t, exnd, fab, 62, i+1, "--metrics", netperfMetrics)
	}
	c := newShimCluster(t, exnd, nodes)
	var b0, b1 extdsCounts
	before := func(t *testing.T) { b0, b1 = scrapeEXTDS(t, nodes[0]), scrapeEXTDS(t, nodes[1]) }
	after := func(t *testing.T, r nstest.NetperfResult) {
		a0, a1 := scrapeEXTDS(t, nodes[0]), scrapeEXTDS(t, nodes[1])
		conns := [2]float64{a0.conns - b0.conns, a1.conns - b1.conns}
		fb := a0.fallbacks + a1.fallbacks - b0.fallbacks - b1.fallbacks
		herr := a0.handshakeErrs + a1.handshakeErrs - b0.handshakeErrs - b1.handshakeErrs
		rx := a0.rxBytes + a1.rxBytes - b0.rxBytes - b1.rxBytes
		t.Logf("%s: EXT-DS connections node 1 %.0f, node 2 %.0f; fallbacks %.0f; EXT-DS rx %.0f bytes", r.Test, conns[0], conns[1], fb, rx)
		// The control connection, plus the data connection of the TCP
		// tests (UDP_RR's data is UDP: plain over exn0), or one per
		// transaction for TCP_CRR (netperf's rate times its elapsed
		// time; both printed with a few digits, hence the 5%).
		want := 1.0
		switch r.Test {
		case "TCP_STREAM", "TCP_MAERTS", "TCP_RR":
			want = 2
		case "TCP_CRR":
			want = 1 + math.Floor(0.95*r.TransRate*r.Elapsed)
		}
		for i, n := range conns {
			if n < want {
				t.Errorf("%s: node %d counted %.0f EXT-DS connections, want at least %.0f", r.Test, i+1, n, want)
			}
		}
		if fb != 0 || herr != 0 {
			t.Errorf("%s: %.0f fallbacks to TCP and %.0f handshake errors, want none", r.Test, fb, herr)
		}
		if r.Test == "TCP_STREAM" || r.Test == "TCP_MAERTS" {
			if payload := r.Throughput * 1e6 / 8 * r.Elapsed; rx < 0.9*payload {
				t.Errorf("%s: EXT-DS delivered %.0f bytes, netperf moved about %.0f", r.Test, rx, payload)
			}
		}
	}
	netperfRuns(t, nodes[1].NS, nodes[0].NS, nodes[1].IP.String(), c.env(1), c.env(0), before, after)
}

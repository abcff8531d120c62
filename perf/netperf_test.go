package perf

import (
	"fmt"
	"strings"
	"testing"

	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

// netperfWay is one path BenchmarkNetperf measures between the same two
// namespaces.
type netperfWay struct {
	key, name      string
	ip             string
	srvEnv, cliEnv []string
	cli, srv       *nstest.Netns // where netperf and netserver run (nil: nodes 1 and 2)
	only           string        // the one test of this way ("": every test)
}

// medNetperf is the median of f over the runs rs, and the runs' values
// ("a / b / c") for the table.
func medNetperf(rs []nstest.NetperfResult, f func(nstest.NetperfResult) float64) (float64, string) {
	var v []float64
	for _, r := range rs {
		v = append(v, f(r))
	}
	return testenv.Median(v), dsJoin(v)
}

// BenchmarkNetperf is issue #15's benchmark: unmodified netperf
// (TCP_RR, TCP_CRR, TCP_STREAM) between two namespaces that each run
// exnd on one shm fabric, three ways in the same run: TCP over a veth
// pair between the same namespaces, TCP over exn0, and through
// libextds.so at both ends (EXT-DS). Each repetition (EXN_PERF_REPS,
// default 3) runs every test every way, interleaved; the table gives
// medians, RR latency percentiles (P50/P90/P99 from the omni selectors)
// and the ratios. EXN_PERF_SECS sets netperf -l (default 4). Needs the
// netperf build (make netperf); perf/netperf.sh runs it. A fourth way,
// on a second pair of nodes whose exnd holds no port (--extds-short-hold=0),
// runs TCP_CRR with every connection set up over EXT-DS:
//
//	go test -run '^$' -bench '^BenchmarkNetperf$' -benchtime 1x -timeout 30m ./perf/
func BenchmarkNetperf(b *testing.B) {
	testenv.RequirePrivileged(b, "ip", "ss", "gcc")
	netperf, netserver := nstest.Netperf(b)
	d := secs()
	reps := perfReps()
	exnd := nstest.Build(b)
	lib := nstest.BuildShimLib(b)
	fab := nstest.ShmFabric(b)
	n1 := nstest.StartNode(b, exnd, fab, 13, 1)
	n2 := nstest.StartNode(b, exnd, fab, 13, 2)
	_, vethB := nstest.Veth(b, n1.NS, n2.NS, 13)
	for _, ip := range []string{vethB, n2.IP.String()} {
		if _, err := nstest.Ping(n1.NS, ip, 2, 56, ""); err != nil {
			b.Fatal(err)
		}
	}
	// A second pair, with exnd's holds for short connections off
	// (docs/shim.md, "Short connections"): TCP_CRR there sets up every
	// connection over EXT-DS, which is what a connection costs to set up.
	fab2 := nstest.ShmFabric(b)
	n3 := nstest.StartNode(b, exnd, fab2, 14, 1, "--extds-short-hold=0")
	n4 := nstest.StartNode(b, exnd, fab2, 14, 2, "--extds-short-hold=0")
	if _, err := nstest.Ping(n3.NS, n4.IP.String(), 2, 56, ""); err != nil {
		b.Fatal(err)
	}
	shim := func(n *nstest.Node) []string { return []string{"LD_PRELOAD=" + lib, "EXTDS_CONTROL=" + n.Control} }
	ways := []netperfWay{
		{key: "veth", name: "TCP over veth", ip: vethB},
		{key: "exn0", name: "TCP over exn0", ip: n2.IP.String()},
		{key: "shim", name: "shim (EXT-DS)", ip: n2.IP.String(), srvEnv: shim(n2), cliEnv: shim(n1)},
		{key: "shimsetup", name: "shim, holds off", ip: n4.IP.String(), srvEnv: shim(n4), cliEnv: shim(n3), cli: n3.NS, srv: n4.NS, only: "TCP_CRR"},
	}
	// One netserver per way: the shim's must be shimmed, the others not
	// (a shimmed netserver would delay plain clients by exnd's peek).
	ports := make([]int, len(ways))
	for i, w := range ways {
		ports[i] = nstest.Port()
		ns := n2.NS
		if w.srv != nil {
			ns = w.srv
		}
		nstest.StartNetserver(b, ns, netserver, w.srvEnv, ports[i])
	}
	tests := []string{"TCP_RR", "TCP_CRR", "TCP_STREAM"}
	// res[test][way][rep]
	res := make([][][]nstest.NetperfResult, len(tests))
	for ti := range tests {
		res[ti] = make([][]nstest.NetperfResult, len(ways))
	}
	for rep := 0; rep < reps; rep++ {
		for ti, test := range tests {
			for wi, w := range ways {
				if w.only != "" && w.only != test {
					continue
				}
				cli := n1.NS
				if w.cli != nil {
					cli = w.cli
				}
				r, err := nstest.RunNetperf(cli, w.cliEnv, netperf, w.ip, ports[wi], d, test)
				if err == nil {
					err = r.Sane()
				}
				if err != nil {
					b.Fatalf("%s %s: %v", w.name, test, err)
				}
				res[ti][wi] = append(res[ti][wi], r)
			}
		}
		b.Logf("rep %d done, load %s", rep+1, loadAvg())
	}
	med := medNetperf
	thr := func(r nstest.NetperfResult) float64 { return r.Throughput }
	var sb strings.Builder
	fmt.Fprintf(&sb, "netperf -l %d, medians of %d repetitions (the ways interleaved); load at the end %s\n\n", d, reps, loadAvg())
	fmt.Fprintf(&sb, "| netperf test | veth | TCP over exn0 | shim (EXT-DS) | exn0 / veth | shim / exn0 | shim / veth |\n|---|---|---|---|---|---|---|\n")
	for ti, test := range tests {
		unit := "trans/s"
		if !strings.HasSuffix(test, "RR") {
			unit = "Mbit/s"
		}
		var m [3]float64
		var runs [3]string
		for wi := range m {
			m[wi], runs[wi] = med(res[ti][wi], thr)
			b.ReportMetric(m[wi], test+"-"+ways[wi].key+"-"+strings.ReplaceAll(unit, "/", "-per-"))
		}
		fmt.Fprintf(&sb, "| %s | %.0f %s (%s) | %.0f (%s) | %.0f (%s) | %.2fx | %.2fx | %.2fx |\n", test,
			m[0], unit, runs[0], m[1], runs[1], m[2], runs[2], m[1]/m[0], m[2]/m[1], m[2]/m[0])
	}
	fmt.Fprintf(&sb, "\nRR round-trip latency, microseconds (netperf omni P50_LATENCY, P90_LATENCY, P99_LATENCY; medians):\n\n")
	fmt.Fprintf(&sb, "| netperf test | percentile | veth | TCP over exn0 | shim (EXT-DS) | exn0 / veth | shim / exn0 | shim / veth |\n|---|---|---|---|---|---|---|---|\n")
	for ti, test := range tests {
		if !strings.HasSuffix(test, "RR") {
			continue
		}
		for _, p := range []struct {
			name string
			f    func(nstest.NetperfResult) float64
		}{{"p50", func(r nstest.NetperfResult) float64 { return r.P50 }},
			{"p90", func(r nstest.NetperfResult) float64 { return r.P90 }},
			{"p99", func(r nstest.NetperfResult) float64 { return r.P99 }}} {
			var m [3]float64
			for wi := range m {
				m[wi], _ = med(res[ti][wi], p.f)
				b.ReportMetric(m[wi], test+"-"+ways[wi].key+"-"+p.name+"-us")
			}
			fmt.Fprintf(&sb, "| %s | %s | %.0f | %.0f | %.0f | %.2fx | %.2fx | %.2fx |\n", test, p.name, m[0], m[1], m[2], m[1]/m[0], m[2]/m[1], m[2]/m[0])
		}
	}
	// The fourth way: TCP_CRR with every connection set up over EXT-DS.
	for ti, test := range tests {
		const wi = 3
		if rs := res[ti][wi]; len(rs) > 0 {
			rate, runs := med(rs, thr)
			p50, _ := med(rs, func(r nstest.NetperfResult) float64 { return r.P50 })
			exn0, _ := med(res[ti][1], thr)
			b.ReportMetric(rate, test+"-"+ways[wi].key+"-trans-per-s")
			b.ReportMetric(p50, test+"-"+ways[wi].key+"-p50-us")
			fmt.Fprintf(&sb, "\n%s with every connection set up over EXT-DS (a second node pair, exnd --extds-short-hold=0): %.0f trans/s (%s), %.2fx TCP over exn0; round trip p50 %.0f us\n",
				test, rate, runs, rate/exn0, p50)
		}
	}
	b.ReportMetric(float64(reps), "reps")
	report(b, fmt.Sprintf("%d CPUs", numCPU()), sb.String())
}

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
}

// BenchmarkNetperf is issue #15's benchmark: unmodified netperf
// (TCP_RR, TCP_CRR, TCP_STREAM) between two namespaces that each run
// exnd on one shm fabric, three ways in the same run: TCP over a veth
// pair between the same namespaces, TCP over exn0, and through
// libextds.so at both ends (EXT-DS). Each repetition (EXN_PERF_REPS,
// default 3) runs every test every way, interleaved; the table gives
// medians, RR latency percentiles (P50/P90/P99 from the omni selectors)
// and the ratios. EXN_PERF_SECS sets netperf -l (default 4). Needs the
// netperf build (make netperf); perf/netperf.sh runs it:
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
	shim := func(n *nstest.Node) []string { return []string{"LD_PRELOAD=" + lib, "EXTDS_CONTROL=" + n.Control} }
	ways := []netperfWay{
		{"veth", "TCP over veth", vethB, nil, nil},
		{"exn0", "TCP over exn0", n2.IP.String(), nil, nil},
		{"shim", "shim (EXT-DS)", n2.IP.String(), shim(n2), shim(n1)},
	}
	// One netserver per way: the shim's must be shimmed, the others not
	// (a shimmed netserver would delay plain clients by exnd's peek).
	ports := make([]int, len(ways))
	for i, w := range ways {
		ports[i] = nstest.Port()
		nstest.StartNetserver(b, n2.NS, netserver, w.srvEnv, ports[i])
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
				r, err := nstest.RunNetperf(n1.NS, w.cliEnv, netperf, w.ip, ports[wi], d, test)
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
	med := func(rs []nstest.NetperfResult, f func(nstest.NetperfResult) float64) (float64, string) {
		var v []float64
		for _, r := range rs {
			v = append(v, f(r))
		}
		return testenv.Median(v), dsJoin(v)
	}
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
		for wi := range ways {
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
			for wi := range ways {
				m[wi], _ = med(res[ti][wi], p.f)
				b.ReportMetric(m[wi], test+"-"+ways[wi].key+"-"+p.name+"-us")
			}
			fmt.Fprintf(&sb, "| %s | %s | %.0f | %.0f | %.0f | %.2fx | %.2fx | %.2fx |\n", test, p.name, m[0], m[1], m[2], m[1]/m[0], m[2]/m[1], m[2]/m[0])
		}
	}
	b.ReportMetric(float64(reps), "reps")
	report(b, fmt.Sprintf("%d CPUs", numCPU()), sb.String())
}

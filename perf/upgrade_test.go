package perf

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

// BenchmarkShimUpgrade is issue #33's benchmark: connections that start
// as the program's TCP connection and move onto a direct one in the
// background (EXTDS_SETUP=upgrade, docs/shim.md "Upgrade"), against TCP
// over exn0 between the same two namespaces, in the same run, on one
// host (sub-benchmark shm: one exnd each on a shm fabric) and across
// hosts (net: two namespaces joined by an underlay bridge, the net
// fabric; the upgrade word crosses by the engines, docs/direct.md "The
// upgrade word across hosts"); holds off (--extds-short-hold=0):
//
//   - TCP_CRR: connections per second, and the round trip p50, which
//     for TCP_CRR is connect, request and first response byte;
//   - TCP_RR right after the TCP_CRR run, on the same netserver: the
//     long connection's round trip p50 (it moves after UPG_AGE_NS);
//   - a long TCP_RR started one second into a two-second TCP_CRR burst
//     to the same netserver, running on after it;
//   - right after the TCP_CRR run, one connection's 1-byte ping-pong for
//     a second (shim/test/upgrade_probe.c pingpong): when its descriptor became
//     direct, and its round trip p50 after that.
//
// Each repetition (EXN_PERF_REPS, default 3) runs both ways, interleaved;
// EXN_PERF_SECS sets netperf -l (default 4). perf/shim-upgrade.sh runs it.
func BenchmarkShimUpgrade(b *testing.B) {
	testenv.RequirePrivileged(b, "ip", "ss", "gcc")
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d CPUs; load before %s\n", numCPU(), loadAvg())
	for _, fab := range []string{"shm", "net"} {
		b.Run(fab, func(b *testing.B) {
			fmt.Fprintf(&sb, "\n### %s\n\n", map[string]string{"shm": "One host (shm)", "net": "Across hosts (net, two namespaces on an underlay bridge)"}[fab])
			defer func() {
				if b.Failed() {
					fmt.Fprintf(&sb, "**%s failed** (the benchmark's log says why)\n", fab)
				}
			}()
			upgradeFabric(b, &sb, fab)
		})
	}
	report(b, fmt.Sprintf("%d CPUs", numCPU()), sb.String())
}

// upgradeFabric runs BenchmarkShimUpgrade on two nodes of fabric fab
// ("shm" or "net") and writes its table into sb.
func upgradeFabric(b *testing.B, sb *strings.Builder, fab string) {
	netperf, netserver := nstest.Netperf(b)
	d := secs()
	reps := perfReps()
	exnd := nstest.Build(b)
	lib := nstest.BuildShimLib(b)
	var n1, n2 *nstest.Node
	if fab == "shm" {
		f := nstest.ShmFabric(b)
		n1 = nstest.StartNode(b, exnd, f, 17, 1, "--extds-short-hold=0")
		n2 = nstest.StartNode(b, exnd, f, 17, 2, "--extds-short-hold=0")
	} else {
		c := nstest.StartUnderlayCluster(b, exnd, "net", nstest.NetPort, 83, []int{1, 2}, "--extds-short-hold=0")
		n1, n2 = c.Nodes[0], c.Nodes[1]
	}
	if _, err := nstest.Ping(n1.NS, n2.IP.String(), 2, 56, ""); err != nil {
		b.Fatal(err)
	}
	if _, err := nstest.Ping(n2.NS, n1.IP.String(), 2, 56, ""); err != nil {
		b.Fatal(err)
	}
	up := func(n *nstest.Node) []string {
		return []string{"LD_PRELOAD=" + lib, "EXTDS_CONTROL=" + n.Control, "EXTDS_SETUP=upgrade"}
	}
	pp := filepath.Join(b.TempDir(), "upgrade")
	testenv.MustCC(b, "-O2", "-pthread", "-Wall", "-Wextra", "-Werror", "-o", pp, testenv.ModulePath("shim", "test", "upgrade.c"), testenv.ModulePath("shim", "test", "upgrade_probe.c"))
	type way struct {
		name           string
		srvEnv, cliEnv []string
		port, ppPort   int
	}
	ways := []*way{{name: "TCP over exn0"}, {name: "shim, upgrade", srvEnv: up(n2), cliEnv: up(n1)}}
	for _, w := range ways {
		w.port = nstest.Port()
		nstest.StartNetserver(b, n2.NS, netserver, w.srvEnv, w.port)
		w.ppPort = nstest.Port()
		srv := n2.NS.StartEnv(b, w.srvEnv, pp, "server", n2.IP.String(), fmt.Sprint(w.ppPort))
		if err := n2.NS.WaitListening(srv, fmt.Sprint(w.ppPort), 10*time.Second); err != nil {
			b.Fatal(err)
		}
	}
	ip := n2.IP.String()
	run := func(w *way, test string) nstest.NetperfResult {
		r, err := nstest.RunNetperf(n1.NS, w.cliEnv, netperf, ip, w.port, d, test)
		if err == nil {
			err = r.Sane()
		}
		if err != nil {
			b.Fatalf("%s %s: %v", w.name, test, err)
		}
		return r
	}
	// The burst of short connections lasts burstSecs; the long connection
	// opens one second into it and runs d seconds, most of them after
	// the burst ended (issue #33: "runs direct once the burst is over").
	const burstSecs = 2
	// crr[way], rr[way], mixed[way]: one result per repetition.
	var crr, rr, mixed [2][]nstest.NetperfResult
	// ping-pong after TCP_CRR: when direct (µs), p50 after (µs).
	var ppAt, ppP50 [2][]float64
	pingpong := func(wi int, w *way) {
		out, err := n1.NS.RunEnv(30*time.Second, w.cliEnv, pp, "pingpong", ip, fmt.Sprint(w.ppPort), "1000")
		var at, before, after, n float64
		if err == nil {
			_, err = fmt.Sscanf(strings.TrimSpace(out), "pingpong direct_after_us %g before_p50_us %g after_p50_us %g round_trips %g", &at, &before, &after, &n)
		}
		if err != nil {
			b.Fatalf("%s: pingpong: %v: %s", w.name, err, out)
		}
		if at < 0 {
			after = before // never direct: TCP's p50 throughout
		}
		ppAt[wi] = append(ppAt[wi], at)
		ppP50[wi] = append(ppP50[wi], after)
	}
	for rep := 0; rep < reps; rep++ {
		for wi, w := range ways {
			crr[wi] = append(crr[wi], run(w, "TCP_CRR"))
			pingpong(wi, w)
			rr[wi] = append(rr[wi], run(w, "TCP_RR"))
			// A long connection opened during a burst of short ones.
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := nstest.RunNetperf(n1.NS, w.cliEnv, netperf, ip, w.port, burstSecs, "TCP_CRR")
				if err != nil {
					b.Errorf("%s: burst: %v", w.name, err)
				}
				_ = r
			}()
			time.Sleep(time.Second)
			mixed[wi] = append(mixed[wi], run(w, "TCP_RR"))
			wg.Wait()
		}
		b.Logf("rep %d done, load %s", rep+1, loadAvg())
	}
	med := medNetperf
	thr := func(r nstest.NetperfResult) float64 { return r.Throughput }
	p50 := func(r nstest.NetperfResult) float64 { return r.P50 }
	fmt.Fprintf(sb, "netperf -l %d, medians of %d repetitions (the ways interleaved); load at the end %s\n\n", d, reps, loadAvg())
	fmt.Fprintf(sb, "| measure | TCP over exn0 | shim, upgrade | shim / exn0 |\n|---|---|---|---|\n")
	row := func(name string, rs [2][]nstest.NetperfResult, f func(nstest.NetperfResult) float64, unit, key string) {
		a, ra := med(rs[0], f)
		c, rc := med(rs[1], f)
		b.ReportMetric(a, key+"-exn0")
		b.ReportMetric(c, key+"-upgrade")
		fmt.Fprintf(sb, "| %s | %.0f %s (%s) | %.0f (%s) | %.2fx |\n", name, a, unit, ra, c, rc, c/a)
	}
	row("TCP_CRR, connections/s", crr, thr, "trans/s", "crr-trans-per-s")
	row("TCP_CRR round trip p50 (connect to first response byte)", crr, p50, "us", "crr-p50-us")
	row("TCP_RR right after TCP_CRR, p50", rr, p50, "us", "rr-p50-us")
	row("TCP_RR right after TCP_CRR, transactions/s", rr, thr, "trans/s", "rr-trans-per-s")
	row(fmt.Sprintf("TCP_RR opened 1 s into a %d s TCP_CRR burst, p50 over its %d s", burstSecs, d), mixed, p50, "us", "mixed-p50-us")
	at, ats := testenv.Median(ppAt[1]), dsJoin(ppAt[1])
	pa, pas := testenv.Median(ppP50[0]), dsJoin(ppP50[0])
	pb, pbs := testenv.Median(ppP50[1]), dsJoin(ppP50[1])
	b.ReportMetric(at, "pingpong-direct-after-us")
	fmt.Fprintf(sb, "| one connection's ping-pong right after TCP_CRR: round trip p50 (after it became direct) | %.1f us (%s) | %.2f (%s) | %.3fx |\n", pa, pas, pb, pbs, pb/pa)
	fmt.Fprintf(sb, "\nThat connection became direct %.0f us after its connect (%s; shim/upgrade.h UPG_AGE_NS is 2 ms).\n", at, ats)
	b.ReportMetric(float64(reps), "reps")
}

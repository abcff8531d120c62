package perf

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

// shimWay is one path BenchmarkShimDirect and BenchmarkShimXHost
// measure: the namespaces and address of the server, and the
// environments of both programs.
type shimWay struct {
	key, name      string
	srv, cli       *nstest.Netns
	ip             string
	srvEnv, cliEnv []string
}

// shimWays is base (the kernel's TCP between two namespaces of their
// own, or between the nodes' namespaces over the underlay) followed by
// the three ways between node cli and node srv: TCP over exn0, both
// programs under libextds.so with the relay through exnd
// (EXTDS_DIRECT=0), and under libextds.so with direct connections (the
// default).
func shimWays(base shimWay, lib string, cli, srv *nstest.Node) []shimWay {
	ip := srv.IP.String()
	return []shimWay{
		base,
		{"exn0", "TCP over exn0", srv.NS, cli.NS, ip, nil, nil},
		{"relay", "shim, relay", srv.NS, cli.NS, ip, shimEnv(lib, srv, "EXTDS_DIRECT=0"), shimEnv(lib, cli, "EXTDS_DIRECT=0")},
		{"direct", "shim, direct", srv.NS, cli.NS, ip, shimEnv(lib, srv), shimEnv(lib, cli)},
	}
}

// shimEnv is the environment of a program under libextds.so talking to
// node n's exnd, plus extra.
func shimEnv(lib string, n *nstest.Node, extra ...string) []string {
	return append([]string{"LD_PRELOAD=" + lib, "EXTDS_CONTROL=" + n.Control}, extra...)
}

// BenchmarkShimDirect is issue #14's benchmark: unmodified sockperf
// (TCP ping-pong, 64 B), iperf3 (1 stream) and netperf TCP_RR between two
// namespaces that each run exnd on one shm fabric, four ways in the same
// run: TCP over a veth pair between two more namespaces, TCP over exn0,
// both programs under libextds.so with the relay through exnd
// (EXTDS_DIRECT=0), and under libextds.so with direct connections (the
// default: the programs move the bytes, docs/direct.md). For the shim
// iperf3 runs it also reports both exnds' CPU time during the transfer as
// a share of one core. Each repetition (EXN_PERF_REPS, default 3) runs
// every tool every way, interleaved; the table gives medians and ratios.
// EXN_PERF_SECS sets each run's length (default 4). perf/shim-direct.sh
// runs it:
//
//	go test -run '^$' -bench '^BenchmarkShimDirect$' -benchtime 1x -timeout 30m ./perf/
func BenchmarkShimDirect(b *testing.B) {
	testenv.RequirePrivileged(b, "ip", "ss", "gcc", "sockperf", "iperf3")
	netperf, netserver := nstest.Netperf(b)
	lib := nstest.BuildShimLib(b)
	p := newPair(b, 14, 14)
	d, reps := secs(), perfReps()
	ways := shimWays(shimWay{"veth", "TCP over veth", p.vb, p.va, p.vethB, nil, nil}, lib, p.n1, p.n2)
	res := runWays(b, ways, []int{p.n1.Proc.Pid(), p.n2.Proc.Pid()}, netperf, netserver, reps, d, nil)
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d s per run, medians of %d repetitions (the ways interleaved); %d CPUs; load at the end %s\n\n", d, reps, numCPU(), loadAvg())
	wayTable(b, &sb, "", ways, res, []wayRow{
		{"sockperf TCP ping-pong 64 B p50", "sockperf-p50", "us", "<= 0.3x exn0 and <= 1.0x veth; goal 0.15x exn0", func(s waySample) float64 { return s.p50 }},
		{"iperf3, 1 stream", "iperf3", "Gbit/s", ">= 1.0x veth; goal 1.5x", func(s waySample) float64 { return s.gbps }},
		{"both exnds' CPU during iperf3", "exnd-cpu", "% of a core", "< 5 % (direct)", func(s waySample) float64 { return s.cpu / s.wall * 100 }},
		{"netperf TCP_RR", "tcp-rr", "trans/s", ">= 3x exn0", func(s waySample) float64 { return s.rr }},
	})
	b.ReportMetric(float64(reps), "reps")
	report(b, "", sb.String())
}

// waySample is one repetition of the tools one way.
type waySample struct {
	p50, p99 float64 // sockperf TCP ping-pong 64 B, µs
	gbps     float64 // iperf3, 1 stream: the receiver's Gbit/s
	bytes    float64 // what that iperf3 run moved
	cpu      float64 // the exnds' CPU seconds during the iperf3 run
	wall     float64 // the iperf3 run's length in seconds
	rr       float64 // netperf TCP_RR, trans/s
}

// runWays starts a netserver for every way, then runs every tool every
// way (measureWay), reps times, the ways interleaved; after, if not nil,
// runs at the end of each repetition. It returns the samples by way,
// the netservers killed.
// exnds are the pids whose CPU time prices the iperf3 runs.
func runWays(b *testing.B, ways []shimWay, exnds []int, netperf, netserver string, reps, d int, after func(rep int)) [][]waySample {
	b.Helper()
	ports := make([]int, len(ways))
	for i, w := range ways {
		ports[i] = nstest.Port()
		ns := nstest.StartNetserver(b, w.srv, netserver, w.srvEnv, ports[i])
		defer func() { _ = ns.Kill() }() // no listener left behind for what follows
	}
	res := make([][]waySample, len(ways))
	for rep := 0; rep < reps; rep++ {
		for wi, w := range ways {
			s, err := measureWay(b, w, d, exnds, netperf, ports[wi])
			if err != nil {
				b.Fatalf("%s: %v", w.name, err)
			}
			res[wi] = append(res[wi], s)
		}
		if after != nil {
			after(rep)
		}
		b.Logf("rep %d done, load %s", rep+1, loadAvg())
	}
	return res
}

// measureWay runs, one way, sockperf TCP ping-pong with 64-byte
// messages, one iperf3 TCP stream (priced in the exnds' CPU time) and
// netperf TCP_RR against the way's netserver on port, each for secs
// seconds.
func measureWay(b *testing.B, w shimWay, secs int, exnds []int, netperf string, port int) (waySample, error) {
	var s waySample
	sp, err := sockperfEnv(b, w, secs)
	if err != nil {
		return s, err
	}
	s.p50, s.p99 = sp.P50, sp.P99
	t0, start := cpuTicks(exnds), time.Now()
	ip, err := nstest.Iperf3Env(b, w.srv, w.cli, w.srvEnv, w.cliEnv, w.ip, secs)
	if err != nil {
		return s, err
	}
	s.cpu, s.wall = float64(cpuTicks(exnds)-t0)/clockTicks, time.Since(start).Seconds()
	s.gbps, s.bytes = ip.BitsPerSecond/1e9, ip.Bytes
	r, err := nstest.RunNetperf(w.cli, w.cliEnv, netperf, w.ip, port, secs, "TCP_RR")
	if err == nil {
		err = r.Sane()
	}
	if err != nil {
		return s, fmt.Errorf("TCP_RR: %w", err)
	}
	s.rr = r.Throughput
	return s, nil
}

// wayRow is one row of wayTable: a measurement, its metric key, unit
// and bar, and what it reads from a sample.
type wayRow struct {
	name, key, unit, bar string
	f                    func(waySample) float64
}

// wayTable writes the markdown table of the four ways' medians (ways in
// shimWays' order), row by row, with the ratios shim direct / exn0 and
// shim direct / the base way, and reports each median as the metric
// prefix+key-way.
func wayTable(b *testing.B, sb *strings.Builder, prefix string, ways []shimWay, res [][]waySample, rows []wayRow) {
	fmt.Fprintf(sb, "| measurement | %s | %s | %s | %s | direct / exn0 | direct / %s | bar |\n|---|---|---|---|---|---|---|---|\n",
		ways[0].name, ways[1].name, ways[2].name, ways[3].name, ways[0].key)
	for _, m := range rows {
		var v [4]float64
		for wi := range ways {
			v[wi] = medianOf(res[wi], m.f)
			b.ReportMetric(v[wi], prefix+m.key+"-"+ways[wi].key)
		}
		fmt.Fprintf(sb, "| %s (%s) | %.2f | %.2f | %.2f | %.2f | %s | %s | %s |\n", m.name, m.unit, v[0], v[1], v[2], v[3], ratio(v[3], v[1]), ratio(v[3], v[0]), m.bar)
	}
}

// medianOf is the median of f over samples.
func medianOf(samples []waySample, f func(waySample) float64) float64 {
	var v []float64
	for _, s := range samples {
		v = append(v, f(s))
	}
	return testenv.Median(v)
}

// ratio is a/b as "1.23x", or "-" when b is 0.
func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

func cpuTicks(pids []int) uint64 {
	var sum uint64
	for _, pid := range pids {
		t, _ := nstest.CPUTicks(pid)
		sum += t
	}
	return sum
}

// sockperfEnv is sockperf TCP ping-pong with 64-byte messages, both
// programs with their way's environment.
func sockperfEnv(b *testing.B, w shimWay, secs int) (nstest.SockperfResult, error) {
	return nstest.SockperfEnv(b, w.srv, w.cli, w.srvEnv, w.cliEnv, w.ip, secs, "-m", "64")
}

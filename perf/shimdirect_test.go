package perf

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

// shimWay is one path BenchmarkShimDirect measures: the namespaces and
// address of the server, and the environments of both programs.
type shimWay struct {
	key, name      string
	srv, cli       *nstest.Netns
	ip             string
	srvEnv, cliEnv []string
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
	shim := func(n *nstest.Node, extra ...string) []string {
		return append([]string{"LD_PRELOAD=" + lib, "EXTDS_CONTROL=" + n.Control}, extra...)
	}
	ip := p.n2.IP.String()
	ways := []shimWay{
		{"veth", "TCP over veth", p.vb, p.va, p.vethB, nil, nil},
		{"exn0", "TCP over exn0", p.n2.NS, p.n1.NS, ip, nil, nil},
		{"relay", "shim, relay", p.n2.NS, p.n1.NS, ip, shim(p.n2, "EXTDS_DIRECT=0"), shim(p.n1, "EXTDS_DIRECT=0")},
		{"direct", "shim, direct", p.n2.NS, p.n1.NS, ip, shim(p.n2), shim(p.n1)},
	}
	ports := make([]int, len(ways))
	for i, w := range ways {
		ports[i] = nstest.Port()
		nstest.StartNetserver(b, w.srv, netserver, w.srvEnv, ports[i])
	}
	exnds := []int{p.n1.Proc.Pid(), p.n2.Proc.Pid()}
	type sample struct{ sp, ip, cpu, rr float64 }
	res := make([][]sample, len(ways))
	for rep := 0; rep < reps; rep++ {
		for wi, w := range ways {
			var s sample
			var err error
			if s.sp, err = sockperfEnv(b, w, d); err != nil {
				b.Fatalf("%s: %v", w.name, err)
			}
			t0 := cpuTicks(exnds)
			start := time.Now()
			if s.ip, err = iperf3Env(b, w, d); err != nil {
				b.Fatalf("%s: %v", w.name, err)
			}
			s.cpu = float64(cpuTicks(exnds)-t0) / 100 / time.Since(start).Seconds() * 100 // % of one core (USER_HZ 100)
			r, err := nstest.RunNetperf(w.cli, w.cliEnv, netperf, w.ip, ports[wi], d, "TCP_RR")
			if err == nil {
				err = r.Sane()
			}
			if err != nil {
				b.Fatalf("%s TCP_RR: %v", w.name, err)
			}
			s.rr = r.Throughput
			res[wi] = append(res[wi], s)
		}
		b.Logf("rep %d done, load %s", rep+1, loadAvg())
	}
	med := func(wi int, f func(sample) float64) float64 {
		var v []float64
		for _, s := range res[wi] {
			v = append(v, f(s))
		}
		return testenv.Median(v)
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d s per run, medians of %d repetitions (the ways interleaved); %d CPUs; load at the end %s\n\n", d, reps, numCPU(), loadAvg())
	fmt.Fprintf(&sb, "| measurement | veth | TCP over exn0 | shim, relay | shim, direct | direct / exn0 | direct / veth | bar |\n|---|---|---|---|---|---|---|---|\n")
	for _, m := range []struct {
		name, key, unit, bar string
		f                    func(sample) float64
	}{
		{"sockperf TCP ping-pong 64 B p50", "sockperf-p50", "us", "<= 0.3x exn0 and <= 1.0x veth; goal 0.15x exn0", func(s sample) float64 { return s.sp }},
		{"iperf3, 1 stream", "iperf3", "Gbit/s", ">= 1.0x veth; goal 1.5x", func(s sample) float64 { return s.ip }},
		{"both exnds' CPU during iperf3", "exnd-cpu", "% of a core", "< 5 % (direct)", func(s sample) float64 { return s.cpu }},
		{"netperf TCP_RR", "tcp-rr", "trans/s", ">= 3x exn0", func(s sample) float64 { return s.rr }},
	} {
		var v [4]float64
		for wi := range ways {
			v[wi] = med(wi, m.f)
			b.ReportMetric(v[wi], m.key+"-"+ways[wi].key)
		}
		fmt.Fprintf(&sb, "| %s (%s) | %.2f | %.2f | %.2f | %.2f | %.2fx | %.2fx | %s |\n", m.name, m.unit, v[0], v[1], v[2], v[3], v[3]/v[1], v[3]/v[0], m.bar)
	}
	b.ReportMetric(float64(reps), "reps")
	report(b, "", sb.String())
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
// programs with their way's environment; it returns the p50 in µs.
func sockperfEnv(b *testing.B, w shimWay, secs int) (float64, error) {
	r, err := nstest.SockperfEnv(b, w.srv, w.cli, w.srvEnv, w.cliEnv, w.ip, secs, "-m", "64")
	return r.P50, err
}

// iperf3Env is one iperf3 TCP stream; it returns the receiver's Gbit/s.
func iperf3Env(b *testing.B, w shimWay, secs int) (float64, error) {
	r, err := nstest.Iperf3Env(b, w.srv, w.cli, w.srvEnv, w.cliEnv, w.ip, secs)
	return r.BitsPerSecond / 1e9, err
}

package perf

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

// BenchmarkExtEth measures EXT-Eth over exn0 (two namespaces, one exnd
// each, shm fabric) against a veth pair between two other namespaces, in
// the same run: iperf3 with 1 and 2 streams, sockperf TCP ping-pong p50
// and p99, and exnd's idle CPU. It reports absolute values and ratios.
// Each measurement runs once; use -benchtime=1x (perf/ext-eth.sh does).
//
//	go test -run '^$' -bench ExtEth -benchtime 1x -timeout 10m ./perf/
func BenchmarkExtEth(b *testing.B) {
	testenv.RequirePrivileged(b, "ip", "iperf3", "sockperf")
	d := secs()

	p := newPair(b, 9, 9)
	va, vb, vethB, n1, n2 := p.va, p.vb, p.vethB, p.n1, p.n2

	type row struct {
		name, unit   string
		veth, exn    float64
		bar          string
		higherBetter bool
	}
	var rows []row

	for _, streams := range []int{1, 2} {
		var extra []string
		if streams > 1 {
			extra = []string{"-P", strconv.Itoa(streams)}
		}
		rv, err := nstest.Iperf3(b, vb, va, vethB, d, extra...)
		if err != nil {
			b.Fatal(err)
		}
		re, err := nstest.Iperf3(b, n2.NS, n1.NS, n2.IP.String(), d, extra...)
		if err != nil {
			b.Fatal(err)
		}
		bar := ""
		if streams == 1 {
			bar = ">= 0.5x"
		}
		rows = append(rows, row{fmt.Sprintf("iperf3 TCP, %d stream(s)", streams), "Gbit/s", rv.BitsPerSecond / 1e9, re.BitsPerSecond / 1e9, bar, true})
	}

	sv, err := nstest.Sockperf(b, vb, va, vethB, d)
	if err != nil {
		b.Fatal(err)
	}
	se, err := nstest.Sockperf(b, n2.NS, n1.NS, n2.IP.String(), d)
	if err != nil {
		b.Fatal(err)
	}
	rows = append(rows,
		row{"sockperf TCP ping-pong p50", "us", sv.P50, se.P50, "<= 3x", false},
		row{"sockperf TCP ping-pong p99", "us", sv.P99, se.P99, "", false})

	// Idle CPU: both exnds, no traffic, over 5 s.
	time.Sleep(500 * time.Millisecond)
	idle := 0.0
	for _, n := range []*nstest.Node{n1, n2} {
		t0, err := nstest.CPUTicks(n.Proc.Pid())
		if err != nil {
			b.Fatal(err)
		}
		w0 := time.Now()
		time.Sleep(5 * time.Second)
		t1, err := nstest.CPUTicks(n.Proc.Pid())
		if err != nil {
			b.Fatal(err)
		}
		pct := float64(t1-t0) / clockTicks / time.Since(w0).Seconds() * 100
		idle = max(idle, pct)
	}

	var sb strings.Builder
	fmt.Fprintf(&sb, "| measurement | veth | exn0 (shm) | exn0 / veth | bar |\n|---|---|---|---|---|\n")
	for _, r := range rows {
		ratio := r.exn / r.veth
		fmt.Fprintf(&sb, "| %s | %.2f %s | %.2f %s | %.2fx | %s |\n", r.name, r.veth, r.unit, r.exn, r.unit, ratio, r.bar)
		key := strings.NewReplacer(" ", "-", ",", "", "(", "", ")", "").Replace(r.name)
		b.ReportMetric(r.veth, key+"-veth-"+r.unit)
		b.ReportMetric(r.exn, key+"-exn-"+r.unit)
		b.ReportMetric(ratio, key+"-ratio")
	}
	fmt.Fprintf(&sb, "| exnd idle CPU (max of 2 nodes, 5 s) | | %.2f %% of a core | | < 2%% |\n", idle)
	b.ReportMetric(idle, "idle-cpu-%")
	report(b, fmt.Sprintf("iperf3/sockperf %d s each, %d CPUs", d, numCPU()), sb.String())
}

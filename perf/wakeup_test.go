package perf

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

// BenchmarkWakeup measures the wake-up design (docs/wakeup.md) on two
// exnd nodes on one shm fabric, each in its own namespace, against a veth
// pair between two other namespaces, in the same run: ping over exn0 at 1,
// 5 and 50 pings a second (p50 and worst), `exnctl ping` on the fabric
// after a second of quiet (cold) and back to back (warm), sockperf TCP
// ping-pong with 64-byte messages, and each exnd's CPU over 10 s of idle
// as a share of the wall time. perf/wakeup.sh runs it.
//
//	go test -run '^$' -bench Wakeup -benchtime 1x -timeout 15m ./perf/
func BenchmarkWakeup(b *testing.B) {
	testenv.RequirePrivileged(b, "ip", "ping", "sockperf", "gcc")
	p := newPair(b, 11, 11)
	va, vb, vethB, n1, n2 := p.va, p.vb, p.vethB, p.n1, p.n2
	var sb strings.Builder
	fmt.Fprintf(&sb, "load before: %s\n\n", loadAvg())
	fmt.Fprintf(&sb, "| measurement | veth | exn0 (shm) | exn0 / veth | bar |\n|---|---|---|---|---|\n")
	// row prints a line and reports KEY-veth-UNIT and KEY-exn-UNIT (the
	// names perf/report's wakeup section reads).
	row := func(name, key string, veth, exn float64, unit, bar string) {
		fmt.Fprintf(&sb, "| %s | %.3f %s | %.3f %s | %.2fx | %s |\n", name, veth, unit, exn, unit, exn/veth, bar)
		b.ReportMetric(veth, key+"-veth-"+unit)
		b.ReportMetric(exn, key+"-exn-"+unit)
	}
	for _, r := range []struct {
		rate, count int
	}{{1, 10}, {5, 20}, {50, 100}} {
		pv, err := pingRTTs(va, vethB, r.rate, r.count)
		if err != nil {
			b.Fatal(err)
		}
		pe, err := pingRTTs(n1.NS, n2.IP.String(), r.rate, r.count)
		if err != nil {
			b.Fatal(err)
		}
		row(fmt.Sprintf("ping %d/s p50", r.rate), fmt.Sprintf("ping%d-p50", r.rate), pct(pv, 50), pct(pe, 50), "ms", "<= 0.5 ms; goal <= 2x veth")
		bar := ""
		if r.rate == 5 {
			bar = "<= 3 ms"
		}
		row(fmt.Sprintf("ping %d/s worst of %d", r.rate, r.count), fmt.Sprintf("ping%d-worst", r.rate), pct(pv, 100), pct(pe, 100), "ms", bar)
	}

	cold, warm, err := fabricPings(n1)
	if err != nil {
		b.Fatal(err)
	}
	// The floor: two C processes ping-ponging through FIFOs, parked in
	// poll(2), after the same quiet (cold) and back to back (warm).
	floorCold, err := fifoFloor(b, 10, time.Second)
	if err != nil {
		b.Fatal(err)
	}
	floorWarm, err := fifoFloor(b, 2000, 0)
	if err != nil {
		b.Fatal(err)
	}
	// The same between two Go processes parked in the netpoller, as
	// exnd parks: what the Go runtime adds to a cold wake-up.
	goCold, err := goFloor(b, 10, time.Second)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Fprintf(&sb, "| exnctl ping, cold (after 1 s quiet), p50 of %d; floor = C FIFO ping-pong after 1 s | %.1f us (floor) | %.1f us | %.2fx floor | <= 100 us |\n",
		len(cold), floorCold, pct(cold, 50), pct(cold, 50)/floorCold)
	fmt.Fprintf(&sb, "| exnctl ping, cold, against two Go processes ping-ponging through FIFOs in the netpoller after 1 s (Go floor) | %.1f us (Go floor) | %.1f us | %.2fx Go floor | |\n",
		goCold, pct(cold, 50), pct(cold, 50)/goCold)
	b.ReportMetric(goCold, "go-floor-cold-us")
	fmt.Fprintf(&sb, "| exnctl ping, warm (back to back), p50 of %d; floor back to back | %.1f us (floor) | %.1f us | %.2fx floor | |\n",
		len(warm), floorWarm, pct(warm, 50), pct(warm, 50)/floorWarm)
	b.ReportMetric(floorCold, "fifo-floor-cold-us")
	b.ReportMetric(pct(cold, 50), "fping-cold-p50-us")
	b.ReportMetric(pct(warm, 50), "fping-warm-p50-us")
	b.ReportMetric(floorWarm, "fifo-floor-warm-us")

	sv, err := sockperf64(b, vb, va, vethB, secs())
	if err != nil {
		b.Fatal(err)
	}
	se, err := sockperf64(b, n2.NS, n1.NS, n2.IP.String(), secs())
	if err != nil {
		b.Fatal(err)
	}
	row("sockperf TCP ping-pong 64 B p50", "sockperf64-p50", sv, se, "us", "<= 2x veth; goal 1.2x")

	time.Sleep(time.Second)
	idle := 0.0
	for _, n := range []*nstest.Node{n1, n2} {
		share, err := idleShare(n.Proc.Pid(), 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		fmt.Fprintf(&sb, "| exnd node %d idle, 10 s: CPU time / wall time | | %.3f %% | | < 0.5 %%; goal < 0.1 %% |\n", n.ID, share)
		idle = max(idle, share)
	}
	b.ReportMetric(idle, "idle-max-pct")
	fmt.Fprintf(&sb, "\nload after: %s\n", loadAvg())
	report(b, fmt.Sprintf("%d CPUs", numCPU()), sb.String())
}

// BenchmarkWakeupIdleScale measures an idle exnd's CPU share with 2 and
// with 32 nodes on one shm fabric (every node in its own namespace), in
// the same run: the liveness cost per peer (docs/wakeup.md).
//
//	go test -run '^$' -bench WakeupIdleScale -benchtime 1x -timeout 15m ./perf/
func BenchmarkWakeupIdleScale(b *testing.B) {
	testenv.RequirePrivileged(b, "ip")
	exnd := nstest.Build(b)
	var sb strings.Builder
	fmt.Fprintf(&sb, "load before: %s\n\n| nodes on the fabric | idle CPU per exnd, mean | max | bar |\n|---|---|---|---|\n", loadAvg())
	for _, size := range []int{2, 32} {
		fab := nstest.ShmFabric(b)
		nodes := make([]*nstest.Node, size)
		for i := range nodes {
			nodes[i] = nstest.StartNode(b, exnd, fab, 12, i+1)
		}
		// Joins settle, and the kernels' IPv6 start-up chatter on exn0
		// (duplicate address detection, router solicitations, MLD
		// reports: multicast to every peer) dies down.
		time.Sleep(12 * time.Second)
		pids := make([]int, size)
		for i, n := range nodes {
			pids[i] = n.Proc.Pid()
		}
		shares, err := idleShares(pids, 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		var sum, worst float64
		for _, s := range shares {
			sum += s
			worst = max(worst, s)
		}
		mean := sum / float64(size)
		fmt.Fprintf(&sb, "| %d | %.3f %% | %.3f %% | < 0.5 %%, and 32 nodes no worse than 2 |\n", size, mean, worst)
		b.ReportMetric(mean, fmt.Sprintf("idle-mean-%dnodes-pct", size))
		for _, n := range nodes {
			if err := n.Stop(10 * time.Second); err != nil {
				b.Fatal(err)
			}
		}
	}
	fmt.Fprintf(&sb, "\nload after: %s\n", loadAvg())
	report(b, fmt.Sprintf("%d CPUs", numCPU()), sb.String())
}

var pingTime = regexp.MustCompile(`time=([0-9.]+) ms`)

// pingRTTs pings ip from ns count times at rate a second and returns the
// round trips in ms; every reply must come back.
func pingRTTs(ns *nstest.Netns, ip string, rate, count int) ([]float64, error) {
	out, err := ns.Run(time.Duration(count/rate+15)*time.Second, "ping", "-n", "-c", strconv.Itoa(count),
		"-i", strconv.FormatFloat(1/float64(rate), 'f', 3, 64), "-W", "2", ip)
	if err != nil {
		return nil, fmt.Errorf("ping %s at %d/s: %w: %s", ip, rate, err, out)
	}
	var rtt []float64
	for _, m := range pingTime.FindAllStringSubmatch(out, -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		rtt = append(rtt, v)
	}
	if len(rtt) != count {
		return nil, fmt.Errorf("ping %s at %d/s: %d of %d replies: %s", ip, rate, len(rtt), count, out)
	}
	return rtt, nil
}

// fabricPings runs the control operation "ping" (what `exnctl ping`
// does) from n to node 2: ten single pings each after a second of quiet
// (cold), then 50 back to back (warm). RTTs in µs.
func fabricPings(n *nstest.Node) (cold, warm []float64, err error) {
	var r struct {
		RTT []float64 `json:"rtt_us"`
	}
	for range 10 {
		time.Sleep(time.Second)
		if err := n.Call(&r, "ping", "2", "1"); err != nil {
			return nil, nil, err
		}
		cold = append(cold, r.RTT...)
	}
	if err := n.Call(&r, "ping", "2", "50"); err != nil {
		return nil, nil, err
	}
	return cold, r.RTT, nil
}

// sockperf64 runs sockperf TCP ping-pong with 64-byte messages for secs
// seconds (server in srv, client in cli) and returns the p50 in µs.
func sockperf64(b *testing.B, srv, cli *nstest.Netns, ip string, secs int) (float64, error) {
	r, err := sockperfEnv(b, shimWay{srv: srv, cli: cli, ip: ip}, secs)
	return r.P50, err
}

// fifoFloor builds and runs perf/testdata/fifo_pingpong.c: count round
// trips between two processes parked in poll(2) on FIFOs, gap apart, and
// returns the p50 in µs.
func fifoFloor(b *testing.B, count int, gap time.Duration) (float64, error) {
	dir := b.TempDir()
	bin := dir + "/fifo_pingpong"
	// perf/bench.sh runs the test binary from the repository root, go test
	// from this package's folder: find the source in the module.
	if err := testenv.CC("-O2", "-Wall", "-Werror", "-o", bin, testenv.ModulePath("perf", "testdata", "fifo_pingpong.c")); err != nil {
		return 0, err
	}
	timeout := time.Duration(count)*gap + 30*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, dir, strconv.Itoa(count), strconv.Itoa(int(gap.Microseconds()))).Output()
	if err != nil {
		return 0, fmt.Errorf("fifo_pingpong: %v", err)
	}
	f := strings.Fields(string(out))
	if len(f) != 2 {
		return 0, fmt.Errorf("fifo_pingpong: %q", out)
	}
	return strconv.ParseFloat(f[0], 64)
}

// idleShare is pid's CPU time over d as a percentage of d.
func idleShare(pid int, d time.Duration) (float64, error) {
	s, err := idleShares([]int{pid}, d)
	if err != nil {
		return 0, err
	}
	return s[0], nil
}

// idleShares is each of pids' CPU time over the same d, as a percentage
// of d.
func idleShares(pids []int, d time.Duration) ([]float64, error) {
	t0 := make([]uint64, len(pids))
	for i, pid := range pids {
		var err error
		if t0[i], err = nstest.CPUNanos(pid); err != nil {
			return nil, err
		}
	}
	w0 := time.Now()
	time.Sleep(d)
	wall := time.Since(w0)
	shares := make([]float64, len(pids))
	for i, pid := range pids {
		t1, err := nstest.CPUNanos(pid)
		if err != nil {
			return nil, err
		}
		shares[i] = float64(t1-t0[i]) / float64(wall.Nanoseconds()) * 100
	}
	return shares, nil
}

// pct is the p-th percentile of v (p = 100: the largest).
func pct(v []float64, p int) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	i := (len(s) - 1) * p / 100
	return s[i]
}

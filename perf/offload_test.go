package perf

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

// BenchmarkOffload measures exn0 with the TAP offloads (issue #20) against
// a build without them and against the kernel's own path, interleaved in
// one run: iperf3 over a veth pair (MTU 1500, the kernel's offloads)
// beside exn0 on shm (1 stream, -P 4, and at MTU 1500), and the net
// fabric's underlay (veth+bridge) beside exn0 on net. Every exn0 figure
// comes with the CPU both exnd used per GB moved (user+system from
// /proc). The "before" exnd is EXN_OFFLOAD_BEFORE (a binary built from an
// older commit; perf/offload.sh builds one from 9fff62a); without it only
// the current build is measured. EXN_PERF_REPS repetitions (default 3),
// EXN_PERF_SECS seconds per iperf3 run (default 4); medians.
//
//	perf/offload.sh [results.md]
func BenchmarkOffload(b *testing.B) {
	testenv.RequirePrivileged(b, "ip", "iperf3")
	d := secs()
	reps := perfReps()
	load0 := loadAvg()
	type build struct{ name, exnd string }
	builds := []build{{"after", nstest.Build(b)}}
	if p := os.Getenv("EXN_OFFLOAD_BEFORE"); p != "" {
		builds = append([]build{{"before", p}}, builds...)
	}

	va, vb := nstest.NewNetns(b, "va"), nstest.NewNetns(b, "vb")
	_, vethB := nstest.Veth(b, va, vb, 9)
	type path struct {
		srv, cli *nstest.Netns
		ip       string
		nodes    []*nstest.Node // exnd processes to charge CPU to
	}
	veth := path{vb, va, vethB, nil}
	type kase struct {
		name  string
		base  path   // the kernel's path
		exn   []path // per build
		extra []string
	}
	var shm, shm1500, net []path
	var underlay path
	for i, bl := range builds {
		fab := nstest.ShmFabric(b)
		sub := 60 + 4*i
		n1 := nstest.StartNode(b, bl.exnd, fab, sub, 1)
		n2 := nstest.StartNode(b, bl.exnd, fab, sub, 2)
		shm = append(shm, path{n2.NS, n1.NS, n2.IP.String(), []*nstest.Node{n1, n2}})
		fab2 := nstest.ShmFabric(b)
		m1 := nstest.StartNode(b, bl.exnd, fab2, sub+1, 1, "--mtu", "1500")
		m2 := nstest.StartNode(b, bl.exnd, fab2, sub+1, 2, "--mtu", "1500")
		shm1500 = append(shm1500, path{m2.NS, m1.NS, m2.IP.String(), []*nstest.Node{m1, m2}})
		c := nstest.StartNetCluster(b, bl.exnd, sub+2, []int{1, 2})
		a, z := c.Nodes[0], c.Nodes[1]
		net = append(net, path{z.NS, a.NS, z.IP.String(), []*nstest.Node{a, z}})
		underlay = path{z.NS, a.NS, nstest.UnderlayIP(sub+2, z.ID).String(), nil}
	}
	cases := []kase{
		{"shm, 1 stream (veth MTU 1500)", veth, shm, nil},
		{"shm, -P 4 (veth MTU 1500)", veth, shm, []string{"-P", "4"}},
		{"shm, exn0 MTU 1500 (veth MTU 1500)", veth, shm1500, nil},
		{"net, 1 stream (its underlay)", underlay, net, nil},
	}
	// Warm up every path (ARP, hellos).
	for _, c := range cases {
		for _, p := range append([]path{c.base}, c.exn...) {
			if _, err := nstest.Ping(p.cli, p.ip, 2, 56, ""); err != nil {
				b.Fatal(err)
			}
		}
	}
	// gbps[case][0 = base, 1.. = builds], cpu likewise (ms per GB).
	gbps := make([][][]float64, len(cases))
	cpu := make([][][]float64, len(cases))
	for ci := range cases {
		gbps[ci] = make([][]float64, 1+len(builds))
		cpu[ci] = make([][]float64, 1+len(builds))
	}
	for r := range reps {
		for ci, c := range cases {
			paths := append([]path{c.base}, c.exn...)
			// Rotate the order so no path always runs first.
			for k := range paths {
				pi := (k + r + ci) % len(paths)
				p := paths[pi]
				t0 := exndTicks(b, p.nodes)
				res, err := nstest.Iperf3(b, p.srv, p.cli, p.ip, d, c.extra...)
				if err != nil {
					b.Fatalf("%s, path %d: %v", c.name, pi, err)
				}
				gbps[ci][pi] = append(gbps[ci][pi], res.BitsPerSecond/1e9)
				if p.nodes != nil && res.Bytes > 0 {
					cpu[ci][pi] = append(cpu[ci][pi], float64(exndTicks(b, p.nodes)-t0)*1000/clockTicks/(res.Bytes/1e9))
				}
			}
		}
	}
	med := func(v []float64) float64 {
		if len(v) == 0 {
			return 0
		}
		s := slices.Clone(v)
		slices.Sort(s)
		return s[len(s)/2]
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "iperf3 -t %d, %d repetitions interleaved, medians; load %s at start, %s at end; %d CPUs\n\n", d, reps, load0, loadAvg(), numCPU())
	fmt.Fprintf(&sb, "| case | kernel path Gbit/s |")
	for _, bl := range builds {
		fmt.Fprintf(&sb, " exn0 %s Gbit/s | ratio | exnd CPU ms/GB |", bl.name)
	}
	sb.WriteString("\n|---|---|")
	for range builds {
		sb.WriteString("---|---|---|")
	}
	sb.WriteString("\n")
	for ci, c := range cases {
		base := med(gbps[ci][0])
		fmt.Fprintf(&sb, "| %s | %.2f |", c.name, base)
		for bi, bl := range builds {
			g, m := med(gbps[ci][1+bi]), med(cpu[ci][1+bi])
			fmt.Fprintf(&sb, " %.2f | %.2fx | %.0f |", g, g/base, m)
			key := strings.NewReplacer(" ", "-", ",", "", "(", "", ")", "").Replace(c.name) + "-" + bl.name
			b.ReportMetric(g/base, key+"-ratio")
			b.ReportMetric(m, key+"-cpu-ms/GB")
		}
		sb.WriteString("\n")
	}
	sb.WriteString("\nPer-run values (Gbit/s; CPU ms/GB):\n\n")
	for ci, c := range cases {
		fmt.Fprintf(&sb, "- %s: kernel %.2f", c.name, gbps[ci][0])
		for bi, bl := range builds {
			fmt.Fprintf(&sb, "; %s %.2f, %.0f", bl.name, gbps[ci][1+bi], cpu[ci][1+bi])
		}
		sb.WriteString("\n")
	}
	report(b, "", sb.String())
}

package perf

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

// Subnets of BenchmarkTAPRelay: the veth (10.78.S), the shm nodes
// (10.77.S, and S+1 at MTU 1500), the net and ofi:tcp underlays
// (10.78.S, 10.77.S); the relays' TAPs take 10.76.S: the one-process
// relays the shm nodes' S and S+1, the two-process relays S+2 and S+3,
// the TCP relays their underlay's S.
const (
	relayVethSubnet = 86
	relayShmSubnet  = 86
	relayNetSubnet  = 90
	relayOFISubnet  = 91
	relayOFIPort    = 7472
	relayTCPPort    = 7921
)

// relayPath is one way between two namespaces: its name, the server's
// and the client's namespace, the server's address, and the exnd
// processes whose CPU it costs (none for a kernel path or a relay).
type relayPath struct {
	name     string
	srv, cli *nstest.Netns
	ip       string
	nodes    []*nstest.Node
}

// relayCase is one block of BenchmarkTAPRelay: the kernel's path (ways[0]),
// exn0 (ways[1]) and the smallest TAP gateways of the same shape, under
// one tool.
type relayCase struct {
	name     string
	sockperf bool     // sockperf 64 B p50 instead of iperf3
	extra    []string // iperf3 arguments
	ways     []relayPath
	bar      string // issue #35's bar on exn0 / kernel path
}

// BenchmarkTAPRelay prices issue #35's throughput bars against the
// smallest user-space TAP gateways of exn0's two shapes
// (perf/testdata/tap_fwd.c), measured interleaved with the kernel's path
// and exn0 in one run:
//
//   - one host: a veth pair (MTU 1500, the kernel's offloads), exn0 on
//     shm between two exnd, and tap_fwd pair: one process holding a TAP
//     in each namespace, copying each frame from one to the other in a
//     blocking thread per direction. That is the two TAP copies any TAP
//     gateway makes and nothing else, so it bounds every design with a
//     TAP on this machine, exnd's included. And tap_fwd shm: two
//     processes, a TAP each, joined by a shared-memory ring per
//     direction with a doorbell: the same two copies and the
//     cross-process wake-up that any design with a gateway per node
//     pays (exnd on shm besides makes the GET's copy). iperf3 1 stream,
//     -P 4, and 1 stream with exn0 and the relays at MTU 1500; sockperf
//     64 B p50.
//   - between hosts: the underlay (veth+bridge), exn0 on net, and
//     tap_fwd over one TCP connection on the underlay (the four copies
//     of exnd on net: TAP read, socket send, socket receive, TAP write).
//     iperf3 1 stream and sockperf. With the ofi build tag the same
//     again on ofi:tcp, over an underlay of its own.
//
// The relays' TAPs take exnd's virtio-net header and offloads, so
// super-frames cross them whole as they cross exn0. Each iperf3 run of
// exn0 comes with both exnd's CPU per GB; every iperf3 run with the whole
// machine's busy share (/proc/stat). EXN_PERF_REPS repetitions (default
// 3), EXN_PERF_SECS seconds per run (default 4); medians. The table
// gives each way against the kernel's path and exn0 against the relay;
// it asserts nothing. perf/tap-relay.sh runs it:
//
//	go test -run '^$' -bench '^BenchmarkTAPRelay$' -benchtime 1x -timeout 30m ./perf/
func BenchmarkTAPRelay(b *testing.B) {
	testenv.RequirePrivileged(b, "ip", "gcc", "iperf3", "sockperf")
	d, reps := secs(), perfReps()
	load0 := loadAvg()
	exnd := nstest.Build(b)
	fwd := b.TempDir() + "/tap_fwd"
	testenv.MustCC(b, "-O2", "-Wall", "-Werror", "-pthread", "-o", fwd, testenv.ModulePath("perf", "testdata", "tap_fwd.c"))

	va, vb := nstest.NewNetns(b, "va"), nstest.NewNetns(b, "vb")
	_, vethB := nstest.Veth(b, va, vb, relayVethSubnet)
	veth := relayPath{"veth", vb, va, vethB, nil}

	fab := nstest.ShmFabric(b)
	n1 := nstest.StartNode(b, exnd, fab, relayShmSubnet, 1)
	n2 := nstest.StartNode(b, exnd, fab, relayShmSubnet, 2)
	fab1500 := nstest.ShmFabric(b)
	m1 := nstest.StartNode(b, exnd, fab1500, relayShmSubnet+1, 1, "--mtu", "1500")
	m2 := nstest.StartNode(b, exnd, fab1500, relayShmSubnet+1, 2, "--mtu", "1500")
	shm := relayPath{"exn0 (exnd on shm)", n2.NS, n1.NS, n2.IP.String(), []*nstest.Node{n1, n2}}
	shm1500 := relayPath{"exn0 (exnd on shm), MTU 1500", m2.NS, m1.NS, m2.IP.String(), []*nstest.Node{m1, m2}}
	one := startTAPRelay(b, fwd, "pair", n1.NS, n2.NS, "tf", relayShmSubnet, 65521)
	one1500 := startTAPRelay(b, fwd, "pair", m1.NS, m2.NS, "tg", relayShmSubnet+1, 1500)
	two := startTAPRelay(b, fwd, "shm", n1.NS, n2.NS, "th", relayShmSubnet+2, 65521)
	two1500 := startTAPRelay(b, fwd, "shm", m1.NS, m2.NS, "ti", relayShmSubnet+3, 1500)

	cases := []relayCase{
		{name: "one host, iperf3 1 stream", ways: []relayPath{veth, shm, one, two}, bar: ">= 0.9x"},
		{name: "one host, iperf3 -P 4", extra: []string{"-P", "4"}, ways: []relayPath{veth, shm, one, two}, bar: ">= 0.65x"},
		{name: "one host, iperf3 1 stream, exn0 and the relays at MTU 1500", ways: []relayPath{veth, shm1500, one1500, two1500}, bar: ">= 0.8x"},
		{name: "one host, sockperf 64 B p50 (µs)", sockperf: true, ways: []relayPath{veth, shm, one, two}, bar: "<= 1.5x"},
	}
	hosts := []struct {
		spec         string
		port, subnet int
	}{{"net", nstest.NetPort, relayNetSubnet}}
	if ofiBuilt {
		hosts = append(hosts, struct {
			spec         string
			port, subnet int
		}{"ofi:tcp", relayOFIPort, relayOFISubnet})
	}
	for _, h := range hosts {
		c := nstest.StartUnderlayCluster(b, exnd, h.spec, h.port, h.subnet, []int{1, 2})
		a, z := c.Nodes[0], c.Nodes[1]
		ulIP := nstest.UnderlayIP(h.subnet, z.ID).String()
		ul := relayPath{"underlay (kernel TCP)", z.NS, a.NS, ulIP, nil}
		ex := relayPath{"exn0 (exnd on " + h.spec + ")", z.NS, a.NS, z.IP.String(), []*nstest.Node{a, z}}
		tcp := startTCPRelay(b, fwd, a.NS, z.NS, "tt", h.subnet, ulIP)
		cases = append(cases,
			relayCase{name: "between hosts, " + h.spec + ", iperf3 1 stream", ways: []relayPath{ul, ex, tcp}, bar: ">= 0.65x"},
			relayCase{name: "between hosts, " + h.spec + ", sockperf 64 B p50 (µs)", sockperf: true, ways: []relayPath{ul, ex, tcp}, bar: "<= 2x"})
	}
	for _, c := range cases {
		for _, p := range c.ways {
			if _, err := nstest.Ping(p.cli, p.ip, 2, 56, ""); err != nil {
				b.Fatalf("%s, %s: warm-up: %v", c.name, p.name, err)
			}
		}
	}

	// val[case][way]; cpu[case][way]: exnd ms per GB; busy[case][way]:
	// the machine's busy share during the run, %.
	val := make([][][]float64, len(cases))
	cpu := make([][][]float64, len(cases))
	busy := make([][][]float64, len(cases))
	for ci, c := range cases {
		val[ci], cpu[ci], busy[ci] = make([][]float64, len(c.ways)), make([][]float64, len(c.ways)), make([][]float64, len(c.ways))
	}
	for r := range reps {
		for ci, c := range cases {
			for k := range c.ways {
				wi := (k + r + ci) % len(c.ways) // no way always first
				p := c.ways[wi]
				if c.sockperf {
					sp, err := nstest.Sockperf(b, p.srv, p.cli, p.ip, d)
					if err != nil {
						b.Fatalf("%s, %s: %v", c.name, p.name, err)
					}
					val[ci][wi] = append(val[ci][wi], sp.P50)
					continue
				}
				t0, s0 := exndTicks(b, p.nodes), machineStat(b)
				res, err := nstest.Iperf3(b, p.srv, p.cli, p.ip, d, c.extra...)
				if err != nil {
					b.Fatalf("%s, %s: %v", c.name, p.name, err)
				}
				s1 := machineStat(b)
				val[ci][wi] = append(val[ci][wi], res.BitsPerSecond/1e9)
				busy[ci][wi] = append(busy[ci][wi], 100*s1.busyShare(s0))
				if p.nodes != nil && res.Bytes > 0 {
					cpu[ci][wi] = append(cpu[ci][wi], float64(exndTicks(b, p.nodes)-t0)*1000/clockTicks/(res.Bytes/1e9))
				}
			}
		}
	}

	var sb strings.Builder
	fmt.Fprintf(&sb, "iperf3 (Gbit/s) and sockperf TCP ping-pong 64 B p50 (µs), %d s per run, medians of %d repetitions (the ways interleaved); %d CPUs; load %s at the start\n\n",
		d, reps, numCPU(), load0)
	sb.WriteString("| case | way | median | per run | / kernel path | exn0 / this way | machine busy | exnd CPU ms/GB | issue #35's bar (exn0 / kernel) |\n|---|---|---|---|---|---|---|---|---|\n")
	for ci, c := range cases {
		k, e := testenv.Median(val[ci][0]), testenv.Median(val[ci][1])
		for wi, p := range c.ways {
			v := testenv.Median(val[ci][wi])
			busyCol, cpuCol, exn0Col, bar := "", "", "", ""
			if !c.sockperf {
				busyCol = fmt.Sprintf("%.0f %%", testenv.Median(busy[ci][wi]))
			}
			if wi == 1 {
				bar = c.bar
				if !c.sockperf {
					cpuCol = fmt.Sprintf("%.0f", testenv.Median(cpu[ci][wi]))
				}
			}
			if wi != 1 {
				exn0Col = fmt.Sprintf("%.2fx", e/v)
			}
			fmt.Fprintf(&sb, "| %s | %s | %.2f | %s | %.2fx | %s | %s | %s | %s |\n",
				c.name, p.name, v, dsJoin(val[ci][wi]), v/k, exn0Col, busyCol, cpuCol, bar)
			if wi > 0 {
				key := strings.NewReplacer(" ", "-", ",", "", "(", "", ")", "", "µ", "u").Replace(c.name + "-" + p.name)
				b.ReportMetric(v/k, key+"-ratio")
			}
		}
	}
	fmt.Fprintf(&sb, "\nload at the end %s\n", loadAvg())
	report(b, "", sb.String())
}

// exndTicks is the CPU ticks (user+system) nodes have used.
func exndTicks(b *testing.B, nodes []*nstest.Node) uint64 {
	b.Helper()
	var sum uint64
	for _, n := range nodes {
		t, err := nstest.CPUTicks(n.Proc.Pid())
		if err != nil {
			b.Fatalf("node %d cpu: %v", n.ID, err)
		}
		sum += t
	}
	return sum
}

// cpuStat is the machine's CPU time from /proc/stat's first line, in
// ticks: all of it, and the idle part (idle and iowait).
type cpuStat struct{ total, idle uint64 }

func machineStat(b *testing.B) cpuStat {
	b.Helper()
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		b.Fatalf("/proc/stat: unexpected first line %q", line)
	}
	var s cpuStat
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			b.Fatalf("/proc/stat: %q: %v", line, err)
		}
		s.total += n
		if i == 3 || i == 4 { // idle, iowait
			s.idle += n
		}
	}
	return s
}

// busyShare is the share of the CPUs busy between s0 and s.
func (s cpuStat) busyShare(s0 cpuStat) float64 {
	t := s.total - s0.total
	if t == 0 {
		return 0
	}
	return 1 - float64(s.idle-s0.idle)/float64(t)
}

// startTAPRelay starts tap_fwd MODE (pair or shm) in ns1 with TAPs
// PFX0 and PFX1, moves PFX1 into ns2, addresses them 10.76.subnet.1 and
// .2 with the given MTU and returns the path from ns1 to ns2 through
// it. The relay stops with the benchmark (the harness kills what it
// started, a shm relay's child with its parent).
func startTAPRelay(b *testing.B, fwd, mode string, ns1, ns2 *nstest.Netns, pfx string, subnet, mtu int) relayPath {
	b.Helper()
	a, z := pfx+"0", pfx+"1"
	p := ns1.Start(b, fwd, mode, a, z)
	waitReady(b, p)
	ns1.MustRun(b, 5*time.Second, "ip", "link", "set", z, "netns", ns2.Name)
	relayAddr(b, ns1, a, subnet, 1, mtu)
	relayAddr(b, ns2, z, subnet, 2, mtu)
	name := "TAP relay, one process (tap_fwd pair)"
	if mode == "shm" {
		name = "TAP relay, two processes over shared memory (tap_fwd shm)"
	}
	if mtu != 65521 {
		name += fmt.Sprintf(", MTU %d", mtu)
	}
	return relayPath{name, ns2, ns1, fmt.Sprintf("10.76.%d.2", subnet), nil}
}

// startTCPRelay starts tap_fwd over TCP: listening in ns2 on ul2, and
// connecting from ns1, each with a TAP named PFX0 addressed 10.76.subnet.1
// (ns1) and .2 (ns2) at exn0's MTU.
func startTCPRelay(b *testing.B, fwd string, ns1, ns2 *nstest.Netns, pfx string, subnet int, ul2 string) relayPath {
	b.Helper()
	tap, port := pfx+"0", strconv.Itoa(relayTCPPort)
	srv := ns2.Start(b, fwd, "listen", tap, ul2, port)
	cli := ns1.Start(b, fwd, "connect", tap, ul2, port)
	waitReady(b, srv)
	waitReady(b, cli)
	relayAddr(b, ns1, tap, subnet, 1, 65521)
	relayAddr(b, ns2, tap, subnet, 2, 65521)
	return relayPath{"TAP relay over one TCP connection (tap_fwd listen/connect)", ns2, ns1, fmt.Sprintf("10.76.%d.2", subnet), nil}
}

// waitReady waits until a tap_fwd prints "ready".
func waitReady(b *testing.B, p *nstest.Proc) {
	b.Helper()
	err := nstest.Eventually(10*time.Second, func() error {
		if strings.Contains(p.Output(), "ready") {
			return nil
		}
		if p.Exited() {
			return fmt.Errorf("tap_fwd exited: %s", p.Output())
		}
		return fmt.Errorf("tap_fwd not ready: %q", p.Output())
	})
	if err != nil {
		b.Fatal(err)
	}
}

// relayAddr gives a relay's TAP dev in ns the address 10.76.subnet.id/24
// and the MTU (0: the TAP's own), and sets it up.
func relayAddr(b *testing.B, ns *nstest.Netns, dev string, subnet, id, mtu int) {
	b.Helper()
	if mtu != 0 {
		ns.MustRun(b, 5*time.Second, "ip", "link", "set", dev, "mtu", strconv.Itoa(mtu))
	}
	ns.MustRun(b, 5*time.Second, "ip", "addr", "add", fmt.Sprintf("10.76.%d.%d/24", subnet, id), "dev", dev)
	ns.MustRun(b, 5*time.Second, "ip", "link", "set", dev, "up")
}

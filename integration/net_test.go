package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric/members"
	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

// netLiveness is the reply of exnd's "liveness" control operation.
type netLiveness struct {
	Up          []int  `json:"up"`
	PeerDown    uint64 `json:"peer_down_total"`
	PeerUp      uint64 `json:"peer_up_total"`
	Invalidated uint64 `json:"neighbors_invalidated_total"`
}

func liveness(t *testing.T, n *nstest.Node) netLiveness {
	t.Helper()
	var l netLiveness
	if err := n.Call(&l, "liveness"); err != nil {
		t.Fatal(err)
	}
	return l
}

// seenDown says why n does not yet see node dead down: its liveness still
// counts it up or has not counted one more peer-down than before, or its
// neighbour table still holds entries learned from it.
func seenDown(t *testing.T, n *nstest.Node, dead int, before netLiveness) error {
	l := liveness(t, n)
	if slices.Contains(l.Up, dead) || l.PeerDown != before.PeerDown+1 {
		return fmt.Errorf("liveness %+v (before %+v)", l, before)
	}
	if ln := learnedNodes(t, n); slices.Contains(ln, dead) {
		return fmt.Errorf("learned entries of nodes %v", ln)
	}
	return nil
}

// learnedNodes returns the nodes with a learned entry in n's neighbour
// table (exnctl neighbors).
func learnedNodes(t *testing.T, n *nstest.Node) []int {
	t.Helper()
	var nb []struct {
		IP     string `json:"ip"`
		Node   int    `json:"node"`
		Source string `json:"source"`
	}
	if err := n.Call(&nb, "neighbors"); err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range nb {
		if e.Source == "learned" && !slices.Contains(out, e.Node) {
			out = append(out, e.Node)
		}
	}
	sort.Ints(out)
	return out
}

// engineStats returns n's EXT-Eth engine counters (exnctl stats).
func engineStats(t *testing.T, n *nstest.Node) map[string]any {
	t.Helper()
	var s struct {
		Engine map[string]any `json:"engine"`
	}
	if err := n.Call(&s, "stats"); err != nil {
		t.Fatal(err)
	}
	return s.Engine
}

func pingAll(t *testing.T, nodes []*nstest.Node, size int) {
	t.Helper()
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				if _, err := nstest.Ping(a.NS, b.IP.String(), 2, size, "a5"); err != nil {
					t.Errorf("node %d -> %d: %v", a.ID, b.ID, err)
				}
			}
		}
	}
}

func pingAll6(t *testing.T, nodes []*nstest.Node) {
	t.Helper()
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				if _, err := nstest.Ping(a.NS, b.IP6.String(), 1, 56, ""); err != nil {
					t.Errorf("node %d -> %d: %v", a.ID, b.ID, err)
				}
			}
		}
	}
}

// TestNetFabric is issue #8 §2: three namespaces joined only by an
// underlay bridge, one exnd each on the net fabric (one TCP connection
// per node pair over the underlay), carrying unmodified ping, iperf3 and
// sockperf over exn0; a SIGKILLed node is seen down by the others'
// liveness within a bounded time while they keep working, and rejoins
// with the same ID without restarting them.
func TestNetFabric(t *testing.T) {
	testenv.RequirePrivileged(t, "ip", "ss", "iperf3", "sockperf", "ping")
	exnd := nstest.Build(t)
	c := nstest.StartNetCluster(t, exnd, 50, []int{1, 2, 3})
	nodes := c.Nodes

	t.Run("link", func(t *testing.T) {
		for _, n := range nodes {
			out := n.NS.MustRun(t, 5*time.Second, "ip", "-o", "link", "show", "exn0")
			mac := fmt.Sprintf("link/ether 2e:87:04:07:00:%02x", n.ID)
			if !strings.Contains(out, mac) || !strings.Contains(out, " mtu 65521 ") {
				t.Errorf("node %d: want %q and mtu 65521 in: %s", n.ID, mac, out)
			}
			var st struct {
				Fabric string `json:"fabric"`
			}
			if err := n.Call(&st, "status"); err != nil || st.Fabric != n.Fabric {
				t.Errorf("node %d: status fabric %q, %v; want %q", n.ID, st.Fabric, err, n.Fabric)
			}
			// The only routes out of the namespace are the underlay and exn0.
			routes := n.NS.MustRun(t, 5*time.Second, "ip", "-4", "route", "show")
			for _, l := range strings.Split(strings.TrimSpace(routes), "\n") {
				if !strings.Contains(l, "dev ul0") && !strings.Contains(l, "dev exn0") {
					t.Errorf("node %d: unexpected route %q", n.ID, l)
				}
			}
		}
	})

	t.Run("ping6", func(t *testing.T) {
		for _, n := range nodes {
			if _, err := n.WaitIPv6(10 * time.Second); err != nil {
				t.Fatalf("node %d: %v", n.ID, err)
			}
		}
		pingAll6(t, nodes)
	})

	t.Run("ping4", func(t *testing.T) {
		pingAll(t, nodes, 56)
		// Eager (20), rendezvous (1000, 60000) both ways on one pair.
		for _, size := range []int{20, 1000, 60000} {
			for _, p := range [][2]int{{0, 2}, {2, 0}} {
				a, b := nodes[p[0]], nodes[p[1]]
				if _, err := nstest.Ping(a.NS, b.IP.String(), 2, size, "c3a55a0f"); err != nil {
					t.Errorf("ping -s %d node %d -> %d: %v", size, a.ID, b.ID, err)
				}
			}
		}
	})

	t.Run("content", func(t *testing.T) {
		transfer(t, nodes[0], nodes[1], 4<<20, 81)
		transfer(t, nodes[2], nodes[0], 4<<20+13, 82)
	})

	t.Run("iperf3", func(t *testing.T) {
		a, b := nodes[0], nodes[1]
		checkTCP(t, a, b)
	})

	t.Run("sockperf", func(t *testing.T) {
		a, b := nodes[1], nodes[2]
		checkSockperf(t, a, b)
	})

	// A silent peer: SIGSTOP freezes node 3's exnd with its TCP
	// connections open (the kernel still ACKs), so only the liveness
	// protocol (swim, the default: docs/membership.md) can tell; SIGCONT
	// brings it back, and the sessions are rebuilt without restarting
	// anything.
	t.Run("freeze", func(t *testing.T) {
		n3 := nodes[2]
		before := [2]netLiveness{liveness(t, nodes[0]), liveness(t, nodes[1])}
		for _, n := range nodes[:2] {
			if !slices.Contains(learnedNodes(t, n), 3) {
				t.Fatalf("node %d: no learned entry of node 3 before the freeze: %v", n.ID, learnedNodes(t, n))
			}
		}
		if err := n3.Proc.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		resumed := false
		resume := func() {
			if !resumed {
				resumed = true
				_ = n3.Proc.Signal(syscall.SIGCONT)
			}
		}
		defer resume()
		// swim's worst case with members.Fabric among three nodes: up to
		// two probe intervals until node 3's turn in the probe order,
		// one more for the direct and indirect probes to time out, then
		// the suspicion timeout at its longest (SuspicionMaxTimeoutMult ·
		// SuspicionMult · ProbeInterval, when the other node's
		// confirmation comes late), plus a 100 ms liveness poll and slack.
		// Typically it takes 1.1–1.3 s; 1.5 s was exceeded once in CI
		// (1.67 s).
		p := members.Fabric
		bound := 3*p.ProbeInterval +
			time.Duration(p.SuspicionMaxTimeoutMult*p.SuspicionMult)*p.ProbeInterval + 250*time.Millisecond
		for i, n := range nodes[:2] {
			err := nstest.Eventually(bound, func() error { return seenDown(t, n, 3, before[i]) })
			if err != nil {
				t.Errorf("node %d: frozen node 3 not seen down within %v: %v", n.ID, bound, err)
			} else {
				t.Logf("node %d saw frozen node 3 down after %v", n.ID, time.Since(stopped).Round(time.Millisecond))
			}
		}
		if d := time.Since(stopped); d < 500*time.Millisecond {
			t.Errorf("node 3 declared dead after %v, before swim's least suspicion timeout could expire", d)
		}
		resume()
		resumedAt := time.Now()
		if err := c.WaitPeers(10*time.Second, nodes...); err != nil {
			t.Fatalf("after SIGCONT: %v", err)
		}
		t.Logf("sessions back %v after SIGCONT", time.Since(resumedAt).Round(time.Millisecond))
		pingAll(t, nodes, 1000)
	})

	// Last, because it takes node 3 down.
	t.Run("kill", func(t *testing.T) { netKill(t, c) })
}

// netKill SIGKILLs node 3's exnd while node 1 streams to it (so node 1
// has rendezvous frames advertised to it), then checks that nodes 1 and 2
// see it down within a bound (a SIGKILL closes its TCP connections, so
// they hear EOF at once; 600 ms of silence is the bound for a host that
// vanishes), that its learned neighbour entries go, that node 1's
// transmit slots come back, that 1 and 2 keep working, and that a new
// exnd with ID 3 rejoins without restarting them.
func netKill(t *testing.T, c *nstest.NetCluster) {
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	// Every table learns entries for the others. The IPv4 addresses are
	// static (the peers file), so the learned entries are IPv6 ones from
	// NDP; the kernels' caches are flushed so that they ask again (the
	// freeze invalidated node 3's entries while the kernels kept theirs).
	for _, n := range c.Nodes {
		n.NS.MustRun(t, 5*time.Second, "ip", "-6", "neigh", "flush", "dev", "exn0")
	}
	pingAll6(t, c.Nodes)
	before := map[*nstest.Node]netLiveness{n1: liveness(t, n1), n2: liveness(t, n2)}
	for _, n := range []*nstest.Node{n1, n2} {
		if !slices.Contains(learnedNodes(t, n), 3) {
			t.Fatalf("node %d: no learned entry of node 3 before the kill: %v", n.ID, learnedNodes(t, n))
		}
	}

	srv, cli := iperfTowards(t, n1, n3)
	if err := n3.Proc.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if err := n3.Proc.Wait(5 * time.Second); err == nil {
		t.Fatalf("node 3 exnd exited cleanly after SIGKILL?")
	}

	// Seen down: liveness counted it, its learned entries are gone.
	const bound = 2 * time.Second
	for _, n := range []*nstest.Node{n1, n2} {
		err := nstest.Eventually(bound, func() error { return seenDown(t, n, 3, before[n]) })
		if err != nil {
			t.Errorf("node %d: node 3 not seen down %v after the kill: %v", n.ID, bound, err)
		} else {
			t.Logf("node %d saw node 3 down within %v", n.ID, time.Since(killed).Round(time.Millisecond))
		}
	}

	// Node 1's rendezvous slots advertised to node 3 came back (the
	// engine's housekeeping), and the frames to it were dropped as
	// peer-down or reclaimed by the advert timeout, not leaked.
	// The engine reclaims an advert to a dead peer after AdvertTimeout
	// (2 s), so the bound is that plus slack.
	if err := nstest.Eventually(5*time.Second, func() error {
		e := engineStats(t, n1)
		if e["tx_slots_in_use"] != float64(0) || e["outstanding_adverts"] != float64(0) {
			return fmt.Errorf("tx_slots_in_use %v, outstanding_adverts %v", e["tx_slots_in_use"], e["outstanding_adverts"])
		}
		return nil
	}); err != nil {
		t.Errorf("node 1: %v", err)
	} else {
		t.Logf("node 1: transmit slots all free %v after the kill", time.Since(killed).Round(time.Millisecond))
	}
	e := engineStats(t, n1)
	drops, _ := e["drops"].(map[string]any)
	t.Logf("node 1 after the kill: drops peer-down %v, advert_timeouts %v, adverts_refused %v",
		drops["peer-down"], e["advert_timeouts"], e["adverts_refused"])
	// Survivors keep working.
	checkSurvivors(t, n1, n2, n3, srv, cli, killed)

	// Rejoin: the same ID, the same peers file, the others untouched.
	pids := []int{n1.Proc.Pid(), n2.Proc.Pid()}
	n3.Start(t)
	if err := c.WaitPeers(10*time.Second, c.Nodes...); err != nil {
		t.Fatalf("rejoin: %v\n%s", err, n3.Proc.Output())
	}
	if _, err := nstest.Ping(n1.NS, n3.IP.String(), 2, 20000, "77"); err != nil {
		t.Errorf("restarted node 3 from 1: %v\n%s", err, n3.Proc.Output())
	}
	if _, err := nstest.Ping(n3.NS, n2.IP.String(), 2, 56, "77"); err != nil {
		t.Errorf("restarted node 3 to 2: %v", err)
	}
	for i, n := range []*nstest.Node{n1, n2} {
		if n.Proc.Pid() != pids[i] || n.Proc.Exited() {
			t.Errorf("node %d was restarted or exited", n.ID)
		}
		if l := liveness(t, n); l.PeerUp < before[n].PeerUp+1 {
			t.Errorf("node %d: rejoin not counted: %+v", n.ID, l)
		}
	}
}

// TestNetPerf is issue #8's performance item: iperf3, one stream, over
// exn0 on the net fabric against iperf3 over the underlay the fabric runs
// on (the same veths and bridge), in one run, medians of 3 runs each. The
// bar is exn0 >= 0.5x the underlay. Timing-sensitive, so it runs only
// with EXN_PERF=1 (EXN_PERF_SECS sets the duration of a run, default 3 s):
//
//	EXN_PERF=1 go test -run TestNetPerf -v ./integration/
func TestNetPerf(t *testing.T) {
	secs := perfSecs(t)
	exnd := nstest.Build(t)
	c := nstest.StartNetCluster(t, exnd, 51, []int{1, 2})
	a, b := c.Nodes[0], c.Nodes[1]
	ul := nstest.UnderlayIP(51, b.ID).String()
	pingAll(t, c.Nodes, 56)
	ways := []struct{ name, ip string }{{"TCP over exn0 (net fabric)", b.IP.String()}, {"TCP over the underlay (veth+bridge)", ul}}
	var res [2][]float64
	// exnd CPU time (both nodes, user+system) per GB over exn0: how much
	// the data path costs, which the load other processes put on the
	// machine moves far less than it moves throughput.
	var cpuPerGB []float64
	exndTicks := func() uint64 {
		var sum uint64
		for _, n := range []*nstest.Node{a, b} {
			tk, err := nstest.CPUTicks(n.Proc.Pid())
			if err != nil {
				t.Fatalf("node %d cpu: %v", n.ID, err)
			}
			sum += tk
		}
		return sum
	}
	// Interleaved, so a load change on the machine hits both alike.
	for run := range 3 {
		for wi, w := range ways {
			if run == 2 && wi == 0 {
				profile(t, secs, a, b)
			}
			t0 := exndTicks()
			r, err := nstest.Iperf3(t, b.NS, a.NS, w.ip, secs)
			if err != nil {
				t.Fatalf("%s: %v", w.name, err)
			}
			res[wi] = append(res[wi], r.BitsPerSecond/1e9)
			if wi == 0 {
				// USER_HZ is 100 on Linux: a tick is 10 ms.
				cpuPerGB = append(cpuPerGB, float64(exndTicks()-t0)*10/(float64(r.Bytes)/1e9))
			}
		}
	}
	med := func(v []float64) float64 { s := slices.Clone(v); slices.Sort(s); return s[len(s)/2] }
	m0, m1 := med(res[0]), med(res[1])
	var sb strings.Builder
	fmt.Fprintf(&sb, "| iperf3 -t %d, 1 stream | runs (Gbit/s) | median |\n|---|---|---:|\n", secs)
	for wi, w := range ways {
		fmt.Fprintf(&sb, "| %s | %.2f | %.2f |\n", w.name, res[wi], med(res[wi]))
	}
	fmt.Fprintf(&sb, "| exn0 / underlay | | %.2fx |\n", m0/m1)
	fmt.Fprintf(&sb, "| exnd CPU per GB over exn0 (ms, both nodes) | %.0f | %.0f |\n", cpuPerGB, med(cpuPerGB))
	t.Logf("%d CPUs\n%s", runtime.NumCPU(), sb.String())
	if out := os.Getenv("EXN_PERF_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(sb.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if m0 < 0.5*m1 {
		t.Errorf("bar: iperf3 over exn0 on net %.2f Gbit/s < 0.5x the underlay's %.2f", m0, m1)
	}
}

// profile, with EXN_PERF_PROFILE=DIR, records `perf record -g` of the
// nodes' exnd processes for secs seconds in the background (started just
// before a run over exn0) into DIR/exnd-<id>.data; `perf report -i` reads
// them. Without it, or without perf, it does nothing.
func profile(t *testing.T, secs int, nodes ...*nstest.Node) {
	dir := os.Getenv("EXN_PERF_PROFILE")
	if dir == "" {
		return
	}
	if _, err := exec.LookPath("perf"); err != nil {
		t.Logf("EXN_PERF_PROFILE: no perf: %v", err)
		return
	}
	for _, n := range append(nodes, nil) {
		// The Proc is "ip netns exec", which execs exnd: same PID. The
		// extra nil is the whole system (-a) into DIR/system.data.
		out, target := filepath.Join(dir, "system.data"), []string{"-a"}
		if n != nil {
			out, target = filepath.Join(dir, fmt.Sprintf("exnd-%d.data", n.ID)), []string{"-p", strconv.Itoa(n.Proc.Pid())}
		}
		args := append(append([]string{"record", "-g", "-q", "-o", out}, target...), "--", "sleep", strconv.Itoa(secs))
		cmd := exec.Command("perf", args...)
		if err := cmd.Start(); err != nil {
			t.Logf("perf record: %v", err)
			continue
		}
		t.Cleanup(func() {
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				t.Logf("perf record: %v -> %s", err, out)
			case <-time.After(time.Duration(secs)*time.Second + 30*time.Second):
				_ = cmd.Process.Kill()
				t.Errorf("perf record %s: still running; killed", out)
			}
		})
	}
}

// netFrozenBound is how long TestNetClusterLiveness gives every peer to
// report a frozen node down: issue #36's bound (3 s) with slack for a
// loaded CI machine (perf/cluster.sh measures the time itself).
const netFrozenBound = 6 * time.Second

// TestNetClusterLiveness (issue #36): four nodes on the net fabric with
// membership liveness (the default, docs/membership.md). A node whose
// exnd is frozen (SIGSTOP: its sockets stay open, so no session ends by
// itself) is reported down by every other node within netFrozenBound,
// node 1's /metrics (scraped over HTTP) counts it, and it is up again
// everywhere once it runs again.
func TestNetClusterLiveness(t *testing.T) {
	testenv.RequirePrivileged(t, "ip")
	const metrics = "127.0.0.1:9464" // each node's own namespace
	c := nstest.StartNetClusterEach(t, nstest.Build(t), 53, []int{1, 2, 3, 4}, func(int) []string { return []string{"--metrics", metrics} })
	frozenSeenDown(t, c, c.Nodes[3], metrics)
}

// frozenSeenDown freezes frozen's exnd (SIGSTOP), checks that every
// other node of c reports it down within netFrozenBound and that node
// 1's /metrics (at metrics in its namespace) counts it, thaws it, and
// waits until every node lists every other again.
func frozenSeenDown(t *testing.T, c *nstest.NetCluster, frozen *nstest.Node, metrics string) {
	t.Helper()
	var others []*nstest.Node
	for _, n := range c.Nodes {
		if n != frozen {
			others = append(others, n)
		}
	}
	if err := frozen.Proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	d, err := nstest.SeenDown(others, frozen.ID, 50*time.Millisecond, netFrozenBound)
	frozen.Proc.Signal(syscall.SIGCONT)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("a frozen node seen down by the %d others in %v", len(others), d.Round(time.Millisecond))
	if v := sample(t, scrape(t, others[0], metrics), "exn_membership_declared_dead_total"); v < 1 {
		t.Errorf("node %d: exn_membership_declared_dead_total %v after the frozen node went down, want >= 1", others[0].ID, v)
	}
	if err := c.WaitPeers(20*time.Second, c.Nodes...); err != nil {
		t.Fatalf("after it ran again: %v", err)
	}
}

//go:build ofi

package integration

import (
	"fmt"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric/ofi"
	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

// ofiPort is where each node's libfabric tcp endpoint listens on the
// underlay (fabric/ofi DefaultPort).
const ofiPort = 7471

// TestOFIFabric runs EXT-Eth over real libfabric: two namespaces joined
// only by an underlay bridge, each running exnd with --fabric ofi:PROV and
// a peers file naming the underlay addresses, on provider tcp and on shm
// (whose addresses are strings: the peers file's "HOST:PORT" becomes the
// name "fi_ns://HOST:PORT" on both sides, fabric/ofi insertPeer; its
// background goroutines park on host bells). It checks exn0, ping both
// ways (a small frame on the eager path and a large one on the
// rendezvous path, RMA GET through fi_read), and unmodified iperf3 over
// exn0. Built only with -tags ofi (make ofi).
func TestOFIFabric(t *testing.T) {
	testenv.RequirePrivileged(t, "ip", "iperf3", "ping")
	exnd := nstest.Build(t)
	for _, tc := range []struct {
		prov   string
		subnet int
	}{{"tcp", 31}, {"shm", 33}} {
		t.Run(tc.prov, func(t *testing.T) { testOFIFabric(t, exnd, "ofi:"+tc.prov, tc.subnet) })
	}
}

func testOFIFabric(t *testing.T, exnd, spec string, subnet int) {
	// What each node's NIC keeps in /dev/shm on ofi:shm (its provider
	// region and host bell), by its address: the NICs remove them when
	// exnd stops (checked at the end); this cleanup, registered before the
	// cluster's (so it runs after exnd was killed), removes them if the
	// test ends early.
	var files []string
	if spec == "ofi:shm" {
		for _, id := range []int{1, 2} {
			name := fmt.Sprintf("fi_ns://%s:%d\x00", nstest.UnderlayIP(subnet, id), ofiPort)
			files = append(files, ofi.HostFiles([]byte(name))...)
		}
	}
	t.Cleanup(func() {
		for _, f := range files {
			os.Remove(f)
		}
	})
	c := nstest.StartUnderlayCluster(t, exnd, spec, ofiPort, subnet, []int{1, 2})
	a, b := c.Nodes[0], c.Nodes[1]
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("%s up: %v", spec, err) // the names above are not what the NICs use
		}
	}

	var st struct {
		Fabric string `json:"fabric"`
	}
	if err := a.Call(&st, "status"); err != nil {
		t.Fatal(err)
	}
	if st.Fabric != spec {
		t.Fatalf("status fabric = %q, want %s", st.Fabric, spec)
	}
	for _, size := range []int{56, 20000} {
		if _, err := nstest.Ping(a.NS, b.IP.String(), 3, size, "a5"); err != nil {
			t.Errorf("ping -s %d 1 -> 2: %v", size, err)
		}
		if _, err := nstest.Ping(b.NS, a.IP.String(), 3, size, "5a"); err != nil {
			t.Errorf("ping -s %d 2 -> 1: %v", size, err)
		}
	}
	r, err := nstest.Iperf3(t, b.NS, a.NS, b.IP.String(), 2)
	if err != nil {
		t.Fatalf("iperf3 over exn0 on %s: %v", spec, err)
	}
	if r.BitsPerSecond <= 0 {
		t.Fatalf("iperf3 moved nothing: %+v", r)
	}
	t.Logf("iperf3 over exn0 on %s: %.2f Gbit/s", spec, r.BitsPerSecond/1e9)
	// Receiver-granted PUT (exn/push.go): tcp places a write before a
	// later send (FI_ORDER_SAW), so the large frames go by push once
	// grants flow; shm does not, so nothing is granted there.
	var pushed, granted, bad float64
	for _, n := range c.Nodes {
		s := engineStats(t, n)
		if s == nil {
			t.Fatal("no engine stats")
		}
		pushed += s["rx_frames"].(map[string]any)["push"].(float64)
		granted += s["grants_sent"].(float64)
		for _, r := range []string{"push-forged", "push-stale", "push-failed", "grant-malformed"} {
			bad += s["drops"].(map[string]any)[r].(float64)
		}
	}
	t.Logf("%s: %.0f frames pushed, %.0f buffers granted", spec, pushed, granted)
	if want := spec == "ofi:tcp"; want != (pushed > 0) || want != (granted > 0) || bad != 0 {
		t.Errorf("%s: %.0f frames pushed, %.0f buffers granted, %.0f push drops; want pushes: %v, no drops", spec, pushed, granted, bad, want)
	}
	for _, n := range c.Nodes {
		if err := n.Stop(10 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range files {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("%s left after exnd stopped", f)
		}
	}
}

// TestOFIvsNetPerf (issue #9) measures EXT-Eth over ofi:tcp against the
// native net fabric on the same machine, in the same run: two two-node
// underlay clusters (ofi:tcp on 10.78.32.0/24, net on 10.78.52.0/24), both
// up for the whole test, and iperf3 with 1 stream for EXN_PERF_SECS
// (default 3) seconds over exn0 of each, and over the ofi cluster's
// underlay (veth+bridge) for reference, interleaved 3 times so a load
// change hits all alike; ping RTT (10 × 56 B over exn0) once per round.
// Medians are logged as a table (and written to EXN_PERF_OUT if set). Set
// EXN_PERF=1; needs root and -tags ofi:
//
//	EXN_PERF=1 go test -tags ofi -run TestOFIvsNetPerf -v ./integration/
func TestOFIvsNetPerf(t *testing.T) {
	secs := perfSecs(t)
	exnd := nstest.Build(t)
	oc := nstest.StartUnderlayCluster(t, exnd, "ofi:tcp", ofiPort, 32, []int{1, 2})
	nc := nstest.StartUnderlayCluster(t, exnd, "net", nstest.NetPort, 52, []int{1, 2})
	pingAll(t, oc.Nodes, 56)
	pingAll(t, nc.Nodes, 56)
	if t.Failed() {
		t.FailNow()
	}
	type way struct {
		name     string
		cli, srv *nstest.Node
		ip       string
		rtt      bool // also ping over it
	}
	ways := []way{
		{"exn0 on ofi:tcp", oc.Nodes[0], oc.Nodes[1], oc.Nodes[1].IP.String(), true},
		{"exn0 on net", nc.Nodes[0], nc.Nodes[1], nc.Nodes[1].IP.String(), true},
		{"underlay (veth+bridge, no exn)", oc.Nodes[0], oc.Nodes[1], nstest.UnderlayIP(32, oc.Nodes[1].ID).String(), false},
	}
	gbps := make([][]float64, len(ways))
	rtts := make([][]float64, len(ways))
	for range 3 {
		for wi, w := range ways {
			r, err := nstest.Iperf3(t, w.srv.NS, w.cli.NS, w.ip, secs)
			if err != nil {
				t.Fatalf("iperf3 over %s: %v", w.name, err)
			}
			gbps[wi] = append(gbps[wi], r.BitsPerSecond/1e9)
			if w.rtt {
				out, err := nstest.Ping(w.cli.NS, w.ip, 10, 56, "")
				if err != nil {
					t.Fatalf("ping over %s: %v", w.name, err)
				}
				avg, ok := pingAvgMs(out)
				if !ok {
					t.Fatalf("ping over %s: no rtt line in %q", w.name, out)
				}
				rtts[wi] = append(rtts[wi], avg)
			}
		}
	}
	med := func(v []float64) float64 { s := slices.Clone(v); slices.Sort(s); return s[len(s)/2] }
	var sb strings.Builder
	fmt.Fprintf(&sb, "| 2 nodes, iperf3 -t %d, 1 stream | runs (Gbit/s) | median Gbit/s | ping RTT avg, median (ms) |\n|---|---|---:|---:|\n", secs)
	for wi, w := range ways {
		rtt := ""
		if w.rtt {
			rtt = fmt.Sprintf("%.3f", med(rtts[wi]))
		}
		fmt.Fprintf(&sb, "| %s | %.2f | %.2f | %s |\n", w.name, gbps[wi], med(gbps[wi]), rtt)
	}
	fmt.Fprintf(&sb, "| ofi:tcp / net | | %.2fx | |\n", med(gbps[0])/med(gbps[1]))
	t.Logf("%d CPUs\n%s", runtime.NumCPU(), sb.String())
	if out := os.Getenv("EXN_PERF_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(sb.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

var pingRTT = regexp.MustCompile(`rtt min/avg/max/mdev = [0-9.]+/([0-9.]+)/`)

// pingAvgMs returns the average RTT in ms from ping's summary line.
func pingAvgMs(out string) (float64, bool) {
	m := pingRTT.FindStringSubmatch(out)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(m[1], 64)
	return v, err == nil
}

// TestOFIClusterLiveness (issue #36, docs/fabric-ofi.md "Membership"):
// three nodes on ofi:tcp with membership (exnd's default). A node whose
// exnd is frozen while idle (SIGSTOP: its provider sockets stay open and
// nobody sends to it, so the backend's own liveness never learns) is
// reported down by both others within netFrozenBound, node 1's /metrics
// counts it, and it is up again everywhere once it runs again.
func TestOFIClusterLiveness(t *testing.T) {
	testenv.RequirePrivileged(t, "ip")
	const metrics = "127.0.0.1:9464"
	c := nstest.StartUnderlayCluster(t, nstest.Build(t), "ofi:tcp", ofiPort, 34, []int{1, 2, 3}, "--metrics", metrics)
	if err := c.WaitPeers(20*time.Second, c.Nodes...); err != nil {
		t.Fatal(err)
	}
	// Membership converges by the joins' push-pull; give it a probe
	// round so both others have node 3 as a member, not just as a peer.
	testenv.Eventually(t, "membership converged", 10*time.Second, func() bool {
		for _, n := range c.Nodes {
			if sample(t, scrape(t, n, metrics), "exn_membership_members") != 3 {
				return false
			}
		}
		return true
	})
	frozenSeenDown(t, c, c.Nodes[2], metrics)
}

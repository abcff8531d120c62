package integration

// Issue #18 in two namespaces on the shm fabric: server shapes that work
// with EXT-DS (a root master whose workers setuid to nobody, pre-fork
// accept on one inherited listener, a master that closes its listener
// while workers serve), the probe/accept disagreements (acceptor without
// the shim, with EXTDS_MODE=off, without access to exnd) whose bytes must
// be those of plain TCP, and exnd restarts. Clients run as nobody. The
// proof that EXT-DS carried the data is exnd's /metrics, scraped over
// HTTP.

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

type safetyCluster struct {
	nodes   [2]*nstest.Node
	net     *nstest.NetCluster // the nodes' net fabric; nil on shm
	metrics [2]string          // http://IP:PORT/metrics, reachable inside the node's namespace
	lib     string
	prog    string
}

// startSafety starts two nodes of one shm fabric with the given
// --control-access. The library, the test program and the control
// sockets live in a directory every user can reach (t.TempDir is
// root-only).
func startSafety(t *testing.T, subnet int, access [2]string) *safetyCluster {
	t.Helper()
	return startSafetyOn(t, "shm", subnet, access)
}

// startSafetyOn is startSafety on fabric "shm" or "net" (an underlay
// between the two nodes: StartNetClusterEach).
func startSafetyOn(t *testing.T, fabric string, subnet int, access [2]string) *safetyCluster {
	t.Helper()
	testenv.RequirePrivileged(t, "ip", "gcc", "curl", "setpriv")
	dir, err := os.MkdirTemp("", "exn-safety-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	c := &safetyCluster{lib: filepath.Join(dir, "libextds.so"), prog: filepath.Join(dir, "forksrv")}
	if err := testenv.CompileShim(c.lib); err != nil {
		t.Fatal(err)
	}
	testenv.MustCC(t, "-O2", "-Wall", "-Werror", "-o", c.prog, testenv.ModulePath("integration", "testdata", "forksrv.c"))
	exnd := nstest.Build(t)
	var args [2][]string
	for i := range args {
		ip := nstest.NodeIP(subnet, i+1).String()
		mport := nstest.PortArg()
		c.metrics[i] = "http://" + ip + ":" + mport + "/metrics"
		// The harness's control socket is overridden (Node.Control
		// follows). Holds for short connections off: these tests count
		// every connection as switched (TestNetperfShimShortHold has
		// holds).
		args[i] = []string{"--control", filepath.Join(dir, fmt.Sprintf("n%d.sock", i+1)),
			"--metrics", ip + ":" + mport, "--control-access", access[i], "--extds-short-hold=0"}
	}
	switch fabric {
	case "shm":
		fab := nstest.ShmFabric(t)
		for i := range c.nodes {
			c.nodes[i] = nstest.StartNode(t, exnd, fab, subnet, i+1, args[i]...)
		}
	case "net":
		c.net = nstest.StartNetClusterEach(t, exnd, subnet, []int{1, 2}, func(id int) []string { return args[id-1] })
		c.nodes = [2]*nstest.Node{c.net.Nodes[0], c.net.Nodes[1]}
	default:
		t.Fatalf("fabric %q", fabric)
	}
	c.fillNeighbours(t)
	return c
}

// restart starts node i's exnd again once the signalled one has exited,
// and refills the neighbour tables.
func (c *safetyCluster) restart(t *testing.T, i int) {
	t.Helper()
	_ = c.nodes[i].Proc.Wait(10 * time.Second)
	c.nodes[i].Start(t)
	if c.net != nil {
		if err := c.net.WaitPeers(15*time.Second, c.nodes[:]...); err != nil {
			t.Fatal(err)
		}
	}
	// The other node's fabric liveness (gateway/liveness.go) declares
	// this one down after a SIGKILL up to about a second later and
	// invalidates its neighbour entries then; let that settle before
	// refilling them (a connect inside that window fails: see the report
	// of issue #18).
	time.Sleep(2 * time.Second)
	c.fillNeighbours(t)
}

func (c *safetyCluster) fillNeighbours(t *testing.T) {
	t.Helper()
	for i := range c.nodes {
		if _, err := nstest.Ping(c.nodes[i].NS, c.nodes[1-i].IP.String(), 1, 56, ""); err != nil {
			t.Fatal(err)
		}
	}
}

// metric sums the samples of name whose labels contain every label
// ("reason=\"no_claim\"") on node i's /metrics, scraped with curl.
func (c *safetyCluster) metric(t *testing.T, i int, name string, labels ...string) float64 {
	t.Helper()
	var out string
	err := nstest.Eventually(10*time.Second, func() error {
		var err error
		out, err = c.nodes[i].NS.Run(5*time.Second, "curl", "-sf", c.metrics[i])
		return err
	})
	if err != nil {
		t.Fatalf("scrape node %d: %v: %s", i+1, err, out)
	}
	sum := 0.0
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name+"{") {
			continue
		}
		ok := true
		for _, lb := range labels {
			ok = ok && strings.Contains(l, lb)
		}
		if f := strings.Fields(l); ok && len(f) == 2 {
			v, _ := strconv.ParseFloat(f[1], 64)
			sum += v
		}
	}
	return sum
}

// counters are the sums over both nodes that the tests compare.
type safetyCounters struct{ switched, fallbacks, extdsRx float64 }

func (c *safetyCluster) counters(t *testing.T) safetyCounters {
	var s safetyCounters
	for i := range c.nodes {
		s.switched += c.metric(t, i, "exn_shim_switched_total")
		s.fallbacks += c.metric(t, i, "exn_shim_fallbacks_total")
		s.extdsRx += c.metric(t, i, "exn_extds_rx_bytes_total")
		s.extdsRx += c.metric(t, i, "exn_shim_direct_bytes_total", "direction=\"in\"") // direct connections
	}
	return s
}

// server starts forksrv on node 2 (as root, shimmed unless env says
// otherwise) and waits for its listener.
func (c *safetyCluster) server(t *testing.T, mode string, workers int, env []string) (*nstest.Proc, string) {
	t.Helper()
	port := nstest.PortArg()
	s := c.nodes[1].NS.StartEnv(t, env, c.prog, "server", c.nodes[1].IP.String(), port, strconv.Itoa(workers), mode)
	if err := c.nodes[1].NS.WaitListening(s, port, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return s, port
}

func (c *safetyCluster) shim(i int, extra ...string) []string {
	// Connect-time switching, as shimCluster.env says why.
	return append([]string{"LD_PRELOAD=" + c.lib, "EXTDS_CONTROL=" + c.nodes[i].Control, "EXTDS_DEBUG=1", "EXTDS_SETUP=" + testSetup()}, extra...)
}

// longClient starts forksrv's client on node 1 (root, shimmed) for one
// request of 1 TiB to port, and returns once node 2 has the connection
// switched (relayed or direct) and it ran for 200 ms more.
func (c *safetyCluster) longClient(t *testing.T, port string) *nstest.Proc {
	t.Helper()
	cli := c.nodes[0].NS.StartEnv(t, c.shim(0), c.prog, "client", c.nodes[1].IP.String(), port, strconv.Itoa(1<<40), "1")
	if err := nstest.Eventually(10*time.Second, func() error {
		if c.metric(t, 1, "exn_shim_active_connections")+c.metric(t, 1, "exn_shim_direct_active_connections") < 1 {
			return fmt.Errorf("no switched connection yet")
		}
		return nil
	}); err != nil {
		t.Fatalf("%v: %s", err, cli.Output())
	}
	time.Sleep(200 * time.Millisecond)
	return cli
}

// client runs forksrv's client on node 1 as nobody under the shim.
func (c *safetyCluster) client(t *testing.T, port string, size, count int) string {
	t.Helper()
	out, err := c.nodes[0].NS.RunEnv(120*time.Second, c.shim(0), "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
		c.prog, "client", c.nodes[1].IP.String(), port, strconv.Itoa(size), strconv.Itoa(count))
	if err != nil || !strings.Contains(out, "ok ") {
		t.Fatalf("client (nobody): %v\n%s\nexnd 1: %s\nexnd 2: %s", err, out, tailStr(c.nodes[0].Proc.Output()), tailStr(c.nodes[1].Proc.Output()))
	}
	return out
}

// TestSafetyForkingServer: a root master listens under the shim and forks
// workers that setuid to nobody and accept on the inherited listener; the
// master closes its copy. Clients run as nobody. Every request succeeds
// and both exnds' /metrics show every connection switched and the bytes
// carried by EXT-DS.
func TestSafetyForkingServer(t *testing.T) {
	c := startSafety(t, 46, [2]string{"all", "all"})
	s, port := c.server(t, "setuid", 3, c.shim(1))
	const size, count = 256 << 10, 20
	b := c.counters(t)
	out := c.client(t, port, size, count)
	a := c.counters(t)
	t.Logf("client: %s\nserver: %s", tailStr(out), tailStr(s.Output()))
	t.Logf("switched %+.0f, fallbacks %+.0f, EXT-DS rx %+.0f bytes", a.switched-b.switched, a.fallbacks-b.fallbacks, a.extdsRx-b.extdsRx)
	if a.switched-b.switched != 2*count || a.fallbacks != b.fallbacks {
		t.Errorf("want all %d connections switched on both ends, no fallback: %+v -> %+v\nserver: %s", count, b, a, s.Output())
	}
	if a.extdsRx-b.extdsRx < size*count {
		t.Errorf("EXT-DS delivered %.0f bytes, want at least %d", a.extdsRx-b.extdsRx, size*count)
	}
}

// TestSafetyDisagreement: a listener registered by a shimmed process is
// accepted by workers that cannot take part: exec'd without the shim,
// with EXTDS_MODE=off, or (otheruid) running under another uid than the
// registrant (nobody registers and passes the listener over SCM_RIGHTS,
// uid 65533 accepts: its shim never learnt of that listener, so it asks
// exnd nothing and the client's claim goes unanswered, no_claim; a
// shim-accept of another uid on a registration is refused as not_owner,
// TestSafetyAttack). The client (shimmed, as nobody) must get exactly
// the bytes of plain TCP, and the fallback is counted with its reason.
func TestSafetyDisagreement(t *testing.T) {
	c := startSafety(t, 47, [2]string{"all", "all"})
	for _, mode := range []string{"exec-plain", "exec-off", "otheruid"} {
		t.Run(mode, func(t *testing.T) {
			_, port := c.server(t, mode, 2, c.shim(1))
			b := c.counters(t)
			nc := c.metric(t, 0, "exn_extds_fallbacks_total")
			c.client(t, port, 64<<10, 5)
			a := c.counters(t)
			if a.switched != b.switched {
				t.Errorf("%s: %.0f connections switched, want none", mode, a.switched-b.switched)
			}
			if d := c.metric(t, 0, "exn_extds_fallbacks_total") - nc; d < 1 {
				t.Errorf("%s: no fallback counted on the client's node", mode)
			}
		})
	}
}

// TestSafetyNoAccess: node 2's control socket is root-only, so the
// workers (nobody) cannot reach exnd: plain TCP, the bytes intact.
func TestSafetyNoAccess(t *testing.T) {
	c := startSafety(t, 48, [2]string{"all", "root"})
	_, port := c.server(t, "setuid", 2, c.shim(1))
	b := c.counters(t)
	c.client(t, port, 64<<10, 5)
	a := c.counters(t)
	if a.switched != b.switched || a.fallbacks <= b.fallbacks {
		t.Errorf("want no switch and a counted fallback: %+v -> %+v", b, a)
	}
}

// TestSafetyRestart: exnd on the server's node is stopped (SIGTERM, then
// SIGKILL) under an open EXT-DS transfer: the client gets an error within
// seconds. Once exnd is back, the next connections to the server that
// kept running are EXT-DS again (the listener came back from exnd's
// state file).
//
// Each signal gets a fresh pair of nodes. Known open issue: a SIGKILL
// restart that follows a SIGTERM restart of the same node made the next
// shimmed connect fail with ECONNREFUSED (an Upgrade error after the
// agreement); not yet explained, see the report of issue #18.
func TestSafetyRestart(t *testing.T) {
	for i, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			c := startSafety(t, 49+i*6, [2]string{"all", "all"})
			_, port := c.server(t, "setuid", 2, c.shim(1))
			c.client(t, port, 64<<10, 3)
			cli := c.longClient(t, port)
			if err := c.nodes[1].Proc.Signal(sig); err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			err := cli.Wait(10 * time.Second)
			t.Logf("client after %v of exnd: exited in %v: %v: %s", sig, time.Since(t0).Round(time.Millisecond), err, strings.TrimSpace(cli.Output()))
			if err == nil || strings.Contains(err.Error(), "still running") {
				t.Fatalf("the open connection did not fail promptly: %v", err)
			}
			c.restart(t, 1)
			b := c.metric(t, 1, "exn_shim_switched_total")
			c.client(t, port, 64<<10, 3)
			if d := c.metric(t, 1, "exn_shim_switched_total") - b; d != 3 {
				t.Errorf("after the restart %.0f of 3 connections to the running server were EXT-DS", d)
			}
		})
	}
}

// TestSafetyRestartBeforeAccept scripts the last probe/accept
// disagreement: exnd on the server's node restarts between the client's
// connect (its probe and claim go to the old exnd) and the server's
// accept (it asks the new one). The client's claim is never answered, so
// it goes on as plain TCP and writes its request; the new exnd, which
// restored the listener from its state file, peeks that request and
// leaves the accepted socket plain. The request must succeed with every
// byte intact, and both fallbacks be counted with their reasons.
func TestSafetyRestartBeforeAccept(t *testing.T) {
	c := startSafety(t, 62, [2]string{"all", "all"})
	gate := filepath.Join(filepath.Dir(c.prog), "gate")
	_, port := c.server(t, "gated", 1, c.shim(1, "FORKSRV_GATE="+gate))
	noClaim := c.metric(t, 0, "exn_shim_fallbacks_total", `reason="no_claim"`)
	cli := c.nodes[0].NS.StartEnv(t, c.shim(0), c.prog, "client", c.nodes[1].IP.String(), port, strconv.Itoa(256<<10), "1")
	if err := nstest.Eventually(10*time.Second, func() error {
		if c.metric(t, 0, "exn_shim_fallbacks_total", `reason="no_claim"`) <= noClaim {
			return fmt.Errorf("the client's connect has not fallen back yet")
		}
		return nil
	}); err != nil {
		t.Fatalf("%v: %s", err, cli.Output())
	}
	if err := c.nodes[1].Proc.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = c.nodes[1].Proc.Wait(10 * time.Second)
	c.nodes[1].Start(t)
	plain := c.metric(t, 1, "exn_shim_fallbacks_total", `reason="plain_client"`)
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cli.Wait(60 * time.Second); err != nil || !strings.Contains(cli.Output(), "ok 1 requests") {
		t.Fatalf("client: %v: %s\nexnd 2: %s", err, cli.Output(), tailStr(c.nodes[1].Proc.Output()))
	}
	if err := nstest.Eventually(10*time.Second, func() error {
		if c.metric(t, 1, "exn_shim_fallbacks_total", `reason="plain_client"`) <= plain {
			return fmt.Errorf("the new exnd counted no plain_client fallback for the accept")
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

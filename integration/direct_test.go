package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

// directChecks are the checks shim/test/directcalls.c runs, in its order;
// every one must print "ok NAME" (docs/shim.md, "On a direct descriptor",
// names them in its test column).
var directChecks = []string{
	"nb-connect", "nb-connect-refused", "rcvtimeo", "sndtimeo", "msg-peek", "msg-waitall", "msg-dontwait",
	"fionread", "half-close", "peer-close", "readv-writev", "msg-iov64", "sendfile", "splice", "full-ring-nb", "names", "dup",
	"fork-child", "fork-both", "fork-rw", "exec-server", "exec-client", "cloexec", "pollin-poll", "pollin-select",
	"pollout-poll", "pollout-select", "pollout-epoll", "epoll-lt", "epoll-et", "epoll-oneshot", "et-bursts",
}

// directLimits are checks allowed to print "limit NAME: why" instead of
// "ok NAME": calls that cannot work in direct mode, documented as limits
// in docs/shim.md. Empty: every call works.
var directLimits = map[string]bool{}

// directRelays is how many connections checks hand to exnd's relay by
// exec, per node: exec-client on node 1, exec-server on node 2; cloexec
// must not add one, nor fork-rw (two processes parked on one side).
func directRelays(checks []string) [2]float64 {
	var r [2]float64
	for _, c := range checks {
		switch c {
		case "exec-client":
			r[0]++
		case "exec-server":
			r[1]++
		}
	}
	return r
}

// directMetrics is the metrics address of both nodes (one namespace each).
const directMetrics = "127.0.0.1:9464"

// directArgs are both nodes' exnd flags for the call table: metrics, and
// holds for short connections off. Every check is a connection of a few
// milliseconds, so four in a row would put the server's port on hold
// and the next ones would be plain TCP (extds/shimsrv/hold.go): the
// table needs every connection direct. (It passed with holds on only
// while a forked child's listener close cost exnd a /proc/net/tcp read,
// 8 ms, that made each connection outlive shortLife.)
var directArgs = []string{"--metrics", directMetrics, "--extds-short-hold=0"}

// reclaimArgs are directArgs with exnd's reclaimer of idle rings every
// 10 ms (docs/direct.md, "Rings that shrink when idle"): it punches the
// rings out between the checks' bursts, and the checks must not notice.
func reclaimArgs() []string { return append(slices.Clone(directArgs), "--extds-reclaim-idle=10ms") }

// buildDirectCalls compiles shim/test/directcalls.c into dir.
func buildDirectCalls(t *testing.T, dir string) string {
	t.Helper()
	prog := filepath.Join(dir, "directcalls")
	testenv.MustCC(t, "-O2", "-Wall", "-Wextra", "-Werror", "-o", prog, testenv.ModulePath("shim", "test", "directcalls.c"))
	return prog
}

type directCount struct{ conns, relays, relaysMetric, directMetric, reclaimsMetric float64 }

func (c *shimCluster) directCounts(t *testing.T, i int) directCount {
	t.Helper()
	out := mustExnctl(t, c.exnctl, c.socks[i], "--json", "stats")
	var s struct {
		Shim struct {
			DirectConns  float64 `json:"direct_conns"`
			DirectRelays float64 `json:"direct_relays"`
		} `json:"shim"`
	}
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("stats: %v: %s", err, out)
	}
	fams := scrape(t, c.nodes[i], directMetrics)
	return directCount{conns: s.Shim.DirectConns, relays: s.Shim.DirectRelays,
		directMetric: sample(t, fams, "exn_shim_direct_total"), relaysMetric: sample(t, fams, "exn_shim_direct_relays_total"),
		reclaimsMetric: sample(t, fams, "exn_shim_direct_ring_reclaims_total")}
}

// TestDirectCalls is issue #14's "everything a TCP socket does keeps
// working" for direct connections: shim/test/directcalls.c runs a check
// per call (fork, exec with and without FD_CLOEXEC, the dup family,
// non-blocking connect, timeouts, MSG_* flags, half-close, vectored I/O,
// sendfile, FIONREAD, addresses, poll/select/epoll readiness in and out),
// both ends under libextds.so on two exnd nodes of one shm fabric, and
// exnd's stats and metrics must show every connection direct and exactly
// the exec'd ones relayed.
func TestDirectCalls(t *testing.T) {
	testenv.RequirePrivileged(t, "ip", "gcc")
	runDirectCalls(t, shmShimCluster(t, nstest.Build(t), 43, reclaimArgs()...))
}

// TestDirectCallsNet is TestDirectCalls across hosts (issue #38,
// docs/direct.md "Across hosts"): the same checks between two exnd nodes
// of a net fabric, where each node keeps its own copy of a connection's
// buffer and exnd's engine joins the copies; every connection must be
// direct on both nodes and exactly the exec'd ones relayed.
func TestDirectCallsNet(t *testing.T) {
	testenv.RequirePrivileged(t, "ip", "gcc")
	runDirectCalls(t, netShimCluster(t, nstest.Build(t), 44, reclaimArgs()...))
}

// runDirectCalls runs shim/test/directcalls.c's checks on c (both nodes
// started with --metrics directMetrics): the server on node 2, the
// client on node 1; it checks every result line and both nodes' direct
// and relay counters.
func runDirectCalls(t *testing.T, c *shimCluster) {
	t.Helper()
	prog := buildDirectCalls(t, t.TempDir())
	ip := c.nodes[1].IP.String()
	port := nstest.PortArg()

	before := [2]directCount{c.directCounts(t, 0), c.directCounts(t, 1)}
	// EXN_DIRECT_CHECKS (space-separated names) runs only those checks,
	// EXN_DIRECT_DEBUG=1 adds EXTDS_DEBUG=1 on both ends: for debugging.
	checks := directChecks
	args := []string{prog, "client", ip, port}
	if s := os.Getenv("EXN_DIRECT_CHECKS"); s != "" {
		checks = strings.Fields(s)
		args = append(args, checks...)
	}
	srvEnv, cliEnv := c.env(1), c.env(0)
	if os.Getenv("EXN_DIRECT_DEBUG") == "1" {
		srvEnv, cliEnv = append(srvEnv, "EXTDS_DEBUG=1"), append(cliEnv, "EXTDS_DEBUG=1")
	}
	srv := c.nodes[1].NS.StartEnv(t, srvEnv, prog, "server", ip, port)
	if err := c.nodes[1].NS.WaitListening(srv, port, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	out, cerr := c.nodes[0].NS.RunEnv(5*time.Minute, cliEnv, args...)
	serr := srv.Wait(90 * time.Second)
	t.Logf("client:\n%s\nserver:\n%s", out, srv.Output())
	if cerr != nil {
		t.Errorf("client: %v", cerr)
	}
	if serr != nil {
		t.Errorf("server: %v", serr)
	}
	for _, l := range strings.Split(srv.Output(), "\n") {
		if strings.HasPrefix(l, "FAIL") {
			t.Errorf("server: %s", l)
		}
	}
	seen := map[string]string{}
	conns := -1
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 2 && f[0] == "ok":
			seen[f[1]] = "ok"
		case len(f) >= 2 && f[0] == "limit":
			name := strings.TrimSuffix(f[1], ":")
			seen[name] = "limit"
			if !directLimits[name] {
				t.Errorf("check %s reported a limit that docs/shim.md does not list: %s", name, l)
			}
		case len(f) >= 1 && f[0] == "FAIL":
			t.Errorf("%s", l)
			if len(f) >= 2 {
				seen[strings.TrimSuffix(f[1], ":")] = "fail"
			}
		case len(f) == 2 && f[0] == "conns":
			conns, _ = strconv.Atoi(f[1])
		}
	}
	for _, name := range checks {
		switch seen[name] {
		case "ok", "fail":
		case "limit":
			t.Logf("check %s: expected limit (docs/shim.md)", name)
		default:
			t.Errorf("check %s: no result line", name)
		}
	}
	if t.Failed() {
		return
	}

	after := [2]directCount{c.directCounts(t, 0), c.directCounts(t, 1)}
	// Each end counts each connection, the final "quit" included; every
	// connection was verified direct by both programs, so the counters
	// must have grown by at least that much on both nodes.
	want := float64(conns + 1)
	relays := directRelays(checks)
	for i := range after {
		d := directCount{conns: after[i].conns - before[i].conns, relays: after[i].relays - before[i].relays,
			directMetric: after[i].directMetric - before[i].directMetric, relaysMetric: after[i].relaysMetric - before[i].relaysMetric}
		t.Logf("node %d: direct connections +%.0f (metric +%.0f), relays +%.0f (metric +%.0f), rings reclaimed +%.0f; client made %d",
			i+1, d.conns, d.directMetric, d.relays, d.relaysMetric, after[i].reclaimsMetric-before[i].reclaimsMetric, conns)
		if conns <= 0 || d.conns < want || d.directMetric < want {
			t.Errorf("node %d: direct connections +%.0f (exn_shim_direct_total +%.0f), want at least %.0f", i+1, d.conns, d.directMetric, want)
		}
		// With every check's, et-bursts' pauses give the reclaimer
		// idle rings on both nodes (the server's sink answers, so its
		// exnd's direction moves too).
		if r := after[i].reclaimsMetric - before[i].reclaimsMetric; slices.Contains(checks, "et-bursts") && r < 1 {
			t.Errorf("node %d: exn_shim_direct_ring_reclaims_total +%.0f, want at least 1 (--extds-reclaim-idle=10ms)", i+1, r)
		}
		if d.relays != relays[i] || d.relaysMetric != relays[i] {
			t.Errorf("node %d: relays +%.0f (exn_shim_direct_relays_total +%.0f), want %.0f (exec without FD_CLOEXEC only)",
				i+1, d.relays, d.relaysMetric, relays[i])
		}
	}
}

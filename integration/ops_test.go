package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"golang.org/x/sys/unix"
)

var exnctlBuilt testenv.Built

// buildExnctl builds cmd/exnctl next to the exnd nstest.Build made (a
// directory the harness removes after the tests) and returns its path.
func buildExnctl(t *testing.T, exnd string) string {
	t.Helper()
	return exnctlBuilt.Path(t, func() (string, error) {
		cmd := exec.Command("go", "build", "-o", filepath.Dir(exnd)+"/", "./cmd/exnctl")
		cmd.Dir = testenv.ModuleRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("go build ./cmd/exnctl: %w\n%s", err, out)
		}
		return filepath.Join(filepath.Dir(exnd), "exnctl"), nil
	})
}

// exnctl runs the real exnctl binary against a control socket (a file,
// reachable from outside the node's network namespace) and returns its
// stdout, stderr and exit code.
func exnctl(t *testing.T, bin, sock string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--control", sock}, args...)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), stderr.String(), 0
	case errors.As(err, &ee):
		return stdout.String(), stderr.String(), ee.ExitCode()
	}
	t.Fatalf("exnctl %q: %v", args, err)
	return "", "", -1
}

// mustExnctl is exnctl that fails t unless it exits 0.
func mustExnctl(t *testing.T, bin, sock string, args ...string) string {
	t.Helper()
	out, errOut, code := exnctl(t, bin, sock, args...)
	if code != 0 {
		t.Fatalf("exnctl %q: exit %d: %s%s", args, code, out, errOut)
	}
	return out
}

// dialInNetns opens a TCP connection from inside network namespace ns:
// it moves a locked OS thread into ns, creates the socket there (a socket
// keeps the namespace it was made in), and moves the thread back. A
// thread that cannot move back stays locked, so the runtime discards it.
func dialInNetns(ns, addr string) (net.Conn, error) {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("own netns: %w", err)
	}
	defer orig.Close()
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("netns %s: %w", ns, err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("enter netns %s: %w", ns, err)
	}
	conn, dialErr := net.DialTimeout("tcp", addr, 5*time.Second)
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		if conn != nil {
			conn.Close()
		}
		return nil, fmt.Errorf("leave netns %s: %w", ns, err) // thread stays locked
	}
	runtime.UnlockOSThread()
	return conn, dialErr
}

// scrape fetches http://addr/metrics inside the node's namespace over
// real HTTP, lints it with promlint and parses it.
func scrape(t *testing.T, n *nstest.Node, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext:       func(_ context.Context, _, a string) (net.Conn, error) { return dialInNetns(n.NS.Name, a) },
		DisableKeepAlives: true,
	}}
	defer client.CloseIdleConnections()
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("node %d: scrape: %v", n.ID, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("node %d: scrape: %s, %v", n.ID, resp.Status, err)
	}
	text := string(body)
	problems, err := promlint.New(strings.NewReader(text)).Lint()
	if err != nil {
		t.Fatalf("node %d: promlint: %v", n.ID, err)
	}
	for _, p := range problems {
		t.Errorf("node %d: promlint: %s: %s", n.ID, p.Metric, p.Text)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("node %d: parse metrics: %v", n.ID, err)
	}
	return fams
}

// sample returns the value of the series of family name whose labels
// include want ("k=v" pairs), failing t if there is none.
func sample(t *testing.T, fams map[string]*dto.MetricFamily, name string, want ...string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("no metric %s", name)
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for _, kv := range want {
			k, v, _ := strings.Cut(kv, "=")
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	t.Fatalf("no series %s%v", name, want)
	return 0
}

// TestOps is issue #7: two exnd nodes in namespaces on an shm fabric with
// --metrics and --control; metrics scraped over HTTP inside each
// namespace, the real exnctl against the control sockets, and
// exnd --check-config.
func TestOps(t *testing.T) {
	testenv.RequirePrivileged(t, "ip", "ping")
	exnd := nstest.Build(t)
	ctl := buildExnctl(t, exnd)
	fab := nstest.ShmFabric(t)
	dir := t.TempDir()
	const metricsAddr = "127.0.0.1:9464" // one per namespace, so no clash
	var nodes []*nstest.Node
	var socks []string
	for id := 1; id <= 2; id++ {
		sock := filepath.Join(dir, fmt.Sprintf("exnd%d.sock", id))
		nodes = append(nodes, nstest.StartNode(t, exnd, fab, 9, id, "--metrics", metricsAddr, "--control", sock))
		socks = append(socks, sock)
	}
	n1, n2 := nodes[0], nodes[1]
	// The control socket is the last thing exnd opens.
	for i, n := range nodes {
		if err := nstest.Eventually(10*time.Second, func() error {
			if _, errOut, code := exnctl(t, ctl, socks[i], "status"); code != 0 {
				return fmt.Errorf("node %d: exnctl status: exit %d: %s", n.ID, code, errOut)
			}
			return nil
		}); err != nil {
			t.Fatalf("%v\nexnd output:\n%s", err, n.Proc.Output())
		}
	}

	before1, before2 := scrape(t, n1, metricsAddr), scrape(t, n2, metricsAddr)

	// Traffic: kernel pings over exn0, small (eager) and large
	// (rendezvous), then a fabric ping through exnctl.
	if _, err := nstest.Ping(n1.NS, n2.IP.String(), 3, 56, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := nstest.Ping(n1.NS, n2.IP.String(), 2, 4000, "a5"); err != nil {
		t.Fatal(err)
	}

	t.Run("ping", func(t *testing.T) {
		out := mustExnctl(t, ctl, socks[0], "ping", "2", "-c", "3")
		for _, re := range []string{`(?m)^received\s+3$`, `(?m)^transmitted\s+3$`, `(?m)^loss_percent\s+0$`, `(?m)^avg_us\s+[0-9.]+$`, `(?m)^rtt_us\s+\[[0-9.]+,[0-9.]+,[0-9.]+\]$`} {
			if !regexp.MustCompile(re).MatchString(out) {
				t.Errorf("exnctl ping output lacks %s:\n%s", re, out)
			}
		}
		var r struct {
			Node        int       `json:"node"`
			Received    int       `json:"received"`
			LossPercent float64   `json:"loss_percent"`
			RTT         []float64 `json:"rtt_us"`
			MinUs       float64   `json:"min_us"`
			MaxUs       float64   `json:"max_us"`
		}
		js := mustExnctl(t, ctl, socks[1], "--json", "ping", "1", "-c", "2")
		if err := json.Unmarshal([]byte(js), &r); err != nil {
			t.Fatalf("exnctl --json ping: %v: %s", err, js)
		}
		if r.Node != 1 || r.Received != 2 || len(r.RTT) != 2 || r.LossPercent != 0 || r.MinUs <= 0 || r.MaxUs < r.MinUs || r.MaxUs > 1e6 {
			t.Errorf("exnctl --json ping: %+v", r)
		}
		t.Logf("fabric ping rtt: %v us", r.RTT)
		// A node that is not on the fabric: a failure, not a hang.
		if out, errOut, code := exnctl(t, ctl, socks[0], "ping", "99", "-c", "1"); code != 1 || !strings.Contains(errOut, "no reply") {
			t.Errorf("ping node 99: exit %d, %s%s", code, out, errOut)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		after1, after2 := scrape(t, n1, metricsAddr), scrape(t, n2, metricsAddr)
		grew := func(name string, b, a map[string]*dto.MetricFamily, node string, labels ...string) {
			t.Helper()
			labels = append(labels, "node="+node)
			if x, y := sample(t, b, name, labels...), sample(t, a, name, labels...); y <= x {
				t.Errorf("%s%v on node %s did not grow: %v -> %v", name, labels, node, x, y)
			}
		}
		grew("exn_eth_frames_total", before1, after1, "1", "direction=tx", "proto=eager")
		grew("exn_eth_bytes_total", before1, after1, "1", "direction=tx", "proto=rendezvous")
		grew("exn_eth_frames_total", before2, after2, "2", "direction=rx", "proto=eager")
		grew("exn_eth_frames_total", before2, after2, "2", "direction=rx", "proto=rendezvous")
		grew("exn_fabric_velo_messages_total", before1, after1, "1", "direction=tx")
		grew("exn_fabric_rma_requests_total", before2, after2, "2", "op=get") // node 2 pulls node 1's large frames
		grew("exn_tap_frames_total", before1, after1, "1", "direction=rx", "ifname=exn0")
		grew("exn_fabric_ping_rtt_seconds", before1, after1, "1")
		if v := sample(t, after1, "exn_fabric_ping_rtt_seconds", "node=1"); v != 3 {
			t.Errorf("node 1 ping histogram count %v, want 3 (from exnctl ping -c 3)", v)
		}
		if v := sample(t, after1, "exn_neighbor_entries", "node=1"); v < 1 {
			t.Errorf("node 1 neighbour entries %v after ARP, want at least 1", v)
		}
		if v := sample(t, after1, "exn_eth_slots_in_use", "node=1", "direction=tx"); v != 0 {
			t.Errorf("node 1 tx slots in use %v when idle", v)
		}
		if sample(t, after1, "process_open_fds") <= 0 || sample(t, after1, "go_goroutines") <= 0 {
			t.Errorf("no go/process metrics")
		}
	})

	t.Run("status", func(t *testing.T) {
		out := mustExnctl(t, ctl, socks[0], "status")
		for _, re := range []string{`(?m)^node\s+1$`, `(?m)^mac\s+2e:87:04:07:00:01$`, `(?m)^ifname\s+exn0$`, `(?m)^mtu\s+65521$`,
			`(?m)^fabric\s+shm:` + fab + `$`, `(?m)^uptime_seconds\s+[0-9.]+$`, `(?m)^metrics\s+127.0.0.1:9464$`} {
			if !regexp.MustCompile(re).MatchString(out) {
				t.Errorf("exnctl status lacks %s:\n%s", re, out)
			}
		}
		var s struct {
			Node    int      `json:"node"`
			Addrs   []string `json:"addrs"`
			Eager   int      `json:"eager_threshold"`
			Control string   `json:"control"`
			Version string   `json:"version"`
		}
		js := mustExnctl(t, ctl, socks[1], "--json", "status")
		if err := json.Unmarshal([]byte(js), &s); err != nil {
			t.Fatalf("%v: %s", err, js)
		}
		if s.Node != 2 || len(s.Addrs) != 2 || s.Addrs[0] != n2.IP.String()+"/24" || s.Eager != 480 || s.Control != socks[1] || s.Version == "" {
			t.Errorf("exnctl --json status: %+v", s)
		}
	})

	t.Run("neighbors", func(t *testing.T) {
		out := mustExnctl(t, ctl, socks[0], "neighbors")
		if !regexp.MustCompile(`(?m)^AGE_SECONDS\s+IP\s+MAC\s+NODE\s+SOURCE$`).MatchString(out) ||
			!regexp.MustCompile(`(?m)\s`+regexp.QuoteMeta(n2.IP.String())+`\s+2e:87:04:07:00:02\s+2\s+learned$`).MatchString(out) {
			t.Errorf("exnctl neighbors on node 1 does not show node 2 learned:\n%s", out)
		}
		var ns []struct {
			IP   string `json:"ip"`
			Node int    `json:"node"`
		}
		js := mustExnctl(t, ctl, socks[1], "--json", "neighbors")
		if err := json.Unmarshal([]byte(js), &ns); err != nil {
			t.Fatalf("%v: %s", err, js)
		}
		found := false
		for _, e := range ns {
			found = found || (e.IP == n1.IP.String() && e.Node == 1)
		}
		if !found {
			t.Errorf("node 2 neighbours lack node 1 (%s): %s", n1.IP, js)
		}
	})

	t.Run("stats", func(t *testing.T) {
		out := mustExnctl(t, ctl, socks[0], "stats")
		for _, re := range []string{`(?m)^engine\.tx_frames\.eager\s+[1-9][0-9]*$`, `(?m)^engine\.drops\.foreign-mac\s+\d+$`,
			`(?m)^fabric\.velo_sent\s+[1-9]`, `(?m)^tap\.rx_frames\s+[1-9]`, `(?m)^arp\.entries\s+[1-9]`} {
			if !regexp.MustCompile(re).MatchString(out) {
				t.Errorf("exnctl stats lacks %s:\n%s", re, out)
			}
		}
		var s struct {
			Engine struct {
				RxFrames map[string]uint64 `json:"rx_frames"`
			} `json:"engine"`
			Fabric map[string]uint64 `json:"fabric"`
		}
		js := mustExnctl(t, ctl, socks[1], "--json", "stats")
		if err := json.Unmarshal([]byte(js), &s); err != nil {
			t.Fatalf("%v: %s", err, js)
		}
		if s.Engine.RxFrames["rendezvous"] < 2 || s.Fabric["rma_get"] < 2 {
			t.Errorf("node 2 stats after two large pings: %s", js)
		}
	})

	t.Run("conns", func(t *testing.T) {
		if out := mustExnctl(t, ctl, socks[0], "conns"); strings.TrimSpace(out) != "(none)" {
			t.Errorf("exnctl conns = %q, want (none)", out)
		}
		if out := mustExnctl(t, ctl, socks[0], "--json", "conns"); strings.TrimSpace(out) != "[]" {
			t.Errorf("exnctl --json conns = %q, want []", out)
		}
	})

	t.Run("errors", func(t *testing.T) {
		if _, errOut, code := exnctl(t, ctl, filepath.Join(dir, "nope.sock"), "status"); code != 1 || !strings.Contains(errOut, "is exnd running?") {
			t.Errorf("exnctl against no exnd: exit %d: %s", code, errOut)
		}
		if _, errOut, code := exnctl(t, ctl, socks[0], "ping", "x"); code != 2 || !strings.Contains(errOut, `node "x"`) {
			t.Errorf("exnctl ping x: exit %d: %s", code, errOut)
		}
	})

	t.Run("check-config", func(t *testing.T) {
		peersFile := filepath.Join(dir, "peers")
		if err := os.WriteFile(peersFile, []byte("1 host1 10.77.9.1\n2 host2 10.77.9.2\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		good := filepath.Join(dir, "good.conf")
		if err := os.WriteFile(good, []byte("# node 1\nnode-id = 1\nfabric = shm:checkonly\naddr = 10.77.9.1/24\n"+
			"peers = "+peersFile+"\nmetrics = 127.0.0.1:9464\ncontrol = "+filepath.Join(dir, "never.sock")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		bad := filepath.Join(dir, "bad.conf")
		if err := os.WriteFile(bad, []byte("node-id = 1\nfabric = shm:checkonly\nmtu = 99999\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, code := runExnd(t, exnd, "--check-config", "--config", good); code != 0 || !strings.Contains(out, "configuration OK: node 1") {
			t.Errorf("good config: exit %d: %s", code, out)
		}
		// Nothing was started: no socket, no shm fabric.
		if _, err := os.Stat(filepath.Join(dir, "never.sock")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("--check-config created the control socket: %v", err)
		}
		if fs := nstest.ShmFiles("checkonly"); len(fs) != 0 {
			t.Errorf("--check-config created shm files %v", fs)
		}
		if out, code := runExnd(t, exnd, "--check-config", "--config", bad); code != 2 || !strings.Contains(out, bad+":3: mtu 99999") {
			t.Errorf("bad config: exit %d: %s", code, out)
		}
	})

	// SIGTERM: exnd exits 0 and removes its control socket.
	if err := n1.Stop(10 * time.Second); err != nil {
		t.Fatalf("node 1 stop: %v\n%s", err, n1.Proc.Output())
	}
	if _, err := os.Stat(socks[0]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("control socket %s left after SIGTERM: %v", socks[0], err)
	}
}

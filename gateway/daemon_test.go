package gateway

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/backend"
	"github.com/exn-project/exn/fabric/mem"
	"github.com/exn-project/exn/internal/testenv"
	"github.com/exn-project/exn/tap/taptest"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// testNode is a daemon on a mem fabric with an in-memory TAP: no root.
type testNode struct {
	d   *Daemon
	dev *taptest.Device
	cfg Config
}

func memConfig(t *testing.T, id fabric.NodeID) Config {
	return Config{
		Node: id, Fabric: backend.Spec{Kind: backend.Mem}, Ifname: "exnt", MTU: DefaultMTU,
		EagerThreshold: DefaultEagerThreshold, Metrics: "127.0.0.1:0",
		Control: filepath.Join(t.TempDir(), "exnd.sock"),
	}
}

func startNode(t *testing.T, c *mem.Cluster, cfg Config, opts ...Option) *testNode {
	t.Helper()
	dev := taptest.New(cfg.Ifname, cfg.MTU)
	d, err := Start(cfg, slog.New(slog.DiscardHandler), append([]Option{WithDevice(dev), WithMemCluster(c)}, opts...)...)
	if err != nil {
		t.Fatalf("start node %d: %v", cfg.Node, err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("close node %d: %v", cfg.Node, err)
		}
	})
	return &testNode{d: d, dev: dev, cfg: cfg}
}

func dial(t *testing.T, path string) *control.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := control.Dial(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func call(t *testing.T, c *control.Client, out any, op string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Call(ctx, out, op, args...); err != nil {
		t.Fatalf("%s %v: %v", op, args, err)
	}
}

// garp is a gratuitous ARP request from mac for ip, as a kernel sends
// when an address comes up.
func garp(mac net.HardwareAddr, ip [4]byte) []byte {
	f := make([]byte, 42)
	copy(f[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:12], mac)
	binary.BigEndian.PutUint16(f[12:], 0x0806)
	a := f[14:]
	binary.BigEndian.PutUint16(a[0:], 1)      // Ethernet
	binary.BigEndian.PutUint16(a[2:], 0x0800) // IPv4
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:], 1) // request
	copy(a[8:14], mac)
	copy(a[14:18], ip[:])
	copy(a[24:28], ip[:])
	return f
}

func scrapeMetrics(t *testing.T, addr string) string {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s, %v", resp.Status, err)
	}
	problems, err := promlint.New(strings.NewReader(string(b))).Lint()
	if err != nil {
		t.Fatalf("promlint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	return string(b)
}

func TestDaemonOps(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	core := withParts() // the core daemon alone; parts have their own tests
	c := mem.NewCluster()
	n1 := startNode(t, c, memConfig(t, 1), core)
	n2 := startNode(t, c, memConfig(t, 2), core)
	c1, c2 := dial(t, n1.cfg.Control), dial(t, n2.cfg.Control)

	t.Run("status", func(t *testing.T) {
		var s Status
		call(t, c1, &s, "status")
		if s.Node != 1 || s.MAC != "2e:87:04:07:00:01" || s.Fabric != "mem" || s.Ifname != "exnt" || s.MTU != DefaultMTU ||
			s.EagerThreshold != DefaultEagerThreshold || s.UptimeSeconds < 0 || s.Version == "" || s.PID != os.Getpid() ||
			s.Control != n1.cfg.Control || s.Metrics != n1.d.MetricsAddr() || s.Metrics == "" {
			t.Fatalf("status %+v", s)
		}
		if err := c1.Call(context.Background(), nil, "status", "extra"); err == nil || !strings.Contains(err.Error(), "takes no arguments") {
			t.Fatalf("status extra: %v", err)
		}
	})

	t.Run("ping", func(t *testing.T) {
		var r PingReply
		call(t, c1, &r, "ping", "2", "3")
		if r.Node != 2 || r.Transmitted != 3 || r.Received != 3 || r.LossPercent != 0 || len(r.RTTMicros) != 3 ||
			r.MinMicros <= 0 || r.MinMicros > r.AvgMicros || r.AvgMicros > r.MaxMicros || r.LastError != "" {
			t.Fatalf("ping reply %+v", r)
		}
		for _, rtt := range r.RTTMicros {
			if rtt < r.MinMicros || rtt > r.MaxMicros {
				t.Fatalf("rtt %v outside [min, max] in %+v", rtt, r)
			}
		}
		// Default count is 1.
		call(t, c2, &r, "ping", "1")
		if r.Transmitted != 1 || r.Received != 1 {
			t.Fatalf("ping 1: %+v", r)
		}
	})

	t.Run("ping errors", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			want string
		}{
			{nil, "want NODE [COUNT]"},
			{[]string{"x"}, `node "x": want 0-65535`},
			{[]string{"65536"}, `node "65536"`},
			{[]string{"2", "0"}, `count "0": want 1-10000`},
			{[]string{"2", "10001"}, `count "10001"`},
			{[]string{"2", "3", "4"}, "want NODE [COUNT]"},
			{[]string{"9", "2"}, "ping node 9: no reply to 2 pings"}, // not on the fabric
		} {
			err := c1.Call(context.Background(), nil, "ping", tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ping %q: %v; want %q", tc.args, err, tc.want)
			}
		}
	})

	// The host of node 1 announces 10.77.0.1: a broadcast that crosses
	// the fabric to node 2, whose neighbour table learns it.
	if err := n1.dev.Inject(garp(n1.d.MAC(), [4]byte{10, 77, 0, 1})); err != nil {
		t.Fatal(err)
	}
	select {
	case f := <-n2.dev.Written():
		if len(f) != 42 {
			t.Fatalf("node 2 got a %d-byte frame, want the 42-byte ARP", len(f))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the ARP broadcast never reached node 2")
	}

	t.Run("neighbors", func(t *testing.T) {
		var ns []Neighbor
		call(t, c2, &ns, "neighbors")
		if len(ns) != 1 || ns[0].IP != "10.77.0.1" || ns[0].MAC != "2e:87:04:07:00:01" || ns[0].Node != 1 ||
			ns[0].Source != "learned" || ns[0].AgeSeconds < 0 {
			t.Fatalf("neighbors %+v", ns)
		}
	})

	t.Run("stats", func(t *testing.T) {
		var s1, s2 struct {
			Fabric map[string]uint64 `json:"fabric"`
			Engine struct {
				TxFrames map[string]uint64 `json:"tx_frames"`
				RxFrames map[string]uint64 `json:"rx_frames"`
				Drops    map[string]uint64 `json:"drops"`
				Pending  *int64            `json:"pending_gets"`
			} `json:"engine"`
			TAP   map[string]uint64 `json:"tap"`
			ARP   map[string]int64  `json:"arp"`
			EXTDS json.RawMessage   `json:"extds"`
		}
		call(t, c1, &s1, "stats")
		call(t, c2, &s2, "stats")
		if s1.Engine.TxFrames["multicast"] != 1 || s2.Engine.RxFrames["multicast"] != 1 || s1.TAP["rx_frames"] != 1 ||
			s2.TAP["tx_frames"] != 1 || s2.ARP["learned"] != 1 || s2.ARP["entries"] != 1 || s1.Engine.Pending == nil {
			t.Fatalf("stats: node 1 %+v, node 2 %+v", s1, s2)
		}
		// Ping traffic (VPID 1) shows in the fabric counters: 3+1 pings
		// and pongs each way, plus the broadcast.
		if s1.Fabric["velo_sent"] < 4 || s2.Fabric["velo_recv"] < 4 {
			t.Fatalf("fabric: node 1 %v, node 2 %v", s1.Fabric, s2.Fabric)
		}
		if _, ok := s1.Engine.Drops["foreign-mac"]; !ok || len(s1.Engine.Drops) == 0 {
			t.Fatalf("drops by name: %v", s1.Engine.Drops)
		}
		if s1.EXTDS != nil {
			t.Fatalf("extds stats without an EXT-DS part: %s", s1.EXTDS)
		}
	})

	t.Run("conns", func(t *testing.T) {
		var raw json.RawMessage
		call(t, c1, &raw, "conns")
		if string(raw) != "[]" {
			t.Fatalf("conns = %s, want []", raw)
		}
	})

	t.Run("unknown op", func(t *testing.T) {
		if err := c1.Call(context.Background(), nil, "reboot"); err == nil || !strings.Contains(err.Error(), "unknown operation") {
			t.Fatalf("reboot: %v", err)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		m1, m2 := scrapeMetrics(t, n1.d.MetricsAddr()), scrapeMetrics(t, n2.d.MetricsAddr())
		for _, want := range []string{
			`exn_eth_frames_total{direction="tx",node="1",proto="multicast"} 1`,
			`exn_eth_drops_total{node="1",reason="foreign-mac"} 0`,
			`exn_eth_slots_in_use{direction="tx",node="1"} 0`,
			`exn_tap_frames_total{direction="rx",ifname="exnt",node="1"} 1`,
			`exn_fabric_ping_rtt_seconds_count{node="1"} 3`,
			`exn_neighbor_entries{node="1"} `,
			`go_goroutines `,
			`process_open_fds `,
		} {
			if !strings.Contains(m1, want) {
				t.Errorf("node 1 metrics lack %q", want)
			}
		}
		for _, want := range []string{
			`exn_eth_frames_total{direction="rx",node="2",proto="multicast"} 1`,
			`exn_neighbor_entries{node="2"} 1`,
			`exn_neighbor_learned_total{node="2"} 1`,
			`exn_fabric_ping_rtt_seconds_count{node="2"} 1`,
		} {
			if !strings.Contains(m2, want) {
				t.Errorf("node 2 metrics lack %q", want)
			}
		}
		if strings.Contains(m1, "exn_extds_") {
			t.Errorf("EXT-DS metrics without an EXT-DS part")
		}
	})

	// Close removes the control socket and stops the metrics server.
	ctl, maddr := n1.cfg.Control, n1.d.MetricsAddr()
	if err := n1.d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ctl); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("control socket still there after Close: %v", err)
	}
	if conn, err := net.DialTimeout("tcp", maddr, time.Second); err == nil {
		conn.Close()
		t.Errorf("metrics still served at %s after Close", maddr)
	}
	// A client connected before Close sees its connection end.
	if err := c1.Call(context.Background(), nil, "status"); err == nil {
		t.Errorf("status after Close succeeded")
	}
}

// TestStartFailsCleanly: a control socket another exnd serves, or a
// metrics address in use, fails Start with the setting named, and
// leaves nothing behind.
func TestStartFailsCleanly(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	c := mem.NewCluster()
	n1 := startNode(t, c, memConfig(t, 1))

	cfg := memConfig(t, 2)
	cfg.Control = n1.cfg.Control
	_, err := Start(cfg, slog.New(slog.DiscardHandler), WithDevice(taptest.New("exnt", 0)), WithMemCluster(c))
	if err == nil || !strings.Contains(err.Error(), "--control") || !strings.Contains(err.Error(), "another exnd") {
		t.Fatalf("second exnd on one control socket: %v", err)
	}

	cfg = memConfig(t, 2)
	cfg.Metrics = n1.d.MetricsAddr()
	cfg.where = map[string]string{"metrics": "exnd.conf:4: metrics"}
	_, err = Start(cfg, slog.New(slog.DiscardHandler), WithDevice(taptest.New("exnt", 0)), WithMemCluster(c))
	if err == nil || !strings.Contains(err.Error(), "exnd.conf:4: metrics") || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("metrics address in use: %v", err)
	}
	if _, err := os.Stat(cfg.Control); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("failed Start left its control socket: %v", err)
	}
	// Node 2 can start now: the failed attempts released node ID 2.
	startNode(t, c, memConfig(t, 2))

	// The first node still answers.
	var s Status
	call(t, dial(t, n1.cfg.Control), &s, "status")
	if s.Node != 1 {
		t.Fatalf("status %+v", s)
	}
}

// TestDefaultControlBusy: a second node on the default control path (not
// chosen by flag or file) runs without a control socket rather than
// failing, and the first keeps serving it.
func TestDefaultControlBusy(t *testing.T) {
	c := mem.NewCluster()
	cfg1 := memConfig(t, 1)
	startNode(t, c, cfg1)
	cfg2 := memConfig(t, 2)
	cfg2.Control, cfg2.controlIsDefault = cfg1.Control, true
	n2 := startNode(t, c, cfg2)
	if n2.d.ctl != nil {
		t.Fatal("second node serves the busy default control socket")
	}
	var s Status
	call(t, dial(t, cfg1.Control), &s, "status")
	if s.Node != 1 {
		t.Fatalf("status %+v", s)
	}
}

func TestParseControlIsDefault(t *testing.T) {
	f := writeFile(t, "c.conf", "node-id = 1\nfabric = mem\ncontrol = /tmp/x.sock\n")
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"--node-id", "1", "--fabric", "mem"}, true},
		{[]string{"--node-id", "1", "--fabric", "mem", "--control", "/run/exn/exnd.sock"}, false},
		{[]string{"--config", f}, false},
	} {
		c, err := Parse(tc.args, io.Discard)
		if err != nil || c.controlIsDefault != tc.want {
			t.Errorf("Parse(%q): controlIsDefault %v, %v; want %v", tc.args, c.controlIsDefault, err, tc.want)
		}
	}
}

// TestControlAndMetricsOff: empty --control and --metrics start neither.
func TestControlAndMetricsOff(t *testing.T) {
	cfg := memConfig(t, 1)
	cfg.Control, cfg.Metrics = "", ""
	n := startNode(t, mem.NewCluster(), cfg)
	if n.d.MetricsAddr() != "" || n.d.ctl != nil {
		t.Fatalf("metrics %q, control %v", n.d.MetricsAddr(), n.d.ctl)
	}
}

func TestSnakeName(t *testing.T) {
	for in, want := range map[string]string{
		"VELOSent": "velo_sent", "VELOSentBytes": "velo_sent_bytes", "RMAPut": "rma_put", "RxFrames": "rx_frames",
		"ConnsEXTDS": "conns_extds", "TxZCopyBytes": "tx_z_copy_bytes", "Entries": "entries", "NotifyErrPeerDown": "notify_err_peer_down",
		"TxSlotsInUse": "tx_slots_in_use",
	} {
		if got := snakeName(in); got != want {
			t.Errorf("snakeName(%q) = %q, want %q", in, got, want)
		}
	}
}

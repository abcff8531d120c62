package gateway

import (
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/exn-project/exn/fabric/backend"
)

func TestParseGood(t *testing.T) {
	c, err := Parse([]string{"--node-id", "3", "--fabric", "shm:t1", "--addr", "10.77.0.3/24,fd77::3/64",
		"--addr", "10.78.0.3/16", "--mtu", "9000", "--eager-threshold", "240", "--ifname", "exnx", "--log-level", "debug"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.77.0.3/24"), netip.MustParsePrefix("fd77::3/64"), netip.MustParsePrefix("10.78.0.3/16")}
	if len(c.Addrs) != len(want) {
		t.Fatalf("addrs %v, want %v", c.Addrs, want)
	}
	for i := range want {
		if c.Addrs[i] != want[i] {
			t.Fatalf("addrs %v, want %v", c.Addrs, want)
		}
	}
	if c.Node != 3 || c.Fabric != (backend.Spec{Kind: backend.SHM, Arg: "t1"}) || c.MTU != 9000 ||
		c.EagerThreshold != 240 || c.Ifname != "exnx" || c.LogLevel != slog.LevelDebug || c.Metrics != "" {
		t.Fatalf("config %+v", c)
	}
}

func TestParseMetricsControl(t *testing.T) {
	for _, m := range []string{"127.0.0.1:9464", ":0", "[::1]:9464", "localhost:1"} {
		c, err := Parse([]string{"--node-id", "1", "--fabric", "mem", "--metrics", m, "--control", "/tmp/a.sock"}, io.Discard)
		if err != nil {
			t.Fatalf("--metrics %s: %v", m, err)
		}
		if c.Metrics != m || c.Control != "/tmp/a.sock" {
			t.Fatalf("metrics %q control %q", c.Metrics, c.Control)
		}
	}
	// An empty --control turns the socket off.
	if c, err := Parse([]string{"--node-id", "1", "--fabric", "mem", "--control", ""}, io.Discard); err != nil || c.Control != "" {
		t.Fatalf("--control '': %+v, %v", c, err)
	}
}

func TestParseDefaults(t *testing.T) {
	c, err := Parse([]string{"--node-id=0x102", "--fabric=shm:x"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Node != 0x102 || c.MTU != 65521 || c.EagerThreshold != 480 || c.Ifname != "exn0" ||
		c.Control != "/run/exn/exnd.sock" || c.LogLevel != slog.LevelInfo || len(c.Addrs) != 0 ||
		c.Metrics != "" || c.CheckOnly || c.File != "" || !c.Push || c.GOMAXPROCS != 0 {
		t.Fatalf("defaults %+v", c)
	}
}

// TestProcs: --gomaxprocs wins, then the environment, then one fewer Ps
// than the default on ofi and net (at least one), and the default on shm
// and mem.
func TestProcs(t *testing.T) {
	for _, tc := range []struct {
		fabric string
		flag   int
		env    string
		def    int
		want   int
	}{
		{"ofi:tcp", 0, "", 2, 1},
		{"ofi:tcp", 0, "", 8, 7},
		{"ofi:shm", 0, "", 1, 1},
		{"ofi:tcp", 0, "2", 2, 0},
		{"ofi:tcp", 3, "2", 2, 3},
		{"shm:x", 0, "", 2, 0},
		{"net:127.0.0.1:7000", 0, "", 4, 3},
		{"net:127.0.0.1:7000", 0, "", 2, 1},
		{"net:127.0.0.1:7000", 0, "", 1, 1},
		{"net:127.0.0.1:7000", 0, "3", 2, 0},
		{"mem", 0, "", 4, 0},
		{"shm:x", 2, "", 4, 2},
	} {
		args := []string{"--node-id", "1", "--fabric", tc.fabric, "--peers", "/dev/null", "--gomaxprocs", strconv.Itoa(tc.flag)}
		c, err := Parse(args, io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if got := c.Procs(tc.env, tc.def); got != tc.want {
			t.Errorf("%s --gomaxprocs %d, GOMAXPROCS=%q, default %d: %d Ps, want %d", tc.fabric, tc.flag, tc.env, tc.def, got, tc.want)
		}
	}
}

func TestParseBad(t *testing.T) {
	base := []string{"--node-id", "1", "--fabric", "shm:x"}
	tests := []struct {
		name string
		args []string
		want string // substring naming the flag
		is   error
	}{
		{"no node", []string{"--fabric", "shm:x"}, "--node-id is required", ErrUsage},
		{"node range", []string{"--node-id", "65536", "--fabric", "shm:x"}, "--node-id \"65536\"", ErrUsage},
		{"node text", []string{"--node-id", "one", "--fabric", "shm:x"}, "--node-id \"one\"", ErrUsage},
		{"no fabric", []string{"--node-id", "1"}, "--fabric is required", ErrUsage},
		{"bad fabric", []string{"--node-id", "1", "--fabric", "tcp:x"}, "--fabric", ErrUsage},
		{"net without peers", []string{"--node-id", "1", "--fabric", "net:127.0.0.1:7000"}, "--fabric net:127.0.0.1:7000: the net backend needs --peers", ErrUsage},
		{"shm no name", []string{"--node-id", "1", "--fabric", "shm"}, "--fabric", ErrUsage},
		{"bad addr", append(base, "--addr", "10.0.0.1"), "addr", ErrUsage},
		{"bad addr in list", append(base, "--addr", "10.0.0.1/24,bogus"), "addr", ErrUsage},
		{"mtu low", append(base, "--mtu", "10"), "--mtu 10", ErrUsage},
		{"mtu high", append(base, "--mtu", "65536"), "--mtu 65536", ErrUsage},
		{"v6 small mtu", append(base, "--mtu", "1000", "--addr", "fd00::1/64"), "--addr fd00::1/64", ErrUsage},
		{"eager", append(base, "--eager-threshold", "70000"), "--eager-threshold 70000", ErrUsage},
		{"ifname long", append(base, "--ifname", "abcdefghijklmnopq"), "--ifname", ErrUsage},
		{"ifname slash", append(base, "--ifname", "a/b"), "--ifname", ErrUsage},
		{"log level", append(base, "--log-level", "loud"), "--log-level", ErrUsage},
		{"unknown flag", append(base, "--bogus"), "bogus", ErrUsage},
		{"positional", append(base, "extra"), "unexpected argument", ErrUsage},
		{"netstack without addr", append(base, "--netstack"), "--addr is required with --netstack", ErrUsage},
		{"metrics no port", append(base, "--metrics", "127.0.0.1"), "--metrics \"127.0.0.1\"", ErrUsage},
		{"metrics bad port", append(base, "--metrics", "127.0.0.1:http"), "--metrics", ErrUsage},
		{"metrics port range", append(base, "--metrics", ":70000"), "--metrics", ErrUsage},
		{"metrics bad host", append(base, "--metrics", "exn.example:9464"), "--metrics", ErrUsage},
		{"control too long", append(base, "--control", "/tmp/"+strings.Repeat("x", 200)), "--control", ErrUsage},
		{"eager above frame", append(base, "--mtu", "1500", "--eager-threshold", "1515"), "--eager-threshold 1515: want 14-1514", ErrUsage},
		{"no config file", append(base, "--config", "/nonexistent/exnd.conf"), "--config", ErrUsage},
		{"gomaxprocs negative", append(base, "--gomaxprocs", "-1"), "--gomaxprocs -1", ErrUsage},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.args, io.Discard)
			if err == nil {
				t.Fatalf("Parse(%q) succeeded", tc.args)
			}
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse(%q) = %q; want %v containing %q", tc.args, err, tc.is, tc.want)
			}
		})
	}
}

func TestMainExitCodes(t *testing.T) {
	var out strings.Builder
	if code := Main([]string{"--node-id", "1"}, &out); code != 2 || !strings.Contains(out.String(), "exnd: usage: --fabric is required") {
		t.Fatalf("exit %d, stderr %q", code, out.String())
	}
	out.Reset()
	// ofi needs the ofi build tag, which tests are not built with.
	if code := Main([]string{"--node-id", "1", "--fabric", "ofi:tcp", "--control", ""}, &out); code != 1 || !strings.Contains(out.String(), "-tags ofi") {
		t.Fatalf("exit %d, stderr %q", code, out.String())
	}
	out.Reset()
	if code := Main([]string{"-h"}, &out); code != 0 || !strings.Contains(out.String(), "-eager-threshold") {
		t.Fatalf("exit %d, stderr %q", code, out.String())
	}
}

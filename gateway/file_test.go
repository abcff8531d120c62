package gateway

import (
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/exn-project/exn/fabric/backend"
)

// writeFile writes text to a fresh file in a per-test directory.
func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const goodConf = `# exnd test configuration
node-id = 7
fabric  = shm:conf1   # trailing comment
addr = 10.77.0.7/24
addr = fd77::7/64,10.78.0.7/16

mtu=9000
eager-threshold = 240
ifname = exnc
metrics = 127.0.0.1:9464
control = /tmp/exnc.sock
log-level = warn
`

func TestConfigFile(t *testing.T) {
	f := writeFile(t, "exnd.conf", goodConf)
	c, err := Parse([]string{"--config", f}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	wantAddrs := []netip.Prefix{netip.MustParsePrefix("10.77.0.7/24"), netip.MustParsePrefix("fd77::7/64"), netip.MustParsePrefix("10.78.0.7/16")}
	if c.Node != 7 || c.Fabric != (backend.Spec{Kind: backend.SHM, Arg: "conf1"}) || c.MTU != 9000 || c.EagerThreshold != 240 ||
		c.Ifname != "exnc" || c.Metrics != "127.0.0.1:9464" || c.Control != "/tmp/exnc.sock" || c.LogLevel != slog.LevelWarn ||
		c.File != f || len(c.Addrs) != 3 {
		t.Fatalf("config %+v", c)
	}
	for i := range wantAddrs {
		if c.Addrs[i] != wantAddrs[i] {
			t.Fatalf("addrs %v, want %v", c.Addrs, wantAddrs)
		}
	}
}

func TestConfigFileCommandLineOverrides(t *testing.T) {
	f := writeFile(t, "exnd.conf", goodConf)
	c, err := Parse([]string{"--config", f, "--mtu", "1500", "--addr", "10.9.9.9/8", "--node-id", "9", "--metrics", ""}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// The command line wins, even for a repeatable setting (no merge) and
	// an empty value; the rest comes from the file.
	if c.MTU != 1500 || c.Node != 9 || len(c.Addrs) != 1 || c.Addrs[0] != netip.MustParsePrefix("10.9.9.9/8") ||
		c.Metrics != "" || c.EagerThreshold != 240 || c.Ifname != "exnc" {
		t.Fatalf("config %+v", c)
	}
	// A command-line value that is bad is named as a flag, not as the file.
	_, err = Parse([]string{"--config", f, "--mtu", "10"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--mtu 10") || strings.Contains(err.Error(), f) {
		t.Fatalf("bad --mtu over a file: %v", err)
	}
}

func TestConfigFileBad(t *testing.T) {
	base := "node-id = 1\nfabric = shm:x\n"
	tests := []struct {
		name, text string
		want       string // substring; FILE stands for the file's path
		is         error
	}{
		{"unknown setting", base + "mtus = 9000\n", `FILE:3: unknown setting "mtus"`, ErrUsage},
		{"dashes", base + "--mtu = 9000\n", `FILE:3: unknown setting "--mtu"`, ErrUsage},
		{"no equals", base + "mtu 9000\n", `FILE:3: want 'name = value'`, ErrUsage},
		{"no name", base + "= 9000\n", `FILE:3: want 'name = value'`, ErrUsage},
		{"not a number", base + "mtu = big\n", `FILE:3: mtu = "big"`, ErrUsage},
		{"mtu range", base + "# c\n\nmtu = 10\n", `FILE:5: mtu 10: want 68-65521`, ErrUsage},
		{"duplicate", base + "mtu = 9000\nmtu = 1500\n", `FILE:4: mtu given again (first on line 3)`, ErrUsage},
		{"duplicate node", base + "node-id = 2\n", `FILE:3: node-id given again (first on line 1)`, ErrUsage},
		{"bad addr", base + "addr = 10.0.0.1/24\naddr = 10.0.0.300/24\n", `FILE:4: addr = "10.0.0.300/24"`, ErrUsage},
		{"v6 small mtu", base + "mtu = 1000\naddr = 10.0.0.1/24\naddr = fd00::1/64\n", `FILE:5: addr fd00::1/64: IPv6 needs an MTU of at least 1280`, ErrUsage},
		{"eager above frame", base + "mtu = 1500\neager-threshold = 2000\n", `FILE:4: eager-threshold 2000: want 14-1514`, ErrUsage},
		{"bad fabric", "node-id = 1\nfabric = tcp:x\n", `FILE:2: fabric "tcp:x"`, ErrUsage},
		{"bad node", "node-id = 70000\nfabric = mem\n", `FILE:1: node-id "70000": want an integer 0-65535`, ErrUsage},
		{"no node", "fabric = mem\n", `--node-id is required (flag, or setting in FILE)`, ErrUsage},
		{"no fabric", "node-id = 3\n", `--fabric is required (flag, or setting in FILE)`, ErrUsage},
		{"bad metrics", base + "metrics = 9464\n", `FILE:3: metrics "9464": want HOST:PORT`, ErrUsage},
		{"bad log level", base + "log-level = chatty\n", `FILE:3: log-level "chatty"`, ErrUsage},
		{"bad bool", base + "netstack = maybe\n", `FILE:3: netstack = "maybe"`, ErrUsage},
		{"bad ifname", base + "ifname = a b\n", `FILE:3: ifname "a b"`, ErrUsage},
		{"config in config", base + "config = /etc/other.conf\n", `FILE:3: unknown setting "config"`, ErrUsage},
		{"check in config", base + "check-config = true\n", `FILE:3: unknown setting "check-config"`, ErrUsage},
		{"long line", base + "# " + strings.Repeat("x", MaxConfigLine) + "\n", `FILE:3: line longer than`, ErrUsage},
		{"netstack without addr", base + "netstack = true\n", "--addr is required with --netstack", ErrUsage},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := writeFile(t, "exnd.conf", tc.text)
			_, err := Parse([]string{"--config", f}, io.Discard)
			want := strings.ReplaceAll(tc.want, "FILE", f)
			if err == nil || !errors.Is(err, tc.is) || !strings.Contains(err.Error(), want) {
				t.Fatalf("Parse = %v; want %v containing %q", err, tc.is, want)
			}
		})
	}
}

func TestCheckPeers(t *testing.T) {
	good := writeFile(t, "peers", "# peers\n1 host1 10.77.0.1\n2 host2:7000 10.77.0.2\n")
	bad := writeFile(t, "peers.bad", "1 host1 10.77.0.1\n2 host2 10.77.0.1\n")
	c, err := Parse([]string{"--node-id", "1", "--fabric", "mem", "--peers", good}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := Check(c)
	if err != nil || len(ps) != 2 {
		t.Fatalf("Check = %v, %v", ps, err)
	}
	c.Peers = bad
	if _, err := Check(c); err == nil || !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "--peers") ||
		!strings.Contains(err.Error(), "duplicate ip") {
		t.Fatalf("bad peers: %v", err)
	}
	// From a file, the error names the file line of the peers setting.
	conf := writeFile(t, "exnd.conf", "node-id = 1\nfabric = mem\npeers = "+bad+"\n")
	if c, err = Parse([]string{"--config", conf}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if _, err := Check(c); err == nil || !strings.Contains(err.Error(), conf+":3: peers") {
		t.Fatalf("bad peers from file: %v", err)
	}
	c.Peers = filepath.Join(t.TempDir(), "missing")
	if _, err := Check(c); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("missing peers: %v", err)
	}
}

func TestCheckConfigExitCodes(t *testing.T) {
	peersFile := writeFile(t, "peers", "1 h1 10.77.0.1\n7 h7 10.77.0.7\n")
	good := writeFile(t, "good.conf", goodConf+"peers = "+peersFile+"\n")
	badPeers := writeFile(t, "badpeers.conf", goodConf+"peers = "+writeFile(t, "p", "x y\n")+"\n")
	bad := writeFile(t, "bad.conf", "node-id = 1\nfabric = mem\nmtu = 99999\n")
	ns := writeFile(t, "ns.conf", "node-id = 1\nfabric = mem\nnetstack = true\n")
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"good", []string{"--check-config", "--config", good}, 0, "configuration OK: node 7, fabric shm:conf1"},
		{"flags only", []string{"--check-config", "--node-id", "3", "--fabric", "mem"}, 0, "configuration OK: node 3"},
		{"bad value", []string{"--check-config", "--config", bad}, 2, bad + ":3: mtu 99999"},
		{"bad peers", []string{"--check-config", "--config", badPeers}, 2, "peers"},
		{"bad flag", []string{"--check-config", "--config", good, "--mtu", "1"}, 2, "--mtu 1:"},
		{"netstack without addr", []string{"--check-config", "--config", ns}, 2, "--addr is required with --netstack"},
		{"missing file", []string{"--check-config", "--config", good + ".nope"}, 2, "no such file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			if code := Main(tc.args, &out); code != tc.code || !strings.Contains(out.String(), tc.want) {
				t.Fatalf("exit %d, output %q; want %d and %q", code, out.String(), tc.code, tc.want)
			}
		})
	}
}

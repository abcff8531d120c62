package peers_test

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/peers"
)

func TestParseValid(t *testing.T) {
	in := `# exn peers
0 10.0.0.1:7000 192.168.50.1
1   host-b.example.org:7000   fd00::2   # trailing comment

65535 [fe80::1]:9 
7 node7
8 fe80::8%eth0
9 10.0.0.9
`
	got, err := peers.Parse(strings.NewReader(in))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	want := []peers.Peer{
		{Node: 0, Addr: "10.0.0.1:7000", IP: netip.MustParseAddr("192.168.50.1")},
		{Node: 1, Addr: "host-b.example.org:7000", IP: netip.MustParseAddr("fd00::2")},
		{Node: 65535, Addr: "[fe80::1]:9"},
		{Node: 7, Addr: "node7"},
		{Node: 8, Addr: "fe80::8%eth0"},
		{Node: 9, Addr: "10.0.0.9"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Parse:\n got %+v\nwant %+v", got, want)
	}
}

func TestParseEmpty(t *testing.T) {
	for _, in := range []string{"", "\n\n", "# only a comment\n   \n\t# another\n"} {
		got, err := peers.Parse(strings.NewReader(in))
		if err != nil || len(got) != 0 {
			t.Errorf("Parse(%q) = %v, %v; want no peers, nil", in, got, err)
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		line  int
		field string
		msg   string
	}{
		{"node range", "70000 a", 1, "node", "out of range"},
		{"node negative", "-1 a", 1, "node", "not a decimal"},
		{"node hex", "0x10 a", 1, "node", "not a decimal"},
		{"missing address", "\n\n5", 3, "address", "missing"},
		{"extra field", "1 a 10.0.0.1 junk", 1, "line", "extra field"},
		{"bad ip", "1 a 10.0.0.256", 1, "ip", "not an IP"},
		{"multicast ip", "1 a 224.0.0.1", 1, "ip", "unicast"},
		{"unspecified ip", "1 a ::", 1, "ip", "unicast"},
		{"zone ip", "1 a fe80::1%eth0", 1, "ip", "zone"},
		{"mapped ip", "1 a ::ffff:10.0.0.1", 1, "ip", "ipv4-mapped"},
		{"bad port", "1 a:99999", 1, "address", "port"},
		{"zero port", "1 a:0", 1, "address", "port"},
		{"empty port", "1 a:", 1, "address", "port"},
		{"empty host", "1 :80", 1, "address", "length"},
		{"bad host char", "1 a/b", 1, "address", "bad character"},
		{"brackets v4", "1 [10.0.0.1]:80", 1, "address", "ipv6"},
		{"unbracketed v6 port", "1 fe80::1::80", 1, "address", ""},
		{"dup node", "1 a\n2 b\n1 c", 3, "node", "line 1"},
		{"dup ip", "1 a 10.0.0.1\n2 b 10.0.0.1", 2, "ip", "line 1"},
		{"long line", "1 a\n" + strings.Repeat("x", peers.MaxLineLen+1), 2, "line", "longer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := peers.Parse(strings.NewReader(tt.in))
			if err == nil {
				t.Fatalf("Parse(%q): no error", tt.in)
			}
			if !errors.Is(err, peers.ErrSyntax) {
				t.Errorf("error %v does not wrap ErrSyntax", err)
			}
			pe, ok := errors.AsType[*peers.ParseError](err)
			if !ok {
				t.Fatalf("error %v (%T) is not a *ParseError", err, err)
			}
			if pe.Line != tt.line || pe.Field != tt.field {
				t.Errorf("error %q: line %d field %q; want line %d field %q", err, pe.Line, pe.Field, tt.line, tt.field)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not mention %q", err, tt.msg)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "peers")
	if err := os.WriteFile(good, []byte("3 h:1 10.1.1.3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ps, err := peers.Load(good)
	if err != nil || len(ps) != 1 || ps[0].Node != fabric.NodeID(3) {
		t.Fatalf("Load = %v, %v", ps, err)
	}

	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("# x\n3 h:1 nope\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = peers.Load(bad)
	if err == nil || !strings.Contains(err.Error(), bad+": line 2: ip") {
		t.Fatalf("Load(bad) error = %v; want path, line and field", err)
	}

	_, err = peers.Load(filepath.Join(dir, "missing"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Load(missing) error = %v; want ErrNotExist", err)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"0 10.0.0.1:7000 192.168.50.1\n",
		"1 host:1 fd00::1 # c\n\n65535 [::1]:2\n",
		"70000 a\n", "1 a b c\n", "1 [fe80::1%x]:5\n", "#\n\t\n1 a\n1 b\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		ps, err := peers.Parse(strings.NewReader(in))
		if err != nil {
			if !errors.Is(err, peers.ErrSyntax) {
				t.Fatalf("error %v does not wrap ErrSyntax", err)
			}
			if _, ok := errors.AsType[*peers.ParseError](err); !ok {
				t.Fatalf("error %T is not a *ParseError", err)
			}
			return
		}
		seen := map[fabric.NodeID]bool{}
		for _, p := range ps {
			if seen[p.Node] {
				t.Fatalf("duplicate node %d accepted", p.Node)
			}
			seen[p.Node] = true
			if p.Addr == "" || strings.ContainsAny(p.Addr, " \t#") {
				t.Fatalf("bad addr %q accepted", p.Addr)
			}
			if p.IP.IsValid() && (p.IP.IsMulticast() || p.IP.IsUnspecified()) {
				t.Fatalf("non-unicast ip %v accepted", p.IP)
			}
		}
	})
}

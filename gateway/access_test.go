package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/proxy"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/backend"
	"github.com/exn-project/exn/fabric/mem"
	"github.com/exn-project/exn/internal/testenv"
)

func TestParseNetstack(t *testing.T) {
	base := []string{"--node-id", "1", "--fabric", "mem", "--netstack", "--control", ""}
	c, err := Parse(append(base, "--addr", "10.88.0.1/24,fd88::1/64", "--socks", "127.0.0.1:1080",
		"--forward", "127.0.0.1:5201=10.88.0.2:5201", "--forward", "[::1]:5202=[fd88::2]:5201",
		"--expose", "8080=127.0.0.1:80", "--expose", "22=localhost:22"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := NetstackConfig{
		Socks: "127.0.0.1:1080",
		Forwards: []Forward{
			{Local: "127.0.0.1:5201", Remote: netip.MustParseAddrPort("10.88.0.2:5201")},
			{Local: "[::1]:5202", Remote: netip.MustParseAddrPort("[fd88::2]:5201")},
		},
		Exposes: []Expose{{Port: 8080, Local: "127.0.0.1:80"}, {Port: 22, Local: "localhost:22"}},
	}
	if fmt.Sprint(c.NS) != fmt.Sprint(want) || !c.Netstack {
		t.Fatalf("NS = %+v, want %+v", c.NS, want)
	}

	// The same settings from a configuration file, forward and expose
	// repeated.
	file := filepath.Join(t.TempDir(), "exnd.conf")
	if err := os.WriteFile(file, []byte("node-id = 1\nfabric = mem\nnetstack = true\naddr = 10.88.0.1/24\n"+
		"socks = 127.0.0.1:1080\nforward = 127.0.0.1:1=10.88.0.2:1\nforward = 127.0.0.1:2=10.88.0.2:2\n"+
		"expose = 80=127.0.0.1:80\nexpose = 81=127.0.0.1:81\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fc, err := Parse([]string{"--config", file, "--control", ""}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(fc.NS.Forwards) != 2 || len(fc.NS.Exposes) != 2 || fc.NS.Socks != "127.0.0.1:1080" {
		t.Fatalf("from file: %+v", fc.NS)
	}

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no addr", base, "--addr is required with --netstack"},
		{"v6 only", append(base, "--addr", "fd88::1/64"), "--addr is required"},
		{"two v4", append(base, "--addr", "10.88.0.1/24,10.88.0.2/24"), "one IPv4 and at most one IPv6"},
		{"small mtu", append(base, "--addr", "10.88.0.1/24", "--mtu", "576"), "--mtu 576: --netstack needs at least 1280"},
		{"socks without netstack", []string{"--node-id", "1", "--fabric", "mem", "--socks", "127.0.0.1:1080"}, "--socks needs --netstack"},
		{"forward without netstack", []string{"--node-id", "1", "--fabric", "mem", "--forward", "a=b"}, "--forward needs --netstack"},
		{"socks bad", append(base, "--addr", "10.88.0.1/24", "--socks", "1080"), `--socks "1080"`},
		{"socks host", append(base, "--addr", "10.88.0.1/24", "--socks", "proxy.example:1080"), "want an IP address or localhost"},
		{"forward no =", append(base, "--addr", "10.88.0.1/24", "--forward", "127.0.0.1:1"), "want LOCAL=REMOTE"},
		{"forward remote name", append(base, "--addr", "10.88.0.1/24", "--forward", "127.0.0.1:1=node2:80"), `remote "node2:80"`},
		{"forward remote port 0", append(base, "--addr", "10.88.0.1/24", "--forward", "127.0.0.1:1=10.88.0.2:0"), "want IP:PORT"},
		{"forward dup", append(base, "--addr", "10.88.0.1/24", "--socks", "127.0.0.1:1", "--forward", "127.0.0.1:1=10.88.0.2:1"), "already used by --socks"},
		{"expose port", append(base, "--addr", "10.88.0.1/24", "--expose", "0=127.0.0.1:80"), "want 1-65535"},
		{"expose local port 0", append(base, "--addr", "10.88.0.1/24", "--expose", "80=127.0.0.1:0"), "not 0"},
		{"expose twice", append(base, "--addr", "10.88.0.1/24", "--expose", "80=127.0.0.1:80", "--expose", "80=127.0.0.1:81"), "exposed twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.args, io.Discard)
			if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse(%q) = %v; want usage error containing %q", tc.args, err, tc.want)
			}
		})
	}
}

// nsNode is a --netstack daemon on a mem fabric.
type nsNode struct {
	d  *Daemon
	st NetstackStatus
}

func startNetstack(t *testing.T, c *mem.Cluster, id fabric.NodeID, ns NetstackConfig) *nsNode {
	t.Helper()
	cfg := Config{
		Node: id, Fabric: backend.Spec{Kind: backend.Mem}, Ifname: "exnt", MTU: DefaultMTU,
		EagerThreshold: DefaultEagerThreshold, Netstack: true, NS: ns,
		Control: filepath.Join(t.TempDir(), "exnd.sock"),
		Addrs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 88, 0, byte(id)}), 24),
			netip.MustParsePrefix(fmt.Sprintf("fd88::%x/64", id))},
	}
	d, err := Start(cfg, slog.New(slog.DiscardHandler), WithMemCluster(c))
	if err != nil {
		t.Fatalf("start node %d: %v", id, err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("close node %d: %v", id, err)
		}
	})
	n := &nsNode{d: d}
	n.st = n.status(t)
	return n
}

func (n *nsNode) status(t *testing.T) NetstackStatus {
	t.Helper()
	v, err := n.d.extraHandlers["netstack"](context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return v.(NetstackStatus)
}

// shaServer is a local TCP server: per connection it reads to EOF and
// answers with the SHA-256 of what it read, then closes.
func shaServer(t *testing.T) string {
	t.Helper()
	return testenv.ServeTCP(t, func(c net.Conn) {
		h := sha256.New()
		if _, err := io.Copy(h, c); err == nil {
			c.Write(h.Sum(nil))
		}
	})
}

// dialRoundTrip connects with dial and runs roundTrip on the connection.
func dialRoundTrip(t *testing.T, dial func() (net.Conn, error), size int, seed uint64) {
	t.Helper()
	c, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip(t, c, size, seed)
}

// roundTrip sends size random bytes on c, half-closes, and checks the
// SHA-256 the server answers.
func roundTrip(t *testing.T, c net.Conn, size int, seed uint64) {
	t.Helper()
	cw, ok := c.(interface{ CloseWrite() error })
	if !ok {
		cw = lastTCP.Load() // a SOCKS conn: half-close its TCP conn
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	h := sha256.New()
	src := io.LimitReader(rand.NewChaCha8([32]byte{byte(seed)}), int64(size))
	errc := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.MultiWriter(c, h), src)
		if err == nil {
			err = cw.CloseWrite()
		}
		errc <- err
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("send: %v", err)
	}
	if !bytes.Equal(got, h.Sum(nil)) {
		t.Fatalf("server hashed %x, sent %x", got, h.Sum(nil))
	}
}

// lastTCP is the TCP conn recordingDialer made last: the SOCKS client's
// conn wraps it without CloseWrite.
var lastTCP atomic.Pointer[net.TCPConn]

type recordingDialer struct{}

func (recordingDialer) Dial(network, addr string) (net.Conn, error) {
	c, err := net.Dial(network, addr)
	if err == nil {
		lastTCP.Store(c.(*net.TCPConn))
	}
	return c, err
}

// TestNetstackServices: two --netstack daemons on one mem fabric. Node 2
// exposes a local server on fabric port 8080; node 1 reaches it through
// its SOCKS5 listener (x/net/proxy's client, IPv4 and IPv6) and through a
// --forward, each checked by content with half-closes passed through
// both hops. Refused and unsupported requests get SOCKS5 errors, and
// the daemons shut down with connections open.
func TestNetstackServices(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	server := shaServer(t)
	c := mem.NewCluster()
	b := startNetstack(t, c, 2, NetstackConfig{Exposes: []Expose{{Port: 8080, Local: server}}})
	a := startNetstack(t, c, 1, NetstackConfig{
		Socks:    "127.0.0.1:0",
		Forwards: []Forward{{Local: "127.0.0.1:0", Remote: netip.MustParseAddrPort("10.88.0.2:8080")}},
	})
	if a.st.Socks == "" || len(a.st.Forwards) != 1 || len(b.st.Exposes) != 1 {
		t.Fatalf("status: %+v / %+v", a.st, b.st)
	}
	size := 4 << 20
	if testenv.Small() {
		size = 512 << 10
	}

	socks, err := proxy.SOCKS5("tcp", a.st.Socks, nil, recordingDialer{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cd := socks.(proxy.ContextDialer)
	t.Run("socks4", func(t *testing.T) {
		dialRoundTrip(t, func() (net.Conn, error) { return cd.DialContext(ctx, "tcp", "10.88.0.2:8080") }, size, 1)
	})
	t.Run("socks6", func(t *testing.T) {
		dialRoundTrip(t, func() (net.Conn, error) { return cd.DialContext(ctx, "tcp", "[fd88::2]:8080") }, size/4, 2)
	})
	t.Run("forward", func(t *testing.T) {
		local, _, _ := strings.Cut(a.st.Forwards[0], "=")
		dialRoundTrip(t, func() (net.Conn, error) { return net.Dial("tcp", local) }, size, 3)
	})
	t.Run("socks refused", func(t *testing.T) {
		_, err := cd.DialContext(ctx, "tcp", "10.88.0.2:9")
		if err == nil || !strings.Contains(err.Error(), "refused") {
			t.Fatalf("dial closed port: %v, want connection refused", err)
		}
	})
	t.Run("socks name", func(t *testing.T) {
		_, err := cd.DialContext(ctx, "tcp", "node2.example:8080")
		if err == nil || !strings.Contains(err.Error(), "host unreachable") {
			t.Fatalf("dial by name: %v, want host unreachable", err)
		}
	})
	t.Run("socks raw", func(t *testing.T) {
		for _, tc := range []struct {
			name      string
			send, got []byte
		}{
			{"socks4 client", []byte{4, 1, 0, 80, 10, 88, 0, 2, 0}, nil},
			{"no no-auth method", []byte{5, 1, 2}, []byte{5, 0xff}},
			{"bind", []byte{5, 1, 0, 5, 2, 0, 1, 10, 88, 0, 2, 0, 80}, []byte{5, 0, 5, 7, 0, 1, 0, 0, 0, 0, 0, 0}},
			{"bad atyp", []byte{5, 1, 0, 5, 1, 0, 9}, []byte{5, 0, 5, 8, 0, 1, 0, 0, 0, 0, 0, 0}},
			{"port 0", []byte{5, 1, 0, 5, 1, 0, 1, 10, 88, 0, 2, 0, 0}, []byte{5, 0, 5, 4, 0, 1, 0, 0, 0, 0, 0, 0}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				conn, err := net.Dial("tcp", a.st.Socks)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				conn.SetDeadline(time.Now().Add(5 * time.Second))
				conn.Write(tc.send)
				got, err := io.ReadAll(conn) // the server answers and closes
				if err != nil && tc.got == nil && strings.Contains(err.Error(), "reset") {
					err = nil // closed with our request unread: a reset
				}
				if err != nil {
					t.Fatalf("read: %v", err)
				}
				if !bytes.Equal(got, tc.got) {
					t.Fatalf("answer %v, want %v", got, tc.got)
				}
			})
		}
	})
	t.Run("socks slow client", func(t *testing.T) {
		old := socksHandshakeTimeout.Swap(int64(200 * time.Millisecond))
		defer socksHandshakeTimeout.Store(old)
		conn, err := net.Dial("tcp", a.st.Socks)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.Write([]byte{5}) // and nothing more
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		start := time.Now()
		if _, err := io.ReadAll(conn); err != nil {
			t.Fatalf("read: %v (want the server to close)", err)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("server closed after %v", d)
		}
	})
	st := a.status(t)
	if st.Accepted < 8 || st.Refused < 6 || st.BytesOut < uint64(2*size) {
		t.Errorf("counters %+v", st)
	}
	t.Run("close with open conns", func(t *testing.T) {
		conn, err := cd.DialContext(ctx, "tcp", "10.88.0.2:8080")
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.Write([]byte("pending"))
		start := time.Now()
		if err := a.d.Close(); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("close took %v", d)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadAll(conn); err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
			t.Errorf("client conn after close: %v", err)
		}
	})
}

// TestNetstackConnLimit: connections beyond the limit are refused at
// accept (closed at once, counted) while the others keep working.
func TestNetstackConnLimit(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	old := maxNetstackConns
	maxNetstackConns = 2
	defer func() { maxNetstackConns = old }()
	server := shaServer(t)
	c := mem.NewCluster()
	startNetstack(t, c, 2, NetstackConfig{Exposes: []Expose{{Port: 8080, Local: server}}})
	a := startNetstack(t, c, 1, NetstackConfig{
		Forwards: []Forward{{Local: "127.0.0.1:0", Remote: netip.MustParseAddrPort("10.88.0.2:8080")}},
	})
	local, _, _ := strings.Cut(a.st.Forwards[0], "=")
	var held []net.Conn
	for range 2 {
		conn, err := net.Dial("tcp", local)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		held = append(held, conn)
	}
	// Both are accepted (active 2) before the third arrives.
	if err := nsWaitFor(5*time.Second, func() bool { return a.status(t).Active == 2 }); err != nil {
		t.Fatalf("active: %+v", a.status(t))
	}
	over, err := net.Dial("tcp", local)
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	over.SetDeadline(time.Now().Add(5 * time.Second))
	if n, err := over.Read(make([]byte, 1)); err == nil {
		t.Fatalf("connection over the limit read %d bytes, want it closed", n)
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("connection over the limit left open")
	}
	if st := a.status(t); st.Refused != 1 || st.Active != 2 {
		t.Errorf("status %+v, want refused 1, active 2", st)
	}
	// The held connections still work end to end.
	roundTrip(t, held[0], 1<<16, 9)
}

func nsWaitFor(d time.Duration, f func() bool) error {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if f() {
			return nil
		}
	}
	return errors.New("timed out")
}

// TestNetstackStartFailure: a front door that cannot listen fails Start
// with the flag named, and everything started so far is stopped.
func TestNetstackStartFailure(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	c := mem.NewCluster()
	cfg := Config{
		Node: 1, Fabric: backend.Spec{Kind: backend.Mem}, Ifname: "exnt", MTU: DefaultMTU,
		EagerThreshold: DefaultEagerThreshold, Netstack: true,
		NS:    NetstackConfig{Socks: "127.0.0.1:0", Forwards: []Forward{{Local: busy.Addr().String(), Remote: netip.MustParseAddrPort("10.88.0.2:1")}}},
		Addrs: []netip.Prefix{netip.MustParsePrefix("10.88.0.1/24")},
	}
	d, err := Start(cfg, slog.New(slog.DiscardHandler), WithMemCluster(c))
	if err == nil {
		d.Close()
		t.Fatal("Start with a busy --forward port: no error")
	}
	if !strings.Contains(err.Error(), "--forward "+busy.Addr().String()) {
		t.Fatalf("Start: %v, want the --forward named", err)
	}
	// The node ID is free again: a second start on the same fabric works.
	cfg.NS.Forwards = nil
	d, err = Start(cfg, slog.New(slog.DiscardHandler), WithMemCluster(c))
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}

package node

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/exn"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/mem"
	"github.com/exn-project/exn/internal/testenv"
)

func TestClusterAddresses(t *testing.T) {
	c := newCluster(t, 3)
	for i, n := range c.Nodes() {
		want := netip.MustParsePrefix(fmt.Sprintf("10.88.0.%d/24", i+1))
		if n.Addr() != want {
			t.Errorf("node %d: addr %v, want %v", i, n.Addr(), want)
		}
		if got, want := n.MAC().String(), fmt.Sprintf("2e:87:04:07:00:%02x", i+1); got != want {
			t.Errorf("node %d: mac %s, want %s", i, got, want)
		}
		if n.NIC().Node() != fabric.NodeID(i+1) || n.Engine() == nil || n.MTU() != 65521 {
			t.Errorf("node %d: nic %d, engine %v, mtu %d", i, n.NIC().Node(), n.Engine(), n.MTU())
		}
	}
}

func TestTCPEcho(t *testing.T) {
	c := newCluster(t, 3)
	nodes := c.Nodes()
	for _, n := range nodes {
		echoServer(t, listen(t, n, "tcp", ":7")) // dual-stack
		echoServer(t, listen(t, n, "tcp6", "[::]:8"))
		if _, err := n.Listen("tcp4", ":8"); err != nil {
			t.Errorf("tcp4 :8 beside a v6-only listener: %v", err)
		}
	}
	ctx := testCtx(t, 30*time.Second)
	for _, tc := range []struct {
		from, to int
		network  string
		port     uint16
	}{
		{0, 1, "tcp", 7}, {1, 0, "tcp", 7}, {0, 2, "tcp4", 7}, {2, 1, "tcp", 7},
		{1, 2, "tcp6", 7}, {2, 0, "tcp6", 8},
	} {
		t.Run(fmt.Sprintf("%s/%d-%d:%d", tc.network, tc.from+1, tc.to+1, tc.port), func(t *testing.T) {
			dst := nodes[tc.to].Addr().Addr()
			if tc.network == "tcp6" {
				dst = nodes[tc.to].Addr6().Addr()
			}
			conn, err := nodes[tc.from].DialContext(ctx, tc.network, netip.AddrPortFrom(dst, tc.port).String())
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			for _, size := range []int{1, 100, 479, 481, 1500, 65000, 300000} {
				msg := bytes.Repeat([]byte{byte(size)}, size)
				if _, err := conn.Write(msg); err != nil {
					t.Fatalf("write %d: %v", size, err)
				}
				got := make([]byte, size)
				if _, err := io.ReadFull(conn, got); err != nil {
					t.Fatalf("read %d: %v", size, err)
				}
				if !bytes.Equal(got, msg) {
					t.Fatalf("echo of %d bytes differs", size)
				}
			}
			if got, want := conn.RemoteAddr().String(), netip.AddrPortFrom(dst, tc.port).String(); got != want {
				t.Errorf("remote addr %s, want %s", got, want)
			}
		})
	}
}

func TestUDP(t *testing.T) {
	_, a, b := twoNodes(t)
	pc, err := b.ListenPacket("udp", ":9")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
	conn := dial(t, testCtx(t, 10*time.Second), a, "udp", hostPort(b, 9))
	// Sizes across eager (<= 480 B frames), rendezvous and IP fragmentation
	// (over the MTU: gVisor fragments and reassembles).
	for _, size := range []int{1, 400, 1400, 20000, 65507} {
		msg := bytes.Repeat([]byte{0xa5}, size)
		var got []byte
		// UDP may drop; retry a few times with a deadline.
		for try := 0; try < 5 && got == nil; try++ {
			if _, err := conn.Write(msg); err != nil {
				t.Fatalf("write %d: %v", size, err)
			}
			conn.SetReadDeadline(time.Now().Add(time.Second))
			buf := make([]byte, 70000)
			n, err := conn.Read(buf)
			if err == nil {
				got = buf[:n]
			}
		}
		if !bytes.Equal(got, msg) {
			t.Fatalf("udp echo of %d bytes: got %d bytes", size, len(got))
		}
	}
}

func TestPing(t *testing.T) {
	_, a, b := twoNodes(t)
	ctx := testCtx(t, 10*time.Second)
	for _, dst := range []netip.Addr{b.Addr().Addr(), b.Addr6().Addr()} {
		rtt, err := a.Ping(ctx, dst, []byte("exn"))
		if err != nil {
			t.Fatalf("ping %s: %v", dst, err)
		}
		if rtt <= 0 || rtt > 5*time.Second {
			t.Errorf("ping %s: rtt %v", dst, rtt)
		}
	}
	// A host that is not there: the ping times out with an error.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := a.Ping(short, netip.MustParseAddr("10.88.0.77"), nil); err == nil {
		t.Error("ping to an absent host: no error")
	}
}

// TestLargeTransfer moves tens of MiB one way, checked by sha256; every
// full-size segment crosses the rendezvous path.
func TestLargeTransfer(t *testing.T) {
	_, a, b := twoNodes(t)
	size := 64 << 20
	if testenv.Small() {
		size = 8 << 20
	}
	l := listen(t, b, "tcp", hostPort(b, 5001))
	type result struct {
		n   int64
		sum []byte
		err error
	}
	res := make(chan result, 1)
	go func() {
		conn, err := l.Accept()
		if err != nil {
			res <- result{err: err}
			return
		}
		defer conn.Close()
		h := sha256.New()
		n, err := io.Copy(h, conn)
		res <- result{n, h.Sum(nil), err}
	}()
	conn := dial(t, testCtx(t, 60*time.Second), a, "tcp", hostPort(b, 5001))
	h := sha256.New()
	chunk := make([]byte, 1<<20)
	for off := 0; off < size; off += len(chunk) {
		for i := range chunk {
			chunk[i] = byte(off>>20) ^ byte(i) ^ byte(i>>8)
		}
		h.Write(chunk)
		if _, err := conn.Write(chunk); err != nil {
			t.Fatalf("write at %d: %v", off, err)
		}
	}
	conn.Close()
	r := <-res
	if r.err != nil || r.n != int64(size) || !bytes.Equal(r.sum, h.Sum(nil)) {
		t.Fatalf("received %d bytes (err %v), sha match %v; want %d", r.n, r.err, bytes.Equal(r.sum, h.Sum(nil)), size)
	}
	st := a.Engine().Stats()
	if st.TxFrames[exn.ProtoRendezvous] == 0 || st.TxBytes[exn.ProtoRendezvous] < uint64(size) {
		t.Errorf("engine stats: %d rendezvous frames, %d bytes; want >= %d bytes by rendezvous",
			st.TxFrames[exn.ProtoRendezvous], st.TxBytes[exn.ProtoRendezvous], size)
	}
	if ls := a.Link().Stats(); ls.TxErrors != 0 || ls.TxOversize != 0 {
		t.Errorf("link stats %+v: errors", ls)
	}
}

// TestCloseMidTransfer: a node closing during a transfer resets its
// connections, so the peer's blocked Write fails promptly, and its own
// blocked Read fails too.
func TestCloseMidTransfer(t *testing.T) {
	_, a, b := twoNodes(t)
	l := listen(t, b, "tcp", ":5002")
	accepted := acceptOne(l)
	conn := dial(t, testCtx(t, 10*time.Second), a, "tcp", hostPort(b, 5002))
	bConn := <-accepted
	if bConn == nil {
		t.Fatal("accept failed")
	}
	defer bConn.Close()
	bReadErr := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, bConn)
		if err == nil {
			err = errors.New("read ended with EOF, want an error")
		}
		bReadErr <- err
	}()
	aWriteErr := writeUntilErr(conn, 256<<10)
	time.Sleep(200 * time.Millisecond) // mid-transfer
	if err := b.Close(); err != nil {
		t.Fatalf("close b: %v", err)
	}
	const bound = 5 * time.Second
	start := time.Now()
	err := testenv.Within(t, "peer's write after the node closed", aWriteErr, bound)
	t.Logf("peer's write failed after %v: %v", time.Since(start), err)
	err = testenv.Within(t, "closed node's read", bReadErr, bound)
	t.Logf("closed node's read failed: %v", err)
	// The closed node refuses new work.
	if _, err := b.DialContext(context.Background(), "tcp", hostPort(a, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("dial on a closed node: %v, want net.ErrClosed", err)
	}
	if _, err := b.Listen("tcp", ":1"); !errors.Is(err, net.ErrClosed) {
		t.Errorf("listen on a closed node: %v, want net.ErrClosed", err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
}

// TestCloseUnblocksAcceptAndDial: Close ends a blocked Accept and a dial
// waiting on an unreachable peer.
func TestCloseUnblocks(t *testing.T) {
	c := newCluster(t, 2)
	a := c.Node(0)
	l := listen(t, a, "tcp", ":80")
	pc, err := a.ListenPacket("udp", ":53")
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 3)
	go func() { _, err := l.Accept(); errs <- err }()
	go func() { _, _, err := pc.ReadFrom(make([]byte, 10)); errs <- err }()
	go func() {
		// 10.88.0.9 does not exist: ARP never resolves.
		_, err := a.DialContext(context.Background(), "tcp", "10.88.0.9:80")
		errs <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := testenv.Within(t, "a blocked call after Close", errs, 5*time.Second); err == nil {
			t.Error("blocked call returned no error after Close")
		}
	}
}

func TestBadConfig(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	fab := mem.NewCluster()
	nic, err := fab.NewNIC(1)
	if err != nil {
		t.Fatal(err)
	}
	defer nic.Close()
	good := netip.MustParsePrefix("10.88.0.1/24")
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"nil nic", Config{Addr: good}, "nil NIC"},
		{"no addr", Config{NIC: nic}, "invalid CIDR"},
		{"v6 as addr", Config{NIC: nic, Addr: netip.MustParsePrefix("fd00::1/64")}, "not an IPv4 prefix"},
		{"v4 as addr6", Config{NIC: nic, Addr: good, Addr6: good}, "not an IPv6 prefix"},
		{"network address", Config{NIC: nic, Addr: netip.MustParsePrefix("10.88.0.0/24")}, "network address"},
		{"broadcast address", Config{NIC: nic, Addr: netip.MustParsePrefix("10.88.0.255/24")}, "broadcast address"},
		{"unspecified", Config{NIC: nic, Addr: netip.MustParsePrefix("0.0.0.0/8")}, "not a unicast host"},
		{"mtu too large", Config{NIC: nic, Addr: good, MTU: 70000}, "mtu 70000 not in 1280..65521"},
		{"mtu too small", Config{NIC: nic, Addr: good, MTU: 500}, "mtu 500 not in"},
		{"engine mtu differs", Config{NIC: nic, Addr: good, MTU: 9000, Engine: exn.Config{MTU: 1500}}, "differs"},
		{"tcp buffers", Config{NIC: nic, Addr: good, TCP: TCPConfig{SendBuffer: BufferRange{Min: 10, Default: 5, Max: 20}}}, "min <= default"},
		{"congestion control", Config{NIC: nic, Addr: good, TCP: TCPConfig{CongestionControl: "bbr"}}, "cubic or reno"},
		{"engine config", Config{NIC: nic, Addr: good, Engine: exn.Config{RxBudget: -1}}, "RxBudget"},
		{"bad mac prefix", Config{NIC: nic, Addr: good, Engine: exn.Config{MACPrefix: fabric.MACPrefix{1, 2, 3, 4}}}, "not locally administered"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Logger = quietLogger()
			n, err := New(tc.cfg)
			if err == nil {
				n.Close()
				t.Fatalf("New: no error, want %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v; want it to contain %q", err, tc.want)
			}
		})
	}
	// A failed New leaves VPID 0 free: a good config then works.
	n, err := New(Config{NIC: nic, Addr: good, Logger: quietLogger()})
	if err != nil {
		t.Fatalf("New after failures: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestClusterErrors(t *testing.T) {
	c := newCluster(t, 2)
	_, err := c.AddNode(2, netip.MustParsePrefix("10.88.0.50/24"))
	if !errors.Is(err, fabric.ErrInUse) || !strings.Contains(err.Error(), "node id 2") {
		t.Errorf("duplicate node id: %v, want node id 2 ... ErrInUse", err)
	}
	for _, tc := range []struct {
		name string
		n    int
		opts []ClusterOption
		want string
	}{
		{"zero nodes", 0, nil, "cluster of 0 nodes"},
		{"too many for /30", 3, []ClusterOption{WithPrefix(netip.MustParsePrefix("10.1.0.0/30"))}, "want 1..2"},
		{"invalid prefix", 2, []ClusterOption{WithPrefix(netip.Prefix{})}, "want an IPv4 CIDR"},
		{"v6 prefix", 2, []ClusterOption{WithPrefix(netip.MustParsePrefix("fd00::/64"))}, "want an IPv4 CIDR"},
		{"bad node config", 2, []ClusterOption{WithConfig(func(c *Config) { c.MTU = 1 << 20 })}, "mtu 1048576"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewCluster(tc.n, tc.opts...)
			if err == nil {
				c.Close()
				t.Fatalf("NewCluster: no error, want %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewCluster: %v; want %q", err, tc.want)
			}
		})
	}
}

func TestDialErrors(t *testing.T) {
	c := newCluster(t, 1)
	a := c.Node(0)
	ctx := testCtx(t, 5*time.Second)
	for _, tc := range []struct{ network, addr, want string }{
		{"sctp", "10.88.0.2:1", "unknown network"},
		{"tcp", "10.88.0.2", "missing port"},
		{"tcp", "example.com:80", "IP literal"},
		{"tcp4", "[fd00::1]:80", "address on network tcp4"},
		{"tcp", ":80", "missing host"},
		{"tcp", "10.88.0.2:99999", "port"},
	} {
		if _, err := a.DialContext(ctx, tc.network, tc.addr); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("DialContext(%q, %q): %v, want %q", tc.network, tc.addr, err, tc.want)
		}
	}
	// Nothing listens on node 1 port 1: the dial is refused promptly.
	if _, err := a.DialContext(ctx, "tcp", "10.88.0.1:1"); err == nil {
		t.Error("dial to a closed port: no error")
	}
}

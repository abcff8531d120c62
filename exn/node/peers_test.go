package node

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
)

func TestClusterNodeOutOfRange(t *testing.T) {
	c := newCluster(t, 2)
	if c.Node(0) == nil || c.Node(1) == nil || c.NIC(1) == nil {
		t.Fatal("Node/NIC in range returned nil")
	}
	for _, i := range []int{-1, 2, 1 << 30} {
		if nd := c.Node(i); nd != nil {
			t.Errorf("Node(%d) = %v, want nil", i, nd)
		}
		if nic := c.NIC(i); nic != nil {
			t.Errorf("NIC(%d) = %v, want nil", i, nic)
		}
	}
}

// TestPeerCrashResets: when a peer's NIC dies without the node closing (a
// crash), the survivors' connections to it are reset within a few peer
// checks, in both roles (dialer and acceptor), and blocked reads and
// writes return, instead of hanging until TCP gives up. Connections to
// live peers are untouched.
func TestPeerCrashResets(t *testing.T) {
	c := newCluster(t, 3, WithConfig(func(cfg *Config) { cfg.PeerCheck = 20 * time.Millisecond }))
	a, b, live := c.Node(0), c.Node(1), c.Node(2)
	ctx := testCtx(t, 20*time.Second)

	lb := listen(t, b, "tcp", ":7000")
	acc := acceptOne(lb)
	// a dials b: a's conn is the dialer side of a dead peer.
	ab := dial(t, ctx, a, "tcp", hostPort(b, 7000))
	bSide := <-acc
	if bSide == nil {
		t.Fatal("accept failed")
	}
	defer bSide.Close()
	// b dials a: a's conn is the acceptor side of a dead peer.
	la := listen(t, a, "tcp", ":7001")
	dial(t, ctx, b, "tcp", hostPort(a, 7001))
	aAcc, err := la.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer aAcc.Close()
	// A connection to a live peer, which must survive.
	al := dialEcho(t, ctx, a, live, 7002)

	// Blocked reader on the dialer conn; blocked writer on the accepted
	// conn (b never reads, so the window fills and Write blocks).
	readErr := make(chan error, 1)
	go func() {
		_, err := ab.Read(make([]byte, 1))
		readErr <- err
	}()
	writeErr := writeUntilErr(aAcc, 1<<20)
	time.Sleep(100 * time.Millisecond) // let both block
	select {
	case err := <-readErr:
		t.Fatalf("read returned before the crash: %v", err)
	case err := <-writeErr:
		t.Fatalf("write returned before the crash: %v", err)
	default:
	}

	crash := time.Now()
	if err := c.NIC(1).Close(); err != nil { // b crashes: NIC gone, node not closed
		t.Fatal(err)
	}
	for name, ch := range map[string]<-chan error{"read (dialer side)": readErr, "write (acceptor side)": writeErr} {
		if err := testenv.Within(t, name+" after the peer crashed", ch, 3*time.Second); err == nil || errors.Is(err, io.EOF) {
			t.Errorf("%s: %v, want a reset error", name, err)
		}
	}
	if d := time.Since(crash); d > 2*time.Second {
		t.Errorf("resets took %v", d)
	}
	if got := a.PeerResets(); got != 2 {
		t.Errorf("PeerResets = %d, want 2", got)
	}
	// The live peer's connection still works.
	al.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := al.Write([]byte("ping")); err != nil {
		t.Fatalf("live conn write: %v", err)
	}
	got := make([]byte, 4)
	if _, err := io.ReadFull(al, got); err != nil || string(got) != "ping" {
		t.Fatalf("live conn echo: %q, %v", got, err)
	}
	// Nothing left to reset.
	if n := a.ResetDeadPeers(); n != 0 {
		t.Errorf("ResetDeadPeers after the resets = %d, want 0", n)
	}
}

// TestPeerCheckOff: with the check off, a crashed peer's connection is not
// reset (so the test above measures the check, not something else).
func TestPeerCheckOff(t *testing.T) {
	c, a, b := twoNodes(t, WithConfig(func(cfg *Config) { cfg.PeerCheck = -1 }))
	ctx := testCtx(t, 10*time.Second)
	ab := dialEcho(t, ctx, a, b, 7000)
	if err := c.NIC(1).Close(); err != nil {
		t.Fatal(err)
	}
	ab.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	_, err := ab.Read(make([]byte, 1))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read with the check off: %v, want a timeout (no reset)", err)
	}
	// An explicit check resets it.
	if n := a.ResetDeadPeers(); n != 1 {
		t.Fatalf("ResetDeadPeers = %d, want 1", n)
	}
	ab.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := ab.Read(make([]byte, 1)); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("read after ResetDeadPeers: %v, want a reset", err)
	}
}

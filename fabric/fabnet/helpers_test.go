package fabnet

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
	"github.com/exn-project/exn/internal/testenv"
)

// targetEP is target(t, nil) with its VPID 5 open (closed when t ends).
func targetEP(t *testing.T) (*NIC, fabric.Endpoint) {
	t.Helper()
	n := target(t, nil)
	return n, fabrictest.OpenEP(t, n, 5)
}

// testLogger logs warnings to stderr when EXN_TEST_LOG=1, else discards.
func testLogger() *slog.Logger {
	if os.Getenv("EXN_TEST_LOG") == "1" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// listen opens a loopback listener on a free port.
func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// cluster starts n nodes, IDs 1..n, on loopback and waits for the full
// mesh. mod may adjust each node's config.
const testDeadAfter = 10 * time.Second

func cluster(t testing.TB, n int, mod func(*Config)) []*NIC {
	t.Helper()
	lns := make([]net.Listener, n)
	addrs := map[fabric.NodeID]string{}
	for i := range lns {
		lns[i] = listen(t)
		addrs[fabric.NodeID(i+1)] = lns[i].Addr().String()
	}
	nics := make([]*NIC, n)
	for i := range nics {
		// testDeadAfter: a loaded CI machine under -race can stall a
		// goroutine for longer than DefaultDeadAfter, which would report a
		// live peer down. Tests of heartbeat expiry set their own values.
		cfg := Config{Node: fabric.NodeID(i + 1), Listener: lns[i], Peers: addrs, Logger: testLogger(), DeadAfter: testDeadAfter}
		if mod != nil {
			mod(&cfg)
		}
		nic, err := open(cfg)
		if err != nil {
			t.Fatalf("open node %d: %v", i+1, err)
		}
		nics[i] = nic
		t.Cleanup(func() { nic.Close() })
	}
	for _, nic := range nics {
		waitMesh(t, nic, n-1)
	}
	return nics
}

func waitMesh(t testing.TB, nic *NIC, peers int) {
	t.Helper()
	waitUntil(t, "full mesh", func() bool { return len(nic.Peers()) == peers })
}

func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, what, 10*time.Second, cond)
}

func factory(mod func(*Config)) fabrictest.Factory {
	return func(t testing.TB, n int) []fabric.NIC {
		t.Helper()
		nics := cluster(t, n, mod)
		out := make([]fabric.NIC, n)
		for i, nic := range nics {
			out[i] = nic
		}
		return out
	}
}

func isClosed(err error) bool { return errors.Is(err, net.ErrClosed) }

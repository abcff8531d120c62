package shimsrv

import (
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/internal/sys"
	"github.com/exn-project/exn/internal/testenv"
)

// TestShortRuns: which sequences of accepted connections' lifetimes put
// a port on hold (shortRun short ones in a row; a long one starts the
// count again; connecting sides and a disabled hold never do).
func TestShortRuns(t *testing.T) {
	const short, long = time.Millisecond, 3 * shortLife
	for _, tc := range []struct {
		name  string
		hold  time.Duration
		side  string
		lives []time.Duration
		holds uint64
	}{
		{"four short", time.Second, sideAccept, []time.Duration{short, short, short, short}, 1},
		{"three short", time.Second, sideAccept, []time.Duration{short, short, short}, 0},
		{"a long one between", time.Second, sideAccept, []time.Duration{short, short, short, long, short, short, short}, 0},
		{"eight short", time.Second, sideAccept, []time.Duration{short, short, short, short, short, short, short, short}, 2},
		{"connecting side", time.Second, sideConnect, []time.Duration{short, short, short, short}, 0},
		{"hold off", 0, sideAccept, []time.Duration{short, short, short, short}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, _ := newNodes(t, WithShortHold(tc.hold))
			const port = 4242
			for _, life := range tc.lives {
				a.srv.connEnded(tc.side, port, time.Now().Add(-life))
			}
			if got := a.srv.Stats().Holds; got != tc.holds {
				t.Fatalf("holds %d, want %d", got, tc.holds)
			}
			if held := a.dev.PortHold(port) > 0; held != (tc.holds > 0) {
				t.Fatalf("port held %v after %d holds", held, tc.holds)
			}
			other := extds.TupleKey{Local: netip.MustParseAddrPort("127.0.0.1:4243"), Remote: netip.MustParseAddrPort("127.0.0.1:50000")}
			if _, held := a.srv.heldAccept(other); held {
				t.Fatal("another port is held")
			}
		})
	}
}

// TestShortHold: after shortRun short EXT-DS connections to a registered
// listener, the next connection is plain TCP on both sides, both shims
// are told how long to skip asking, the fallbacks are counted, and the
// stream is the application's alone.
func TestShortHold(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	a, b := newNodes(t, WithShortHold(time.Second))
	ln := testenv.ListenTCP(t)
	b.listen(t, ln)
	for i := range shortRun {
		client, server := pairUp(t, a, b, ln)
		if client.res.Mode != "extds" || server.res.Mode != "extds" {
			t.Fatalf("connection %d: modes %q/%q before any hold", i, client.res.Mode, server.res.Mode)
		}
		client.Close()
		server.Close()
		testenv.Eventually(t, "connection ended", 5*time.Second, func() bool { return b.srv.Stats().Active == 0 })
	}
	if h := b.srv.Stats().Holds; h != 1 {
		t.Fatalf("holds %d after %d short connections", h, shortRun)
	}
	client, server := pairUp(t, a, b, ln)
	defer client.Close()
	defer server.Close()
	limit := uint64((time.Second - extds.HoldMargin).Milliseconds())
	now := sys.MonoNow()
	for _, x := range []*app{client, server} {
		if x.res.Mode != "tcp" || x.res.Reason != "short_lived" || x.res.HoldMS == 0 || x.res.HoldMS > limit {
			t.Fatalf("answer %+v on a held port, want tcp, short_lived, hold_ms in (0, %d]", x.res, limit)
		}
		// hold_end is the same hold on the shared clock: after now, and
		// no later than now plus hold_ms (rounded down) and a millisecond.
		if end := x.res.HoldEnd; end <= now || end > now+(x.res.HoldMS+1)*uint64(time.Millisecond) {
			t.Fatalf("answer %+v: hold_end %d not in (%d, %d]", x.res, end, now, now+(x.res.HoldMS+1)*uint64(time.Millisecond))
		}
	}
	if _, err := io.WriteString(client, "app bytes"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 9)
	if _, err := io.ReadFull(server, buf); err != nil || string(buf) != "app bytes" {
		t.Fatalf("server read %q, %v", buf, err)
	}
	for _, n := range []*node{a, b} {
		if f := n.srv.Stats().Fallbacks["short_lived"]; f != 1 {
			t.Fatalf("short_lived fallbacks %d, want 1", f)
		}
	}
	// The client's exnd answers the next connect itself.
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	served := b.dev.Stats().ProbesServed
	x, err := a.switchConn(t, "shim-connect", c.(*net.TCPConn))
	if err != nil || x.res.Reason != "short_lived" || b.dev.Stats().ProbesServed != served {
		t.Fatalf("second connect: %+v, %v; server asked %d times", x, err, b.dev.Stats().ProbesServed-served)
	}
}

package extds

import (
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/exn-project/exn/extds/internal/agree"
	"github.com/exn-project/exn/internal/testenv"
)

// claimListener is a TCP listener whose port p.devB serves by claims, as
// for a shim's registration; unregistered when the test ends.
func claimListener(t testing.TB, p *pair) (net.Listener, uint16) {
	t.Helper()
	ln := testenv.ListenTCP(t)
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	unreg, err := p.devB.RegisterClaimPort(port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(unreg)
	return ln, port
}

// claimConn is a fresh pair, a listener whose port p.devB serves by
// claims (claimListener) and one connection to it: cl the client's end,
// sv the accepted one, closed when t ends.
func claimConn(t testing.TB) (p *pair, port uint16, cl, sv net.Conn) {
	t.Helper()
	p = newPair(t)
	var ln net.Listener
	ln, port = claimListener(t, p)
	cl, sv = shadowPair(t, ln)
	t.Cleanup(func() { sv.Close() })
	return p, port, cl, sv
}

// settleClaim upgrades cl through p's dialer while the server's side
// settles its connection (settle: a decline, a hold): with claimFirst
// settle runs once the client's CLAIM has reached p.devB's exnd (a probe
// served there), else before the client starts. It returns the client's
// Conn.
func settleClaim(t testing.TB, p *pair, cl net.Conn, claimFirst bool, settle func()) *Conn {
	t.Helper()
	type upgraded struct {
		c   *Conn
		err error
	}
	done := make(chan upgraded, 1)
	upgrade := func() {
		c, err := p.dialer.Upgrade(t.Context(), cl)
		done <- upgraded{c, err}
	}
	if claimFirst {
		served := p.devB.Stats().ProbesServed
		go upgrade()
		testenv.Eventually(t, "the client's CLAIM at the server's exnd", 10*time.Second, func() bool {
			return p.devB.Stats().ProbesServed != served
		})
		settle()
	} else {
		settle()
		go upgrade()
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.c
}

// tupleOf is the TCP connection of the accepted socket sv as the server
// sees it.
func tupleOf(sv net.Conn) TupleKey {
	return TupleKey{Local: sv.LocalAddr().(*net.TCPAddr).AddrPort(), Remote: sv.RemoteAddr().(*net.TCPAddr).AddrPort()}
}

// TestSkippedByHold: an acceptor that accepts late (its window over)
// takes a connection made inside the clients' window of the port's
// latest hold as plain TCP at once, exactly then; and when the client
// did offer after all, its late CLAIM is declined as held, so both sides
// stay TCP and nothing precedes the application's bytes.
func TestSkippedByHold(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t)
	ln, port := claimListener(t, p)
	// No hold yet: nothing was skipped.
	cl0, sv0 := shadowPair(t, ln)
	defer cl0.Close()
	defer sv0.Close()
	if p.devB.SkippedByHold(tupleOf(sv0), time.Now()) {
		t.Fatal("skipped without any hold")
	}
	// A hold of 150 ms, ended: the clients' window was [start, end-25ms].
	start := time.Now()
	p.devB.HoldPort(port, time.Second)
	time.Sleep(150 * time.Millisecond)
	e0 := time.Now() // the hold's end lies in [e0, e1]
	p.devB.HoldPort(port, 0)
	e1 := time.Now()
	const cut = 2*HoldMargin + agree.SkipSlack // the clients' window ends this much earlier
	for _, c := range []struct {
		name string
		made time.Time
		want bool
	}{
		{"before the hold", start.Add(-time.Millisecond), false},
		{"just after its start", start.Add(2 * time.Millisecond), true},
		{"inside the clients' window", start.Add(50 * time.Millisecond), true},
		{"just before the window's end", e0.Add(-cut - time.Millisecond), true},
		{"after the window, inside the hold", e1.Add(-cut + time.Millisecond), false},
		{"after the hold", e1.Add(time.Millisecond), false},
	} {
		cl, sv := shadowPair(t, ln)
		if got := p.devB.SkippedByHold(tupleOf(sv), c.made); got != c.want {
			t.Errorf("%s: SkippedByHold = %v, want %v", c.name, got, c.want)
		}
		cl.Close()
		sv.Close()
	}
	// A connection with a claim already known is Claim's to decide.
	cl1, sv1 := shadowPair(t, ln)
	defer cl1.Close()
	defer sv1.Close()
	claim := p.devB.Claim(tupleOf(sv1))
	if p.devB.SkippedByHold(tupleOf(sv1), start.Add(10*time.Millisecond)) {
		t.Fatal("skipped a connection whose acceptor claimed it")
	}
	claim.Close()

	// The client did not skip: its CLAIM comes after the acceptor took
	// the connection as skipped, and is declined as held (nothing to
	// cache: the hold is over).
	cl, sv := shadowPair(t, ln)
	defer sv.Close()
	if !p.devB.SkippedByHold(tupleOf(sv), start.Add(20*time.Millisecond)) {
		t.Fatal("not skipped inside the window")
	}
	served := p.devB.Stats().ProbesServed
	c, err := p.dialer.Upgrade(t.Context(), cl)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n := p.devB.Stats().ProbesServed - served; n != 1 {
		t.Fatalf("%d claims served, want the client's one", n)
	}
	if h := p.devA.PeerHold(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)); h != 0 {
		t.Fatalf("client keeps a hold of %v after a decline with no time left", h)
	}
	wantFallback(t, c, sv, FallbackShortLived)
}

// wantFallback checks that c, the client's end of the connection whose
// server end is sv, fell back to TCP for reason want, and that the
// application's bytes are the first sv sees: nothing was written before
// them.
func wantFallback(t testing.TB, c *Conn, sv net.Conn, want FallbackReason) {
	t.Helper()
	if why, ok := c.FallbackReason(); c.Mode() != ModeTCP || !ok || why != want {
		t.Fatalf("client: mode %v, reason %v (%v); want TCP, %v", c.Mode(), why, ok, want)
	}
	if _, err := io.WriteString(c, "app bytes"); err != nil {
		t.Fatal(err)
	}
	if _, peeked := peekFirst(t, sv, HelloPrefixLen); string(peeked) != "app " {
		t.Fatalf("server saw %q first: something was written before the app", peeked)
	}
}

// TestHoldPort: while the server's port is on hold a client's CLAIM is
// declined with the remaining time, the client then falls back without
// asking until that time (less the margin) is over, and nothing is
// written into the connection; an ended hold agrees again.
func TestHoldPort(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t)
	ln, port := claimListener(t, p)
	const hold = 500 * time.Millisecond
	p.devB.HoldPort(port, hold)
	if h := p.devB.PortHold(port); h <= hold-HoldMargin-100*time.Millisecond || h > hold-HoldMargin {
		t.Fatalf("PortHold = %v, want just under %v", h, hold-HoldMargin)
	}
	upgrade := func() (FallbackReason, uint64) {
		t.Helper()
		served := p.devB.Stats().ProbesServed
		cl, sv := shadowPair(t, ln)
		defer sv.Close()
		c, err := p.dialer.Upgrade(t.Context(), cl)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		r, ok := c.FallbackReason()
		if c.Mode() != ModeTCP || !ok {
			t.Fatalf("mode %v on a held port", c.Mode())
		}
		// An acceptor that claims the connection after all learns that
		// no hello comes exactly when the client's CLAIM was declined.
		asked := p.devB.Stats().ProbesServed - served
		claim := p.devB.Claim(tupleOf(sv))
		if held := claim.Held(); held != (asked == 1) {
			t.Fatalf("Claim.Held = %v after %d claims served", held, asked)
		}
		claim.Close()
		io.WriteString(c, "app bytes")
		if _, peeked := peekFirst(t, sv, HelloPrefixLen); string(peeked) != "app " {
			t.Fatalf("server saw %q first: something was written before the app", peeked)
		}
		return r, asked
	}
	if r, asked := upgrade(); r != FallbackShortLived || asked != 1 {
		t.Fatalf("first connection: reason %v, %d claims served; want short_lived after 1", r, asked)
	}
	ap := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
	if h := p.devA.PeerHold(ap); h <= 0 || h > hold-2*HoldMargin {
		t.Fatalf("PeerHold = %v, want in (0, %v]", h, hold-2*HoldMargin)
	}
	if r, asked := upgrade(); r != FallbackShortLived || asked != 0 {
		t.Fatalf("second connection: reason %v, %d claims served; want short_lived without asking", r, asked)
	}
	p.devB.HoldPort(port, 0)
	if h := p.devB.PortHold(port); h != 0 {
		t.Fatalf("PortHold after the end = %v", h)
	}
}

// TestAcceptOnHold: an acceptor that finds its port on hold takes the
// connection as plain TCP without claiming it, and its client is told so
// whenever its CLAIM came: one that came before the hold began (a hold's
// start, CI saw it end in no_claim and the negative cache) is declined
// as held when the hold begins (HoldPort), and one that comes after the
// hold ended is declined as held too. The client falls back short_lived, never no_claim, and
// nothing precedes the application's bytes.
func TestAcceptOnHold(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	for _, claimFirst := range []bool{true, false} {
		t.Run(map[bool]string{true: "claim before the hold", false: "claim after the hold"}[claimFirst], func(t *testing.T) {
			p, port, cl, sv := claimConn(t)
			key := tupleOf(sv)
			c := settleClaim(t, p, cl, claimFirst, func() {
				p.devB.HoldPort(port, time.Second)
				if left := p.devB.AcceptOnHold(key); left <= 0 {
					t.Fatalf("AcceptOnHold = %v on a held port", left)
				}
				if !claimFirst {
					p.devB.HoldPort(port, 0) // the CLAIM comes after the hold
					if left := p.devB.AcceptOnHold(TupleKey{Local: key.Local, Remote: netip.MustParseAddrPort("127.0.0.1:1")}); left != 0 {
						t.Fatalf("AcceptOnHold = %v after the hold", left)
					}
				}
			})
			defer c.Close()
			wantFallback(t, c, sv, FallbackShortLived)
		})
	}
}

// TestClaimAfterSilentSkip: an acceptor whose shim skipped asking during
// a hold took a connection as plain TCP, and the client, whose exnd did
// not know the hold, offered it in a CLAIM that arrived only after the
// hold ended (CI met it once, under load): the CLAIM is declined as held
// at once, not left to the claim timeout (no_claim and the client's
// negative cache). Exactly such connections: accepted already and made
// inside the acceptors' window. One made after the hold, one still in
// the accept queue and one on a port never held wait for their acceptor
// as before.
func TestClaimAfterSilentSkip(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t)
	ln, port := claimListener(t, p)
	p.devB.HoldPort(port, time.Second)
	cl, sv := shadowPair(t, ln) // accepted inside the hold; nobody asked
	defer sv.Close()
	time.Sleep(3 * HoldMargin)
	p.devB.HoldPort(port, 0)
	if !p.devB.agree.AcceptedInHold(tupleOf(sv), time.Now()) {
		t.Fatal("a connection accepted inside the hold without asking: not recognized")
	}
	cl2, sv2 := shadowPair(t, ln) // made after the hold
	defer cl2.Close()
	defer sv2.Close()
	if p.devB.agree.AcceptedInHold(tupleOf(sv2), time.Now()) {
		t.Fatal("a connection made after the hold counts as skipped")
	}
	other, otherPort := claimListener(t, p) // a port never held
	cl3, sv3 := shadowPair(t, other)
	defer cl3.Close()
	defer sv3.Close()
	if p.devB.agree.AcceptedInHold(tupleOf(sv3), time.Now()) {
		t.Fatalf("a connection to port %d, never held, counts as skipped", otherPort)
	}

	start := time.Now()
	c, err := p.dialer.Upgrade(t.Context(), cl)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if took := time.Since(start); took >= DefaultClaimTimeout {
		t.Fatalf("the decline took %v: the CLAIM waited out the claim timeout", took)
	}
	if h := p.devA.PeerHold(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)); h != 0 {
		t.Fatalf("client keeps a hold of %v after the hold ended", h)
	}
	wantFallback(t, c, sv, FallbackShortLived)

	// One made inside a hold but still in the accept queue (its own
	// listener: shadowPair would accept it).
	qln, qport := claimListener(t, p)
	p.devB.HoldPort(qport, time.Second)
	queued, err := net.Dial("tcp", qln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer queued.Close()
	time.Sleep(3 * HoldMargin)
	p.devB.HoldPort(qport, 0)
	qk := TupleKey{Local: queued.RemoteAddr().(*net.TCPAddr).AddrPort(), Remote: queued.LocalAddr().(*net.TCPAddr).AddrPort()}
	if p.devB.agree.AcceptedInHold(qk, time.Now()) {
		t.Fatal("a connection in the accept queue counts as skipped")
	}
}

package extds

import (
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
)

func TestHoldReason(t *testing.T) {
	for _, tc := range []struct {
		left time.Duration
		want uint8
		back time.Duration
	}{
		{0, 0x80, 0},
		{15 * time.Millisecond, 0x80, 0},
		{16 * time.Millisecond, 0x81, 16 * time.Millisecond},
		{time.Second, 0x80 | 62, 62 * holdQuantum},
		{MaxHold, 0xFF, MaxHold},
		{time.Minute, 0xFF, MaxHold},
	} {
		r := holdReason(tc.left)
		back, ok := holdOf(r)
		if r != tc.want || !ok || back != tc.back {
			t.Errorf("holdReason(%v) = %#x → %v %v, want %#x → %v", tc.left, r, back, ok, tc.want, tc.back)
		}
	}
	for _, r := range []uint8{0, declineNoListener, declineLate, declineBusy, declineMismatch, 0x7F} {
		if _, ok := holdOf(r); ok {
			t.Errorf("holdOf(%#x) is a hold", r)
		}
	}
}

// TestHoldPort: while the server's port is on hold a client's CLAIM is
// declined with the remaining time, the client then falls back without
// asking until that time (less the margin) is over, and nothing is
// written into the connection; an ended hold agrees again.
func TestHoldPort(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t)
	ln := testenv.ListenTCP(t)
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	unreg, err := p.devB.RegisterClaimPort(port)
	if err != nil {
		t.Fatal(err)
	}
	defer unreg()
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
		claim := p.devB.Claim(TupleKey{Local: sv.LocalAddr().(*net.TCPAddr).AddrPort(), Remote: sv.RemoteAddr().(*net.TCPAddr).AddrPort()})
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

package agree

import (
	"context"
	"net/netip"
	"testing"
	"time"
)

// TestHoldPeerFromSend: the client's window counts from the CLAIM's
// sending, so an answer read late shortens it instead of pushing it past
// the server's.
func TestHoldPeerFromSend(t *testing.T) {
	a := New(nil, Config{}, context.Background()) // holdPeer and PeerHold use no Host
	ap := netip.AddrPortFrom(netip.MustParseAddr("192.0.2.7"), 8080)
	const left = 500 * time.Millisecond
	for _, c := range []struct {
		name  string
		late  time.Duration // how long before now the CLAIM was sent
		upper time.Duration // PeerHold at most
	}{
		{"read at once", 0, left - 2*HoldMargin},
		{"read 100 ms late", 100 * time.Millisecond, left - 2*HoldMargin - 100*time.Millisecond},
		{"read after the window", left - HoldMargin, 0},
	} {
		a.holdPeer(ap, left, time.Now().Add(-c.late))
		h := a.PeerHold(ap)
		if h > c.upper || (c.upper > 0 && h < c.upper-50*time.Millisecond) {
			t.Errorf("%s: PeerHold = %v, want just under %v", c.name, h, c.upper)
		}
		a.negMu.Lock()
		clear(a.held)
		a.negMu.Unlock()
	}
}

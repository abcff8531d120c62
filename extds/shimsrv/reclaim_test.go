package shimsrv

import (
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
)

// TestReclaimIdle: a direct connection's outbound rings, once idle for
// the reclaimer's period, hold no page, on one host and across hosts
// where the fabric allows it; where it does not, or with the reclaimer
// off, the pages stay. The stream goes on unharmed either way.
func TestReclaimIdle(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	const idle = 20 * time.Millisecond
	for _, tc := range []struct {
		name    string
		mode    string
		cfg     DirectConfig // ReclaimIdle and ReclaimRemote only
		reclaim bool
	}{
		{"one host", "one host", DirectConfig{ReclaimIdle: idle}, true},
		{"one host, off", "one host", DirectConfig{ReclaimIdle: -1}, false},
		{"across hosts", "across hosts", DirectConfig{ReclaimIdle: idle, ReclaimRemote: true}, true},
		{"across hosts, a fabric that pins", "across hosts", DirectConfig{ReclaimIdle: idle}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b, _ := newDirectNodesWith(t, tc.mode, func(c *DirectConfig) {
				c.ReclaimIdle, c.ReclaimRemote = tc.cfg.ReclaimIdle, tc.cfg.ReclaimRemote
			})
			client, server := connectDirect(t, a, b, nil)
			ring := client.ep.Ring()
			exchange := func(n int, seed byte) { exchangeBoth(t, client, server, randBytes(n, uint64(seed))) }
			exchange(2*ring, 1) // every page of both rings written
			pages := func() (int, int) {
				c, err1 := client.ep.TxResident()
				s, err2 := server.ep.TxResident()
				if err1 != nil || err2 != nil {
					t.Fatal(err1, err2)
				}
				return c, s
			}
			if c, s := pages(); c != ring/4096 || s != ring/4096 {
				t.Fatalf("pages after traffic: %d and %d, want %d", c, s, ring/4096)
			}
			deadline := time.Now().Add(5 * time.Second)
			if !tc.reclaim {
				deadline = time.Now().Add(10 * idle)
			}
			for time.Now().Before(deadline) {
				if c, s := pages(); c == 0 && s == 0 {
					break
				}
				time.Sleep(idle / 2)
			}
			c, s := pages()
			freed := a.srv.Stats().DirectReclaims + b.srv.Stats().DirectReclaims
			if tc.reclaim && (c != 0 || s != 0 || freed != 2) {
				t.Fatalf("idle for %v: %d and %d pages resident, %d reclaims; want 0, 0, 2", 5*time.Second, c, s, freed)
			}
			if !tc.reclaim && (c != ring/4096 || s != ring/4096 || freed != 0) {
				t.Fatalf("reclaim off: %d and %d pages resident, %d reclaims; want %d each, none", c, s, freed, ring/4096)
			}
			exchange(3*ring+17, 2) // the stream goes on over the holes
		})
	}
}

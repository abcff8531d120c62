package shm

import (
	"slices"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/testenv"
)

// TestPeersChanged: the PeerWatcher channel closes when a peer is found
// and when one goes down, and Peers then says so; a watcher that re-reads
// the channel before Peers misses nothing.
func TestPeersChanged(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	name := uniqueFabric(t)
	a := openNIC(t, name, 1)
	w, ok := a.(fabric.PeerWatcher)
	if !ok {
		t.Fatalf("%T is not a fabric.PeerWatcher", a)
	}
	waitChange := func(what string, ch <-chan struct{}, want func([]fabric.NodeID) bool) {
		t.Helper()
		deadline := time.After(10 * time.Second) // a hang detector: the monitor period is 1 s
		for {
			select {
			case <-ch:
			case <-deadline:
				t.Fatalf("no peer-set change for %s; peers %v", what, a.Peers())
			}
			ch = w.PeersChanged()
			if want(a.Peers()) {
				return
			}
		}
	}
	ch := w.PeersChanged()
	b, err := Open(name, 2)
	if err != nil {
		t.Fatal(err)
	}
	waitChange("node 2 joining", ch, func(p []fabric.NodeID) bool { return slices.Contains(p, 2) })
	ch = w.PeersChanged()
	select {
	case <-ch:
		t.Fatal("the fresh channel is already closed with no change")
	default:
	}
	b.Close()
	waitChange("node 2 leaving", ch, func(p []fabric.NodeID) bool { return !slices.Contains(p, 2) })
}

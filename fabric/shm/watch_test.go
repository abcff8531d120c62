package shm

import (
	"context"
	"slices"
	"syscall"
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

// TestIdleProbesOnlyOnCloses: an idle node with a peer probes no peer
// lock period after period (its liveness cost does not grow with its
// peers); the peer's death, here a SIGKILL of its process, closes its
// files, and that close event makes the monitor probe and mark it down.
func TestIdleProbesOnlyOnCloses(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	name := uniqueFabric(t)
	a := openNIC(t, name, 1)
	n := a.(*nicT)
	if n.closes == nil {
		testenv.Unavailable(t, "no inotify: the monitor probes every period")
	}
	ep, err := a.Open(1)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd, _ := startChild(t, ctx, name, ep)
	testenv.Eventually(t, "node 2 up", 10*time.Second, func() bool { return slices.Contains(a.Peers(), 2) })
	// Two idle periods after the join's own probe round.
	time.Sleep(idleLivenessPeriod)
	r0 := n.WakeStats().ProbeRounds
	time.Sleep(2 * idleLivenessPeriod)
	if r := n.WakeStats().ProbeRounds; r != r0 {
		t.Fatalf("%d probe rounds in two idle periods, want none", r-r0)
	}
	ch := n.PeersChanged()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(10 * time.Second): // a hang detector
		t.Fatalf("node 2's death not seen; peers %v", a.Peers())
	}
	testenv.Eventually(t, "node 2 down", 10*time.Second, func() bool { return !slices.Contains(a.Peers(), 2) })
	if r := n.WakeStats().ProbeRounds; r == r0 {
		t.Fatal("node 2 went down without a probe round")
	}
}

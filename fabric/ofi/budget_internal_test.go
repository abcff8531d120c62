//go:build ofi && cgo

package ofi

import (
	"testing"
	"time"
)

// TestWaitBudget: parks halve the spin down to waitSpinMin; hits keep
// it; below waitSpin every waitProbe-th wait spins the whole waitSpin,
// and a hit of that probe restores the budget.
func TestWaitBudget(t *testing.T) {
	var b waitBudget
	if got := b.get(); got != waitSpin {
		t.Fatalf("fresh budget %v, want %v", got, waitSpin)
	}
	want := waitSpin
	for range 10 {
		b.parked()
		want = max(waitSpinMin, want/2)
		if got := time.Duration(b.ns.Load()); got != want {
			t.Fatalf("after a park: %v, want %v", got, want)
		}
	}
	if want != waitSpinMin {
		t.Fatalf("ten parks left %v, want the floor %v", want, waitSpinMin)
	}
	b.hit(waitSpinMin) // a hit of a short spin keeps it short
	probes := 0
	for i := 1; i <= 3*waitProbe; i++ {
		switch got := b.get(); got {
		case waitSpin:
			probes++
			if i%waitProbe != 0 {
				t.Fatalf("wait %d: probe out of turn", i)
			}
		case waitSpinMin:
		default:
			t.Fatalf("wait %d: spin %v", i, got)
		}
	}
	if probes != 3 {
		t.Fatalf("%d probes in %d waits, want 3", probes, 3*waitProbe)
	}
	b.hit(waitSpin) // a probe that hit
	for range 2 * waitProbe {
		if got := b.get(); got != waitSpin {
			t.Fatalf("after a probe hit: %v, want %v", got, waitSpin)
		}
	}
}

package testenv

import (
	"testing"
	"time"
)

// pollInterval is how often Eventually re-checks its condition: short
// against the waits it bounds (seconds), long enough not to hold a core.
const pollInterval = time.Millisecond

// Eventually polls cond until it holds, failing t if it does not within d.
// what names the awaited state in the failure.
func Eventually(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(pollInterval)
	}
}

// Go runs f in its own goroutine and returns a channel closed when f
// returns: a test's wait for its server or helper goroutine.
func Go(f func()) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	return done
}

// Within returns the value a call running in another goroutine sends on
// ch, failing t if none comes within d (the call is still blocked). what
// names the call in the failure.
func Within[T any](t testing.TB, what string, ch <-chan T, d time.Duration) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s still blocked after %v", what, d)
		var zero T
		return zero
	}
}

//go:build ofi && cgo

package ofi

import (
	"testing"
	"time"
)

// TestPeerDownAwaitsCalls: peerDown's wait for the libfabric calls in
// progress to a peer (awaitIdle) parks until the last one leaves, with
// no polling, and a call that tries to enter meanwhile is refused
// without being waited for.
func TestPeerDownAwaitsCalls(t *testing.T) {
	p := &peer{down: make(chan struct{}), idle: make(chan struct{}, 1)}
	p.isUp.Store(true)
	if !p.enter() {
		t.Fatal("enter on a peer that is up failed")
	}
	done := make(chan struct{})
	go func() {
		p.mu.Lock()
		p.isUp.Store(false)
		close(p.down)
		p.mu.Unlock()
		p.awaitIdle()
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("awaitIdle returned while a call was in progress")
	case <-time.After(20 * time.Millisecond):
	}
	if p.enter() {
		t.Fatal("enter on a peer that is down succeeded")
	}
	p.leave()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("awaitIdle did not return after the last call left")
	}
}

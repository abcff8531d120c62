//go:build ofi && cgo

package ofi

import (
	"context"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
)

// openPair opens two NICs of provider prov in this process and makes
// each the other's peer.
func openPair(t *testing.T, prov string, merge int) (*NIC, *NIC) {
	t.Helper()
	var nics [2]*NIC
	for i := range nics {
		cfg := Config{Provider: prov, Node: fabric.NodeID(i + 1), RMAMerge: merge}
		if prov == "tcp" || prov == "net" {
			cfg.Bind = "127.0.0.1:0"
		}
		n, err := open(cfg)
		if err != nil {
			t.Fatalf("open %s node %d: %v", prov, i+1, err)
		}
		t.Cleanup(func() { n.Close() })
		nics[i] = n
	}
	for i, a := range nics {
		name, err := a.Name()
		if err != nil {
			t.Fatal(err)
		}
		if err := nics[1-i].AddPeer(a.id, name); err != nil {
			t.Fatal(err)
		}
	}
	return nics[0], nics[1]
}

// EchoPair opens VPID 1 on a and b and echoes one message each way
// rounds times. echo, which it returns with the two endpoints, sends one
// message from one to the other and waits for it (ctx bounds both).
// Exported for the external tests too (wake_test.go).
func EchoPair(t *testing.T, ctx context.Context, a, b fabric.NIC, rounds int) (ea, eb fabric.Endpoint, echo func(from, to fabric.Endpoint)) {
	t.Helper()
	ea, eb = fabrictest.OpenEP(t, a, 1), fabrictest.OpenEP(t, b, 1)
	echo = func(from, to fabric.Endpoint) { fabrictest.SendRecv(t, ctx, from, to) }
	for range rounds {
		echo(ea, eb)
		echo(eb, ea)
	}
	return ea, eb, echo
}

// gather calls wait (a fabrictest wait helper) until it has n items, with
// a deadline.
func gather[T any](t *testing.T, n int, wait func(context.Context, []T) int) []T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []T
	buf := make([]T, 64)
	for len(out) < n {
		k := wait(ctx, buf)
		out = append(out, buf[:k]...)
	}
	return out
}

// collect waits until ep has n notifications and returns them.
func collect(t *testing.T, ep fabric.Endpoint, n int) []fabric.Notification {
	t.Helper()
	return gather(t, n, func(ctx context.Context, buf []fabric.Notification) int { return fabrictest.PollWait(t, ctx, ep, buf) })
}

// recvAll receives n messages on ep within a deadline.
func recvAll(t *testing.T, ep fabric.Endpoint, n int) []fabric.Message {
	t.Helper()
	return gather(t, n, func(ctx context.Context, buf []fabric.Message) int { return fabrictest.RecvWait(t, ctx, ep, buf) })
}

package fabnet

import (
	"context"
	"testing"

	"github.com/exn-project/exn/fabric"
)

// TestZeroAlloc proves the steady-state VELO and RMA paths (sender,
// writer, reader, receiver, all in this process) do not allocate.
func TestZeroAlloc(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage instrumentation allocates")
	}
	nics := cluster(t, 2, nil)
	a, _ := nics[0].Open(1)
	b, _ := nics[1].Open(1)
	defer a.Close()
	defer b.Close()
	ra, _ := a.Register(256 << 10)
	rb, _ := b.Register(256 << 10)
	ctx := context.Background()
	out := []fabric.Message{{Peer: b.Addr(), Len: 120}}
	in := make([]fabric.Message, 4)
	ns := make([]fabric.Notification, 4)
	recv := func() {
		for {
			if k, _ := b.Recv(in); k > 0 {
				return
			}
			b.Wait(ctx)
		}
	}
	rma := func(op fabric.Op) func() {
		req := []fabric.RMA{{Op: op, Peer: b.Addr(), Local: ra.NLA, Remote: rb.NLA, Len: 256 << 10, Notify: fabric.NotifyRequester}}
		return func() {
			a.Post(req)
			for {
				if k, _ := a.PollNotifications(ns); k > 0 {
					return
				}
				a.Wait(ctx)
			}
		}
	}
	cases := []struct {
		name string
		fn   func()
	}{
		{"send-recv", func() { a.Send(ctx, out); recv() }},
		{"put-256KiB", rma(fabric.OpPut)},
		{"get-256KiB", rma(fabric.OpGet)},
	}
	for _, tc := range cases {
		tc.fn() // warm up: first grant, pools, buffers
		// Allocations in other goroutines (the writer, the reader) count
		// too: AllocsPerRun reads process-wide statistics.
		if got := testing.AllocsPerRun(200, tc.fn); got > 0.1 {
			t.Errorf("%s: %v allocations per run, want 0", tc.name, got)
		}
	}
}

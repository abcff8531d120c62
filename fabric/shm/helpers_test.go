package shm

// Helpers shared by the package's tests: NICs and endpoints closed at the
// end of the test, one-message send and receive, polling for a condition.

import (
	"context"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/testenv"
)

// openNIC opens node of fab, closed at the end of the test.
func openNIC(t testing.TB, fab string, node fabric.NodeID, opts ...Option) fabric.NIC {
	t.Helper()
	nic, err := Open(fab, node, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nic.Close() })
	return nic
}

// lender returns nic's Lender side.
func lender(t testing.TB, nic fabric.NIC) Lender {
	t.Helper()
	l, ok := nic.(Lender)
	if !ok {
		t.Fatalf("%T is not a Lender", nic)
	}
	return l
}

// lendingPair opens nodes 1 (the owner, which lends VPIDs through l) and 2
// of a new fabric, closed at the end of the test.
func lendingPair(t testing.TB) (fab string, owner, peer fabric.NIC, l Lender) {
	t.Helper()
	fab = uniqueFabric(t)
	owner = openNIC(t, fab, 1)
	peer = openNIC(t, fab, 2)
	return fab, owner, peer, lender(t, owner)
}

// awaitOne takes one item with take (ep's Recv or PollNotifications),
// waiting on ep between tries, until ctx ends. It does not touch a
// testing.TB, so goroutines may call it.
func awaitOne[T any](ctx context.Context, ep fabric.Endpoint, take func([]T) (int, error)) (T, error) {
	var b [1]T
	for {
		n, err := take(b[:])
		if err != nil || n == 1 {
			return b[0], err
		}
		if err := ep.Wait(ctx); err != nil {
			return b[0], err
		}
	}
}

// recvOne waits for one message on ep.
func recvOne(t testing.TB, ctx context.Context, ep fabric.Endpoint) fabric.Message {
	t.Helper()
	m, err := awaitOne(ctx, ep, ep.Recv)
	if err != nil {
		t.Fatalf("receive on %v: %v", ep.Addr(), err)
	}
	return m
}

// pollOne waits for one notification on ep.
func pollOne(t testing.TB, ep fabric.Endpoint, ctx context.Context) fabric.Notification {
	t.Helper()
	n, err := awaitOne(ctx, ep, ep.PollNotifications)
	if err != nil {
		t.Fatalf("waiting for a notification: %v", err)
	}
	return n
}

// sendOne sends payload to to with tag.
func sendOne(t testing.TB, ctx context.Context, ep fabric.Endpoint, to fabric.Addr, tag fabric.Tag, payload string) {
	t.Helper()
	var m fabric.Message
	m.Peer, m.Tag = to, tag
	m.SetPayload([]byte(payload))
	if _, err := ep.Send(ctx, []fabric.Message{m}); err != nil {
		t.Fatalf("send to %v: %v", to, err)
	}
}

// waitFor polls cond for up to 5 s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, what, 5*time.Second, cond)
}

// echo sends every message that arrives on ep back out to to, until a
// tagStop (nil) or an error; a tagStall makes it stop receiving for good,
// so that its mailbox fills (the test then SIGKILLs the process). It runs
// in the re-executed child processes.
func echo(ctx context.Context, ep fabric.Endpoint, to fabric.Addr) error {
	buf := make([]fabric.Message, 16)
	for {
		n, err := ep.Recv(buf)
		if err != nil {
			return err
		}
		for i := range buf[:n] {
			switch buf[i].Tag {
			case tagStop:
				return nil
			case tagStall:
				select {} // hold the full mailbox until SIGKILL
			}
			buf[i].Peer = to
		}
		if _, err := ep.Send(ctx, buf[:n]); err != nil {
			return err
		}
		if n == 0 {
			if err := ep.Wait(ctx); err != nil {
				return err
			}
		}
	}
}

package shm

// Helpers shared by the package's tests: NICs and endpoints closed at the
// end of the test, one-message send and receive, polling for a condition.

import (
	"context"
	"errors"
	"os/exec"
	"strconv"
	"syscall"
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
	return serve(ctx, ep, 16, func(msgs []fabric.Message) (bool, error) {
		for i := range msgs {
			switch msgs[i].Tag {
			case tagStop:
				return true, nil
			case tagStall:
				select {} // hold the full mailbox until SIGKILL
			}
			msgs[i].Peer = to
		}
		_, err := ep.Send(ctx, msgs)
		return false, err
	})
}

// serve receives batches of up to batch messages on ep, waiting on ep
// while its mailbox is empty, and hands each batch to handle until handle
// says it is done or returns an error, or ep fails. The child processes
// run it, so it does not touch a testing.TB.
func serve(ctx context.Context, ep fabric.Endpoint, batch int, handle func([]fabric.Message) (done bool, err error)) error {
	buf := make([]fabric.Message, batch)
	for {
		n, err := ep.Recv(buf)
		if err != nil {
			return err
		}
		if n == 0 {
			if err := ep.Wait(ctx); err != nil {
				return err
			}
			continue
		}
		if done, err := handle(buf[:n]); done || err != nil {
			return err
		}
	}
}

// ---- child processes and wake-ups ----

// childEnv names the fabric a re-exec'd helper process joins (the
// helper tests' children: TestHelperProcess, TestAttachHelper).
const childEnv = "EXN_SHM_CHILD_FABRIC"

// Tags the helper processes and their parents exchange.
const (
	tagRegion = 1 // child → parent: its NLA, or "I am up"
	tagPing   = 2
	tagStop   = 9
	tagStall  = 10 // child stops receiving: its mailbox fills
)

// killAndAwait SIGKILLs the helper process cmd and reaps it, then checks
// that a call blocked on it (what) returns want on res within 5 s, and
// logs how long that took.
func killAndAwait(t testing.TB, cmd *exec.Cmd, what string, res <-chan error, want error) {
	t.Helper()
	killed := time.Now()
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	if err := testenv.Within(t, what+" after SIGKILL", res, 5*time.Second); !errors.Is(err, want) {
		t.Fatalf("%s after SIGKILL: %v, want %v", what, err, want)
	}
	t.Logf("%s returned %v after SIGKILL", what, time.Since(killed))
}

// startChild starts node 2 of fab in a helper process (TestHelperProcess's
// child, killed and reaped when the test ends) and waits, until ctx ends,
// for its announcement to ep (VPID 1 of node 1): the NLA of its region,
// from VPID 1 of node 2.
func startChild(t testing.TB, ctx context.Context, fab string, ep fabric.Endpoint) (*exec.Cmd, fabric.NLA) {
	t.Helper()
	cmd := testenv.StartHelper(t, "TestHelperProcess", childEnv+"="+fab)
	m := recvOne(t, ctx, ep)
	if child := (fabric.Addr{Node: 2, VPID: 1}); m.Tag != tagRegion || m.Peer != child {
		t.Fatalf("child's first message %+v, want its region announcement from %v", m, child)
	}
	v, err := strconv.ParseUint(string(m.Payload()), 10, 64)
	if err != nil {
		t.Fatalf("child's region announcement %q: %v", m.Payload(), err)
	}
	return cmd, fabric.NLA(v)
}

// openChildNode opens node 2 of fab, and its VPID 1, in a helper process.
func openChildNode(fab string, opts ...Option) (fabric.NIC, fabric.Endpoint, error) {
	nic, err := Open(fab, 2, opts...)
	if err != nil {
		return nil, nil, err
	}
	ep, err := nic.Open(1)
	if err != nil {
		nic.Close()
		return nil, nil, err
	}
	return nic, ep, nil
}

// withBackstop sets how long one Wait sleep may last before it re-checks
// (waitSlice by default). The tests lengthen it so that a Wait that
// returns promptly can only have been woken by a producer.
func withBackstop(d time.Duration) Option {
	return func(o *options) error { o.backstop, o.bellBackstop = d, d; return nil }
}

// withoutBell makes the NIC's VPIDs wait on their futex (the fallback).
func withoutBell() Option {
	return func(o *options) error { o.noBell = true; return nil }
}

// wakeStats reads nic's doorbell and futex counters.
func wakeStats(t testing.TB, nic fabric.NIC) WakeStats {
	t.Helper()
	w, ok := nic.(interface{ WakeStats() WakeStats })
	if !ok {
		t.Fatalf("%T has no WakeStats", nic)
	}
	return w.WakeStats()
}

package shm

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
	"github.com/exn-project/exn/internal/testenv"
)

// The child process (node 2) of TestTwoProcesses, run by
// TestHelperProcess (childEnv names the fabric). It opens VPID 1,
// registers a region of childRegionSize filled with pattern, sends its
// NLA (tagRegion), then echoes every message back until it is killed or
// told to stop (tagStop).
const childRegionSize = 64 << 10

func pattern(i int) byte { return byte(i*7 + 3) }

// TestHelperProcess is the child of TestTwoProcesses.
func TestHelperProcess(t *testing.T) {
	testenv.RunHelper(t, childEnv, "child", child)
}

func child(fab string) error {
	nic, ep, err := openChildNode(fab, WithSlots(8))
	if err != nil {
		return err
	}
	defer nic.Close()
	r, err := ep.Register(childRegionSize)
	if err != nil {
		return err
	}
	for i := range r.Buf {
		r.Buf[i] = pattern(i)
	}
	var m fabric.Message
	m.Peer = fabric.Addr{Node: 1, VPID: 1}
	m.Tag = tagRegion
	m.SetPayload([]byte(strconv.FormatUint(uint64(r.NLA), 10)))
	ctx := context.Background()
	if _, err := ep.Send(ctx, []fabric.Message{m}); err != nil {
		return err
	}
	return echo(ctx, ep, fabric.Addr{Node: 1, VPID: 1})
}

// TestTwoProcesses runs node 2 in a second OS process: VELO ping-pong, an
// RMA GET of the child's region checked by content, then SIGKILL of the
// child while this process is blocked sending to its full mailbox. The
// blocked Send must return ErrPeerDown promptly, RMA to it must give an
// NErrPeerDown notification, and the child's files must be reclaimed.
func TestTwoProcesses(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	testenv.VerifyNoFDLeaks(t)
	fab, nic, ep := nodeOne(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	recv1 := func() fabric.Message { t.Helper(); return recvOne(t, ctx, ep) }
	child := fabric.Addr{Node: 2, VPID: 1}

	// 1. The child announces its region.
	cmd, remote := startChild(t, ctx, fab, ep)
	if err := nic.Alive(2); err != nil {
		t.Fatalf("Alive(2) = %v", err)
	}

	// 2. Ping-pong.
	for i := 0; i < 100; i++ {
		var p fabric.Message
		p.Peer, p.Tag = child, tagPing
		p.SetPayload([]byte(strconv.Itoa(i)))
		if _, err := ep.Send(ctx, []fabric.Message{p}); err != nil {
			t.Fatal(err)
		}
		if r := recv1(); string(r.Payload()) != strconv.Itoa(i) || r.Peer != child {
			t.Fatalf("pong %d: %q from %v", i, r.Payload(), r.Peer)
		}
	}

	// 3. RMA GET of the child's region, checked by content.
	local := fabrictest.Register(t, ep, childRegionSize)
	if _, err := ep.Post([]fabric.RMA{{Op: fabric.OpGet, Peer: child, Local: local.NLA, Remote: remote,
		Len: childRegionSize, Notify: fabric.NotifyRequester}}); err != nil {
		t.Fatal(err)
	}
	nt := pollOne(t, ep, ctx)
	if nt.Err != fabric.NErrNone || nt.Kind != fabric.KindRequester || nt.Local != fabric.LastFrame(local.NLA, childRegionSize) {
		t.Fatalf("get notification %+v", nt)
	}
	for i, b := range local.Buf {
		if b != pattern(i) {
			t.Fatalf("byte %d = %d, want %d", i, b, pattern(i))
		}
	}

	// 4. Stall the child, fill its mailbox, SIGKILL it while blocked.
	var stall fabric.Message
	stall.Peer, stall.Tag = child, tagStall
	if _, err := ep.Send(ctx, []fabric.Message{stall}); err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() {
		msgs := make([]fabric.Message, 64) // > 8 slots
		for i := range msgs {
			msgs[i].Peer, msgs[i].Tag = child, tagPing
		}
		_, err := ep.Send(ctx, msgs)
		res <- err
	}()
	for nic.Stats().SendBlocked == 0 {
		time.Sleep(time.Millisecond)
	}
	killAndAwait(t, cmd, "blocked send to the child", res, fabric.ErrPeerDown)
	if err := nic.Alive(2); !errors.Is(err, fabric.ErrPeerDown) {
		t.Fatalf("Alive(2) after kill = %v, want ErrPeerDown", err)
	}
	if _, err := ep.Post([]fabric.RMA{{Op: fabric.OpGet, Peer: child, Local: local.NLA, Remote: remote, Len: 64}}); err != nil {
		t.Fatal(err)
	}
	if nt := pollOne(t, ep, ctx); nt.Err != fabric.NErrPeerDown || nt.Local != local.NLA {
		t.Fatalf("rma to a dead peer: %+v, want NErrPeerDown", nt)
	}
	// Only node 1's files may remain.
	deadline := time.Now().Add(5 * time.Second)
	for {
		var child []string
		for _, f := range fabricFiles(t, fab) {
			if name := f[len("/dev/shm/exn-"+fab+"-"):]; len(name) > 2 && name[:2] == "n2" {
				child = append(child, f)
			}
		}
		if len(child) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dead child's files not reclaimed: %v", child)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A restarted node 2 rejoins under the same ID.
	again, err := Open(fab, 2)
	if err != nil {
		t.Fatalf("reopen node 2: %v", err)
	}
	again.Close()
}

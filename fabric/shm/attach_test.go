package shm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
	"github.com/exn-project/exn/internal/testenv"
)

// TestAttachGrants: grant checks (bad tokens, wrong PID, wrong node, a
// revoked grant, VPIDs outside the grant, double attach, overlapping
// grants), then the attached endpoints do VELO and RMA both ways with a
// peer node while the owner's counters show none of it, and Close
// releases exactly the attachment's VPIDs and files.
func TestAttachGrants(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	testenv.VerifyNoFDLeaks(t)
	fab, owner, peerNIC, l := lendingPair(t)
	own := fabrictest.OpenEP(t, owner, 20)

	// Grant validation.
	for _, c := range []struct {
		base       fabric.VPID
		count, pid int
		want       error
	}{
		{0, 16, 0, fabric.ErrInvalid},   // EXT-Eth's VPID
		{250, 16, 0, fabric.ErrInvalid}, // past 255
		{32, 0, 0, fabric.ErrInvalid},
		{32, 16, -1, fabric.ErrInvalid},
		{16, 16, 0, fabric.ErrInUse}, // VPID 20 is open in the owner
	} {
		if _, err := l.Grant(c.base, c.count, c.pid); !errors.Is(err, c.want) {
			t.Errorf("Grant(%d, %d, %d) = %v, want %v", c.base, c.count, c.pid, err, c.want)
		}
	}
	g, err := l.Grant(32, 16, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Grant(40, 16, 0); !errors.Is(err, fabric.ErrInUse) {
		t.Fatalf("overlapping grant: %v", err)
	}
	other, err := l.Grant(64, 16, 1) // for pid 1: not us
	if err != nil {
		t.Fatal(err)
	}
	if s := l.LeaseStats(); s.Granted != 2 || s.Refused != 6 {
		t.Fatalf("lease stats %+v, want 2 granted, 6 refused", s)
	}

	// Attach refusals.
	bad := func(mod func(*Grant)) Grant { x := g; mod(&x); return x }
	tok := g.Token
	flip := tok[:len(tok)-1] + map[bool]string{true: "0", false: "1"}[tok[len(tok)-1] != '0']
	for name, c := range map[string]struct {
		g    Grant
		node fabric.NodeID
		want error
	}{
		"garbage token":    {bad(func(x *Grant) { x.Token = "nope" }), 1, fabric.ErrInvalid},
		"wrong secret":     {bad(func(x *Grant) { x.Token = flip }), 1, fabric.ErrInvalid},
		"wrong slot":       {bad(func(x *Grant) { x.Token = "s9" + tok[2:] }), 1, fabric.ErrInvalid},
		"wrong base":       {bad(func(x *Grant) { x.VPIDBase = 33 }), 1, fabric.ErrInvalid},
		"wrong node":       {bad(func(x *Grant) { x.Node = 2 }), 2, fabric.ErrInvalid},
		"node mismatch":    {g, 2, fabric.ErrInvalid},
		"other pid's":      {other, 1, fabric.ErrInvalid},
		"node not up":      {bad(func(x *Grant) { x.Node = 7 }), 7, fabric.ErrPeerDown},
		"vpid 0 in grant":  {bad(func(x *Grant) { x.VPIDBase = 0 }), 1, fabric.ErrInvalid},
		"too many vpids":   {bad(func(x *Grant) { x.VPIDs = 300 }), 1, fabric.ErrInvalid},
		"wrong fabric":     {bad(func(x *Grant) { x.Fabric = "zz" }), 1, fabric.ErrInvalid},
		"revoked (stale)":  {other, 1, fabric.ErrInvalid},
		"incarnation skew": {bad(func(x *Grant) { x.Token = "s0.00000000000000ff" + tok[strings.LastIndex(tok, "."):] }), 1, fabric.ErrInvalid},
	} {
		if a, err := Attach(fab, c.node, c.g); !errors.Is(err, c.want) {
			if a != nil {
				a.Close()
			}
			t.Errorf("%s: Attach = %v, want %v", name, err, c.want)
		}
	}
	if err := l.Revoke(other); err != nil {
		t.Fatal(err)
	}
	if err := l.Revoke(other); !errors.Is(err, fabric.ErrInvalid) {
		t.Fatalf("second revoke: %v", err)
	}
	waitFor(t, "the revoked lease to be freed", func() bool { return len(l.Leases()) == 1 })

	a, err := Attach(fab, 1, g)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a2, err := Attach(fab, 1, g); !errors.Is(err, fabric.ErrInUse) {
		if a2 != nil {
			a2.Close()
		}
		t.Fatalf("double attach: %v", err)
	}
	if ls := l.Leases(); len(ls) != 1 || !ls[0].Attached || ls[0].Holder != os.Getpid() {
		t.Fatalf("leases %+v", ls)
	}
	for _, v := range []fabric.VPID{0, 20, 31, 48, 255} {
		if ep, err := a.Open(v); !errors.Is(err, fabric.ErrInvalid) {
			if ep != nil {
				ep.Close()
			}
			t.Errorf("attached Open(%d) = %v, want ErrInvalid", v, err)
		}
	}
	ep, err := a.Open(32)
	if err != nil {
		t.Fatal(err)
	}
	if ep.Addr() != (fabric.Addr{Node: 1, VPID: 32}) {
		t.Fatalf("addr %v", ep.Addr())
	}
	if _, err := a.Open(32); !errors.Is(err, fabric.ErrInUse) {
		t.Fatalf("second attached Open(32): %v", err)
	}
	// The owner cannot take a VPID its holder has open (the VPID file is
	// the one owner across processes).
	if e, err := owner.Open(32); !errors.Is(err, fabric.ErrInUse) {
		if e != nil {
			e.Close()
		}
		t.Fatalf("owner Open(32) while attached: %v", err)
	}

	// Traffic between the attached endpoint and node 2.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	pe := fabrictest.OpenEP(t, peerNIC, 5)
	sendOne(t, ctx, pe, fabric.Addr{Node: 1, VPID: 32}, 3, "to the app")
	if m := recvOne(t, ctx, ep); string(m.Payload()) != "to the app" || m.Peer != (fabric.Addr{Node: 2, VPID: 5}) {
		t.Fatalf("app got %q from %v", m.Payload(), m.Peer)
	}
	sendOne(t, ctx, ep, fabric.Addr{Node: 2, VPID: 5}, 4, "from the app")
	if m := recvOne(t, ctx, pe); string(m.Payload()) != "from the app" || m.Peer != (fabric.Addr{Node: 1, VPID: 32}) {
		t.Fatalf("peer got %q from %v", m.Payload(), m.Peer)
	}
	// The attached process reaches the owner's own VPIDs too.
	sendOne(t, ctx, ep, fabric.Addr{Node: 1, VPID: 20}, 4, "hello owner")
	if m := recvOne(t, ctx, own); string(m.Payload()) != "hello owner" || m.Peer != (fabric.Addr{Node: 1, VPID: 32}) {
		t.Fatalf("owner got %q from %v", m.Payload(), m.Peer)
	}
	// RMA: the app's region lies in its lease's block; node 2 GETs it
	// and the app PUTs into node 2's.
	r := fabrictest.Register(t, ep, 8192)
	if idx := r.NLA.Region(); idx < leaseRegionLo(0) || idx >= leaseRegionLo(0)+leaseRegions {
		t.Fatalf("attached region index %d outside lease block %d+%d", idx, leaseRegionLo(0), leaseRegions)
	}
	for i := range r.Buf {
		r.Buf[i] = byte(i * 13)
	}
	pr := fabrictest.Register(t, pe, 8192)
	if _, err := pe.Post([]fabric.RMA{{Op: fabric.OpGet, Peer: ep.Addr(), Local: pr.NLA, Remote: r.NLA, Len: 8192,
		Notify: fabric.NotifyRequester | fabric.NotifyResponder}}); err != nil {
		t.Fatal(err)
	}
	if nt := pollOne(t, pe, ctx); nt.Err != fabric.NErrNone {
		t.Fatalf("peer GET from app: %+v", nt)
	}
	if nt := pollOne(t, ep, ctx); nt.Kind != fabric.KindResponder || nt.Peer != pe.Addr() {
		t.Fatalf("app responder notification %+v", nt)
	}
	for i, b := range pr.Buf {
		if b != byte(i*13) {
			t.Fatalf("GET byte %d = %d", i, b)
		}
	}
	clear(r.Buf)
	if _, err := ep.Post([]fabric.RMA{{Op: fabric.OpGet, Peer: pe.Addr(), Local: r.NLA, Remote: pr.NLA, Len: 8192,
		Notify: fabric.NotifyRequester}}); err != nil {
		t.Fatal(err)
	}
	if nt := pollOne(t, ep, ctx); nt.Err != fabric.NErrNone {
		t.Fatalf("app GET from peer: %+v", nt)
	}
	if r.Buf[100] != byte(100*13%256) {
		t.Fatal("app GET did not copy")
	}
	// Kernel bypass: none of this went through the owner's NIC (it only
	// received the one message for VPID 20).
	if s := owner.Stats(); s.VELOSent != 0 || s.VELORecv != 1 || s.RMABytes != 0 {
		t.Fatalf("owner stats %+v: traffic went through the owner", s)
	}
	if s := a.Stats(); s.VELOSent != 2 || s.VELORecv != 1 || s.RMABytes != 8192 {
		t.Fatalf("attached stats %+v", s)
	}

	// Close releases the attachment only: its VPID and region files go,
	// the lease is reclaimed, the owner and its VPID stay.
	ep.Close()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Open(33); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Open after Close: %v", err)
	}
	waitFor(t, "the lease to be reclaimed", func() bool { return len(l.Leases()) == 0 })
	for _, f := range fabricFiles(t, fab) {
		if strings.Contains(f, "-v32") || strings.Contains(f, "-a0") || strings.Contains(f, fmt.Sprintf("-r%d.", r.NLA.Region())) {
			t.Fatalf("file left after detach: %s", f)
		}
	}
	if err := owner.Alive(1); err != nil {
		t.Fatal(err)
	}
	sendOne(t, ctx, pe, fabric.Addr{Node: 1, VPID: 20}, 4, "owner still here")
	if m := recvOne(t, ctx, own); string(m.Payload()) != "owner still here" {
		t.Fatalf("owner got %q", m.Payload())
	}
	var m fabric.Message
	m.Peer = fabric.Addr{Node: 1, VPID: 32}
	if _, err := pe.Send(ctx, []fabric.Message{m}); !errors.Is(err, fabric.ErrUnknownNode) {
		t.Fatalf("send to a detached VPID: %v", err)
	}
	// The slot and the VPIDs can be granted again; the new holder's
	// region generation moved on.
	g2, err := l.Grant(32, 16, 0)
	if err != nil {
		t.Fatal(err)
	}
	a2, err := Attach(fab, 1, g2)
	if err != nil {
		t.Fatal(err)
	}
	ep2, err := a2.Open(32)
	if err != nil {
		t.Fatal(err)
	}
	r2 := fabrictest.Register(t, ep2, 64)
	if r2.NLA.Region() == r.NLA.Region() {
		if _, err := pe.Post([]fabric.RMA{{Op: fabric.OpGet, Peer: ep2.Addr(), Local: pr.NLA, Remote: r2.NLA, Len: 64, Notify: fabric.NotifyRequester}}); err != nil {
			t.Fatal(err)
		}
		if nt := pollOne(t, pe, ctx); nt.Err != fabric.NErrNone {
			t.Fatalf("GET from the new holder's region: %+v", nt)
		}
	}
	// Revoking a live attachment: the holder loses it promptly, its
	// endpoint calls fail, and the slot is reclaimed once it let go.
	waitErr := make(chan error, 1)
	go func() { waitErr <- ep2.Wait(context.Background()) }()
	if err := l.Revoke(g2); err != nil {
		t.Fatal(err)
	}
	if err := testenv.Within(t, "Wait after the lease was revoked", waitErr, 5*time.Second); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Wait after revoke: %v", err)
	}
	<-a2.Done()
	// The lost attachment's region stays mapped until a2.Close: an
	// application still copying into it must not fault (an unmap here
	// would kill the test binary with SIGSEGV).
	for i := range r2.Buf {
		r2.Buf[i] ^= 0x5a
	}
	if err := a2.Err(); !errors.Is(err, fabric.ErrPeerDown) {
		t.Fatalf("Err after revoke: %v", err)
	}
	if _, err := a2.Open(33); !errors.Is(err, fabric.ErrPeerDown) {
		t.Fatalf("Open after revoke: %v", err)
	}
	waitFor(t, "the revoked lease to be reclaimed", func() bool { return len(l.Leases()) == 0 })
	a2.Close()
	if s := l.LeaseStats(); s.Revoked != 2 || s.Reclaimed != 3 || s.HolderDied != 0 {
		t.Fatalf("lease stats %+v", s)
	}
}

// The attach helper process. Role "app": read a grant from stdin, attach,
// open the granted base VPID, report, then echo to node 2 VPID 5 until
// killed. Role "owner": open node 1, grant VPIDs 32.. to the parent, write
// the grant, then wait to be killed.
const attachRoleEnv = "EXN_SHM_ATTACH_ROLE"

func TestAttachHelper(t *testing.T) {
	role := os.Getenv(attachRoleEnv)
	if role == "" {
		t.Skip("helper process for the attach tests")
	}
	fab := os.Getenv(childEnv)
	if err := attachHelper(role, fab); err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func attachHelper(role, fab string) error {
	switch role {
	case "owner":
		nic, err := Open(fab, 1)
		if err != nil {
			return err
		}
		g, err := nic.(Lender).Grant(32, 16, os.Getppid())
		if err != nil {
			return err
		}
		b, _ := json.Marshal(g)
		fmt.Println(string(b))
		select {}
	case "app":
		line, err := bufio.NewReader(os.Stdin).ReadString('\n')
		if err != nil {
			return err
		}
		var g Grant
		if err := json.Unmarshal([]byte(line), &g); err != nil {
			return err
		}
		a, err := Attach(fab, g.Node, g)
		if err != nil {
			return err
		}
		if _, err := a.Open(g.VPIDBase - 1); !errors.Is(err, fabric.ErrInvalid) {
			return fmt.Errorf("open outside the grant: %v", err)
		}
		ep, err := a.Open(g.VPIDBase)
		if err != nil {
			return err
		}
		fmt.Println("OK", ep.Addr())
		ctx := context.Background()
		return echo(ctx, ep, fabric.Addr{Node: 2, VPID: 5})
	}
	return fmt.Errorf("unknown role %q", role)
}

func startHelper(t *testing.T, role, fab string) (*exec.Cmd, *bufio.Reader, func(string)) {
	t.Helper()
	cmd, stdin, stdout := testenv.StartPipedHelper(t, "TestAttachHelper", childEnv+"="+fab, attachRoleEnv+"="+role)
	return cmd, bufio.NewReader(stdout), func(s string) {
		if _, err := fmt.Fprintln(stdin, s); err != nil {
			t.Fatal(err)
		}
	}
}

func readLine(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	ch := make(chan string, 1)
	go func() {
		s, _ := r.ReadString('\n')
		ch <- strings.TrimSpace(s)
	}()
	select {
	case s := <-ch:
		return s
	case <-time.After(20 * time.Second):
		t.Fatal("helper process said nothing for 20 s")
		return ""
	}
}

// TestAttachChildApp: a re-exec'd child attaches to node 1 (owned by this
// process) with a grant made for its PID and echoes node 2's messages; it
// cannot open a VPID outside the grant, and the grant is useless to this
// process (wrong PID). SIGKILLing it while node 2 is blocked sending to
// its full mailbox: the owner's sweep reclaims the lease, the blocked send
// ends with ErrUnknownNode, and none of the child's files remain.
func TestAttachChildApp(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	fab, owner, peerNIC, l := lendingPair(t)
	pe := fabrictest.OpenEP(t, peerNIC, 5)

	cmd, out, say := startHelper(t, "app", fab)
	g, err := l.Grant(32, 16, cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if a, err := Attach(fab, 1, g); !errors.Is(err, fabric.ErrInvalid) {
		if a != nil {
			a.Close()
		}
		t.Fatalf("attaching another process's grant: %v", err)
	}
	b, _ := json.Marshal(g)
	say(string(b))
	if s := readLine(t, out); s != "OK 1:32" {
		t.Fatalf("child: %q", s)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	app := fabric.Addr{Node: 1, VPID: 32}
	for i := 0; i < 100; i++ {
		sendOne(t, ctx, pe, app, 2, fmt.Sprint(i))
		if m := recvOne(t, ctx, pe); string(m.Payload()) != fmt.Sprint(i) || m.Peer != app {
			t.Fatalf("echo %d: %q from %v", i, m.Payload(), m.Peer)
		}
	}
	if ls := l.Leases(); len(ls) != 1 || ls[0].Holder != cmd.Process.Pid || !ls[0].Attached {
		t.Fatalf("leases %+v", ls)
	}

	sendOne(t, ctx, pe, app, tagStall, "")
	res := make(chan error, 1)
	go func() {
		msgs := make([]fabric.Message, 4*DefaultSlots)
		for i := range msgs {
			msgs[i].Peer, msgs[i].Tag = app, 2
		}
		_, err := pe.Send(ctx, msgs)
		res <- err
	}()
	waitFor(t, "the send to block", func() bool { return peerNIC.Stats().SendBlocked > 0 })
	killAndAwait(t, cmd, "blocked send to the app", res, fabric.ErrUnknownNode)
	waitFor(t, "the lease to be reclaimed", func() bool { return len(l.Leases()) == 0 })
	if s := l.LeaseStats(); s.HolderDied != 1 || s.Reclaimed != 1 {
		t.Fatalf("lease stats %+v", s)
	}
	for _, f := range fabricFiles(t, fab) {
		if strings.Contains(f, "-v32") || strings.Contains(f, "-a0") {
			t.Fatalf("dead app's file left: %s", f)
		}
	}
	if err := owner.Alive(1); err != nil {
		t.Fatal(err)
	}
}

// TestAttachOwnerDies: the owner (exnd's role) is a re-exec'd child; this
// process attaches with its grant. SIGKILLing the owner ends the
// attachment within a monitor period or so: a blocked Wait returns
// net.ErrClosed, Done closes, Open and Alive(node) say ErrPeerDown, and no
// file of the fabric remains once everything is closed.
func TestAttachOwnerDies(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	testenv.VerifyNoFDLeaks(t)
	fab := uniqueFabric(t)
	cmd, out, _ := startHelper(t, "owner", fab)
	var g Grant
	if err := json.Unmarshal([]byte(readLine(t, out)), &g); err != nil {
		t.Fatal(err)
	}
	a, err := Attach(fab, 1, g)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ep, err := a.Open(33)
	if err != nil {
		t.Fatal(err)
	}
	peerNIC := openNIC(t, fab, 2)
	pe := fabrictest.OpenEP(t, peerNIC, 5)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	sendOne(t, ctx, pe, ep.Addr(), 1, "x")
	if m := recvOne(t, ctx, ep); string(m.Payload()) != "x" {
		t.Fatal("no delivery")
	}
	waitErr := make(chan error, 1)
	go func() { waitErr <- ep.Wait(context.Background()) }()
	time.Sleep(20 * time.Millisecond) // let it sleep on the futex
	killAndAwait(t, cmd, "Wait on the owner's node", waitErr, net.ErrClosed)
	select {
	case <-a.Done():
	case <-time.After(time.Second):
		t.Fatal("Done not closed")
	}
	if err := a.Err(); !errors.Is(err, fabric.ErrPeerDown) {
		t.Fatalf("Err: %v", err)
	}
	if _, err := a.Open(34); !errors.Is(err, fabric.ErrPeerDown) {
		t.Fatalf("Open after the owner died: %v", err)
	}
	if err := a.Alive(1); !errors.Is(err, fabric.ErrPeerDown) {
		t.Fatalf("Alive(own node) after the owner died: %v", err)
	}
	if _, err := ep.Send(ctx, []fabric.Message{{Peer: pe.Addr()}}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Send after the owner died: %v", err)
	}
	waitFor(t, "node 2 to see node 1 down", func() bool { return errors.Is(peerNIC.Alive(1), fabric.ErrPeerDown) })
	// A restarted owner of node 1 rejoins; the stale grant is refused.
	openNIC(t, fab, 1)
	if a2, err := Attach(fab, 1, g); err == nil {
		a2.Close()
		t.Fatal("a grant of the dead owner attached to its successor")
	}
}

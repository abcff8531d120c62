package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
	"github.com/exn-project/exn/internal/testenv"
)

// longBackstop is far longer than any round trip the tests accept
// (promptWake), so a wake-up within promptWake came from a producer.
const (
	longBackstop = 20 * time.Second
	promptWake   = 3 * time.Second
	bellChildEnv = "EXN_SHM_BELL_CHILD"
	// bellDelay is how long each side waits before it sends, so the
	// other's Wait is long: asleep in the netpoller, not spinning.
	bellDelay = 1000 * spinBudget
	tagReport = 11 // child → parent: its WakeStats, then it exits
)

// TestBellHelper is the child of TestBellWakeAcrossProcesses: node 2,
// VPID 1, a long backstop. It announces itself, then answers every ping
// after bellDelay, sleeping in Wait between pings; on tagStop it reports
// its wake counters and exits.
func TestBellHelper(t *testing.T) {
	testenv.RunHelper(t, bellChildEnv, "bell child", bellChild)
}

// wakeModeEnv selects the child's sleep mechanism and removes its reply
// delay (BenchmarkWakeAcrossProcesses).
const wakeModeEnv = "EXN_SHM_WAKE_MODE"

// wakeModeOpts: "futex" sleeps only on the futex (the fallback), "bell"
// only in the netpoller, "spin" as Wait does by default (spinBudget,
// then the netpoller).
func wakeModeOpts(mode string) []Option {
	noSpin := func(o *options) error { o.noSpin = true; return nil }
	switch mode {
	case "futex":
		return []Option{withBackstop(longBackstop), withoutBell(), noSpin}
	case "bell":
		return []Option{withBackstop(longBackstop), noSpin}
	}
	return []Option{withBackstop(longBackstop)}
}

func bellChild(fab string) error {
	opts, delay := []Option{withBackstop(longBackstop)}, bellDelay
	if mode := os.Getenv(wakeModeEnv); mode != "" {
		opts, delay = wakeModeOpts(mode), 0
	}
	nic, ep, err := openChildNode(fab, opts...)
	if err != nil {
		return err
	}
	defer nic.Close()
	ctx := context.Background()
	parent := fabric.Addr{Node: 1, VPID: 1}
	var m fabric.Message
	m.Peer, m.Tag = parent, tagRegion
	if _, err := ep.Send(ctx, []fabric.Message{m}); err != nil {
		return err
	}
	return serve(ctx, ep, 4, func(msgs []fabric.Message) (bool, error) {
		for i := range msgs {
			if msgs[i].Tag == tagStop {
				w := nic.(*nicT).WakeStats()
				var r fabric.Message
				r.Peer, r.Tag = parent, tagReport
				var b [16]byte
				binary.LittleEndian.PutUint64(b[:], w.BellRings)
				binary.LittleEndian.PutUint64(b[8:], w.BellSleeps)
				r.SetPayload(b[:])
				_, err := ep.Send(ctx, []fabric.Message{r})
				return true, err
			}
			time.Sleep(delay)
			msgs[i].Peer = parent
			if _, err := ep.Send(ctx, msgs[i:i+1]); err != nil {
				return false, err
			}
		}
		return false, nil
	})
}

// TestBellWakeAcrossProcesses: a Wait asleep on its doorbell FIFO is woken
// by a sender in another process (and the other way round), with the
// backstop at 20 s in both, so every prompt round trip proves a ring.
func TestBellWakeAcrossProcesses(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	testenv.VerifyNoFDLeaks(t)
	fab, nic, ep := nodeOne(t, withBackstop(longBackstop))
	cmd := testenv.StartHelper(t, "TestBellHelper", bellChildEnv+"="+fab)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	recv1 := func() fabric.Message { t.Helper(); return recvOne(t, ctx, ep) }
	if m := recv1(); m.Tag != tagRegion {
		t.Fatalf("first message tag %d", m.Tag)
	}
	// The FIFO is where the docs say, and is a FIFO.
	bell := nic.(*nicT).vpidPath(1, nic.(*nicT).inc, 1) + ".bell"
	if st, err := os.Stat(bell); err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("doorbell %s: %v %v", bell, st, err)
	}
	child := fabric.Addr{Node: 2, VPID: 1}
	before := wakeStats(t, nic)
	const rounds = 20
	var rtts []time.Duration
	for i := 0; i < rounds; i++ {
		var p fabric.Message
		p.Peer, p.Tag = child, tagPing
		p.SetPayload([]byte(strconv.Itoa(i)))
		time.Sleep(bellDelay) // the child's Wait is long too
		start := time.Now()
		if _, err := ep.Send(ctx, []fabric.Message{p}); err != nil {
			t.Fatal(err)
		}
		if r := recv1(); string(r.Payload()) != strconv.Itoa(i) {
			t.Fatalf("pong %d: %q", i, r.Payload())
		}
		rtt := time.Since(start)
		if rtt > promptWake {
			t.Fatalf("round %d took %v: the Wait was not woken by the child's ring", i, rtt)
		}
		rtts = append(rtts, rtt)
	}
	after := wakeStats(t, nic)
	sort.Slice(rtts, func(i, j int) bool { return rtts[i] < rtts[j] })
	t.Logf("round trips with a %v reply delay: median %v, max %v; wake stats %+v", bellDelay, rtts[rounds/2], rtts[rounds-1], after)
	if got := after.BellSleeps - before.BellSleeps; got < rounds/2 {
		t.Errorf("only %d of %d Waits slept on the doorbell", got, rounds)
	}
	if after.BellFallback != 0 || after.RingFailed != 0 {
		t.Errorf("fallback used: %+v", after)
	}
	var stop fabric.Message
	stop.Peer, stop.Tag = child, tagStop
	if _, err := ep.Send(ctx, []fabric.Message{stop}); err != nil {
		t.Fatal(err)
	}
	r := recv1()
	if r.Tag != tagReport || r.Len != 16 {
		t.Fatalf("report %+v", r)
	}
	rings, sleeps := binary.LittleEndian.Uint64(r.Payload()), binary.LittleEndian.Uint64(r.Payload()[8:])
	t.Logf("child: %d rings, %d doorbell sleeps", rings, sleeps)
	if rings < rounds/2 || sleeps < rounds/2 {
		t.Errorf("child rang %d times and slept %d times on its doorbell, want both >= %d", rings, sleeps, rounds/2)
	}
	if got := after.BellRings - before.BellRings; got < rounds/2 {
		t.Errorf("this process rang the child's doorbell %d times, want >= %d", got, rounds/2)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
}

// TestBellReclaimedWithDeadIncarnation: a SIGKILLed node's doorbell FIFOs
// go with the rest of its files, and a restarted node makes new ones.
func TestBellReclaimedWithDeadIncarnation(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	fab, nic, ep := nodeOne(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd, _ := startChild(t, ctx, fab, ep) // once it has announced, its VPID is open
	bells := func() []string {
		m, err := filepath.Glob(filepath.Join("/dev/shm", "exn-"+fab+"-n2.*-v1.bell"))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	old := bells()
	if len(old) != 1 {
		t.Fatalf("child's doorbell: %v", old)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	// Node 2 was never this NIC's peer (it only received from it), so
	// it is unknown rather than down; either way its files go now.
	if err := nic.Alive(2); !errors.Is(err, fabric.ErrPeerDown) && !errors.Is(err, fabric.ErrUnknownNode) {
		t.Fatalf("Alive(2) after SIGKILL: %v", err)
	}
	for _, f := range fabricFiles(t, fab) {
		if strings.Contains(f, "-n2.") {
			t.Fatalf("dead node's file left: %s", f)
		}
	}
	again := openNIC(t, fab, 2)
	fabrictest.OpenEP(t, again, 1)
	if now := bells(); len(now) != 1 || now[0] == old[0] {
		t.Fatalf("restarted node's doorbell %v (the dead one was %v)", now, old)
	}
}

// TestBellNoFDLeak: every Open makes a FIFO descriptor and every producer
// that rang a sleeping consumer caches one; Close and dropped mappings
// give them all back.
func TestBellNoFDLeak(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	base := testenv.CountFDs(t)
	const vpids = 4
	for round := 0; round < 3; round++ {
		fab := uniqueFabric(t)
		nics := make([]fabric.NIC, 2)
		eps := make([]fabric.Endpoint, 0, 2*vpids)
		for i := range nics {
			n, err := Open(fab, fabric.NodeID(i+1), withBackstop(longBackstop))
			if err != nil {
				t.Fatal(err)
			}
			nics[i] = n
			for v := 1; v <= vpids; v++ {
				ep, err := n.Open(fabric.VPID(v))
				if err != nil {
					t.Fatal(err)
				}
				eps = append(eps, ep)
			}
		}
		// Every endpoint sends to every other while it sleeps, so every
		// producer opens (and caches) a writer on every FIFO.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		for _, to := range eps {
			for _, from := range eps {
				if from == to {
					continue
				}
				got := make(chan error, 1)
				go func() {
					var b [1]fabric.Message
					for {
						n, err := to.Recv(b[:])
						if err != nil || n == 1 {
							got <- err
							return
						}
						if err := to.Wait(ctx); err != nil {
							got <- err
							return
						}
					}
				}()
				// Asleep in the netpoller.
				waitFor(t, "the consumer to sleep", func() bool { return to.(*endpoint).v.bellW.Load() != 0 })
				sendOne(t, ctx, from, to.Addr(), 1, "x")
				if err := <-got; err != nil {
					t.Fatal(err)
				}
			}
		}
		cancel()
		// One FIFO per VPID, and a cached writer per NIC and target VPID
		// (its own node's included): well above the leak check's slack.
		if open := testenv.CountFDs(t); open < base+2*vpids+2*2*vpids {
			t.Fatalf("round %d: %d descriptors open, %d before: no FIFOs or cached writers?", round, open, base)
		}
		var rings uint64
		for _, n := range nics {
			rings += wakeStats(t, n).BellRings
		}
		if want := uint64(2 * vpids * (2*vpids - 1)); rings < want {
			t.Fatalf("round %d: %d rings, want >= %d", round, rings, want)
		}
		for _, n := range nics {
			n.Close()
		}
		if now := testenv.CountFDs(t); now > base+2 {
			t.Fatalf("round %d: %d descriptors open after Close, %d before", round, now, base)
		}
	}
}

// awaitAsleep starts awaitOne(ctx, ep, take) in a goroutine and returns
// its error channel once ep's consumer sleeps (on its futex or its bell).
func awaitAsleep[T any](t testing.TB, ctx context.Context, ep fabric.Endpoint, take func([]T) (int, error)) <-chan error {
	t.Helper()
	got := make(chan error, 1)
	go func() { _, err := awaitOne(ctx, ep, take); got <- err }()
	waitFor(t, "the consumer to sleep", func() bool {
		v := ep.(*endpoint).v
		return v.sleepers.Load()+v.bellW.Load() != 0
	})
	return got
}

// TestBellFallback: a VPID without a FIFO (the NIC option, or a FIFO that
// cannot be made) sleeps on its futex and is still woken by producers of
// either kind, and a producer that cannot reach a FIFO counts it while the
// consumer's backstop delivers the message.
func TestBellFallback(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	testenv.VerifyNoFDLeaks(t)
	fab := uniqueFabric(t)
	a := openNIC(t, fab, 1, withBackstop(longBackstop))
	b := openNIC(t, fab, 2, withBackstop(longBackstop), withoutBell())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// wake makes from send one message to to while to sleeps in Wait, and
	// says how long that took to arrive.
	wake := func(from, to fabric.Endpoint) time.Duration {
		t.Helper()
		got := awaitAsleep(t, ctx, to, to.Recv)
		start := time.Now()
		sendOne(t, ctx, from, to.Addr(), 1, "x")
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}

	// 1. A futex-mode NIC and a bell-mode NIC wake each other.
	ea := fabrictest.OpenEP(t, a, 1)
	eb := fabrictest.OpenEP(t, b, 1)
	for i := 0; i < 5; i++ {
		if d := wake(ea, eb); d > promptWake {
			t.Fatalf("bell producer → futex consumer: %v", d)
		}
		if d := wake(eb, ea); d > promptWake {
			t.Fatalf("futex producer → bell consumer: %v", d)
		}
	}
	wa, wb := wakeStats(t, a), wakeStats(t, b)
	if wb.BellFallback != 1 || wb.FutexSleeps == 0 || wb.BellSleeps != 0 {
		t.Errorf("futex NIC: %+v", wb)
	}
	if wa.BellFallback != 0 || wa.BellSleeps == 0 || wb.BellRings == 0 {
		t.Errorf("bell NIC %+v, its producer %+v", wa, wb)
	}
	if _, err := os.Stat(eb.(*endpoint).path + ".bell"); !os.IsNotExist(err) {
		t.Errorf("futex-mode VPID has a doorbell file: %v", err)
	}

	// 2. The FIFO cannot be made (its temporary name is taken): that VPID
	// falls back to the futex, counted, and works.
	an := a.(*nicT)
	planted := an.vpidPath(1, an.inc, 3) + ".tmp.bell"
	if err := os.WriteFile(planted, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	e3, err := a.Open(3)
	os.Remove(planted)
	if err != nil {
		t.Fatal(err)
	}
	defer e3.Close()
	if w := wakeStats(t, a); w.BellFallback != 1 {
		t.Errorf("a FIFO that could not be made: %+v", w)
	}
	if d := wake(ea, e3); d > promptWake {
		t.Fatalf("wake of the fallen-back VPID: %v", d)
	}

	// 3. A producer that cannot open the consumer's FIFO (gone from the
	// directory) counts the failed ring; the consumer's backstop (short
	// on this NIC) still gets the message through.
	c := openNIC(t, fab, 3, withBackstop(50*time.Millisecond))
	e4 := fabrictest.OpenEP(t, c, 4)
	os.Remove(e4.(*endpoint).bellPath)
	failed := wakeStats(t, a).RingFailed
	wake(ea, e4)
	if w := wakeStats(t, a); w.RingFailed <= failed {
		t.Errorf("ring of a missing FIFO not counted: %+v", w)
	}
	if w := wakeStats(t, c); w.Backstops == 0 {
		t.Errorf("consumer not woken by its backstop: %+v", w)
	}
}

// TestConcurrentWaitsDistinctContexts: two Waits on one endpoint, asleep
// in the netpoller with different contexts (the poller and a cond
// waiter): each one's context ending wakes it at once, with a 20 s
// backstop.
func TestConcurrentWaitsDistinctContexts(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	nics := factory(withBackstop(longBackstop))(t, 1)
	ep := fabrictest.OpenEP(t, nics[0], 1)
	ctxA, cancelA := context.WithCancel(context.Background())
	ctxB, cancelB := context.WithCancel(context.Background())
	defer cancelB()
	wait := func(ctx context.Context) <-chan error {
		ch := make(chan error, 1)
		go func() { ch <- ep.Wait(ctx) }()
		return ch
	}
	a := wait(ctxA)
	waitFor(t, "the first Wait to sleep", func() bool { return ep.(*endpoint).v.bellW.Load() == 1 })
	b := wait(ctxB)
	waitFor(t, "the second Wait to sleep", func() bool { return ep.(*endpoint).v.bellW.Load() == 2 })
	for _, step := range []struct {
		name   string
		cancel context.CancelFunc
		done   <-chan error
	}{{"first", cancelA, a}, {"second", cancelB, b}} {
		start := time.Now()
		step.cancel()
		if err := testenv.Within(t, step.name+" Wait after its cancel", step.done, promptWake); !errors.Is(err, context.Canceled) {
			t.Fatalf("%s Wait: %v, want context.Canceled", step.name, err)
		}
		t.Logf("%s Wait returned %v after its cancel", step.name, time.Since(start))
	}
}

// TestBellOwnNotification: an RMA's requester notification lands in the
// poster's own queue, and must ring the poster's own FIFO: a Wait on that
// endpoint in another goroutine (EXT-DS's receive loop, while its writer
// posts) wakes at once, not at the backstop.
func TestBellOwnNotification(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	nics := factory(withBackstop(longBackstop))(t, 2)
	a, b := fabrictest.OpenEP(t, nics[0], 1), fabrictest.OpenEP(t, nics[1], 1)
	la := fabrictest.Register(t, a, 4096)
	rb := fabrictest.Register(t, b, 4096)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := 0; i < 5; i++ {
		got := awaitAsleep(t, ctx, a, a.PollNotifications)
		start := time.Now()
		if _, err := a.Post([]fabric.RMA{{Op: fabric.OpPut, Peer: b.Addr(), Local: la.NLA, Remote: rb.NLA,
			Len: 64, Notify: fabric.NotifyRequester}}); err != nil {
			t.Fatal(err)
		}
		if err := testenv.Within(t, fmt.Sprintf("round %d: a Wait on the poster, woken by its own notification,", i), got, promptWake); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: woken %v after the Post", i, time.Since(start))
	}
	if w := wakeStats(t, nics[0]); w.RingFailed != 0 {
		t.Errorf("rings failed: %+v", w)
	}
}

// TestConformanceFutex runs the suite with every VPID in the futex
// fallback.
func TestConformanceFutex(t *testing.T) { fabrictest.Run(t, factory(withoutBell())) }

// TestDecodeWaitMode: the VPID header's wait mode decodes as futex or
// bell, and anything else is refused.
func TestDecodeWaitMode(t *testing.T) {
	for _, tt := range []struct {
		mode uint32
		bell bool
		ok   bool
	}{{waitFutex, false, true}, {waitBell, true, true}, {2, false, false}, {^uint32(0), false, false}} {
		b := make([]byte, vOffMailbox)
		encodeVPIDHeader(b, vpidHeader{Addr: fabric.Addr{Node: 3, VPID: 1}, Slots: 8, Depth: minNotifyDepth})
		binary.LittleEndian.PutUint32(b[vOffWaitMode:], tt.mode)
		h, err := decodeVPIDHeader(b, fabric.Addr{Node: 3, VPID: 1}, int64(vpidFileSize(8, minNotifyDepth)))
		if (err == nil) != tt.ok || (err == nil && h.Bell != tt.bell) {
			t.Errorf("mode %d: %+v, %v", tt.mode, h, err)
		}
		if err != nil && !errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("mode %d: %v, want ErrInvalid", tt.mode, err)
		}
	}
}

// BenchmarkWakeAcrossProcesses: ping-pong between this process and a
// child: one op is a round trip with two cross-process wake-ups, by
// FUTEX_WAKE of a consumer in FUTEX_WAIT ("futex", the fallback), by a
// FIFO byte to a goroutine parked in the netpoller ("bell"), both without
// a spin, or as Wait does by default ("spin": spinBudget, then the
// netpoller). bell's p50 is what spinBudget is set from.
func BenchmarkWakeAcrossProcesses(b *testing.B) {
	for _, mode := range []string{"futex", "bell", "spin"} {
		b.Run(mode, func(b *testing.B) { benchWake(b, mode) })
	}
}

func benchWake(b *testing.B, mode string) {
	fab := uniqueFabric(b)
	ep := fabrictest.OpenEP(b, openNIC(b, fab, 1, wakeModeOpts(mode)...), 1)
	cmd := testenv.StartHelper(b, "TestBellHelper", bellChildEnv+"="+fab, wakeModeEnv+"="+mode)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var in [1]fabric.Message
	recv1 := func() { fabrictest.RecvWait(b, ctx, ep, in[:]) }
	recv1() // the child is up
	ping := []fabric.Message{{Peer: fabric.Addr{Node: 2, VPID: 1}, Tag: tagPing}}
	ping[0].SetPayload(make([]byte, 64))
	round := func() {
		if _, err := ep.Send(ctx, ping); err != nil {
			b.Fatal(err)
		}
		recv1()
	}
	for i := 0; i < 200; i++ {
		round()
	}
	lat := make([]time.Duration, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range lat {
		t0 := time.Now()
		round()
		lat[i] = time.Since(t0)
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
	ping[0].Tag = tagStop
	if _, err := ep.Send(ctx, ping); err != nil {
		b.Fatal(err)
	}
	recv1()
	if err := cmd.Wait(); err != nil {
		b.Fatalf("child: %v", err)
	}
}

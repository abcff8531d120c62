package shm

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
	"github.com/exn-project/exn/internal/testenv"
)

// lostWakeWait bounds one Wait of TestNoLostWakeup's consumer. Producers
// never pause for more than a few hundred µs, so a Wait that runs this
// long while its mailbox holds a message slept through a ring: a lost
// wake-up. It is a hang detector, not a latency bound.
const lostWakeWait = 10 * time.Second

// TestNoLostWakeup is the stress test of the doorbell protocol
// (docs/wakeup.md): three producers on two other nodes send to one
// consumer with random pauses, so that rings race the consumer's
// announce-recheck-park sequence in every order. The consumer parks in
// every Wait (no spin, in one case) and has no backstop timer; a Wait
// that ends by its deadline with a message waiting is a lost wake-up.
// A 4-slot mailbox keeps senders blocking on space too (the other
// direction of the protocol).
func TestNoLostWakeup(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	per := 20000
	if testenv.Small() {
		per = 2000
	}
	noSpin := func(o *options) error { o.noSpin = true; return nil }
	for _, tc := range []struct {
		name string
		opts []Option
	}{
		{"park-every-wait", []Option{WithSlots(4), noSpin}},
		{"spin-then-park", []Option{WithSlots(4)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nics := factory(tc.opts...)(t, 3)
			cons := fabrictest.OpenEP(t, nics[0], 1)
			prods := []fabric.Endpoint{fabrictest.OpenEP(t, nics[1], 1), fabrictest.OpenEP(t, nics[1], 2), fabrictest.OpenEP(t, nics[2], 1)}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			wait := fabrictest.Spawn(len(prods), func(i int) error {
				return produce(ctx, prods[i], cons.Addr(), uint32(i), per)
			})
			defer func() { cancel(); wait() }() // producers blocked on a full ring stop
			next := make([]uint64, len(prods))
			got, waits, sleeps := 0, 0, 0
			var batch [16]fabric.Message
			ep := cons.(*endpoint)
			for got < per*len(prods) {
				n, err := cons.Recv(batch[:])
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range batch[:n] {
					src, seq := binary.LittleEndian.Uint32(m.Data[:4]), binary.LittleEndian.Uint64(m.Data[4:12])
					if int(src) >= len(next) || seq != next[src] {
						t.Fatalf("message %d from producer %d, want %d", seq, src, next[min(int(src), len(next)-1)])
					}
					next[src]++
				}
				got += n
				if n > 0 {
					continue
				}
				waits++
				before := wakeStats(t, nics[0]).BellSleeps
				wctx, wcancel := context.WithTimeout(ctx, lostWakeWait)
				err = cons.Wait(wctx)
				expired := wctx.Err() != nil // only its deadline ends it
				wcancel()
				if wakeStats(t, nics[0]).BellSleeps != before {
					sleeps++
				}
				if expired {
					// Woken (if at all) by the deadline's own ring, not
					// by the producer whose message is waiting.
					if ep.ready() {
						t.Fatalf("lost wake-up: Wait slept %v with a message waiting (got %d of %d)", lostWakeWait, got, per*len(prods))
					}
					t.Fatalf("no message for %v (got %d of %d)", lostWakeWait, got, per*len(prods))
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if err := wait(); err != nil {
				t.Fatal(err)
			}
			w := wakeStats(t, nics[0])
			t.Logf("%d messages, %d waits, %d parked, wake stats %+v", got, waits, sleeps, w)
			if sleeps == 0 {
				t.Fatal("the consumer never parked: the test did not exercise the doorbell")
			}
			if w.RingFailed != 0 || w.Backstops != 0 {
				t.Fatalf("rings failed or backstops fired: %+v", w)
			}
			// Senders blocked on the full mailbox parked on its space
			// bell (space.go), each woken by a ring: one that was not
			// would have stopped its producer and failed a Wait above.
			w1, w2 := wakeStats(t, nics[1]), wakeStats(t, nics[2])
			t.Logf("senders' wake stats %+v, %+v", w1, w2)
			if w1.SpaceParks+w2.SpaceParks == 0 || w.SpaceRings == 0 {
				t.Fatalf("no sender parked on the space bell (%d, %d parks, %d rings): the test did not exercise it", w1.SpaceParks, w2.SpaceParks, w.SpaceRings)
			}
			if w1.SpaceFallback+w2.SpaceFallback != 0 {
				t.Fatalf("senders fell back to the space futex: %+v, %+v", w1, w2)
			}
		})
	}
}

// produce sends n messages from p to dst, each carrying (id, sequence),
// pausing at random so its sends land at every point of the consumer's
// park sequence.
func produce(ctx context.Context, p fabric.Endpoint, dst fabric.Addr, id uint32, n int) error {
	r := rand.New(rand.NewPCG(uint64(id), 7))
	m := []fabric.Message{{Peer: dst, Tag: tagPing, Len: 12}}
	binary.LittleEndian.PutUint32(m[0].Data[:4], id)
	for i := range n {
		binary.LittleEndian.PutUint64(m[0].Data[4:12], uint64(i))
		if _, err := p.Send(ctx, m); err != nil {
			return err
		}
		switch r.IntN(8) {
		case 0:
			time.Sleep(time.Duration(r.IntN(200)) * time.Microsecond)
		case 1, 2:
			runtime.Gosched()
		case 3:
			for start := time.Now(); time.Since(start) < time.Duration(r.IntN(20))*time.Microsecond; {
			}
		}
	}
	return nil
}

// TestSetWaitSpin: the consumer's spin is clamped to 0..spinBudget, and
// a Wait with none parks at once (and still wakes for a message).
func TestSetWaitSpin(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	fab := uniqueFabric(t)
	nic1, nic2 := openNIC(t, fab, 1), openNIC(t, fab, 2)
	ep1, ep2 := fabrictest.OpenEP(t, nic1, 0), fabrictest.OpenEP(t, nic2, 0)
	ws, ok := ep1.(fabric.WaitSpinner)
	if !ok {
		t.Fatalf("%T is not a fabric.WaitSpinner", ep1)
	}
	e := ep1.(*endpoint)
	if got := time.Duration(e.spin.Load()); got != spinBudget {
		t.Fatalf("default spin %v, want %v", got, spinBudget)
	}
	for _, tc := range []struct{ set, want time.Duration }{
		{time.Microsecond, time.Microsecond},
		{time.Second, spinBudget},
		{-1, 0},
		{0, 0},
	} {
		ws.SetWaitSpin(tc.set)
		if got := time.Duration(e.spin.Load()); got != tc.want {
			t.Errorf("SetWaitSpin(%v): spin %v, want %v", tc.set, got, tc.want)
		}
	}
	if ok, err := e.spinFor(0); ok || err != nil {
		t.Fatalf("spinFor(0) = %v, %v: want no spin", ok, err)
	}
	before := nic1.(*nicT).WakeStats().BellSleeps
	done := make(chan error, 1)
	go func() { done <- ep1.Wait(context.Background()) }()
	waitFor(t, "the spinless Wait parks", func() bool { return nic1.(*nicT).WakeStats().BellSleeps > before })
	sendOne(t, context.Background(), ep2, ep1.Addr(), 1, "x")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

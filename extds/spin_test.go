package extds

import (
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
)

// waitModel is how a peer answers a wait in the simulation of
// TestSpinBudget: answerAt is when the answer arrives if this side spins
// through it; parkedFor is how long a wait that parks sleeps; colocated
// says the peer runs in this process.
type waitModel struct {
	answerAt  func(i int) time.Duration
	parkedFor func(i int, spun time.Duration) time.Duration
	colocated bool
}

// simulate runs n waits through a fresh spinBudget and returns how many
// parked, the total spin time, and the budget after the last one.
func simulate(n int, m waitModel) (parks int, spent, last time.Duration) {
	var b spinBudget
	for i := range n {
		budget := b.next()
		if at := m.answerAt(i); at <= budget {
			b.hit()
			spent += at
			continue
		}
		parks++
		spent += budget
		b.parked(budget, m.parkedFor(i, budget), m.colocated)
	}
	return parks, spent, b.budget()
}

// TestSpinBudget holds the adaptive spin (spin.go) to its promises,
// with the clock simulated: a ping-pong whose answers come within the
// budget never parks and keeps its budget; in one process, a wait whose
// answer comes only once it parks (the peer starved by the spin) drops
// to parking at once and spends under 5 % of a budget per wait on its
// probes, and gets its budget back within a probe gap once the pattern
// becomes a fast ping-pong; across processes, answers that come just
// after the spin (however soon after parking they are handed over) grow
// the budget until it catches them; an idle connection spins less and
// less and ends at zero either way.
func TestSpinBudget(t *testing.T) {
	us := time.Microsecond
	const n = 5000
	always := func(d time.Duration) func(int, time.Duration) time.Duration {
		return func(int, time.Duration) time.Duration { return d }
	}
	for _, tc := range []struct {
		name       string
		m          waitModel
		maxParks   int
		maxPerWait time.Duration // spin per wait, on average
		budget     time.Duration // the budget at the end
	}{
		{"ping-pong within the budget", waitModel{
			answerAt:  func(i int) time.Duration { return time.Duration(1+i%5) * us },
			parkedFor: always(time.Second), // counted by maxParks
		}, 0, 5 * us, connSpinBudget},
		{"one process: starved peer", waitModel{
			answerAt:  func(int) time.Duration { return time.Hour },
			parkedFor: always(us),
			colocated: true,
		}, n, connSpinBudget / 20, 0},
		{"one process: idle", waitModel{
			answerAt:  func(int) time.Duration { return time.Hour },
			parkedFor: always(time.Second),
			colocated: true,
		}, n, connSpinBudget / 20, 0},
		{"one process: starved, then a ping-pong", waitModel{
			answerAt: func(i int) time.Duration {
				if i < n/2 {
					return time.Hour
				}
				return 2 * us
			},
			parkedFor: always(us),
			colocated: true,
		}, n/2 + spinProbeMaxGap, connSpinBudget, connSpinBudget},
		{"other processes: answers 5 µs after the spin, handed over at once", waitModel{
			answerAt:  func(int) time.Duration { return connSpinBudget + 5*us },
			parkedFor: func(_ int, spun time.Duration) time.Duration { return connSpinBudget + 5*us - spun + us },
		}, 1, connSpinBudget + 5*us, 2 * connSpinBudget},
		{"other processes: answers after the spin, woken late", waitModel{
			answerAt:  func(int) time.Duration { return connSpinBudget + 10*us },
			parkedFor: func(_ int, spun time.Duration) time.Duration { return connSpinBudget + 40*us - spun },
		}, 1, connSpinBudget + 10*us, 2 * connSpinBudget},
		{"other processes: idle", waitModel{
			answerAt:  func(int) time.Duration { return time.Hour },
			parkedFor: always(time.Second),
		}, n, connSpinBudget / 20, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parks, spent, last := simulate(n, tc.m)
			if parks > tc.maxParks {
				t.Errorf("%d of %d waits parked, want at most %d", parks, n, tc.maxParks)
			}
			if per := spent / n; per > tc.maxPerWait {
				t.Errorf("spun %v per wait, want at most %v", per, tc.maxPerWait)
			}
			if last != tc.budget {
				t.Errorf("budget %v at the end, want %v", last, tc.budget)
			}
		})
	}
}

// TestIdleReadParks: a Read on a connection with nothing coming spins
// at most its budget, parks (counted), and then costs no CPU; a write
// wakes it. The CPU check is on this process's rusage, which a spin of
// the 200 ms would fill.
func TestIdleReadParks(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t)
	c, s := p.conns(t)
	defer c.Close()
	defer s.Close()
	before := p.devA.Stats().WaitsParked + p.devB.Stats().WaitsParked
	got := make(chan error, 1)
	go func() {
		buf := make([]byte, 1)
		_, err := io.ReadFull(s, buf)
		got <- err
	}()
	for end := time.Now().Add(5 * time.Second); p.devA.Stats().WaitsParked+p.devB.Stats().WaitsParked == before; {
		if time.Now().After(end) {
			t.Fatal("the idle Read never parked")
		}
		time.Sleep(time.Millisecond)
	}
	cpu0 := processCPU(t)
	time.Sleep(200 * time.Millisecond)
	if used := processCPU(t) - cpu0; used > 40*time.Millisecond {
		t.Errorf("an idle parked Read used %v of CPU in 200 ms", used)
	}
	if _, err := c.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a write did not wake the parked Read")
	}
}

// processCPU is this process's user and system CPU time so far.
func processCPU(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

package extds

import "time"

// The adaptive spin of a Conn's waits (issue #37, docs/wakeup.md
// "Adaptive spin of EXT-DS waits").
//
// A waiter (Read for data, Write for credits) polls its vdev itself for a
// spin budget before it parks (Conn.spinWaitLocked). Whether that spin
// pays depends on where the peer runs, which the library cannot know in
// advance:
//
//   - across processes (shm), parking costs a wake-up chain of 20–40 µs,
//     so a spin that covers the peer's answer turns a round trip of two
//     wake-ups into one of a few µs;
//   - in one process (mem), the peer is a goroutine. When it is queued on
//     the spinner's own P it cannot run until the spinner parks, so the
//     spin delays the very answer it waits for: each half round trip then
//     costs exactly the budget (BenchmarkPingPong: 21.0 µs p50 with a
//     20 µs spin, 1.1 µs with none).
//
// So each Conn learns its budget per direction, between zero and
// connSpinMax, from the waits it sees:
//
//   - a wait that ends within its spin keeps the budget;
//   - peers in this process (fabric.Colocated: mem): a wait that spun,
//     parked, and was woken within spinQuickWake of parking was
//     answered only because it stopped spinning: the spin starved the
//     answerer. The budget drops to zero (park at once). The budget
//     never grows past connSpinBudget there: a rule that doubled it
//     after a wait that parked but ended soon after made both sides of
//     an in-process ping-pong grow to the maximum, because the peer's
//     spin delays this side's wake-up by the peer's budget, which that
//     rule read as "spin longer" (BenchmarkPingPong 1 B: p99 52–64 µs,
//     against 11–15 µs without growth);
//   - peers in other processes (shm, net, ofi): nothing this side does
//     delays the answer, so a wait that spun, parked and still ended
//     within connSpinMax of its start would have been caught by a longer
//     spin: the budget becomes twice that spin, up to connSpinMax. (The
//     starvation rule there read an answer that came just after the
//     spin, handed over by this process's receive loop within a µs, as
//     starvation, and parked every wait of a 1 KiB ping-pong between two
//     shm processes: p50 0.61× TCP over exn0 instead of 0.27×.)
//   - a wait longer than connSpinMax (think time, an idle connection)
//     halves the budget: the spin did not pay, and an idle connection
//     soon costs nothing but its park;
//   - at zero, a wait whose wake-up was slow brings the next probe
//     forward (a spin might have caught it);
//   - below connSpinBudget, every probeGap-th wait spins connSpinBudget
//     (a probe). A probe that hits restores connSpinBudget; one that
//     fails doubles the gap, up to spinProbeMaxGap, so a Conn whose spin
//     never pays spends at most one budget per spinProbeMaxGap waits on
//     finding that out again.
//
// Idle stays idle: a wait spins at most connSpinMax, then parks on its
// channel with no timer.

const (
	// connSpinMax is the longest budget a Conn learns across processes,
	// and a wait longer than this is think time or idleness, not a round
	// trip that a spin could catch: twice the cross-process wake-up chain
	// (20–40 µs here, docs/wakeup.md). Spinning longer than parking
	// costs can at best save that cost; at twice it the spin wastes at
	// most as much as it could save (the ski-rental bound).
	connSpinMax = 80 * time.Microsecond
	// spinQuickWake is how soon after parking a wake-up says the spin
	// itself held the answer back: less than any cross-process wake-up
	// takes here (≥ 15 µs, docs/wakeup.md) and more than an in-process
	// goroutine hand-off (about 1 µs).
	spinQuickWake = 5 * time.Microsecond
	// spinProbeGap and spinProbeMaxGap bound how often a Conn below
	// connSpinBudget tries the full budget again: at first every 16th
	// wait, so a pattern that changed is found within 16 round trips; at
	// most every 1024th, so a spin that keeps failing costs under 2 % of
	// one budget per wait.
	spinProbeGap    = 16
	spinProbeMaxGap = 1024
)

// spinBudget is one direction's learned spin. The zero value starts at
// connSpinBudget. Guarded by the Conn's mu (every wait runs under it).
type spinBudget struct {
	cur    time.Duration // the budget, minus connSpinBudget: 0 is connSpinBudget (so the zero value is ready)
	gap    uint32        // waits between probes (0: spinProbeGap)
	count  uint32        // waits since the last probe
	probed bool          // the current wait is a probe
}

// budget is the learned budget.
func (b *spinBudget) budget() time.Duration { return b.cur + connSpinBudget }

// next returns the spin of the wait that starts now.
func (b *spinBudget) next() time.Duration {
	cur := b.budget()
	b.probed = false
	if cur >= connSpinBudget {
		return cur
	}
	if b.gap == 0 {
		b.gap = spinProbeGap
	}
	if b.count++; b.count >= b.gap {
		b.count, b.probed = 0, true
		return connSpinBudget
	}
	return cur
}

// hit records a wait that ended within its spin.
func (b *spinBudget) hit() {
	if b.probed {
		b.set(connSpinBudget)
		b.gap = spinProbeGap
	}
}

// parked records a wait that spun spun (0: it parked at once), then
// parked for parked; colocated: the peer runs in this process.
func (b *spinBudget) parked(spun, parked time.Duration, colocated bool) {
	switch {
	case colocated && spun > 0 && parked < spinQuickWake:
		b.set(0)
		b.failedProbe()
	case !colocated && spun > 0 && spun+parked <= connSpinMax:
		b.set(min(connSpinMax, 2*spun))
		b.gap = spinProbeGap
	case spun+parked > connSpinMax:
		b.set(b.budget() / 2)
		b.failedProbe()
	case spun == 0 && parked >= spinQuickWake:
		b.gap = spinProbeGap // a spin might have caught this one: probe soon
	}
}

func (b *spinBudget) failedProbe() {
	if b.probed {
		b.gap = min(spinProbeMaxGap, max(spinProbeGap, 2*b.gap))
	}
}

func (b *spinBudget) set(d time.Duration) {
	if d < time.Microsecond {
		d = 0 // below what a spin step and a clock read cost
	}
	b.cur = d - connSpinBudget
}

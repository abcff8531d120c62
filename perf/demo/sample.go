package demo

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// The sampling rule's defaults (Sampling's zero values stand for them).
const (
	// DefaultAllUpTo: clusters of at most this many nodes measure every
	// ordered pair (8 nodes: 56 pairs).
	DefaultAllUpTo = 8
	// DefaultPeers: random peers per node, besides its ring successor,
	// in a sampled run (64 nodes: 64 x 3 = 192 of 4032 pairs).
	DefaultPeers = 2
)

// Sampling chooses the ordered pairs a run measures.
//
// A cluster of at most AllUpTo nodes measures all n(n-1) ordered pairs.
// A larger one measures, for every node i (0-based), the ring pair
// i -> (i+1) mod n and Peers more pairs i -> j, with j drawn without
// replacement from the other n-2 nodes by a PCG generator seeded with
// Seed: n(1+Peers) pairs, every node a sender and a receiver (the ring
// alone sees to that). When 1+Peers >= n-1 that is every pair, and the
// run measures all of them.
type Sampling struct {
	AllUpTo int    // all pairs up to this many nodes (0: DefaultAllUpTo; < 0: always sample)
	Peers   int    // random peers per node besides the ring successor (0: DefaultPeers; < 0: ring only)
	Seed    uint64 // seed of the random peers
}

// withDefaults resolves the zero values.
func (s Sampling) withDefaults() Sampling {
	if s.AllUpTo == 0 {
		s.AllUpTo = DefaultAllUpTo
	}
	switch {
	case s.Peers == 0:
		s.Peers = DefaultPeers
	case s.Peers < 0:
		s.Peers = 0
	}
	return s
}

// Edge is one ordered pair of a run, as 0-based node indices.
type Edge struct{ From, To int }

// SamplePairs returns the pairs a run of n nodes measures under s (see
// Sampling), sorted by sender, then receiver, and whether that is every
// ordered pair.
func SamplePairs(n int, s Sampling) (pairs []Edge, all bool, err error) {
	if n < 2 {
		return nil, false, fmt.Errorf("demo: %d nodes: need at least 2", n)
	}
	s = s.withDefaults()
	if n <= s.AllUpTo || s.Peers+1 >= n-1 {
		pairs = make([]Edge, 0, n*(n-1))
		for a := range n {
			for b := range n {
				if a != b {
					pairs = append(pairs, Edge{a, b})
				}
			}
		}
		return pairs, true, nil
	}
	rng := rand.New(rand.NewPCG(s.Seed, s.Seed^0x9e3779b97f4a7c15))
	pairs = make([]Edge, 0, n*(1+s.Peers))
	cand := make([]int, 0, n-2)
	for a := range n {
		next := (a + 1) % n
		pairs = append(pairs, Edge{a, next})
		cand = cand[:0]
		for b := range n {
			if b != a && b != next {
				cand = append(cand, b)
			}
		}
		// A partial Fisher-Yates shuffle: the first Peers candidates.
		for i := range s.Peers {
			j := i + rng.IntN(len(cand)-i)
			cand[i], cand[j] = cand[j], cand[i]
			pairs = append(pairs, Edge{a, cand[i]})
		}
	}
	slices.SortFunc(pairs, func(x, y Edge) int {
		if x.From != y.From {
			return x.From - y.From
		}
		return x.To - y.To
	})
	return pairs, false, nil
}

// The time plan's cost model and floors: a test on one path costs its
// throughput time, its round trips (a tenth more for the warm-up) at
// estRTT each, and estSetup for the two connections. The budget never
// scales a test below minDuration or minRoundTrips (nor raises one
// above what was asked for).
const (
	estRTT        = 30 * time.Microsecond
	estSetup      = 10 * time.Millisecond
	minDuration   = 100 * time.Millisecond
	minRoundTrips = 200
)

// Plan is the per-pair test size a run uses.
type Plan struct {
	Duration   time.Duration // throughput test per pair and path
	RoundTrips int           // ping-pong round trips per pair and path
	Scale      float64       // the factor the budget asked for (1: none); the floors may keep a test larger
	Estimate   time.Duration // the cost model's estimate of all the measurements
}

// PlanTests sizes the tests of pairs pairs on paths paths: duration d
// and rounds round trips each, unless that is estimated to take longer
// than budget (> 0), in which case both are scaled by the same factor
// to fit, down to the floors.
func PlanTests(pairs, paths int, d time.Duration, rounds int, budget time.Duration) (Plan, error) {
	if pairs < 1 || paths < 1 || d <= 0 || rounds <= 0 || budget < 0 {
		return Plan{}, errors.New("demo: plan: pairs, paths, duration and round trips must be positive, budget not negative")
	}
	cost := func(d time.Duration, rounds int) time.Duration {
		per := d + time.Duration(rounds+rounds/10)*estRTT + estSetup
		return time.Duration(pairs*paths) * per
	}
	p := Plan{Duration: d, RoundTrips: rounds, Scale: 1, Estimate: cost(d, rounds)}
	if budget == 0 || p.Estimate <= budget {
		return p, nil
	}
	// Solve pairs*paths*(s*d + s*rounds*1.1*estRTT + estSetup) = budget.
	n := float64(pairs * paths)
	fixed := n * float64(estSetup)
	varying := n * (float64(d) + float64(rounds)*1.1*float64(estRTT))
	s := (float64(budget) - fixed) / varying
	s = max(s, 0)
	p.Scale = s
	p.Duration = max(min(d, minDuration), time.Duration(float64(d)*s))
	p.RoundTrips = max(min(rounds, minRoundTrips), int(float64(rounds)*s))
	p.Estimate = cost(p.Duration, p.RoundTrips)
	return p, nil
}

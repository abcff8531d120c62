package members

// The membership simulation (issue #36): n nodes in this process on a
// simNet (simnet_test.go), real memberlist instances on the Fabric
// profile, in real time. TestSimulation runs it small in make test;
// BenchmarkSimulation runs it at full size (up to 1,000 nodes) and
// reports the figures docs/membership.md records.
//
// Time scale: one process holds every node, and 1,000 instances of the
// Fabric profile need more than this machine's 2 CPUs (each cost about
// 0.15 % of a core here when this was written, 0.04 % since the profile
// of 2026-11-29 22:30 UTC, and 1,000 at full speed were not tried again;
// a starved instance answers late, which is not what is being measured). Above 100 nodes the simulation therefore
// runs the profile slowed down by scale = n/100 (every interval and
// timeout multiplied) and reports times divided by scale and rates
// multiplied by it: the protocol's behaviour in the profile's own time,
// as on a machine fast enough to run them all.

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/testenv"
)

type simCluster struct {
	tb    testing.TB
	net   *simNet
	nodes []*simNode
	scale float64 // the profile's intervals are multiplied by it

	mu sync.Mutex
	// downs[v][s]: when node s saw node v go down (v not killed: a false
	// positive).
	downs  map[fabric.NodeID]map[fabric.NodeID]time.Time
	killed map[fabric.NodeID]time.Time
}

type simNode struct {
	id fabric.NodeID
	tr *simTransport
	m  *Members
}

// startCluster starts n nodes, joins each to node 0 and waits until every
// node sees all n alive. The cluster is stopped when tb ends.
func startCluster(tb testing.TB, n int) *simCluster {
	tb.Helper()
	return startClusterScaled(tb, n, max(1, float64(n)/100))
}

// startClusterScaled is startCluster on the time scale scale.
func startClusterScaled(tb testing.TB, n int, scale float64) *simCluster {
	tb.Helper()
	c := &simCluster{tb: tb, net: newSimNet(), scale: scale, downs: map[fabric.NodeID]map[fabric.NodeID]time.Time{}, killed: map[fabric.NodeID]time.Time{}}
	tb.Cleanup(c.stop)
	p := Fabric.scaled(c.scale)
	for i := range n {
		id := fabric.NodeID(i + 1)
		tr := c.net.transport(i)
		m, err := New(Config{Node: id, Transport: tr, Profile: p, OnChange: func(v fabric.NodeID, alive bool) {
			if !alive {
				c.sawDown(id, v)
			}
		}})
		if err != nil {
			tb.Fatal(err)
		}
		c.nodes = append(c.nodes, &simNode{id: id, tr: tr, m: m})
	}
	// Each node joins through a random node of the first joinSeeds (as
	// a fabric's nodes would join through the peers file's first few):
	// joinWorkers at a time, so no seed serves every full-state exchange.
	const joinSeeds, joinWorkers = 8, 8
	work := make(chan int)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range joinWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				seed := c.nodes[rand.IntN(min(i, joinSeeds))]
				if _, err := c.nodes[i].m.Join([]string{seed.tr.addr}); err != nil {
					errs <- fmt.Errorf("node %d: %w", c.nodes[i].id, err)
				}
			}
		}()
	}
	for i := 1; i < n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
	c.waitAll(n, c.real(30*time.Second)+time.Duration(n)*50*time.Millisecond)
	return c
}

func (c *simCluster) sawDown(s, v fabric.NodeID) {
	now := time.Now()
	c.mu.Lock()
	if c.downs[v] == nil {
		c.downs[v] = map[fabric.NodeID]time.Time{}
	}
	if _, ok := c.downs[v][s]; !ok {
		c.downs[v][s] = now
	}
	c.mu.Unlock()
}

// scaled is p with every interval and timeout multiplied by k.
func (p Profile) scaled(k float64) Profile {
	d := func(v time.Duration) time.Duration { return time.Duration(float64(v) * k) }
	p.ProbeInterval, p.ProbeTimeout = d(p.ProbeInterval), d(p.ProbeTimeout)
	p.GossipInterval, p.PushPullInterval = d(p.GossipInterval), d(p.PushPullInterval)
	p.StreamTimeout = d(p.StreamTimeout)
	return p
}

// real is a duration of the profile's time in this cluster's time.
func (c *simCluster) real(d time.Duration) time.Duration { return time.Duration(float64(d) * c.scale) }

// waitAll waits until every live node sees want nodes alive.
func (c *simCluster) waitAll(want int, limit time.Duration) {
	c.tb.Helper()
	end := time.Now().Add(limit)
	for {
		var short []string
		for _, nd := range c.nodes {
			if st := nd.m.Stats(); !nd.tr.dead.Load() && st.Alive != want {
				short = append(short, fmt.Sprintf("%d sees %d (%d joins, %d leaves)", nd.id, st.Alive, st.Joins, st.Leaves))
			}
		}
		if len(short) == 0 {
			return
		}
		if time.Now().After(end) {
			c.tb.Fatalf("after %v, not every node sees %d alive: %v", limit, want, short[:min(len(short), 10)])
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *simCluster) stop() {
	var wg sync.WaitGroup
	for _, nd := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nd.m.Close()
		}()
	}
	wg.Wait()
}

// kill stops k nodes at once (the last k), as crashes would.
func (c *simCluster) kill(k int) []*simNode {
	victims := c.nodes[len(c.nodes)-k:]
	now := time.Now()
	c.mu.Lock()
	for _, v := range victims {
		c.killed[v.id] = now
	}
	c.mu.Unlock()
	for _, v := range victims {
		v.tr.kill()
	}
	for _, v := range victims {
		v.m.Close()
	}
	return victims
}

// detection waits until every survivor saw every victim down (or limit,
// in the profile's time) and returns the detection times of all
// (survivor, victim) pairs in the profile's time, sorted, and how many
// pairs were still undetected at the limit.
func (c *simCluster) detection(victims []*simNode, limit time.Duration) (times []time.Duration, missing int) {
	survivors := len(c.nodes) - len(victims)
	deadline := time.Now().Add(c.real(limit))
	for {
		c.mu.Lock()
		seen := 0
		for _, v := range victims {
			seen += len(c.downs[v.id])
		}
		c.mu.Unlock()
		if seen >= survivors*len(victims) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, v := range victims {
		at := c.killed[v.id]
		for s, t := range c.downs[v.id] {
			if _, dead := c.killed[s]; !dead {
				times = append(times, time.Duration(float64(t.Sub(at))/c.scale))
			}
		}
	}
	slices.Sort(times)
	return times, survivors*len(victims) - len(times)
}

// falsePositives counts (observer, node) pairs where a node that was never
// killed was seen down.
func (c *simCluster) falsePositives() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for v, by := range c.downs {
		if _, dead := c.killed[v]; !dead {
			n += len(by)
		}
	}
	return n
}

// rate measures, over d of the profile's time, the packets and streams
// each node sends per second of the profile's time (mean over live
// nodes), and the process's CPU time per node per second of real time.
func (c *simCluster) rate(d time.Duration) (msgs, cpu float64) {
	d = c.real(d)
	live := 0
	var sent0 uint64
	for _, nd := range c.nodes {
		if !nd.tr.dead.Load() {
			live++
			sent0 += nd.tr.sent.Load()
		}
	}
	cpu0 := cpuTime()
	t0 := time.Now()
	time.Sleep(d)
	el := time.Since(t0).Seconds()
	var sent1 uint64
	for _, nd := range c.nodes {
		if !nd.tr.dead.Load() {
			sent1 += nd.tr.sent.Load()
		}
	}
	return float64(sent1-sent0) / float64(live) / el * c.scale, (cpuTime() - cpu0).Seconds() / float64(live) / el
}

// heapPerNode is the live heap after a collection, per node.
func heapPerNode(n int) float64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapAlloc) / float64(n)
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func pct(ts []time.Duration, p float64) time.Duration {
	if len(ts) == 0 {
		return 0
	}
	return ts[min(len(ts)-1, int(p*float64(len(ts))))]
}

// TestSimulation: a small cluster finds a crashed node everywhere within
// the bound, sees no false positive under 1 % loss, and a node paused for
// less than the suspicion timeout is not declared dead.
func TestSimulation(t *testing.T) {
	// Small (as under the race detector, which slows every instance
	// several times): fewer nodes, and the profile slowed down ×3 so
	// that a late goroutine is not a late answer; times are checked in
	// the profile's time either way.
	n, scale := 16, 1.0
	if testenv.Small() {
		n, scale = 8, 3
	}
	c := startClusterScaled(t, n, scale)

	c.net.setLoss(0.01)
	time.Sleep(c.real(2 * time.Second))
	c.net.setLoss(0)
	if fp := c.falsePositives(); fp != 0 {
		t.Errorf("1%% loss: %d false positives", fp)
	}

	// Well below the least suspicion timeout (SuspicionMult ·
	// ProbeInterval = 0.75 s): the paused node refutes the suspicion
	// when it resumes. 0.2 s: with 0.3 s, the race detector's run in CI
	// (two CPUs, other packages testing beside it) once saw one false
	// positive (2026-11-29), the refutation starved past the timeout.
	c.nodes[1].tr.pause(c.real(200 * time.Millisecond))
	time.Sleep(c.real(3 * time.Second))
	if fp := c.falsePositives(); fp != 0 {
		t.Errorf("a node paused for 0.2 s: %d false positives", fp)
	}

	victims := c.kill(1)
	times, missing := c.detection(victims, 10*time.Second)
	if missing > 0 {
		t.Fatalf("%d of %d survivors never saw the crashed node down", missing, n-1)
	}
	if last := times[len(times)-1]; last > 3*time.Second {
		t.Errorf("the last survivor saw the crash after %v, want within 3 s", last)
	}
	t.Logf("%d nodes: crash seen by all in p50 %v, max %v", n, pct(times, 0.5), times[len(times)-1])
}

// BenchmarkSimulation runs the simulation at 10, 100 and 1,000 nodes
// (EXN_SIM_NODES overrides the largest): per node, the messages sent and
// the CPU per second when idle; false positives under 1 % and 5 % loss
// (10 s each) and with one node paused for 1 s; then the detection times
// when 1, 10 and 100 nodes crash at once (each wave after the last is
// seen). Times and rates are in the profile's time (see the time scale
// above); %cpu/node is of real time on this machine. It ignores b.N: each
// size runs once.
func BenchmarkSimulation(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			t0 := time.Now()
			c := startCluster(b, n)
			b.Logf("%d nodes (time scale %g) converged in %v", n, c.scale, time.Since(t0).Round(time.Millisecond))
			// Memory per node, each knowing n members: between two sizes
			// it gives membership's cost per known member
			// (docs/fabric-net.md "Memory per peer").
			b.ReportMetric(heapPerNode(n), "heapB/node")
			// The joins' gossip is retransmitted 4·log10(n+1) times by
			// every node that learns it: let it drain before the idle
			// rate is taken.
			time.Sleep(c.real(20 * time.Second))
			msgs, cpu := c.rate(10 * time.Second)
			b.ReportMetric(msgs, "msgs/s/node")
			b.ReportMetric(cpu*100, "%cpu/node")
			// False positives per phase: (observer, node) pairs that saw a
			// node down that was never killed, counted from the phase's
			// start (the join storm before is not measured).
			fp := c.falsePositives()
			b.ReportMetric(float64(fp), "fp-before")
			for _, loss := range []float64{0.01, 0.05} {
				c.net.setLoss(loss)
				time.Sleep(c.real(10 * time.Second))
				c.net.setLoss(0)
				now := c.falsePositives()
				b.ReportMetric(float64(now-fp), fmt.Sprintf("fp@%g%%loss", loss*100))
				fp = now
			}
			c.nodes[0].tr.pause(c.real(time.Second))
			time.Sleep(c.real(5 * time.Second))
			b.ReportMetric(float64(c.falsePositives()-fp), "fp@pause1s")
			for _, k := range []int{1, 10, 100} {
				if k > n/4 {
					break
				}
				victims := c.kill(k)
				times, missing := c.detection(victims, 30*time.Second)
				b.ReportMetric(pct(times, 0.5).Seconds(), fmt.Sprintf("s-p50@%ddead", k))
				b.ReportMetric(pct(times, 0.99).Seconds(), fmt.Sprintf("s-p99@%ddead", k))
				if len(times) > 0 {
					b.ReportMetric(times[len(times)-1].Seconds(), fmt.Sprintf("s-max@%ddead", k))
				}
				b.ReportMetric(float64(missing), fmt.Sprintf("missed@%ddead", k))
				c.nodes = c.nodes[:len(c.nodes)-k]
			}
		})
	}
}

// TestLeaveAfterClose: Close and Leave in either order, twice, neither
// panics (memberlist's own Leave does after Shutdown) nor fails.
func TestLeaveAfterClose(t *testing.T) {
	for _, order := range [][]string{{"close", "leave"}, {"leave", "close"}, {"close", "close"}} {
		c := startCluster(t, 2)
		m := c.nodes[1].m
		for _, op := range order {
			var err error
			if op == "close" {
				err = m.Close()
			} else {
				err = m.Leave(time.Second)
			}
			if err != nil {
				t.Errorf("%v: %s: %v", order, op, err)
			}
		}
	}
}

package exn

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/mem"
	"github.com/exn-project/exn/fabric/shm"
	"github.com/exn-project/exn/internal/testenv"
)

// collectLink is a Link that copies and keeps every frame.
type collectLink struct {
	mu     sync.Mutex
	frames [][]byte
	offs   []Offload // offs[i] is frames[i]'s metadata
	notify chan struct{}
	block  chan struct{} // if non-nil, DeliverFrames waits on it first; under mu
}

// hold makes DeliverFrames wait until the returned channel is closed. It
// is set under mu: a frame on shm reaches the rx loop through shared
// memory, which gives the race detector no order against the test.
func (l *collectLink) hold() chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.block = make(chan struct{})
	return l.block
}

func newCollectLink() *collectLink { return &collectLink{notify: make(chan struct{}, 1)} }

func (l *collectLink) DeliverFrames(fs [][]byte) error { return l.DeliverFramesOffload(fs, nil) }

func (l *collectLink) DeliverFramesOffload(fs [][]byte, offs []Offload) error {
	l.mu.Lock()
	blk := l.block
	l.mu.Unlock()
	if blk != nil {
		<-blk
	}
	l.mu.Lock()
	for i, f := range fs {
		l.frames = append(l.frames, append([]byte(nil), f...))
		var o Offload
		if offs != nil {
			o = offs[i]
		}
		l.offs = append(l.offs, o)
	}
	l.mu.Unlock()
	select {
	case l.notify <- struct{}{}:
	default:
	}
	return nil
}

func (l *collectLink) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.frames)
}

// wait returns the first n frames, failing tb after timeout.
func (l *collectLink) wait(tb testing.TB, n int, timeout time.Duration) [][]byte {
	tb.Helper()
	deadline := time.After(timeout)
	for {
		l.mu.Lock()
		if len(l.frames) >= n {
			out := l.frames[:n:n]
			l.mu.Unlock()
			return out
		}
		have := len(l.frames)
		l.mu.Unlock()
		select {
		case <-l.notify:
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			tb.Fatalf("got %d frames, want %d", have, n)
		}
	}
}

func newFakeClock() *testenv.Clock {
	return testenv.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
}

type node struct {
	nic  fabric.NIC
	eng  *Engine
	link *collectLink
}

// cluster is a fabric the tests open nodes of: a *mem.Cluster, or
// shmCluster.
type cluster interface {
	NewNIC(id fabric.NodeID) (fabric.NIC, error)
}

// shmCluster is a fabric/shm fabric of this test's, whose NICs lend a
// peer's memory in place (fabric.RemoteViewer): the engine takes
// rendezvous frames by view there (view.go), by GET on mem.
type shmCluster struct{ name string }

var shmSeq atomic.Int64

// newShmCluster names a fresh shm fabric and checks at the end of the test
// that its NICs, closed by then, left no file in /dev/shm.
func newShmCluster(tb testing.TB) shmCluster {
	tb.Helper()
	name := fmt.Sprintf("exntest%d_%d", os.Getpid(), shmSeq.Add(1))
	tb.Cleanup(func() {
		left, _ := filepath.Glob("/dev/shm/exn-" + name + "-*")
		for _, f := range left {
			os.Remove(f)
		}
		if len(left) > 0 {
			tb.Errorf("shm fabric %s left files: %v", name, left)
		}
	})
	return shmCluster{name}
}

func (c shmCluster) NewNIC(id fabric.NodeID) (fabric.NIC, error) { return shm.Open(c.name, id) }

// openEth opens node id of cluster c and its EXT-Eth VPID. The caller
// closes the NIC.
func openEth(tb testing.TB, c cluster, id fabric.NodeID) (fabric.NIC, fabric.Endpoint) {
	tb.Helper()
	nic, err := c.NewNIC(id)
	if err != nil {
		tb.Fatal(err)
	}
	ep, err := nic.Open(fabric.EthVPID)
	if err != nil {
		tb.Fatal(err)
	}
	return nic, ep
}

// clockedNode starts node 1 of cluster c with cfg on a fake clock it
// returns (cfg.Now is replaced).
func clockedNode(tb testing.TB, c cluster, cfg Config) (*node, *testenv.Clock) {
	tb.Helper()
	clk := newFakeClock()
	cfg.Now = clk.Now
	return newNodes(tb, c, cfg, 1)[0], clk
}

// newNodes starts one engine per id on cluster c with cfg.
func newNodes(tb testing.TB, c cluster, cfg Config, ids ...fabric.NodeID) []*node {
	tb.Helper()
	var out []*node
	for _, id := range ids {
		nic, ep := openEth(tb, c, id)
		l := newCollectLink()
		e, err := New(nic, ep, l, cfg)
		if err != nil {
			tb.Fatal(err)
		}
		n := &node{nic: nic, eng: e, link: l}
		tb.Cleanup(func() {
			l.mu.Lock()
			blk := l.block
			l.mu.Unlock()
			if blk != nil {
				select {
				case <-blk:
				default:
					close(blk)
				}
			}
			e.Close()
			nic.Close()
		})
		out = append(out, n)
	}
	return out
}

func pair(tb testing.TB, cfg Config, opts ...mem.Option) (a, b *node) {
	tb.Helper()
	return pairOn(tb, mem.NewCluster(opts...), cfg)
}

// pairOn starts engines on nodes 1 and 2 of c, with leak checks.
func pairOn(tb testing.TB, c cluster, cfg Config) (a, b *node) {
	tb.Helper()
	testenv.VerifyNoLeaks(tb)
	ns := newNodes(tb, c, cfg, 1, 2)
	return ns[0], ns[1]
}

// fabrics are the two ways a rendezvous frame is taken: by GET (mem) and
// in place (shm, view.go). Tests of the receive path run on both.
var fabrics = []struct {
	name   string
	open   func(testing.TB) cluster
	viewed bool
}{
	{"mem, by GET", func(testing.TB) cluster { return mem.NewCluster() }, false},
	{"shm, in place", func(tb testing.TB) cluster { return newShmCluster(tb) }, true},
}

// frame builds an Ethernet frame of size bytes (>= 14) from src to dst:
// EtherType 0x88B5 (local experimental), then a 4-byte sequence number if
// it fits, then a pattern derived from seq.
func frame(dst, src []byte, size int, seq uint32) []byte {
	f := make([]byte, size)
	copy(f[0:6], dst)
	copy(f[6:12], src)
	f[12], f[13] = 0x88, 0xB5
	if size >= 18 {
		binary.BigEndian.PutUint32(f[14:18], seq)
	}
	for i := 18; i < size; i++ {
		f[i] = byte(uint32(i)*31 + seq*7)
	}
	return f
}

func mustTransmit(tb testing.TB, e *Engine, frames ...[]byte) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := e.Transmit(ctx, frames)
	if err != nil || n != len(frames) {
		tb.Fatalf("Transmit: n=%d/%d err=%v", n, len(frames), err)
	}
}

// eventually polls cond until it holds or 5 s pass.
func eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	testenv.Eventually(tb, what, 5*time.Second, cond)
}

// settled is quiet on both engines of a transfer from a to b, and checks
// that b dropped nothing.
func settled(tb testing.TB, a, b *node) {
	tb.Helper()
	quiet(tb, a.eng)
	quiet(tb, b.eng)
	if s := b.eng.Stats(); s.TotalDrops() != 0 {
		tb.Errorf("drops:%s", dropsString(s))
	}
}

// quiet waits until e has nothing in flight and checks the pools are
// whole.
func quiet(tb testing.TB, e *Engine) {
	tb.Helper()
	var s Stats
	deadline := time.Now().Add(5 * time.Second)
	for {
		s = e.Stats()
		if s.TxSlotsInUse == 0 && s.RxSlotsInUse == 0 && s.PendingGets == 0 &&
			s.OutstandingAdverts == 0 && s.WaitingAdverts == 0 {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("engine not quiet after 5 s: tx slots %d, rx slots %d, pending GETs %d, outstanding adverts %d, waiting adverts %d, refusals sent %d lost %d, advert timeouts %d, drops:%s",
				s.TxSlotsInUse, s.RxSlotsInUse, s.PendingGets, s.OutstandingAdverts, s.WaitingAdverts,
				s.RefusalsSent, s.RefusalsLost, s.AdvertTimeouts, dropsString(s))
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func dropsString(s Stats) string {
	out := ""
	for r := DropReason(1); r < NumDropReasons; r++ {
		if s.Drops[r] != 0 {
			out += fmt.Sprintf(" %v=%d", r, s.Drops[r])
		}
	}
	return out
}

// benchNodes starts engines 1 and 2 without leak checks; node 2 delivers
// to l.
func benchNodes(tb testing.TB, cfg Config, l Link) []*node {
	tb.Helper()
	c := mem.NewCluster()
	var out []*node
	for i, id := range []fabric.NodeID{1, 2} {
		nic, err := c.NewNIC(id)
		if err != nil {
			tb.Fatal(err)
		}
		ep, _ := nic.Open(fabric.EthVPID)
		link := Link(newCollectLink())
		if i == 1 {
			link = l
		}
		e, err := New(nic, ep, link, cfg)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { e.Close(); nic.Close() })
		out = append(out, &node{nic: nic, eng: e})
	}
	return out
}

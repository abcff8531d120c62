package exn

import (
	"bytes"
	"context"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/mem"
	"github.com/exn-project/exn/internal/testenv"
)

// TestViewSenderDies: a frame taken in place stays readable when its
// sender dies before the Link has written it (the view holds the
// mapping), arrives whole, and its end notifies no one and leaks nothing.
func TestViewSenderDies(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	c := newShmCluster(t)
	b := newNodes(t, c, Config{}, 1)[0]
	hold := b.link.hold()
	at := newAttacker(t, c, 3)
	to := b.nic.Node()
	good := frame(b.eng.MAC(), nodeMAC(at.nic.Node()), 2000, 1)
	copy(at.reg.Buf, good)
	at.send(t, msg(to, tagAdvert, advertBytes(at.reg.NLA, uint32(len(good)), 0)))
	eventually(t, "frame taken in place", func() bool { return b.eng.Stats().RxViewed == 1 })
	// The Link is blocked on the viewed frame; its sender dies.
	at.nic.Close()
	close(hold)
	if got := b.link.wait(t, 1, 5*time.Second)[0]; !bytes.Equal(got, good) {
		t.Error("frame of a sender that died after the view differs")
	}
	quiet(t, b.eng)
	if s := b.eng.Stats(); s.TotalDrops() != 0 || s.RxFrames[ProtoRendezvous] != 1 {
		t.Errorf("rendezvous frames %d, drops:%s", s.RxFrames[ProtoRendezvous], dropsString(s))
	}
}

// TestViewsReleased: every view ends, whether its frame was delivered,
// dropped or still queued when the engines closed: once the engines and
// NICs are closed, this process maps no file of the fabric any more (a
// view not ended would keep its peer's region mapped).
func TestViewsReleased(t *testing.T) {
	c := newShmCluster(t)
	a, b := pairOn(t, c, Config{})
	var frames [][]byte
	for i := range 200 {
		frames = append(frames, frame(b.eng.MAC(), a.eng.MAC(), 600+i*40, uint32(i)))
	}
	mustTransmit(t, a.eng, frames...)
	b.link.wait(t, len(frames), 10*time.Second)
	if got := b.eng.Stats().RxViewed; got != uint64(len(frames)) {
		t.Fatalf("%d frames taken in place, want %d", got, len(frames))
	}
	// More traffic, and the engines close under it.
	go func() {
		for range 20 {
			if _, err := a.eng.Transmit(context.Background(), frames[:20]); err != nil {
				return
			}
		}
	}()
	time.Sleep(2 * time.Millisecond)
	for _, n := range []*node{b, a} {
		n.eng.Close()
		n.nic.Close()
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(maps), "\n") {
		if strings.Contains(line, "exn-"+c.name+"-") {
			t.Errorf("still mapped after close: %s", line)
		}
	}
}

// spinRecorder is an endpoint that lets its consumer set Wait's spin,
// and records what it was set to.
type spinRecorder struct {
	fabric.Endpoint
	mu   sync.Mutex
	spin []time.Duration
}

func (r *spinRecorder) SetWaitSpin(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.spin = append(r.spin, d)
}

// TestWaitSpin: an engine on an endpoint that lets it choose sets its
// receive loop's Wait to park at once (rxWaitSpin), and still receives.
func TestWaitSpin(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	c := mem.NewCluster()
	a := newNodes(t, c, Config{}, 1)[0]
	nic, ep := openEth(t, c, 2)
	rec := &spinRecorder{Endpoint: ep}
	l := newCollectLink()
	e, err := New(nic, rec, l, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { e.Close(); nic.Close() }()
	rec.mu.Lock()
	got := slices.Clone(rec.spin)
	rec.mu.Unlock()
	if !slices.Equal(got, []time.Duration{rxWaitSpin}) {
		t.Fatalf("SetWaitSpin calls %v, want [%v]", got, rxWaitSpin)
	}
	f := frame(e.MAC(), a.eng.MAC(), 2000, 1)
	mustTransmit(t, a.eng, f)
	if got := l.wait(t, 1, 5*time.Second)[0]; !bytes.Equal(got, f) {
		t.Error("frame differs")
	}
}

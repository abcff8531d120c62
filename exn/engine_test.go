package exn

import (
	"bytes"
	"context"
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"time"
)

func TestFrameSizes(t *testing.T) {
	a, b := pair(t, Config{MTU: MaxMTU})
	sizes := []int{14, 60, 120, 121, 480, 481, 496, 497, 1500, 9000, 65535 + 14}
	for i, size := range sizes {
		f := frame(b.eng.MAC(), a.eng.MAC(), size, uint32(i))
		before := b.eng.Stats()
		mustTransmit(t, a.eng, f)
		got := b.link.wait(t, i+1, 5*time.Second)[i]
		if !bytes.Equal(got, f) {
			t.Fatalf("size %d: frame differs (got %d bytes)", size, len(got))
		}
		after := b.eng.Stats()
		want := ProtoEager
		if size > DefaultEagerThreshold {
			want = ProtoRendezvous
		}
		if after.RxFrames[want] != before.RxFrames[want]+1 {
			t.Errorf("size %d: not received as %v", size, want)
		}
	}
	settled(t, a, b)
}

// TestOrderMixed sends a random mix of small and large frames, with
// pools small enough that adverts wait for rx buffers and Transmit waits
// for tx slots, and checks they arrive complete and in order.
func TestOrderMixed(t *testing.T) {
	for _, f := range fabrics {
		t.Run(f.name, func(t *testing.T) { orderMixed(t, f.open(t)) })
	}
}

func orderMixed(t *testing.T, c cluster) {
	a, b := pairOn(t, c, Config{TxSlots: 3, RxSlots: 2})
	n := 2000
	if testing.Short() {
		n = 300
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var frames [][]byte
	for i := range n {
		size := 14 + rng.IntN(600)
		if rng.IntN(4) == 0 {
			size = 481 + rng.IntN(20000)
		}
		frames = append(frames, frame(b.eng.MAC(), a.eng.MAC(), max(size, 18), uint32(i)))
	}
	for i := 0; i < n; {
		k := min(1+rng.IntN(40), n-i)
		mustTransmit(t, a.eng, frames[i:i+k]...)
		i += k
	}
	got := b.link.wait(t, n, 30*time.Second)
	for i := range got {
		if !bytes.Equal(got[i], frames[i]) {
			t.Fatalf("frame %d: got seq %d len %d, want len %d", i, binary.BigEndian.Uint32(got[i][14:]), len(got[i]), len(frames[i]))
		}
	}
	settled(t, a, b)
}

// TestConcurrentTransmit: several goroutines transmit mixed sizes to one
// receiver; each goroutine's frames arrive complete and in its order.
func TestConcurrentTransmit(t *testing.T) {
	a, b := pair(t, Config{TxSlots: 4, RxSlots: 3})
	const senders = 4
	per := 300
	if testing.Short() {
		per = 60
	}
	done := make(chan struct{})
	for g := range senders {
		go func() {
			defer func() { done <- struct{}{} }()
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for i := range per {
				size := 18 + rng.IntN(1500)
				f := frame(b.eng.MAC(), a.eng.MAC(), size, uint32(g<<24|i))
				if _, err := a.eng.Transmit(context.Background(), [][]byte{f}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for range senders {
		<-done
	}
	got := b.link.wait(t, senders*per, 30*time.Second)
	next := make([]uint32, senders)
	for _, f := range got {
		seq := binary.BigEndian.Uint32(f[14:])
		g, i := seq>>24, seq&0xFFFFFF
		if i != next[g] {
			t.Fatalf("sender %d: frame %d arrived, want %d", g, i, next[g])
		}
		if !bytes.Equal(f, frame(b.eng.MAC(), a.eng.MAC(), len(f), seq)) {
			t.Fatalf("sender %d frame %d corrupt", g, i)
		}
		next[g]++
	}
	quiet(t, a.eng)
	quiet(t, b.eng)
}

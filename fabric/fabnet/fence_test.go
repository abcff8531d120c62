package fabnet

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
)

// batch is what one takeLocked put on the wire: the VELO frames' tags,
// and the PUTs whose last chunk it carried.
type batch struct {
	tags []fabric.Tag
	last []*bulk
}

// takeAll drains the session's queues as the writer would, one batch at a
// time, and describes each batch.
func takeAll(t *testing.T, s *session) []batch {
	t.Helper()
	var out []batch
	for range 100 {
		s.wmu.Lock()
		ok := s.takeLocked()
		s.wmu.Unlock()
		if !ok {
			return out
		}
		var b batch
		for c := s.out.ctl; len(c) > 0; {
			p, err := decodePrefix(c)
			if err != nil {
				t.Fatalf("control frames: %v", err)
			}
			if p.typ == tVELO {
				d, err := fabric.DecodeDescriptor(binary.LittleEndian.Uint64(c[prefixSize:]))
				if err != nil {
					t.Fatalf("velo descriptor: %v", err)
				}
				b.tags = append(b.tags, d.Tag)
			}
			c = c[prefixSize+int(p.n):]
		}
		for _, it := range s.out.items[:s.out.n] {
			if it.done {
				b.last = append(b.last, it.b)
			}
		}
		out = append(out, b)
		s.out.ctl, s.out.n = nil, 0 // the bulks stay ours: no finishOut
	}
	t.Fatal("queues never drained")
	return nil
}

// TestPutFence: a VPID's message sent after its PUT leaves in a batch
// after the PUT's last chunk; other VPIDs' messages, and messages behind
// a GET response, do not wait.
func TestPutFence(t *testing.T) {
	reg := &region{buf: make([]byte, 2<<20)}
	put := func(a fabric.VPID, chunks int) *bulk {
		return &bulk{put: true, reg: reg, total: uint32(chunks * chunkSize), a: a, b: a}
	}
	get := &bulk{reg: reg, total: 20 * chunkSize, a: 2, b: 2}
	msg := fabric.Message{Peer: fabric.Addr{VPID: 1}, Len: 8}

	type step struct {
		bulk *bulk       // queue this transfer, or
		velo fabric.VPID // send a message from this VPID
	}
	big, small, other := put(2, 20), put(2, 1), put(3, 20)
	for _, tc := range []struct {
		name  string
		steps []step
		// want: for each message sent, in order, the transfer whose last
		// chunk leaves in the batch before it (nil: the first batch)
		want []*bulk
	}{
		{"own put fences", []step{{bulk: big}, {velo: 2}}, []*bulk{big}},
		{"other vpid passes", []step{{bulk: big}, {velo: 1}}, []*bulk{nil}},
		{"other vpid's put does not fence", []step{{bulk: other}, {velo: 2}}, []*bulk{nil}},
		{"get response does not fence", []step{{bulk: get}, {velo: 2}}, []*bulk{nil}},
		{"a later message waits behind a fenced one", []step{{bulk: big}, {velo: 2}, {bulk: small}, {velo: 2}, {velo: 1}}, []*bulk{big, big, nil}},
		{"a message waits for every put before it", []step{{bulk: big}, {bulk: small}, {velo: 2}}, []*bulk{big}},
		{"a message does not wait for a later put", []step{{bulk: small}, {velo: 2}, {bulk: big}}, []*bulk{small}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, b := range []*bulk{big, small, other, get} {
				b.off, b.aborted, b.seq = 0, false, 0
			}
			s := &session{}
			var sent []fabric.VPID
			for _, st := range tc.steps {
				if st.bulk != nil {
					if !s.queueBulk(st.bulk) {
						t.Fatal("queueBulk refused")
					}
					continue
				}
				m := msg
				m.Tag = fabric.Tag(len(sent))
				s.queueVELO(st.velo, &m)
				sent = append(sent, st.velo)
			}
			// Each message must leave in the batch after its transfer's
			// last chunk (or in the first batch), and a VPID's messages in
			// the order it sent them.
			doneAt := map[*bulk]int{}
			last := map[fabric.VPID]fabric.Tag{}
			seen := 0
			for i, b := range takeAll(t, s) {
				for _, tag := range b.tags {
					v, w := sent[tag], tc.want[tag]
					switch {
					case w == nil && i != 0:
						t.Errorf("message %d (vpid %d) left in batch %d, want the first", tag, v, i)
					case w != nil:
						if at, ok := doneAt[w]; !ok || at != i-1 {
							t.Errorf("message %d (vpid %d) left in batch %d, want the one after its put's last chunk (%d, %v)", tag, v, i, at, ok)
						}
					}
					if p, ok := last[v]; ok && p > tag {
						t.Errorf("message %d of vpid %d overtook message %d", tag, v, p)
					}
					last[v] = tag
					seen++
				}
				for _, l := range b.last {
					doneAt[l] = i
				}
			}
			if seen != len(sent) {
				t.Errorf("%d of %d messages left", seen, len(sent))
			}
			if len(s.fences) != 0 || len(s.fenced) != 0 {
				t.Errorf("fence state left: %d frames, %d bytes", len(s.fences), len(s.fenced))
			}
			for v, n := range s.openPuts {
				t.Errorf("openPuts[%d] = %d after every chunk was taken", v, n)
			}
		})
	}
}

// TestPutFenceEndToEnd: between two real nodes, a message an endpoint
// sends right after its PUT finds the PUT's data in place at the peer
// (the suite's PutOrder case, which skips while PutsBeforeSends answers
// false: endpoint.go).
func TestPutFenceEndToEnd(t *testing.T) {
	nics := cluster(t, 2, nil)
	a, b := fabrictest.OpenEP(t, nics[0], 1), fabrictest.OpenEP(t, nics[1], 1)
	const size = 300 << 10 // five chunks and a part
	la, rb := fabrictest.Register(t, a, size), fabrictest.Register(t, b, size)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for round := range 10 {
		for i := range la.Buf {
			la.Buf[i] = byte(round + i)
		}
		if _, err := a.Post([]fabric.RMA{{Op: fabric.OpPut, Peer: b.Addr(), Local: la.NLA, Remote: rb.NLA, Len: size}}); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Send(ctx, []fabric.Message{{Peer: b.Addr(), Tag: 1, Len: 8}}); err != nil {
			t.Fatal(err)
		}
		var m [1]fabric.Message
		fabrictest.RecvWait(t, ctx, b, m[:])
		for i, v := range rb.Buf {
			if v != la.Buf[i] {
				t.Fatalf("round %d: byte %d = %#x when the message came, want %#x", round, i, v, la.Buf[i])
			}
		}
	}
}

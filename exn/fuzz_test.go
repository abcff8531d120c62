package exn

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/exn-project/exn/fabric"
)

// FuzzReassembly feeds an arbitrary fragment sequence (each: tag byte,
// length byte, data) to one reassembler, then a valid fragmentation of a
// known frame. Whatever came before, the known frame must come out intact
// (resync on the next first fragment), no frame may exceed maxFrame, and
// after a reset every buffer is back in the pool.
func FuzzReassembly(f *testing.F) {
	f.Add([]byte{0xC0, 120, 0x81, 5})
	f.Add([]byte{0xE0, 14, 0x80, 120, 0x81, 120, 0x80, 120})
	f.Add([]byte{0xC0, 120, 0xC0, 120, 0xA1, 3, 0x01, 16})
	f.Add([]byte{0x81, 120, 0xA2, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		const maxFrame = 1514
		pool := newBufPool(480, maxFrame)
		var r reasm
		data := bytes.Repeat([]byte{0x5A}, fragLen)
		for len(in) >= 2 {
			tag, n := fabric.Tag(in[0]|0x80), int(in[1])%(fragLen+1)
			in = in[2:]
			buf, got, _, _ := r.feed(pool, tag, data[:n], maxFrame)
			if buf != nil {
				if got < EthHeaderLen || got > maxFrame {
					t.Fatalf("frame of %d bytes", got)
				}
				pool.put(buf)
			}
		}
		want := frame(nodeMAC(2), nodeMAC(1), 1000, 7)
		msgs := make([]fabric.Message, numFragments(len(want)))
		putFragments(msgs, want, fabric.Addr{Node: 2}, false)
		var out *frameBuf
		var n int
		for i := range msgs {
			buf, got, drop, _ := r.feed(pool, msgs[i].Tag, msgs[i].Payload(), maxFrame)
			if drop != DropNone {
				t.Fatalf("valid fragment %d dropped: %v", i, drop)
			}
			if buf != nil {
				out, n = buf, got
			}
		}
		if out == nil || !bytes.Equal(out.b[:n], want) {
			t.Fatal("valid frame after garbage not reassembled")
		}
		pool.put(out)
		r.reset(pool)
		if pool.inUse != 0 {
			t.Fatalf("%d buffers leaked", pool.inUse)
		}
	})
}

// FuzzAdvert: decodeAdvert never panics, accepts only well-formed
// adverts, and what it accepts re-encodes to the same bytes.
func FuzzAdvert(f *testing.F) {
	f.Add(advertBytes(fabric.MakeNLA(1, 64), 1000, 3))
	f.Add(advertBytes(0, 1000, 3))
	f.Add(advertBytes(fabric.MakeNLA(1, 0), 13, 0))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, p []byte) {
		const maxFrame = 9014
		a, reason := decodeAdvert(p, maxFrame)
		if reason != DropNone {
			if reason != DropAdvertMalformed && reason != DropAdvertLength {
				t.Fatalf("reason %v", reason)
			}
			return
		}
		if a.len < EthHeaderLen || a.len > maxFrame || a.nla.Region() == 0 {
			t.Fatalf("accepted %+v", a)
		}
		var b [advertLen]byte
		a.encode(b[:])
		if !bytes.Equal(b[:], p) {
			t.Fatalf("re-encode %x != %x", b, p)
		}
	})
}

// FuzzPushed: a push announcement, plain or offload, decodes only with
// the advert's checks and the exact length, and re-encodes to itself.
func FuzzPushed(f *testing.F) {
	f.Add(pushedBytes(fabric.MakeNLA(1, 64), 1000, 3, 9), false)
	f.Add(make([]byte, advertXLen+stampLen), true)
	f.Add([]byte{1, 2, 3}, false)
	f.Fuzz(func(t *testing.T, p []byte, x bool) {
		const maxFrame = 9014
		a, reason := decodePushed(p, maxFrame, x)
		if reason != DropNone {
			switch reason {
			case DropPushForged, DropAdvertMalformed, DropAdvertLength, DropOffloadForged:
			default:
				t.Fatalf("reason %v", reason)
			}
			return
		}
		if a.len < EthHeaderLen || a.nla.Region() == 0 || (!x && a.len > maxFrame) {
			t.Fatalf("accepted %+v", a)
		}
		b := make([]byte, fabric.MaxVELOPayload)
		if n := a.encodePushed(b, x); !bytes.Equal(b[:n], p) {
			t.Fatalf("re-encode %x != %x", b[:n], p)
		}
	})
}

// FuzzGrant: a grant decodes only with 1..maxGrantNLAs NLAs that leave
// room for the push header, and says exactly those.
func FuzzGrant(f *testing.F) {
	f.Add(grantBytes(7, fabric.MakeNLA(2, 64), fabric.MakeNLA(2, 9216)))
	f.Add(grantBytes(7))
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, p []byte) {
		inc, nlas, ok := decodeGrant(p)
		if !ok {
			return
		}
		k := len(nlas) / 8
		if k < 1 || k > maxGrantNLAs || len(nlas)%8 != 0 || len(p) != grantHdr+len(nlas) {
			t.Fatalf("accepted %d NLAs from %d bytes", k, len(p))
		}
		var want []fabric.NLA
		for i := range k {
			a := fabric.NLA(binary.LittleEndian.Uint64(nlas[8*i:]))
			if a.Region() == 0 || a.Offset() < pushHdrLen {
				t.Fatalf("accepted NLA %v", a)
			}
			want = append(want, a)
		}
		if !bytes.Equal(grantBytes(inc, want...), p) {
			t.Fatal("re-encode differs")
		}
	})
}

// TestFragmentRoundTrip checks fragment counts at the boundaries and that
// putFragments/feed round-trip every size.
func TestFragmentRoundTrip(t *testing.T) {
	pool := newBufPool(480, 65535+14)
	var r reasm
	for _, tc := range []struct{ size, frags int }{
		{14, 1}, {120, 1}, {121, 2}, {480, 4}, {481, 5}, {4000, 34}, {65549, 547},
	} {
		if got := numFragments(tc.size); got != tc.frags {
			t.Errorf("numFragments(%d) = %d, want %d", tc.size, got, tc.frags)
		}
		want := frame(nodeMAC(2), nodeMAC(1), tc.size, 1)
		msgs := make([]fabric.Message, tc.frags)
		putFragments(msgs, want, fabric.Addr{Node: 2}, false)
		for i := range msgs {
			buf, n, drop, _ := r.feed(pool, msgs[i].Tag, msgs[i].Payload(), 65549)
			if drop != DropNone {
				t.Fatalf("size %d frag %d: %v", tc.size, i, drop)
			}
			if (buf != nil) != (i == len(msgs)-1) {
				t.Fatalf("size %d: completion at fragment %d", tc.size, i)
			}
			if buf != nil {
				if !bytes.Equal(buf.b[:n], want) {
					t.Fatalf("size %d differs", tc.size)
				}
				pool.put(buf)
			}
		}
	}
	if pool.inUse != 0 {
		t.Errorf("%d buffers in use", pool.inUse)
	}
}

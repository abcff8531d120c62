package fabric

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

func TestNotificationRoundTrip(t *testing.T) {
	cases := []Notification{
		{Kind: KindRequester, Op: OpPut, Peer: Addr{1, 0}, Len: 1, Local: MakeNLA(1, 0)},
		{Kind: KindCompleter, Op: OpGet, Peer: Addr{0xFFFF, 255}, Len: MaxRMALen, Local: ^NLA(0)},
		{Kind: KindResponder, Op: OpGet, Err: NErrPeerDown, Peer: Addr{42, 7}, Len: 497, Local: LastFrame(MakeNLA(3, 8), 497)},
		{Kind: KindRequester, Op: OpPut, Err: NErrBounds, Len: 0},
	}
	for _, want := range cases {
		var b [NotificationSize]byte
		want.Encode(b[:])
		got, err := DecodeNotification(b[:])
		if err != nil {
			t.Fatalf("decode %+v: %v", want, err)
		}
		if got != want {
			t.Fatalf("round trip: got %+v, want %+v", got, want)
		}
	}
}

func TestDecodeNotificationRejects(t *testing.T) {
	valid := Notification{Kind: KindRequester, Op: OpPut, Len: 8}
	word := func(mod func(w0 uint64) uint64) []byte {
		var b [NotificationSize]byte
		valid.Encode(b[:])
		w0 := binary.LittleEndian.Uint64(b[:8])
		binary.LittleEndian.PutUint64(b[:8], mod(w0))
		return b[:]
	}
	cases := []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"short", make([]byte, NotificationSize-1)},
		{"op 0", word(func(w uint64) uint64 { return w &^ 3 })},
		{"op 3", word(func(w uint64) uint64 { return w | 3 })},
		{"kind 0", word(func(w uint64) uint64 { return w &^ (3 << 2) })},
		{"err 4", word(func(w uint64) uint64 { return w | 4<<4 })},
		{"err 15", word(func(w uint64) uint64 { return w | 15<<4 })},
		{"reserved bit 56", word(func(w uint64) uint64 { return w | 1<<56 })},
		{"reserved bit 63", word(func(w uint64) uint64 { return w | 1<<63 })},
		{"len over max", word(func(w uint64) uint64 { return w&^(0xFFFFFF<<32) | (MaxRMALen+1)<<32 })},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := DecodeNotification(tc.b); !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
		})
	}
}

func FuzzDecodeNotification(f *testing.F) {
	for _, n := range []Notification{
		{Kind: KindRequester, Op: OpPut, Len: 1},
		{Kind: KindResponder, Op: OpGet, Err: NErrAccess, Peer: Addr{9, 9}, Len: MaxRMALen, Local: 1 << 40},
	} {
		var b [NotificationSize]byte
		n.Encode(b[:])
		f.Add(b[:])
	}
	f.Add([]byte{})
	f.Add(bytes.Repeat([]byte{0xFF}, NotificationSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := DecodeNotification(b)
		if rejected(t, err) {
			return
		}
		// Anything accepted re-encodes to the same 16 bytes.
		var out [NotificationSize]byte
		n.Encode(out[:])
		if !bytes.Equal(out[:], b[:NotificationSize]) {
			t.Fatalf("re-encode of %+v: %x, input %x", n, out, b[:NotificationSize])
		}
	})
}

func TestLastFrame(t *testing.T) {
	base := MakeNLA(2, 1000)
	cases := []struct {
		len  uint32
		want NLA
	}{
		{0, base},
		{1, base},
		{RMAMTU - 1, base},
		{RMAMTU, base},
		{RMAMTU + 1, base + RMAMTU},
		{2 * RMAMTU, base + RMAMTU},
		{2*RMAMTU + 5, base + 2*RMAMTU},
		{MaxRMALen, base + NLA(MaxRMALen/RMAMTU)*RMAMTU}, // 8 MiB is not a multiple of 496
	}
	for _, tc := range cases {
		if got := LastFrame(base, tc.len); got != tc.want {
			t.Errorf("LastFrame(base, %d) = base+%d, want base+%d", tc.len, got-base, tc.want-base)
		}
	}
}

// checkLastFrame is the property of equations 5.1/5.2: the last frame
// starts inside the transfer on an RMAMTU boundary from its start, and what
// is left from there is 1..RMAMTU bytes.
func checkLastFrame(t testing.TB, start NLA, length uint32) {
	t.Helper()
	got := LastFrame(start, length)
	if length == 0 {
		if got != start {
			t.Fatalf("LastFrame(%v, 0) = %v", start, got)
		}
		return
	}
	k := uint64(got - start)
	if got < start || k >= uint64(length) {
		t.Fatalf("LastFrame(%v, %d) = %v not in the transfer", start, length, got)
	}
	if k%RMAMTU != 0 {
		t.Fatalf("LastFrame(%v, %d) = start+%d, not a multiple of %d", start, length, k, RMAMTU)
	}
	if rest := uint64(length) - k; rest == 0 || rest > RMAMTU {
		t.Fatalf("LastFrame(%v, %d): last frame holds %d bytes", start, length, rest)
	}
}

func FuzzLastFrame(f *testing.F) {
	for _, l := range []uint32{0, 1, RMAMTU - 1, RMAMTU, RMAMTU + 1, MaxRMALen} {
		f.Add(uint64(MakeNLA(1, 0)), l)
	}
	f.Fuzz(func(t *testing.T, start uint64, length uint32) {
		length %= MaxRMALen + 1
		// Keep the transfer inside one region, as a valid request is.
		s := MakeNLA(NLA(start).Region(), NLA(start).Offset()%(MaxRegionSize-MaxRMALen))
		checkLastFrame(t, s, length)
	})
}

func TestLastFrameProperty(t *testing.T) {
	for l := uint32(0); l <= 4*RMAMTU+1; l++ {
		checkLastFrame(t, MakeNLA(7, 13), l)
	}
}

package fabric

import (
	"bytes"
	"errors"
	"math"
	"testing"
)

func TestDescriptorRoundTrip(t *testing.T) {
	for _, d := range []Descriptor{
		{},
		{Node: 0xFFFF, VPID: 255, Tag: 255, Len: MaxVELOPayload},
		{Node: Node63(), VPID: 3, Tag: 1, Len: 0, MC: true},
		{Node: 12, VPID: 0, Tag: 9, Len: 64},
	} {
		w := d.Encode()
		if w>>DescriptorSeqShift != 0 {
			t.Fatalf("Encode(%+v) set backend bits: %#x", d, w)
		}
		got, err := DecodeDescriptor(w)
		if err != nil || got != d {
			t.Fatalf("round trip %+v: got %+v, %v", d, got, err)
		}
		// The backend bits are ignored.
		if got, err := DecodeDescriptor(w | 0xABCDEF<<DescriptorSeqShift); err != nil || got != d {
			t.Fatalf("with sequence bits %+v: got %+v, %v", d, got, err)
		}
	}
}

// Node63 is the broadcast group as a descriptor node field.
func Node63() NodeID { return NodeID(Broadcast) }

func TestDecodeDescriptorRejects(t *testing.T) {
	for _, w := range []uint64{
		uint64(MaxVELOPayload+1) << 32,
		uint64(0x7F) << 32,
		1<<39 | uint64(MaxGroups),
		1<<39 | 0xFFFF,
	} {
		if _, err := DecodeDescriptor(w); !errors.Is(err, ErrInvalid) {
			t.Errorf("DecodeDescriptor(%#x) = %v, want ErrInvalid", w, err)
		}
	}
}

// rejected reports whether a fuzzer's input was refused (err is not
// nil), failing t if the refusal is not ErrInvalid.
func rejected(t testing.TB, err error) bool {
	t.Helper()
	if err != nil && !errors.Is(err, ErrInvalid) {
		t.Fatalf("error not ErrInvalid: %v", err)
	}
	return err != nil
}

func FuzzDecodeDescriptor(f *testing.F) {
	f.Add(Descriptor{Node: 5, VPID: 1, Tag: 2, Len: 120}.Encode())
	f.Add(Descriptor{Node: 63, MC: true}.Encode())
	f.Add(uint64(math.MaxUint64))
	f.Fuzz(func(t *testing.T, w uint64) {
		d, err := DecodeDescriptor(w)
		if rejected(t, err) {
			return
		}
		if d.Len > MaxVELOPayload || d.MC && d.Node >= MaxGroups {
			t.Fatalf("accepted invalid descriptor %+v", d)
		}
		if d.Encode() != w&(1<<DescriptorSeqShift-1) {
			t.Fatalf("re-encode %+v = %#x, input %#x", d, d.Encode(), w)
		}
	})
}

func TestNLA(t *testing.T) {
	a := MakeNLA(MaxRegions, MaxRegionSize-1)
	if a.Region() != MaxRegions || a.Offset() != MaxRegionSize-1 {
		t.Fatalf("MakeNLA max: region %d offset %#x", a.Region(), a.Offset())
	}
	if b := MakeNLA(1, 0); b.Region() != 1 || b.Offset() != 0 || b == 0 {
		t.Fatalf("MakeNLA(1, 0) = %v", b)
	}
	if NLA(0).Region() != 0 {
		t.Fatal("NLA 0 has a region")
	}
}

func TestCheckRange(t *testing.T) {
	r := MakeNLA(4, 0)
	cases := []struct {
		a    NLA
		n    uint64
		size uint64
		ok   bool
	}{
		{r, 0, 0, true},
		{r, 1, 0, false},
		{r, 100, 100, true},
		{r, 101, 100, false},
		{r + 100, 0, 100, true},
		{r + 100, 1, 100, false},
		{r + 101, 0, 100, false},
		{r + 50, 50, 100, true},
		{r + 50, math.MaxUint64, 100, false},              // n wraps off+n
		{r + 1, math.MaxUint64 - 1, math.MaxUint64, true}, // exactly fits
		{r + 1, math.MaxUint64, math.MaxUint64, false},    // one past
		{MakeNLA(4, MaxRegionSize-1), 2, MaxRegionSize, false},
		{MakeNLA(4, MaxRegionSize-1), 1, MaxRegionSize, true},
	}
	for _, tc := range cases {
		if got := CheckRange(tc.a, tc.n, tc.size); got != tc.ok {
			t.Errorf("CheckRange(%v, %d, %d) = %v, want %v", tc.a, tc.n, tc.size, got, tc.ok)
		}
	}
}

func FuzzCheckRange(f *testing.F) {
	f.Add(uint64(MakeNLA(1, 10)), uint64(5), uint64(20))
	f.Add(uint64(MakeNLA(1, 10)), uint64(math.MaxUint64), uint64(20))
	f.Fuzz(func(t *testing.T, a, n, size uint64) {
		off := NLA(a).Offset()
		// Reference in 128-bit arithmetic: off+n <= size without overflow.
		hi, lo := uint64(0), off+n
		if lo < off {
			hi = 1
		}
		want := hi == 0 && lo <= size
		if got := CheckRange(NLA(a), n, size); got != want {
			t.Fatalf("CheckRange(off %d, n %d, size %d) = %v, want %v", off, n, size, got, want)
		}
	})
}

func TestCheckRMA(t *testing.T) {
	ok := RMA{Op: OpGet, Len: 1, Notify: NotifyRequester | NotifyCompleter | NotifyResponder}
	cases := []struct {
		name string
		mod  func(*RMA)
		ok   bool
	}{
		{"valid get", func(*RMA) {}, true},
		{"valid put", func(r *RMA) { r.Op, r.Notify = OpPut, NotifyRequester|NotifyCompleter }, true},
		{"max len", func(r *RMA) { r.Len = MaxRMALen }, true},
		{"no notify", func(r *RMA) { r.Notify = 0 }, true},
		{"op 0", func(r *RMA) { r.Op = 0 }, false},
		{"op 3", func(r *RMA) { r.Op = 3 }, false},
		{"len 0", func(r *RMA) { r.Len = 0 }, false},
		{"len over", func(r *RMA) { r.Len = MaxRMALen + 1 }, false},
		{"unknown flag", func(r *RMA) { r.Notify = 1 << 3 }, false},
		{"put responder", func(r *RMA) { r.Op, r.Notify = OpPut, NotifyResponder }, false},
	}
	for _, tc := range cases {
		r := ok
		tc.mod(&r)
		err := CheckRMA(&r)
		if tc.ok != (err == nil) || err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: CheckRMA = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

func TestCheckSend(t *testing.T) {
	cases := []struct {
		name string
		m    Message
		ok   bool
	}{
		{"empty", Message{}, true},
		{"max", Message{Len: MaxVELOPayload}, true},
		{"over", Message{Len: MaxVELOPayload + 1}, false},
		{"mc broadcast", Message{MC: true, Peer: Addr{Node: NodeID(Broadcast)}}, true},
		{"mc bad group", Message{MC: true, Peer: Addr{Node: MaxGroups}}, false},
		{"unicast high node", Message{Peer: Addr{Node: 0xFFFF}}, true},
	}
	for _, tc := range cases {
		err := CheckSend(&tc.m)
		if tc.ok != (err == nil) || err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: CheckSend = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
	var m Message
	if err := m.SetPayload(bytes.Repeat([]byte{1}, MaxVELOPayload)); err != nil || len(m.Payload()) != MaxVELOPayload {
		t.Fatalf("SetPayload(120): %v, len %d", err, len(m.Payload()))
	}
	if err := m.SetPayload(make([]byte, MaxVELOPayload+1)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("SetPayload(121) = %v", err)
	}
}

func TestCountErr(t *testing.T) {
	var c Counters
	for _, e := range []error{nil, ErrInvalid, ErrPeerDown, ErrUnknownNode, ErrInUse, errors.New("other")} {
		if got := c.CountErr(e); got != e {
			t.Fatalf("CountErr changed the error: %v", got)
		}
	}
	s := c.Snapshot()
	if s.Invalid != 1 || s.PeerDown != 1 || s.UnknownNode != 1 || s.InUse != 1 {
		t.Fatalf("counters %+v", s)
	}
}

func TestMACPrefix(t *testing.T) {
	if err := DefaultMACPrefix.Validate(); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		s  string
		ok bool
	}{
		{"2e:87:04:07", true},
		{"2E:87:04:07", true},
		{"2e-87-04-07", false}, // colon form only
		{"02:00:00:00", true},
		{"00:87:04:07", false}, // universally administered
		{"2f:87:04:07", false}, // multicast
		{"2e:87:04", false},
		{"2e:87:04:07:01", false},
		{"zz:87:04:07", false},
		{"", false},
	}
	for _, tc := range cases {
		p, err := ParseMACPrefix(tc.s)
		if tc.ok != (err == nil) || err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseMACPrefix(%q) = %v, %v; want ok=%v", tc.s, p, err, tc.ok)
		}
	}
	for _, n := range []NodeID{0, 1, 0x1234, 0xFFFF} {
		mac := DefaultMACPrefix.MAC(n)
		got, ok := DefaultMACPrefix.Node(mac)
		if !ok || got != n {
			t.Errorf("Node(MAC(%d)) = %d, %v", n, got, ok)
		}
		if mac[0]&1 != 0 {
			t.Errorf("MAC(%d) = %v is multicast", n, mac)
		}
	}
	for _, mac := range [][]byte{nil, {0x2E, 0x87, 0x04, 0x07, 1}, {0x2E, 0x87, 0x04, 0x08, 0, 1}, {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}} {
		if _, ok := DefaultMACPrefix.Node(mac); ok {
			t.Errorf("Node(%x) accepted a foreign MAC", mac)
		}
	}
	if a := testing.AllocsPerRun(100, func() { DefaultMACPrefix.Node([]byte{0x2E, 0x87, 4, 7, 0, 1}) }); a != 0 {
		t.Errorf("Node allocates %v per call", a)
	}
}

func FuzzParseMACPrefix(f *testing.F) {
	f.Add("2e:87:04:07")
	f.Add("ff:ff:ff:ff")
	f.Add("2e:87:04:07:00:00")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseMACPrefix(s)
		if rejected(t, err) {
			return
		}
		if p.Validate() != nil {
			t.Fatalf("accepted invalid prefix %x", p)
		}
		for _, n := range []NodeID{0, 0xBEEF} {
			if got, ok := p.Node(p.MAC(n)); !ok || got != n {
				t.Fatalf("prefix %x: node %d round trip = %d, %v", p, n, got, ok)
			}
		}
	})
}

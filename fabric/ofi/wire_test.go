package ofi

import (
	"errors"
	"strings"
	"testing"

	"github.com/exn-project/exn/fabric"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []header{
		{typ: pVELO, desc: fabric.Descriptor{Node: 0xFFFF, VPID: 255, Tag: 0xA5, Len: 120}, dst: 7, epoch: 63},
		{typ: pMcast, desc: fabric.Descriptor{Node: 300, VPID: 1, Len: 0}, dst: 9, epoch: 1, group: fabric.Broadcast},
		{typ: pByeAck, desc: fabric.Descriptor{Node: 2}},
	} {
		got, err := decodeHeader(h.encode())
		if err != nil || got != h {
			t.Fatalf("round trip of %+v: %+v, %v", h, got, err)
		}
	}
	// Epoch and group are masked to their 6 bits, not spilled into the type.
	h := header{typ: pVELO, epoch: 0xFF, group: 0xFF}
	got, err := decodeHeader(h.encode())
	if err != nil || got.typ != pVELO || got.epoch != epochMask || got.group != groupMask {
		t.Fatalf("masked fields: %+v, %v", got, err)
	}
}

func TestHeaderRejects(t *testing.T) {
	bad := []uint64{
		uint64(numPtypes) << hdrTypeShift,        // unknown packet type
		fabric.Descriptor{Len: 121}.Encode() | 0, // payload over 120 bytes
	}
	for _, w := range bad {
		if _, err := decodeHeader(w); !errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("decodeHeader(%#x) = %v, want ErrInvalid", w, err)
		}
	}
}

func TestRegAnswer(t *testing.T) {
	a := regAnswer{cookie: 1 << 60, status: stOK, owner: 200, key: 0xDEADBEEF, base: 0x7f0000001000, size: 4096}
	var b [regABody]byte
	a.put(b[:])
	got, err := parseRegAnswer(b[:])
	if err != nil || got != a {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	if _, err := parseRegAnswer(b[:regABody-1]); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("short answer: %v", err)
	}
	a.size = 0
	a.put(b[:])
	if _, err := parseRegAnswer(b[:]); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("zero-size ok answer: %v", err)
	}
}

func TestOpctx(t *testing.T) {
	c := opctx(mkctx(ctxRMA, 8191))
	if c.kind() != ctxRMA || c.index() != 8191 {
		t.Fatalf("opctx: kind %d index %d", c.kind(), c.index())
	}
}

// TestExplain checks each start-up diagnosis: the first requirement the
// provider fails is the one named.
func TestExplain(t *testing.T) {
	cause := errors.New("fi_getinfo: No data available (-61)")
	cases := []struct {
		name string
		has  func(caps uint64, rdm, order bool) bool
		want string
	}{
		{"missing", func(uint64, bool, bool) bool { return false }, `provider "p" not found`},
		{"no rdm", func(c uint64, rdm, _ bool) bool { return !rdm }, "FI_EP_RDM"},
		{"no rma", func(c uint64, _, _ bool) bool { return c&probeRMA == 0 }, "lacks FI_RMA"},
		{"no source", func(c uint64, _, _ bool) bool { return c&probeSource == 0 }, "lacks FI_SOURCE"},
		{"no order", func(uint64, bool, bool) bool { return true }, "FI_ORDER_SAS"},
	}
	for _, tc := range cases {
		err := explain("p", cause, tc.has, func() []string { return []string{"tcp", "shm"} })
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want it to mention %q", tc.name, err, tc.want)
		}
	}
	err := explain("p", cause, func(uint64, bool, bool) bool { return false }, func() []string { return []string{"tcp", "shm"} })
	if !strings.Contains(err.Error(), "available: tcp, shm") {
		t.Errorf("missing provider error does not list the available ones: %v", err)
	}
}

func FuzzDecodeHeader(f *testing.F) {
	f.Add(header{typ: pVELO, desc: fabric.Descriptor{Node: 1, VPID: 2, Len: 8}, dst: 3}.encode())
	f.Add(uint64(0xFFFFFFFFFFFFFFFF))
	f.Fuzz(func(t *testing.T, w uint64) {
		h, err := decodeHeader(w)
		if err != nil {
			return
		}
		if h.desc.Len > fabric.MaxVELOPayload || h.typ >= numPtypes {
			t.Fatalf("accepted %+v", h)
		}
		// Re-encoding is stable (the descriptor's MC bit aside, which the
		// wire never sets).
		if h2, err := decodeHeader(h.encode()); err != nil || h2 != h {
			t.Fatalf("re-encode %+v: %+v %v", h, h2, err)
		}
	})
}

func TestHostFiles(t *testing.T) {
	for _, tc := range []struct {
		name     string
		provider string // the provider region's file, or "" for none
	}{
		{"fi_shm://10581:0:0\x00", "/dev/shm/10581:0:0"},
		{"fi_ns://10.78.33.1:7471\x00", "/dev/shm/10.78.33.1:7471"},
		{"fi_ns://10.78.33.1:7471", "/dev/shm/10.78.33.1:7471"},
		{"fi_shm://../etc/x\x00", ""}, // no path out of /dev/shm
		{"fi_shm://\x00", ""},
		{"\x02\x00\x1d\x2f\x7f\x00\x00\x01", ""}, // a sockaddr (tcp): bell only
	} {
		got := HostFiles([]byte(tc.name))
		if len(got) < 2 || !strings.HasPrefix(got[0], "/dev/shm/exn-ofi-") || !strings.HasSuffix(got[0], ".word") ||
			got[1] != strings.TrimSuffix(got[0], ".word")+".bell" {
			t.Errorf("%q: bell files %q", tc.name, got)
			continue
		}
		if want := tc.provider; want == "" && len(got) != 2 || want != "" && (len(got) != 3 || got[2] != want) {
			t.Errorf("%q: provider files %q, want %q", tc.name, got[2:], want)
		}
	}
	if a, b := HostFiles([]byte("fi_shm://1:0:0\x00")), HostFiles([]byte("fi_shm://1:0:1\x00")); a[0] == b[0] {
		t.Errorf("two NICs share a bell: %q", a[0])
	}
}

func TestCheckBundle(t *testing.T) {
	rec := func(tag byte, n int) []byte { return append([]byte{tag, byte(n)}, make([]byte, n)...) }
	cat := func(rs ...[]byte) []byte {
		var b []byte
		for _, r := range rs {
			b = append(b, r...)
		}
		return b
	}
	full := rec(1, fabric.MaxVELOPayload)
	for _, tc := range []struct {
		name string
		body []byte
		ok   bool
	}{
		{"two adverts", cat(rec(1, 16), rec(1, 16)), true},
		{"empty records", cat(rec(1, 0), rec(2, 0)), true},
		{"largest", cat(full, full, full, full, full, full, full, full, rec(3, bundleBody-8*len(full)-bundleRec)), true},
		{"one record", rec(1, 16), false},
		{"empty", nil, false},
		{"torn header", cat(rec(1, 16), []byte{1}), false},
		{"torn payload", cat(rec(1, 16), rec(1, 16)[:10]), false},
		{"over a payload", cat(rec(1, 16), rec(1, fabric.MaxVELOPayload+1)), false},
		{"over the body", cat(full, full, full, full, full, full, full, full, full), false},
	} {
		if err := checkBundle(tc.body); (err == nil) != tc.ok || err != nil && !errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("%s: %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

func FuzzCheckBundle(f *testing.F) {
	f.Add([]byte{1, 2, 0xAA, 0xBB, 2, 0})
	f.Add([]byte{1, 200, 0})
	f.Fuzz(func(t *testing.T, body []byte) {
		if checkBundle(body) != nil {
			return
		}
		// Accepted: the records tile the body exactly, each within a
		// VELO payload, at least two, the body within bundleBody.
		k := 0
		for b := body; len(b) > 0; k++ {
			n := int(b[1])
			if n > fabric.MaxVELOPayload || len(b) < bundleRec+n {
				t.Fatalf("accepted a bad record at %d: %x", k, body)
			}
			b = b[bundleRec+n:]
		}
		if k < 2 || len(body) > bundleBody {
			t.Fatalf("accepted %d records, %d bytes", k, len(body))
		}
	})
}

package wire

import (
	"net/netip"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
)

func TestHoldReason(t *testing.T) {
	for _, tc := range []struct {
		left time.Duration
		want uint8
		back time.Duration
	}{
		{0, 0x80, 0},
		{15 * time.Millisecond, 0x80, 0},
		{16 * time.Millisecond, 0x81, 16 * time.Millisecond},
		{time.Second, 0x80 | 62, 62 * HoldQuantum},
		{MaxHold, 0xFF, MaxHold},
		{time.Minute, 0xFF, MaxHold},
	} {
		r := HoldReason(tc.left)
		back, ok := HoldOf(r)
		if r != tc.want || !ok || back != tc.back {
			t.Errorf("HoldReason(%v) = %#x → %v %v, want %#x → %v", tc.left, r, back, ok, tc.want, tc.back)
		}
	}
	for _, r := range []uint8{0, DeclineNoListener, DeclineLate, DeclineBusy, DeclineMismatch, 0x7F} {
		if _, ok := HoldOf(r); ok {
			t.Errorf("HoldOf(%#x) is a hold", r)
		}
	}
}

// TestRDirectBodies: the cross-host agreement's bodies decode what their
// encoders made and refuse every field a forger could get wrong.
func TestRDirectBodies(t *testing.T) {
	peer := fabric.Addr{Node: 2, VPID: 16}
	nla := fabric.MakeNLA(3, 9)
	var m fabric.Message
	EncClaimRDirect(&m, peer, 7, 80, 9, 1<<16, 1<<40, nla)
	rd := append([]byte(nil), m.Payload()[HdrLen:]...)
	EncCommitR(&m, peer, 9, 80, 1<<33, nla)
	cr := append([]byte(nil), m.Payload()[HdrLen:]...)

	port, tok, ring, id, got, ok := DecodeClaimRDirect(rd)
	if !ok || port != 80 || tok != 9 || ring != 1<<16 || id != 1<<40 || got != nla {
		t.Fatalf("CLAIM_RDIRECT = %d %d %d %d %v %v", port, tok, ring, id, got, ok)
	}
	cport, cid, cnla, ok := DecodeCommitR(cr)
	if !ok || cport != 80 || cid != 1<<33 || cnla != nla {
		t.Fatalf("COMMIT_R = %d %d %v %v", cport, cid, cnla, ok)
	}
	with := func(b []byte, off int, v byte) []byte {
		c := append([]byte(nil), b...)
		c[off] = v
		return c
	}
	zero := func(b []byte, off, n int) []byte {
		c := append([]byte(nil), b...)
		clear(c[off : off+n])
		return c
	}
	type bad struct {
		name string
		p    []byte
		rdir bool
	}
	cases := []bad{
		{"rdirect short", rd[:len(rd)-1], true},
		{"rdirect long", append(append([]byte(nil), rd...), 0), true},
		{"rdirect reserved", with(rd, 2, 1), true},
		{"commit short", cr[:len(cr)-1], false},
		{"commit status 0", with(cr, 2, 0), false},
		{"commit status 2", with(cr, 2, 2), false},
		{"commit reserved", with(cr, 3, 1), false},
	}
	// Every field that must not be zero: its name, offset and size in
	// each body.
	type field struct {
		name      string
		off, size int
	}
	for _, f := range []field{{"port", 0, 2}, {"token", 4, 4}, {"ring", 8, 4}, {"id", 12, 8}, {"nla", 20, 8}} {
		cases = append(cases, bad{"rdirect zero " + f.name, zero(rd, f.off, f.size), true})
	}
	for _, f := range []field{{"port", 0, 2}, {"id", 4, 8}, {"nla", 12, 8}} {
		cases = append(cases, bad{"commit zero " + f.name, zero(cr, f.off, f.size), false})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var ok bool
			if tc.rdir {
				_, _, _, _, _, ok = DecodeClaimRDirect(tc.p)
			} else {
				_, _, _, ok = DecodeCommitR(tc.p)
			}
			if ok {
				t.Fatalf("accepted %x", tc.p)
			}
		})
	}
}

// TestClaimFlags: DecodeClaim takes the direct and upgrade flags in any
// combination and ClaimFlagNone only alone (a forgo is not an offer).
func TestClaimFlags(t *testing.T) {
	peer := fabric.Addr{Node: 2, VPID: 16}
	local, remote := netip.MustParseAddrPort("10.0.0.1:40000"), netip.MustParseAddrPort("10.0.0.2:80")
	for _, tc := range []struct {
		flags uint32
		ok    bool
	}{
		{0, true},
		{ClaimFlagDirect, true},
		{ClaimFlagDirect | ClaimFlagUpgrade, true},
		{ClaimFlagNone, true},
		{ClaimFlagNone | ClaimFlagDirect, false},
		{ClaimFlagNone | ClaimFlagUpgrade, false},
		{8, false},
	} {
		var fm fabric.Message
		EncClaim(&fm, peer, 7, local, remote, tc.flags)
		sport, cport, cip, sip, flags, ok := DecodeClaim(fm.Data[HdrLen:fm.Len])
		if ok != tc.ok || ok && (flags != tc.flags || sport != 80 || cport != 40000 || cip != local.Addr() || sip != remote.Addr()) {
			t.Errorf("flags %#x: decoded %d %d %v %v %#x %v, want ok %v", tc.flags, sport, cport, cip, sip, flags, ok, tc.ok)
		}
	}
}

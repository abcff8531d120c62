package wire

import (
	"testing"
	"time"
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

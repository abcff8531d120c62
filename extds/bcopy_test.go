package extds

import (
	"testing"

	"github.com/exn-project/exn/internal/testenv"
)

func TestBCopyContent(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	big := 1 << 20
	if testenv.Small() {
		big = 256 << 10
	}
	tests := []struct {
		name     string
		sizes    []int
		wantVELO bool
		wantRMA  bool
	}{
		{"small", []int{1, 7, 116, 117, 480, 3, 100}, true, false},
		{"large", []int{481, 4096, 65536, big}, false, true},
		{"mixed", []int{1, 70000, 5, 481, 100, big, 2, 480, 1000, 3}, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t)
			c, s := p.openConns(t)
			transfer(t, c, s, tc.sizes, c.Write)
			st := p.devA.Stats()
			// A large write goes by VELO only while the ring is full.
			veloOK := tc.wantVELO == (st.TxVELOBytes > 0) || !tc.wantVELO && st.RingFullFallbacks > 0
			if !veloOK || tc.wantRMA != (st.TxRMABytes > 0) {
				t.Errorf("paths: velo %d rma %d bytes; want velo %v rma %v", st.TxVELOBytes, st.TxRMABytes, tc.wantVELO, tc.wantRMA)
			}
			// and the other direction
			transfer(t, s, c, tc.sizes, s.Write)
		})
	}
}

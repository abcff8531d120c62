package rdirect

import (
	"fmt"
	"testing"
	"time"

	"github.com/exn-project/exn/extds/dring"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/sys"
	"github.com/exn-project/exn/internal/testenv"
)

// Side s's bits of the upgrade word (shim/upgrade.h).
func att(s int) uint32 { return dring.UpgAtt << s }
func mov(s int) uint32 { return dring.UpgMov << s }
func wsh(s int) uint32 { return dring.UpgWsh << s }
func det(s int) uint32 { return dring.UpgDet << s }
func req(s int) uint32 { return dring.UpgReq << s }

// upgSet is sd's program changing its copy of the upgrade word (the shim
// CASes; an Or is the same change) and ringing its bell, as the shim's
// dring_kick does, or, with kick, exnd's Kick.
func (sd *side) upgSet(t *testing.T, bits uint32, kick bool) {
	t.Helper()
	sd.upg.Or(bits)
	if kick {
		sd.c.Kick()
	} else if err := sys.RingSocketBell(sd.pbell); err != nil {
		t.Fatal(err)
	}
}

// upgHas waits until both copies of p's word have bits.
func upgHas(t *testing.T, p *pair, what string, bits [2]uint32) {
	t.Helper()
	testenv.Eventually(t, what, 5*time.Second, func() bool {
		return p.a.upg.Load()&bits[0] == bits[0] && p.b.upg.Load()&bits[1] == bits[1]
	})
}

func TestNibbles(t *testing.T) {
	for s := range 2 {
		for n := range uint8(nibMask + 1) {
			w := wordBits(n, s)
			if got := nibble(w|dring.UpgXHost|dring.UpgGone|wordBits(nibMask, 1-s), s); got != n {
				t.Fatalf("side %d: nibble(wordBits(%#x)) = %#x", s, n, got)
			}
		}
		for _, c := range []struct {
			nib  uint8
			word uint32
		}{{nibAtt, att(s)}, {nibMov, mov(s)}, {nibWsh, wsh(s)}, {nibDet, det(s)}, {nibReq, req(s)}} {
			if w := wordBits(c.nib, s); w != c.word {
				t.Errorf("side %d: nibble bit %#x is word bits %#x, want %#x", s, c.nib, w, c.word)
			}
		}
	}
}

// TestUpgradeAcross: the two programs' changes to their copies of the
// upgrade word reach each other's copy by the engines' CDCs alone (no
// byte moves), a request to move is granted in both copies unless the
// peer program left first, and nothing is reset.
func TestUpgradeAcross(t *testing.T) {
	type step struct {
		side int // the program that changes its copy: 0 on node 1, 1 on node 2
		bits uint32
	}
	attBoth := []step{{0, att(0)}, {1, att(1)}}
	cases := []struct {
		name  string
		kick  bool // Kick instead of the program's bell
		steps []step
		want  uint32 // in both copies at the end
		never uint32 // in neither copy
	}{
		{name: "grant", steps: append(attBoth, step{0, req(0)}),
			want: att(0) | att(1) | req(0) | mov(0), never: mov(1) | req(1) | dring.UpgGone},
		{name: "grant-kicked", kick: true, steps: append(attBoth, step{1, req(1)}),
			want: att(0) | att(1) | req(1) | mov(1), never: mov(0) | req(0) | dring.UpgGone},
		{name: "both", steps: append(attBoth, step{0, req(0)}, step{1, req(1)}),
			want: att(0) | att(1) | req(0) | req(1) | mov(0) | mov(1), never: dring.UpgGone},
		{name: "refused", steps: append(attBoth, step{1, det(1)}, step{0, req(0)}),
			want: att(0) | att(1) | det(1) | req(0), never: mov(0) | mov(1) | dring.UpgGone},
		{name: "wsh", steps: append(attBoth, step{1, wsh(1)}, step{0, req(0)}),
			want: att(0) | att(1) | wsh(1) | req(0) | mov(0), never: mov(1) | dring.UpgGone},
	}
	for _, tc := range cases {
		for _, mode := range modes {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				testenv.VerifyNoLeaks(t)
				cl := newCluster(t, mode)
				p := cl.dial(t, dring.MinRing)
				exchange(t, p, 100)
				sides := [2]*side{p.a, p.b}
				var had uint32
				for i, s := range tc.steps {
					sides[s.side].upgSet(t, s.bits, tc.kick)
					had |= s.bits
					upgHas(t, p, fmt.Sprintf("step %d in both copies", i), [2]uint32{had, had})
				}
				upgHas(t, p, "the end", [2]uint32{tc.want, tc.want})
				time.Sleep(20 * time.Millisecond) // anything more would have come by now
				for n, sd := range sides {
					if w := sd.upg.Load(); w&tc.never != 0 || w != tc.want {
						t.Errorf("node %d's copy %#x, want %#x", n+1, w, tc.want)
					}
				}
				for n := 1; n <= 2; n++ {
					if r := cl.eng[n].Stats().Resets; r != ([NumReasons]uint64{}) {
						t.Fatalf("node %d resets %v", n, r)
					}
				}
				exchange(t, p, 3000)
			})
		}
	}
}

// TestUpgradeEarly: a CDC that changed the word before Start is folded
// into the early one and applied by Start; an early forged grant resets
// the connection at Start.
func TestUpgradeEarly(t *testing.T) {
	t.Run("request", func(t *testing.T) {
		testenv.VerifyNoLeaks(t)
		cl := newCluster(t, modeOrdered)
		p := cl.prepare(t, dring.MinRing)
		if err := p.b.c.Start(1, p.a.c.LocalID(), p.a.c.LocalNLA()); err != nil {
			t.Fatal(err)
		}
		p.b.upgSet(t, att(1), false)
		testenv.Eventually(t, "an early CDC", 5*time.Second, func() bool { return cl.eng[1].Stats().CDCsRecv >= 1 })
		p.b.upgSet(t, req(1), false)
		testenv.Eventually(t, "a second early CDC", 5*time.Second, func() bool { return cl.eng[1].Stats().CDCsRecv >= 2 })
		if w := p.a.upg.Load(); w != 0 {
			t.Fatalf("word %#x before Start", w)
		}
		if err := p.a.c.Start(2, p.b.c.LocalID(), p.b.c.LocalNLA()); err != nil {
			t.Fatal(err)
		}
		upgHas(t, p, "the request granted", [2]uint32{att(1) | req(1) | mov(1), att(1) | req(1) | mov(1)})
		exchange(t, p, 1000)
	})
	t.Run("forged", func(t *testing.T) {
		testenv.VerifyNoLeaks(t)
		cl := newCluster(t, modeOrdered)
		p := cl.prepare(t, dring.MinRing)
		var m fabric.Message
		(&cdc{seq: 1, dst: p.a.c.LocalID(), src: p.b.c.LocalID(), echo: nibMov}).encode(&m, cl.eng[2].Addr())
		cl.eng[1].handle(&m)
		if err := p.a.c.Start(2, p.b.c.LocalID(), p.b.c.LocalNLA()); err != nil {
			t.Fatal(err)
		}
		if r := cl.eng[1].Stats().Resets[ReasonUpgrade]; r != 1 {
			t.Fatalf("upgrade resets %d, want 1", r)
		}
		if w := p.a.upg.Load(); w != dring.UpgGone {
			t.Fatalf("word %#x, want gone alone", w)
		}
		expectReset(t, p.a.prog)
	})
}

// TestUpgradeGone: whatever resets the connection sets UpgGone in the
// copy of each side the engine resets, before it rings the program.
func TestUpgradeGone(t *testing.T) {
	cases := []struct {
		name   string
		reset  func(cl *cluster, p *pair)
		reason Reason // node 1's
		both   bool   // node 2's copy too
	}{
		{"user", func(cl *cluster, p *pair) { p.a.c.Reset() }, ReasonUser, true},
		{"program", func(cl *cluster, p *pair) { p.a.prog.Reset() }, ReasonProgram, true},
		{"peer-reset", func(cl *cluster, p *pair) { p.b.c.Reset() }, ReasonPeerReset, true},
		{"close", func(cl *cluster, p *pair) { p.a.c.Close() }, ReasonClose, true},
		{"engine-close", func(cl *cluster, p *pair) { cl.eng[1].Close() }, ReasonClose, true},
		{"local", func(cl *cluster, p *pair) {
			p.a.ctl[0].Tail.Swap(1 << 40)
			p.a.c.Kick()
		}, ReasonLocal, true},
		{"violation", func(cl *cluster, p *pair) {
			s := p.a.c.snap()
			m := forged(p.a.c, cdc{seq: s.seq + 1, prod: s.recvTail - 1, cons: s.recvHead})
			cl.eng[1].handle(&m)
		}, ReasonTailBack, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			testenv.VerifyNoLeaks(t)
			cl := newCluster(t, modeOrdered)
			p := cl.dial(t, dring.MinRing)
			exchange(t, p, 100)
			// A program that asked and waits for its grant, which the
			// peer, gone first, never gives.
			p.b.upgSet(t, det(1), false)
			p.a.upgSet(t, att(0)|req(0), false)
			upgHas(t, p, "the request", [2]uint32{det(1), req(0)})
			tc.reset(cl, p)
			want := [2]uint32{dring.UpgGone, 0}
			if tc.both {
				want[1] = dring.UpgGone
			}
			upgHas(t, p, "gone", want)
			if r := cl.eng[1].Stats().Resets[tc.reason]; r != 1 {
				t.Fatalf("%v resets %d, want 1", tc.reason, r)
			}
			if w := p.a.upg.Load(); w&(mov(0)|mov(1)) != 0 {
				t.Fatalf("word %#x: a move", w)
			}
		})
	}
}

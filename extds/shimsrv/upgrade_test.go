package shimsrv

import (
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/exn-project/exn/extds/dring"
	"github.com/exn-project/exn/internal/sys"
	"github.com/exn-project/exn/internal/testenv"
)

// TestUpgradeFD is shim-connect upgrade / shim-accept upgrade
// (upgrade.go) without the shim: both sides of an established connection
// in use are answered "direct" with V, the buffer and the bell, the
// program's socket keeps its O_NONBLOCK (exnd never takes it into Go's
// poller) and its stream has the application's bytes alone. On one host
// the buffer's upgrade word is 0; across hosts each side's copy is
// marked dring.UpgXHost, and the engines join the two words: both
// attach, side 0 asks to move, and both copies show the grant.
func TestUpgradeFD(t *testing.T) {
	for _, mode := range []string{"one host", "across hosts"} {
		t.Run(mode, func(t *testing.T) {
			testenv.VerifyNoLeaks(t)
			a, b := newDirectNodesMode(t, mode)
			ln := testenv.ListenTCP(t)
			b.listen(t, ln)
			cc, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			sc, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer sc.Close()
			if _, err := cc.Write([]byte("before|")); err != nil {
				t.Fatal(err)
			}
			type answer struct {
				res SwitchResult
				out []*os.File
				nb  [2]int // O_NONBLOCK before and after
				err error
			}
			ask := func(n *node, op string, c net.Conn) <-chan answer {
				ch := make(chan answer, 1)
				f, err := c.(*net.TCPConn).File()
				if err != nil {
					t.Fatal(err)
				}
				go func() {
					defer f.Close()
					var a answer
					fl, _ := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
					a.nb[0] = fl & unix.O_NONBLOCK
					a.out, a.err = n.cl.CallFDs(t.Context(), &a.res, []*os.File{f}, op, ArgUpgrade)
					fl, _ = unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
					a.nb[1] = fl & unix.O_NONBLOCK
					ch <- a
				}()
				return ch
			}
			sa := ask(b, "shim-accept", sc)
			ca := ask(a, "shim-connect", cc)
			got := [2]answer{<-ca, <-sa}
			for i, g := range got {
				for _, f := range g.out {
					defer f.Close()
				}
				if g.err != nil {
					t.Fatalf("side %d: %v", i, g.err)
				}
				if g.nb[0] != g.nb[1] {
					t.Errorf("side %d: O_NONBLOCK %#x before, %#x after: exnd changed the program's socket", i, g.nb[0], g.nb[1])
				}
				if g.res.Mode != "direct" || g.res.Side == nil || *g.res.Side != i || len(g.out) != 3 {
					t.Fatalf("side %d: %+v with %d descriptors, want direct, side %d, 3", i, g.res, len(g.out), i)
				}
			}
			var words [2]*atomic.Uint32
			for i, g := range got {
				words[i] = upgradeWord(t, g.out[1])
				want := uint32(0)
				if mode != "one host" {
					want = dring.UpgXHost
				}
				if w := words[i].Load(); w != want {
					t.Errorf("side %d: upgrade word %#x, want %#x", i, w, want)
				}
			}
			if mode != "one host" {
				// The programs' part (shim/upgrade.c), reduced to the word:
				// each attaches, then side 0 asks; each rings its bell.
				ring := func(i int, bits uint32) {
					words[i].Or(bits)
					if err := rawFD(got[i].out[2], func(fd int) { _ = sys.RingSocketBell(fd) }); err != nil {
						t.Fatal(err)
					}
				}
				ring(0, dring.UpgAtt)
				ring(1, dring.UpgAtt<<1)
				both := dring.UpgXHost | dring.UpgAtt | dring.UpgAtt<<1
				testenv.Eventually(t, "both attached in both copies", 5*time.Second, func() bool {
					return words[0].Load() == both && words[1].Load() == both
				})
				ring(0, dring.UpgReq)
				both |= dring.UpgReq | dring.UpgMov
				testenv.Eventually(t, "side 0's move granted in both copies", 5*time.Second, func() bool {
					return words[0].Load() == both && words[1].Load() == both
				})
			}
			if _, err := cc.Write([]byte("after")); err != nil {
				t.Fatal(err)
			}
			cc.(*net.TCPConn).CloseWrite()
			b2, err := io.ReadAll(sc)
			if err != nil || string(b2) != "before|after" {
				t.Fatalf("stream %q, %v; want the application's bytes alone", b2, err)
			}
		})
	}
}

// upgradeWord maps the buffer f (a program's descriptor of it) for the
// rest of the test and returns its upgrade word.
func upgradeWord(t *testing.T, f *os.File) *atomic.Uint32 {
	t.Helper()
	var st unix.Stat_t
	if err := rawStat(f, &st); err != nil {
		t.Fatal(err)
	}
	mem, err := sys.MapShared(f, int(st.Size))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sys.Unmap(mem) })
	w, err := dring.UpgradeWord(mem)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

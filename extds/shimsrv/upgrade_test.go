package shimsrv

import (
	"io"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/exn-project/exn/internal/testenv"
)

// TestUpgradeFD is shim-connect upgrade / shim-accept upgrade
// (upgrade.go) without the shim: on one host both sides of an
// established connection in use are answered "direct" with V, the buffer
// and the bell, the program's socket keeps its O_NONBLOCK (exnd never
// takes it into Go's poller) and its stream has the application's bytes
// alone; across hosts the answer is "tcp" with upgrade_remote.
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
				switch mode {
				case "one host":
					if g.res.Mode != "direct" || g.res.Side == nil || *g.res.Side != i || len(g.out) != 3 {
						t.Errorf("side %d: %+v with %d descriptors, want direct, side %d, 3", i, g.res, len(g.out), i)
					}
				default:
					if g.res.Mode != "tcp" || g.res.Reason != ReasonUpgradeRemote || len(g.out) != 0 {
						t.Errorf("side %d: %+v with %d descriptors, want tcp %s", i, g.res, len(g.out), ReasonUpgradeRemote)
					}
				}
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

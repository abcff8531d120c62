package rdirect

import (
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/extds/dring"
	"github.com/exn-project/exn/internal/testenv"
)

// registrations counts the descriptors in e's epoll set.
func registrations(t *testing.T, e *Engine) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(e.poll.FD()))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "tfd:")
}

// One bell per connection: the engine's epoll set holds one descriptor
// per prepared connection (and its own eventfd), and closing a
// connection takes it out.
func TestOneRegistrationPerConn(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	cl := newCluster(t, modeOrdered)
	base := registrations(t, cl.eng[1])
	const n = 5
	ps := make([]*pair, n)
	for i := range ps {
		ps[i] = cl.dial(t, dring.MinRing)
	}
	exchange(t, ps[0], 100)
	if got := registrations(t, cl.eng[1]); got != base+n {
		t.Fatalf("%d descriptors in the epoll set with %d connections, want %d", got, n, base+n)
	}
	if err := ps[0].a.c.Close(); err != nil {
		t.Fatal(err)
	}
	if got := registrations(t, cl.eng[1]); got != base+n-1 {
		t.Fatalf("%d descriptors after one Close, want %d", got, base+n-1)
	}
}

// The program's bell closes (it exited) before exnd, which sees the last
// close on E, stores fin and rd_closed: the engine takes its bell out of
// the epoll set (it would report the end of file for ever) and does not
// reset; exnd's stores and Kick then finish the connection cleanly, the
// bytes the program wrote included.
func TestProgramBellGone(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			cl := newCluster(t, mode)
			p := cl.dial(t, dring.MinRing)
			exchange(t, p, 64)
			base := registrations(t, cl.eng[1])
			if _, err := p.a.prog.Write([]byte("last words")); err != nil {
				t.Fatal(err)
			}
			p.a.prog.Close() // the program exits: B_0 closes, no fin
			testenv.Eventually(t, "the bell to leave the epoll set", 5*time.Second, func() bool {
				return registrations(t, cl.eng[1]) == base-1
			})
			w := cl.eng[1].Stats().Wakes
			time.Sleep(20 * time.Millisecond)
			if d := cl.eng[1].Stats().Wakes - w; d > 10 {
				t.Fatalf("%d wake-ups in 20 ms with the bell at end of file", d)
			}
			// exnd at the last close (shimsrv's watch).
			p.a.ctl[1].RdClosed.Swap(1)
			p.a.ctl[0].Fin.Swap(1)
			p.a.c.Kick()
			got, err := io.ReadAll(p.b.prog)
			if err != nil || string(got) != "last words" {
				t.Fatalf("peer read %q, %v; want the last words and EOF", got, err)
			}
			p.b.prog.CloseWrite()
			select {
			case <-p.a.c.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("connection not done after fin both ways")
			}
			for n := 1; n <= 2; n++ {
				if r := cl.eng[n].Stats().Resets; r != ([NumReasons]uint64{}) {
					t.Fatalf("node %d resets %v, want none", n, r)
				}
			}
		})
	}
}

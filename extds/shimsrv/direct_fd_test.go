package shimsrv

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/extds/dring"
	"github.com/exn-project/exn/extds/rdirect"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/testenv"
)

// directModes are the two kinds of direct connection a test runs: one
// host (the two exnds share the buffer's directory and pair the bells by
// connect and accept) and across hosts (each exnd has its own buffer and
// an rdirect engine, bells from a socketpair).
var directModes = []string{"one host", "across hosts"}

// newDirectNodesMode is newDirectNodes for mode.
func newDirectNodesMode(t *testing.T, mode string) (a, b *node) {
	t.Helper()
	if mode == "one host" {
		a, b, _ = newDirectNodes(t)
		return a, b
	}
	return newNodesWrapped(t, func(id fabric.NodeID, nic fabric.NIC) (extds.Attachment, []Option) {
		ep, err := nic.Open(rdirect.VPID)
		if err != nil {
			t.Fatal(err)
		}
		eng, err := rdirect.New(ep, rdirect.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { eng.Close() }) // after the server's (cleanups run last first)
		return nic, []Option{WithDirect(DirectConfig{Fabric: "t", Dir: t.TempDir(), Node: id, Ring: dring.MinRing * 4, Engine: eng})}
	})
}

// poolsFull reports whether the pools of ready buffers of ns that are in
// use are full again (a filler makes the replacement of each one taken,
// in the background; across hosts the connecting exnd takes from its
// own pool too).
func poolsFull(ns ...*node) func() bool {
	return func() bool {
		for _, n := range ns {
			n.srv.mu.Lock()
			started := n.srv.pool.started
			n.srv.mu.Unlock()
			if started && len(n.srv.pool.ready) != poolSize {
				return false
			}
		}
		return true
	}
}

// A direct connection costs each exnd at most two descriptors (issue
// #32): E and one bell (one host: its dup of its program's bell; across
// hosts: the engine's end). Counted over the whole process, which holds
// both exnds and both programs here: each program keeps V and its bell
// (the buffer is closed once mapped, as the shim does), so a connection
// may add at most 2+2 for the programs and 2+2 for the exnds.
func TestDirectDescriptorsPerConn(t *testing.T) {
	for _, mode := range directModes {
		t.Run(mode, func(t *testing.T) {
			testenv.VerifyNoLeaks(t)
			a, b := newDirectNodesMode(t, mode)
			ln := testenv.ListenTCP(t)
			b.listen(t, ln)
			var held []*os.File
			t.Cleanup(func() {
				for _, f := range held {
					f.Close()
				}
			})
			connect := func() {
				ch := acceptOne(ln, func(c *net.TCPConn) ([]*os.File, error) {
					_, out := b.callDirect(t, "shim-accept", c)
					return out, nil
				})
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				_, out := a.callDirect(t, "shim-connect", c.(*net.TCPConn))
				r := <-ch
				if r.err != nil {
					t.Fatal(r.err)
				}
				for _, o := range [][]*os.File{out, r.v} {
					o[1].Close() // the buffer: mapped and closed by the shim
					held = append(held, o[0], o[2])
				}
			}
			connect() // the pool's filler starts with the first accept
			testenv.Eventually(t, "the pools to fill", 5*time.Second, poolsFull(a, b))
			const n = 20
			before := testenv.CountFDs(t)
			for range n {
				connect()
			}
			testenv.Eventually(t, "the pools to fill again", 5*time.Second, poolsFull(a, b))
			after := testenv.CountFDs(t)
			t.Logf("%d descriptors for %d connections", after-before, n)
			if per := float64(after-before) / n; per > 8 {
				t.Fatalf("%.2f descriptors per direct connection in the process (two exnds and two programs); want at most 8", per)
			}
			for _, nd := range []*node{a, b} {
				if st := nd.srv.Stats(); st.DirectActive != n+1 {
					t.Fatalf("direct connections active %d, want %d", st.DirectActive, n+1)
				}
			}
		})
	}
}

// A direct connection across hosts works as on one host: bytes both ways,
// the relay after exec with the bell shim-relay hands over (exnd holds
// none of the program's side before), and the last close as EOF.
func TestDirectAcrossHosts(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	a, b := newDirectNodesMode(t, "across hosts")
	client, server := connectDirect(t, a, b, nil)
	data := bytes.Repeat([]byte("0123456789"), 10_000)
	errc := make(chan error, 2)
	go send(client.ep, data, errc)
	go send(server.ep, data, errc)
	for _, r := range []io.Reader{server.ep, client.ep} {
		if got, want := recvSum(t, r, len(data)), recvSum(t, bytes.NewReader(data), len(data)); got != want {
			t.Fatal("stream differs")
		}
	}
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	relayV(t, a, client, true)
	for range 3 {
		if _, err := client.v.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(server.ep, buf); err != nil || string(buf) != "ping" {
			t.Fatalf("server read %q, %v", buf, err)
		}
		if _, err := server.ep.Write([]byte("pong")); err != nil {
			t.Fatal(err)
		}
		client.v.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(client.v, buf); err != nil || string(buf) != "pong" {
			t.Fatalf("client read %q, %v", buf, err)
		}
	}
	if _, err := client.v.Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	client.Close() // the last close of V
	got, err := io.ReadAll(server.ep)
	if err != nil || string(got) != "bye" {
		t.Fatalf("server read %q, %v; want bye, EOF", got, err)
	}
	if _, err := server.ep.Write([]byte("x")); !errors.Is(err, dring.ErrPeerClosed) {
		// rd_closed travels with the next CDC: the write may still go in
		// before it lands; a second one must fail.
		time.Sleep(50 * time.Millisecond)
		if _, err := server.ep.Write([]byte("x")); !errors.Is(err, dring.ErrPeerClosed) {
			t.Fatalf("write after the peer's close: %v", err)
		}
	}
}

package shimsrv

// The direct agreement over the fabric (extds/claimdirect.go) as exnd's
// shim server runs it: nothing crosses the shadow TCP connection, an
// abort leaves both programs plain TCP, and a COMMIT that never comes
// resets the buffer the client may be using.

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/extds/dring"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/sys"
	"github.com/exn-project/exn/internal/testenv"
)

// The agreement writes nothing into the TCP connection: TCP_INFO of the
// client's socket shows no payload either way once both are direct.
func TestDirectNothingOnTCP(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	a, b, _ := newDirectNodes(t)
	// Both TCP sockets outlive the switch (so no FIN is counted either).
	var mu sync.Mutex
	var kept []*os.File
	defer func() {
		for _, f := range kept {
			f.Close()
		}
	}()
	connectDirect(t, a, b, func(c *net.TCPConn) {
		f, err := c.File()
		if err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		kept = append(kept, f)
		mu.Unlock()
	})
	mu.Lock()
	defer mu.Unlock()
	if len(kept) != 2 {
		t.Fatalf("kept %d sockets, want 2", len(kept))
	}
	for _, f := range kept {
		kc, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		out, in, err := sys.TCPBytes(kc.(*net.TCPConn))
		kc.Close()
		if err != nil {
			t.Fatal(err)
		}
		if out != 0 || in != 0 {
			t.Errorf("a shadow connection carried %d bytes out and %d in, want none", out, in)
		}
	}
	if n := b.dev.Stats().DirectAgreed; n != 1 {
		t.Errorf("accepting Device: DirectAgreed %d, want 1", n)
	}
}

// The client's exnd cannot open the buffer (here: it looks in another
// directory): it aborts, and both programs keep their TCP sockets, the
// stream untouched.
func TestDirectAbortIsTCP(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	dirs := map[fabric.NodeID]string{1: t.TempDir(), 2: t.TempDir()}
	a, b := newNodesPer(t, func(id fabric.NodeID) []Option {
		return []Option{WithDirect(DirectConfig{Fabric: "t", Dir: dirs[id], Node: id, Ring: dring.MinRing})}
	})
	ln := testenv.ListenTCP(t)
	b.listen(t, ln)
	ch := acceptOne(ln, func(c *net.TCPConn) (*net.TCPConn, error) {
		return c, b.expectTCP(t, "shim-accept", c)
	})
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := a.expectTCP(t, "shim-connect", c.(*net.TCPConn)); err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.v.Close()
	if err := testenv.Carry(c, r.v, []byte("GET / HTTP/1.0\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	for _, nd := range []*node{a, b} {
		if n := nd.dev.Stats().Fallbacks["direct_abort"]; n != 1 {
			t.Errorf("fallbacks direct_abort %d, want 1", n)
		}
	}
}

// expectTCP hands tc over with "direct" and requires the answer "tcp"
// (the program keeps its socket).
func (n *node) expectTCP(t *testing.T, op string, tc *net.TCPConn) error {
	f, err := tc.File()
	if err != nil {
		return err
	}
	defer f.Close()
	var res SwitchResult
	out, err := n.cl.CallFDs(t.Context(), &res, []*os.File{f}, op, "direct")
	for _, f := range out {
		f.Close()
	}
	if err != nil || res.Mode != "tcp" || len(out) != 0 {
		return errors.Join(err, errors.New(op+": mode "+res.Mode+", want tcp"))
	}
	return nil
}

// A client exnd that opened the buffer but whose COMMIT comes after the
// accepting exnd gave up: shim-accept fails, and the client, direct by
// then, reads a reset instead of waiting forever.
func TestDirectNoCommitResets(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	a, b, dir := newDirectNodes(t) // handshake timeout 500 ms
	ln := testenv.ListenTCP(t)
	b.listen(t, ln)
	ch := acceptOne(ln, func(c *net.TCPConn) (struct{}, error) {
		f, err := c.File()
		if err != nil {
			return struct{}{}, err
		}
		defer f.Close()
		var res SwitchResult
		_, err = b.cl.CallFDs(t.Context(), &res, []*os.File{f}, "shim-accept", "direct")
		if err == nil {
			return struct{}{}, errors.New("shim-accept succeeded without a COMMIT")
		}
		return struct{}{}, nil
	})
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var fs *dring.Files
	open := func(di *extds.DirectInfo) error {
		var err error
		fs, err = dring.Open(dir, dring.Name("t", di.Node, di.ID))
		time.Sleep(800 * time.Millisecond) // a stalled exnd
		return err
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, di, err := (&extds.Dialer{Device: a.dev}).UpgradeDirect(ctx, c, open)
	if err != nil || di == nil {
		t.Fatalf("client: %+v, %v; want direct", di, err)
	}
	if r := <-ch; r.err != nil {
		t.Fatal(r.err)
	}
	ep, err := dring.Attach(fs, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	if _, err := ep.Read(make([]byte, 1)); !errors.Is(err, dring.ErrReset) {
		t.Fatalf("client read %v, want ErrReset", err)
	}
}

// watchedNIC is a mem NIC that announces peer changes, as fabric/shm's
// does (fabric.PeerWatcher): the test closes changed when it kills the
// peer node.
type watchedNIC struct {
	fabric.NIC
	mu      sync.Mutex
	changed chan struct{}
}

func (w *watchedNIC) PeersChanged() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changed
}

func (w *watchedNIC) announce() {
	w.mu.Lock()
	defer w.mu.Unlock()
	close(w.changed)
	w.changed = make(chan struct{})
}

// With a fabric that announces peer changes, the peer node's death is
// seen at the announcement, not by polling: the poll period is an hour
// here, so only the PeerWatcher path can pass. "late start": the death
// is announced after the connection was entered (and its peer checked
// alive) but before the liveness goroutine that enterDirect started has
// run; the goroutine must still see it (CI once lost it under the race
// detector, when the goroutine took the fabric's watch channel only once
// it ran, after the change).
func TestDirectPeerNodeDownWatched(t *testing.T) {
	for _, late := range []bool{false, true} {
		t.Run(map[bool]string{false: "running", true: "late start"}[late], func(t *testing.T) {
			testenv.VerifyNoLeaks(t)
			dir := t.TempDir()
			var wa *watchedNIC
			announced := make(chan struct{})
			a, b := newNodesWrapped(t, func(id fabric.NodeID, nic fabric.NIC) (extds.Attachment, []Option) {
				opts := []Option{WithDirect(DirectConfig{Fabric: "t", Dir: dir, Node: id, Ring: dring.MinRing * 4}), withLivenessPeriod(time.Hour)}
				if id != 1 {
					return nic, opts
				}
				wa = &watchedNIC{NIC: nic, changed: make(chan struct{})}
				if late {
					opts = append(opts, func(s *Server) { s.livenessStarted = func() { <-announced } })
				}
				return wa, opts
			})
			client, _ := connectDirect(t, a, b, nil)
			b.nic.Close() // the node's fabric presence goes
			wa.announce()
			close(announced)
			errc := make(chan error, 1)
			go func() {
				_, err := client.ep.Read(make([]byte, 1))
				errc <- err
			}()
			select {
			case err := <-errc:
				if !errors.Is(err, dring.ErrReset) {
					t.Fatalf("read with the peer node down: %v, want ErrReset", err)
				}
			case <-time.After(10 * time.Second):
				client.Close() // ends the read
				<-errc
				t.Fatal("the announced death of the peer node did not reset the connection")
			}
		})
	}
}

func withLivenessPeriod(d time.Duration) Option { return func(s *Server) { s.livenessPeriod = d } }

package extds

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/mem"
	"github.com/exn-project/exn/internal/testenv"
)

// pair is two nodes on one mem cluster with an EXT-DS device each; the
// client's resolver places 127.0.0.1 on the server's node.
type pair struct {
	cl         *mem.Cluster
	nicA, nicB fabric.NIC
	devA, devB *Device
	ln         *Listener
	dialer     *Dialer
}

const (
	nodeA fabric.NodeID = 1
	nodeB fabric.NodeID = 2
)

func newPair(t testing.TB, opts ...Option) *pair {
	t.Helper()
	p := &pair{cl: mem.NewCluster()}
	var err error
	if p.nicA, err = p.cl.NewNIC(nodeA); err != nil {
		t.Fatal(err)
	}
	if p.nicB, err = p.cl.NewNIC(nodeB); err != nil {
		t.Fatal(err)
	}
	res := StaticResolver{netip.MustParseAddr("127.0.0.1"): nodeB}
	if p.devA, err = NewDevice(p.nicA, append([]Option{WithResolver(res)}, opts...)...); err != nil {
		t.Fatal(err)
	}
	if p.devB, err = NewDevice(p.nicB, opts...); err != nil {
		t.Fatal(err)
	}
	if p.ln, err = Listen(p.devB, "tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	p.dialer = &Dialer{Device: p.devA}
	t.Cleanup(func() {
		p.ln.Close()
		p.devA.Close()
		p.devB.Close()
		p.nicA.Close()
		p.nicB.Close()
	})
	return p
}

// openConns is conns with both ends closed (server first) at the end of
// the test.
func (p *pair) openConns(t testing.TB) (client, server *Conn) {
	t.Helper()
	c, s := p.conns(t)
	t.Cleanup(func() { s.Close(); c.Close() })
	return c, s
}

// conns dials one connection and accepts it.
func (p *pair) conns(t testing.TB) (client, server *Conn) {
	t.Helper()
	type res struct {
		c   *Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := p.ln.AcceptConn()
		ch <- res{c, err}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := p.dialer.DialConn(ctx, "tcp", p.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	if client.Mode() != ModeEXTDS || r.c.Mode() != ModeEXTDS {
		t.Fatalf("modes %v/%v, want extds", client.Mode(), r.c.Mode())
	}
	return client, r.c
}

func randBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// transfer writes the writes of sizes from w while reading everything on
// r, and checks the sha256 of what arrived.
func transfer(t testing.TB, w io.WriteCloser, r io.Reader, sizes []int, write func([]byte) (int, error)) {
	t.Helper()
	total := 0
	for _, s := range sizes {
		total += s
	}
	data := randBytes(total, uint64(total))
	want := sha256.Sum256(data)
	errc := make(chan error, 1)
	go func() {
		off := 0
		for _, s := range sizes {
			if _, err := write(data[off : off+s]); err != nil {
				errc <- err
				return
			}
			off += s
		}
		errc <- nil
	}()
	h := sha256.New()
	n, err := io.CopyN(h, r, int64(total))
	if err != nil {
		t.Fatalf("read after %d of %d bytes: %v", n, total, err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("write: %v", err)
	}
	if got := h.Sum(nil); string(got) != string(want[:]) {
		t.Fatalf("sha256 mismatch over %d bytes", total)
	}
}

var _ = net.ErrClosed

// registeredListener is testenv.ListenTCP with its port registered on dev
// (Device.RegisterPort) for the test's duration, as a Listener would.
func registeredListener(t testing.TB, dev *Device) net.Listener {
	t.Helper()
	ln := testenv.ListenTCP(t)
	unreg, err := dev.RegisterPort(uint16(ln.Addr().(*net.TCPAddr).Port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(unreg)
	return ln
}

// rawMsg is a message to to with tag and payload, for forging input.
func rawMsg(to fabric.Addr, tag fabric.Tag, payload ...byte) fabric.Message {
	var m fabric.Message
	m.Peer, m.Tag = to, tag
	m.SetPayload(payload)
	return m
}

// le32 is v in little-endian, the byte order of EXT-DS headers.
func le32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }

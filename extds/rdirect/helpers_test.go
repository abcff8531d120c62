package rdirect

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exn-project/exn/extds/dring"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/mem"
	"github.com/exn-project/exn/internal/sys"
	"github.com/exn-project/exn/internal/testenv"
)

// Modes of the fabric under the engines: mem as it is (PutOrderer: a CDC
// follows its PUTs at once), or mem hiding PutOrderer and landing each
// PUT 0–300 µs after Post, out of order (the engine must wait for the
// requester notifications before it announces the bytes).
const (
	modeOrdered = "ordered"
	modeLazy    = "lazy"
)

var modes = []string{modeOrdered, modeLazy}

// lazyEP is an endpoint without PutOrderer whose PUTs land late.
type lazyEP struct {
	fabric.Endpoint
	br fabric.BufferRegistrar
	wg sync.WaitGroup
	n  atomic.Uint64
}

func (l *lazyEP) RegisterBuffer(b []byte) (fabric.Region, error) { return l.br.RegisterBuffer(b) }

func (l *lazyEP) Post(reqs []fabric.RMA) (int, error) {
	for _, r := range reqs {
		if err := fabric.CheckRMA(&r); err != nil {
			return 0, err
		}
	}
	cp := slices.Clone(reqs)
	l.wg.Add(1)
	d := time.Duration(l.n.Add(0x9E3779B97F4A7C15)>>40%300) * time.Microsecond
	time.AfterFunc(d, func() {
		defer l.wg.Done()
		_, _ = l.Endpoint.Post(cp)
	})
	return len(reqs), nil
}

func (l *lazyEP) Close() error {
	err := l.Endpoint.Close()
	l.wg.Wait()
	return err
}

// cluster is a mem fabric with an engine on each of nodes 1 and 2.
type cluster struct {
	mc   *mem.Cluster
	nics [3]fabric.NIC
	eng  [3]*Engine
	mode string
}

func newCluster(t testing.TB, mode string, cfgs ...func(cl *cluster, node int, c *Config)) *cluster {
	t.Helper()
	cl := &cluster{mc: mem.NewCluster(), mode: mode}
	for n := 1; n <= 2; n++ {
		nic, err := cl.mc.NewNIC(fabric.NodeID(n))
		if err != nil {
			t.Fatal(err)
		}
		cl.nics[n] = nic
		t.Cleanup(func() { nic.Close() })
	}
	for n := 1; n <= 2; n++ {
		var cfg Config
		for _, f := range cfgs {
			f(cl, n, &cfg)
		}
		cl.eng[n] = cl.newEngine(t, n, cfg)
	}
	return cl
}

func (cl *cluster) newEngine(t testing.TB, n int, cfg Config) *Engine {
	t.Helper()
	ep, err := cl.nics[n].Open(VPID)
	if err != nil {
		t.Fatal(err)
	}
	if cl.mode == modeLazy {
		ep = &lazyEP{Endpoint: ep, br: ep.(fabric.BufferRegistrar)}
	}
	e, err := New(ep, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// side is one node's half of a connection: the engine's Conn, its
// buffer mapping and files, and the program's Endpoint.
type side struct {
	c     *Conn
	prog  *dring.Endpoint
	mem   []byte
	fs    *dring.Files // the engine's descriptors
	ctl   [2]dring.Control
	upg   *atomic.Uint32 // the copy's upgrade word
	pbell int            // the program's bell B_s (prog's descriptor: ring it as the shim does)
}

var pairSeq atomic.Uint64

// newSide makes a buffer and the engine's Conn of it for program side s
// (not started): the program's Endpoint holds B_s, the engine B_{1−s},
// as exnd across hosts hands them out.
func newSide(t testing.TB, e *Engine, dir string, s, ring int) *side {
	t.Helper()
	name := fmt.Sprintf("c%d", pairSeq.Add(1))
	fs0, fs1, err := dring.CreatePair(dir, name, ring)
	if err != nil {
		t.Fatal(err)
	}
	dring.Remove(dir, name)
	pfs, efs := fs0, fs1
	if s == 1 {
		pfs, efs = fs1, fs0
	}
	m, err := sys.MapShared(efs.Buf, dring.FileSize(ring))
	if err != nil {
		t.Fatal(err)
	}
	sd := &side{mem: m, fs: efs}
	for d := range 2 {
		if sd.ctl[d], err = dring.ControlOf(m, d); err != nil {
			t.Fatal(err)
		}
	}
	if sd.upg, err = dring.UpgradeWord(m); err != nil {
		t.Fatal(err)
	}
	if sd.pbell, err = sys.FileFD(pfs.Bell[s]); err != nil {
		t.Fatal(err)
	}
	if sd.c, err = e.Prepare(m, s, efs.Bell[1-s]); err != nil {
		t.Fatal(err)
	}
	if sd.prog, err = dring.Attach(pfs, s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sd.prog.Close()
		sd.c.Close()
		sys.Unmap(sd.mem)
		sd.fs.Close()
	})
	return sd
}

// pair is a connection: program A side 0 on node 1, program B side 1 on
// node 2.
type pair struct{ a, b *side }

func (cl *cluster) dial(t testing.TB, ring int) *pair {
	t.Helper()
	p := cl.prepare(t, ring)
	p.start(t)
	return p
}

func (cl *cluster) prepare(t testing.TB, ring int) *pair {
	t.Helper()
	dir := t.TempDir()
	return &pair{a: newSide(t, cl.eng[1], dir, 0, ring), b: newSide(t, cl.eng[2], dir, 1, ring)}
}

func (p *pair) start(t testing.TB) {
	t.Helper()
	if err := p.a.c.Start(2, p.b.c.LocalID(), p.b.c.LocalNLA()); err != nil {
		t.Fatal(err)
	}
	if err := p.b.c.Start(1, p.a.c.LocalID(), p.a.c.LocalNLA()); err != nil {
		t.Fatal(err)
	}
}

// streamByte is byte i of test stream seed.
func streamByte(seed, i uint64) byte {
	x := (i + seed) * 0x9E3779B97F4A7C15
	return byte(x>>56 ^ x>>29)
}

// rng is a small deterministic generator for sizes.
type rng struct{ s uint64 }

func (r *rng) intn(n int) int {
	r.s ^= r.s << 13
	r.s ^= r.s >> 7
	r.s ^= r.s << 17
	return int(r.s % uint64(n))
}

// writeStream writes total bytes of stream seed to w in random sizes up
// to max, then closes the write side if fin.
func writeStream(w *dring.Endpoint, seed uint64, total, max int, fin bool) error {
	r := rng{seed | 1}
	buf := make([]byte, max)
	for off := 0; off < total; {
		n := min(1+r.intn(max), total-off)
		for i := range n {
			buf[i] = streamByte(seed, uint64(off+i))
		}
		k, err := w.Write(buf[:n])
		off += k
		if err != nil {
			return err
		}
	}
	if fin {
		w.CloseWrite()
	}
	return nil
}

// readStream reads stream seed from rd to EOF in random sizes up to max
// (pausing now and then when slow) and checks every byte and the total.
func readStream(rd *dring.Endpoint, seed uint64, total, max int, slow bool) error {
	r := rng{seed*3 | 1}
	buf := make([]byte, max)
	got := 0
	for i := 0; ; i++ {
		n, err := rd.Read(buf[:1+r.intn(max)])
		for j := range n {
			if buf[j] != streamByte(seed, uint64(got+j)) {
				return fmt.Errorf("byte %d: got %#x, want %#x", got+j, buf[j], streamByte(seed, uint64(got+j)))
			}
		}
		got += n
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("after %d bytes: %w", got, err)
		}
		if slow && i%8 == 0 {
			time.Sleep(100 * time.Microsecond)
		}
	}
	if got != total {
		return fmt.Errorf("read %d bytes, want %d", got, total)
	}
	return nil
}

// exchange moves n bytes each way through p (content checked) without
// closing anything.
func exchange(t testing.TB, p *pair, n int) {
	t.Helper()
	for _, dir := range [][2]*side{{p.a, p.b}, {p.b, p.a}} {
		w, r := dir[0].prog, dir[1].prog
		msg := make([]byte, n)
		for i := range msg {
			msg[i] = byte(i*7 + n)
		}
		errc := make(chan error, 1)
		go func() { _, err := w.Write(msg); errc <- err }()
		got := make([]byte, n)
		if err := readFull(r, got); err != nil {
			t.Fatalf("exchange: read: %v", err)
		}
		if err := testenv.Within(t, "write", errc, 10*time.Second); err != nil {
			t.Fatalf("exchange: write: %v", err)
		}
		if string(got) != string(msg) {
			t.Fatalf("exchange: wrong bytes")
		}
	}
}

func readFull(r *dring.Endpoint, p []byte) error {
	for got := 0; got < len(p); {
		n, err := r.Read(p[got:])
		got += n
		if err != nil {
			return err
		}
	}
	return nil
}

// within runs f in a goroutine and returns its error, failing t if it
// takes longer than d.
func within(t testing.TB, what string, d time.Duration, f func() error) error {
	t.Helper()
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return testenv.Within(t, what, ch, d)
}

// snap is a consistent view of a Conn's receive state (tests only).
type snap struct {
	seq                  uint32
	recvTail, recvHead   uint64
	sentTail, sentHead   uint64
	recvFin, dead, start bool
}

func (c *Conn) snap() snap {
	c.rxMu.Lock()
	defer c.rxMu.Unlock()
	return snap{
		seq: c.recvSeq, recvTail: c.recvTail, recvHead: c.recvHead,
		sentTail: c.sentTail.Load(), sentHead: c.sentHead.Load(),
		recvFin: c.recvFin, dead: c.dead.Load(), start: c.started.Load(),
	}
}

// forged is a CDC message to c as if from its peer.
func forged(c *Conn, d cdc) fabric.Message {
	var m fabric.Message
	if d.dst == 0 {
		d.dst = c.id
	}
	if d.src == 0 {
		d.src = c.peerID
	}
	d.encode(&m, fabric.Addr{Node: c.e.Addr().Node, VPID: VPID})
	m.Peer = c.peer
	return m
}

// isReset reports whether err is the connection's reset.
func isReset(err error) bool { return errors.Is(err, dring.ErrReset) }

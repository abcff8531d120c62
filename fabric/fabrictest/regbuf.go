package fabrictest

import (
	"context"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/testenv"
)

// Cases for fabric.BufferRegistrar (memory the caller owns, here a
// MAP_SHARED mapping of a memfd, as exnd maps a program's connection
// buffer) and fabric.PutOrderer. Each skips, saying why, on a backend
// whose endpoints do not implement the interface.

// registrar returns ep as a fabric.BufferRegistrar, or skips t.
func registrar(t *testing.T, ep fabric.Endpoint) fabric.BufferRegistrar {
	t.Helper()
	br, ok := ep.(fabric.BufferRegistrar)
	if !ok {
		t.Skipf("%T does not implement fabric.BufferRegistrar", ep)
	}
	return br
}

// sharedMem is a memfd of size bytes mapped MAP_SHARED twice: the buffer
// to register, and a second view of the same pages, standing for the
// other process that shares them. Both are unmapped when t ends; call it
// before opening the fabric, so that happens after the fabric is closed.
func sharedMem(t *testing.T, size int) (buf, view []byte) {
	t.Helper()
	fd, err := unix.MemfdCreate("fabrictest-regbuf", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatalf("memfd_create: %v", err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatalf("ftruncate: %v", err)
	}
	for _, p := range []*[]byte{&buf, &view} {
		b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			t.Fatalf("mmap: %v", err)
		}
		*p = b
		t.Cleanup(func() { unix.Munmap(b) })
	}
	return buf, view
}

// registerBuffer registers buf on ep, failing t if it cannot, and checks
// that the region is buf itself.
func registerBuffer(t *testing.T, ep fabric.Endpoint, buf []byte) fabric.Region {
	t.Helper()
	r, err := registrar(t, ep).RegisterBuffer(buf)
	if err != nil {
		t.Fatalf("%v: register buffer of %d bytes: %v", ep.Addr(), len(buf), err)
	}
	if len(r.Buf) != len(buf) || cap(r.Buf) != len(buf) || unsafe.SliceData(r.Buf) != unsafe.SliceData(buf) {
		t.Fatalf("%v: region buf %p len %d cap %d, want the caller's %p len %d", ep.Addr(), unsafe.SliceData(r.Buf), len(r.Buf), cap(r.Buf), unsafe.SliceData(buf), len(buf))
	}
	return r
}

// rma posts one request from ep to peer and waits until it is over:
// its requester notification, which must carry want, and for a
// successful PUT also the completer notification on peer (the requester
// one says only that ep's side is done; the completer one that the data
// is in place).
func rma(t *testing.T, ep, peer fabric.Endpoint, r fabric.RMA, want fabric.NotifyErr) {
	t.Helper()
	put := r.Op == fabric.OpPut && want == fabric.NErrNone
	r.Notify |= fabric.NotifyRequester
	if put {
		r.Notify |= fabric.NotifyCompleter
	}
	post(t, ep, r)
	n := pollN(t, ep, 1)[0]
	if n.Kind != fabric.KindRequester || n.Err != want || n.Op != r.Op {
		t.Fatalf("%v %d bytes to %v: %s, want requester err %v", r.Op, r.Len, r.Remote, describe(n), want)
	}
	if !put {
		return
	}
	if n := pollN(t, peer, 1)[0]; n.Kind != fabric.KindCompleter || n.Err != fabric.NErrNone || n.Local != fabric.LastFrame(r.Remote, r.Len) {
		t.Fatalf("put %d bytes to %v: target got %s, want its completer notification", r.Len, r.Remote, describe(n))
	}
}

// regbufSize is a size over several RMA packets and over fabnet's 64 KiB
// chunks, and not a multiple of a page.
func regbufSize() int {
	if testenv.Small() {
		return 100<<10 + 123
	}
	return 300<<10 + 123
}

// testBufferRMA: PUT from one node's mapping straight into another's, GET
// back, and the other view of each mapping sees what RMA did; a local
// write to the mapping is what a GET then reads.
func testBufferRMA(t *testing.T, f Factory) {
	size := regbufSize()
	abuf, aview := sharedMem(t, size)
	bbuf, bview := sharedMem(t, size)
	nics := f(t, 2)
	a, b := OpenEP(t, nics[0], 1), OpenEP(t, nics[1], 1)
	ra, rb := registerBuffer(t, a, abuf), registerBuffer(t, b, bbuf)

	fill(aview, 3) // the sharing process writes; ra.Buf is the same memory
	rma(t, a, b, fabric.RMA{Op: fabric.OpPut, Peer: b.Addr(), Local: ra.NLA, Remote: rb.NLA, Len: uint32(size)}, fabric.NErrNone)
	checkBytes(t, "put into a caller's buffer, seen through the other mapping", bview, aview)

	// The target writes its buffer locally; a GET into a's buffer (at an
	// odd offset) reads it.
	fill(bbuf, 77)
	const off = 4097
	rma(t, a, b, fabric.RMA{Op: fabric.OpGet, Peer: b.Addr(), Local: ra.NLA + off, Remote: rb.NLA, Len: uint32(size - off)}, fabric.NErrNone)
	checkBytes(t, "get into a caller's buffer", aview[off:], bview[:size-off])

	// A caller's buffer and a fabric-allocated region work together, and
	// the caller's may be plain Go memory too.
	heap := make([]byte, 8192)
	rh := registerBuffer(t, b, heap)
	rr := Register(t, a, 8192)
	fill(rr.Buf, 9)
	rma(t, a, b, fabric.RMA{Op: fabric.OpPut, Peer: b.Addr(), Local: rr.NLA, Remote: rh.NLA, Len: 8192}, fabric.NErrNone)
	checkBytes(t, "put into a Go buffer", heap, rr.Buf)
	if err := b.Deregister(rh.NLA); err != nil {
		t.Fatalf("deregister the Go buffer: %v", err)
	}

	// Registering nothing is invalid.
	for _, bad := range [][]byte{nil, abuf[:0]} {
		_, err := registrar(t, a).RegisterBuffer(bad)
		wantErr(t, "register an empty buffer", err, fabric.ErrInvalid)
	}
}

// testBufferFaults: RMA past the end of a caller's buffer fails with an
// error notification and touches neither the buffer nor the mapping
// around it; a local range past its end is refused by Post.
func testBufferFaults(t *testing.T, f Factory) {
	page := unix.Getpagesize()
	whole, view := sharedMem(t, 4*page)
	buf := whole[page : 3*page-100] // guard bytes on both sides
	nics := f(t, 2)
	a, b := OpenEP(t, nics[0], 1), OpenEP(t, nics[1], 1)
	la := Register(t, a, 4*page)
	rb := registerBuffer(t, b, buf)
	fill(la.Buf, 0x11)
	fill(view, 0x5a)
	want := append([]byte(nil), view...)
	for _, tc := range []struct {
		name   string
		remote fabric.NLA
		len    uint32
	}{
		{"running past the end", rb.NLA + fabric.NLA(len(buf)) - 10, 100},
		{"one past the end", rb.NLA + fabric.NLA(len(buf)), 1},
		{"longer than the buffer", rb.NLA, uint32(len(buf)) + 1},
	} {
		for _, op := range []fabric.Op{fabric.OpPut, fabric.OpGet} {
			flags := fabric.NotifyCompleter
			if op == fabric.OpGet {
				flags |= fabric.NotifyResponder
			}
			rma(t, a, b, fabric.RMA{Op: op, Peer: b.Addr(), Local: la.NLA, Remote: tc.remote, Len: tc.len, Notify: flags}, fabric.NErrBounds)
			noNotifications(t, b)
			checkBytes(t, op.String()+" "+tc.name+": the mapping", view, want)
		}
	}
	// b's buffer as the local side of a request past its end.
	n, err := b.Post([]fabric.RMA{{Op: fabric.OpGet, Peer: a.Addr(), Local: rb.NLA + fabric.NLA(len(buf)) - 8, Remote: la.NLA, Len: 16}})
	if n != 0 {
		t.Fatalf("post with a local range past the buffer: n = %d", n)
	}
	wantErr(t, "post with a local range past the buffer", err, fabric.ErrInvalid)
	noNotifications(t, b)
	checkBytes(t, "local fault: the mapping", view, want)
}

// testBufferDeregister: after Deregister, RMA to a caller's buffer fails
// and the buffer is still mapped and intact; after Close of its endpoint
// the same.
func testBufferDeregister(t *testing.T, f Factory) {
	size := 64 << 10
	buf, view := sharedMem(t, size)
	buf2, view2 := sharedMem(t, size)
	nics := f(t, 2)
	a, b := OpenEP(t, nics[0], 1), OpenEP(t, nics[1], 1)
	la := Register(t, a, size)
	rb := registerBuffer(t, b, buf)
	fill(la.Buf, 1)
	rma(t, a, b, fabric.RMA{Op: fabric.OpPut, Peer: b.Addr(), Local: la.NLA, Remote: rb.NLA, Len: uint32(size)}, fabric.NErrNone)
	if err := b.Deregister(rb.NLA); err != nil {
		t.Fatalf("deregister: %v", err)
	}
	wantErr(t, "deregister twice", b.Deregister(rb.NLA), fabric.ErrInvalid)
	want := append([]byte(nil), la.Buf...)
	fill(la.Buf, 2)
	for _, op := range []fabric.Op{fabric.OpPut, fabric.OpGet} {
		rma(t, a, b, fabric.RMA{Op: op, Peer: b.Addr(), Local: la.NLA, Remote: rb.NLA, Len: 64}, fabric.NErrAccess)
	}
	checkBytes(t, "deregistered buffer", buf, want)
	fill(buf, 3) // still mapped and writable, and still shared
	checkBytes(t, "deregistered buffer, other mapping", view, buf)
	_, err := b.Post([]fabric.RMA{{Op: fabric.OpPut, Peer: a.Addr(), Local: rb.NLA, Remote: la.NLA, Len: 64}})
	wantErr(t, "post from a deregistered buffer", err, fabric.ErrInvalid)

	// Registered again, the same memory gets a fresh NLA; Close of the
	// endpoint releases it without unmapping it.
	rb2 := registerBuffer(t, b, buf)
	if rb2.NLA == rb.NLA {
		t.Fatalf("re-registration reused NLA %v", rb.NLA)
	}
	registerBuffer(t, b, buf2)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	post(t, a, fabric.RMA{Op: fabric.OpPut, Peer: b.Addr(), Local: la.NLA, Remote: rb2.NLA, Len: 64})
	if n := pollN(t, a, 1)[0]; n.Err == fabric.NErrNone {
		t.Fatalf("put to a closed endpoint's buffer: %s", describe(n))
	}
	checkBytes(t, "buffer of a closed endpoint", view, buf)
	fill(buf2, 4)
	checkBytes(t, "second buffer of a closed endpoint", view2, buf2)
}

// testPutOrder: where an endpoint says PutsBeforeSends, a message sent
// after a PUT to the same node finds the PUT's data in place.
func testPutOrder(t *testing.T, f Factory) {
	size := regbufSize()
	nics := f(t, 2)
	a, b := OpenEP(t, nics[0], 1), OpenEP(t, nics[1], 1)
	if po, ok := a.(fabric.PutOrderer); !ok || !po.PutsBeforeSends() {
		t.Skipf("%T does not promise PutsBeforeSends", a)
	}
	la, rb := Register(t, a, size), Register(t, b, size)
	rounds := 20
	if testenv.Small() {
		rounds = 5
	}
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	for i := range rounds {
		fill(la.Buf, byte(i))
		post(t, a, fabric.RMA{Op: fabric.OpPut, Peer: b.Addr(), Local: la.NLA, Remote: rb.NLA, Len: uint32(size), Notify: fabric.NotifyRequester})
		send(t, a, msg(b.Addr(), 1, uint64(i), 8))
		var m [1]fabric.Message
		RecvWait(t, ctx, b, m[:])
		checkBytes(t, "data put before the message", rb.Buf, la.Buf)
		pollN(t, a, 1)
	}
}

//go:build ofi && cgo

package ofi

// cgo.go is the Go side of the cgo boundary, and the only Go file of the
// package that uses cgo. libfabric's data calls (fi_send, fi_read,
// fi_cq_read, ...) are static inline functions that dispatch through ops
// tables, which cgo cannot call, so a thin layer of C glue wraps each
// one: declared in cgo.h, defined in cgo_open.c (getinfo, open, address
// vector), cgo_data.c (send, receive, completions, the wait fd),
// cgo_rma.c (memory, registration, RMA) and unpark.c (the getinfo filter).
// Rules kept here:
//
//   - No unpinned Go pointer is ever handed to C to keep: every buffer
//     libfabric sees (receive and send slots, RMA regions, CQ entry
//     arrays) is C memory from calloc or mmap, except a caller's buffer
//     (RegisterBuffer), which is meant to be an mmap too and is pinned
//     (runtime.Pinner, a no-op on non-Go memory) while registered in case
//     it is Go memory after all.
//   - Operation contexts are integers (see opctx in wire.go) cast to
//     void* inside C, so no Go value hides in a pointer and the provider
//     is never asked to write into a context (we do not accept FI_CONTEXT).
//   - At most one cgo call per message and none that allocates: the
//     wrappers take plain scalars and C pointers; exn_poll reads a batch
//     of completions, stages received packets and reposts their buffers
//     in one call.

/*
#cgo LDFLAGS: -lfabric
#include "cgo.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"
)

// Capability and access bits the Go side passes to the C glue.
const (
	capMsg    = C.FI_MSG
	capRMA    = C.FI_RMA
	capSource = C.FI_SOURCE
	// regionAccess lets remote peers read and write a region and this
	// endpoint use it as the local buffer of its own reads and writes.
	regionAccess = C.FI_READ | C.FI_WRITE | C.FI_REMOTE_READ | C.FI_REMOTE_WRITE
	// bufAccess is the access of the send/receive slot pools.
	bufAccess = C.FI_SEND | C.FI_RECV

	mrLocal    = C.FI_MR_LOCAL
	mrVirtAddr = C.FI_MR_VIRT_ADDR
	mrProvKey  = C.FI_MR_PROV_KEY

	fiEAGAIN = -C.FI_EAGAIN
	fiEAVAIL = -C.FI_EAVAIL

	flagRecv = C.FI_RECV

	// Error codes (positive, as in fi_cq_err_entry.err) that mean the
	// peer is unreachable.
	fiECONNREFUSED = C.FI_ECONNREFUSED
	fiECONNRESET   = C.FI_ECONNRESET
	fiECONNABORTED = C.FI_ECONNABORTED
	fiEHOSTUNREACH = C.FI_EHOSTUNREACH
	fiETIMEDOUT    = C.FI_ETIMEDOUT
	fiEIO          = C.FI_EIO
	fiENOTCONN     = C.FI_ENOTCONN
	fiESHUTDOWN    = C.FI_ESHUTDOWN
)

// The cgo-free capability constants of diagnose.go must be libfabric's.
var _ = [1]struct{}{}[(probeMsg^capMsg)|(probeRMA^capRMA)|(probeSource^capSource)]

// fiErr is a libfabric error code with the failing call.
type fiErr struct {
	op   string
	code int
}

func (e *fiErr) Error() string {
	return fmt.Sprintf("%s: %s (%d)", e.op, C.GoString(C.fi_strerror(C.int(-e.code))), e.code)
}

func fiError(op string, ret C.ssize_t) error {
	if ret >= 0 {
		return nil
	}
	return &fiErr{op: op, code: int(ret)}
}

func isAgain(err error) bool {
	var fe *fiErr
	return errors.As(err, &fe) && fe.code == fiEAGAIN
}

// info is a libfabric fi_info list returned by getinfo.
type info struct{ p *C.struct_fi_info }

// Ordering levels of getinfo.
const (
	orderNone = 0
	orderSAS  = 1 // send after send
	orderSAW  = 2 // send after send and send after write
)

func getinfo(prov, node, service string, caps uint64, rdm bool, order int) (info, error) {
	var cprov, cnode, csvc *C.char
	if prov != "" {
		cprov = C.CString(prov)
		defer C.free(unsafe.Pointer(cprov))
	}
	if node != "" {
		cnode = C.CString(node)
		defer C.free(unsafe.Pointer(cnode))
	}
	if service != "" {
		csvc = C.CString(service)
		defer C.free(unsafe.Pointer(csvc))
	}
	var out *C.struct_fi_info
	ret := C.exn_getinfo(cprov, cnode, csvc, C.uint64_t(caps), cbool(rdm), C.int(order), &out)
	if ret == C.EXN_UNPARKABLE {
		return info{}, fmt.Errorf("%w: ofi %s: every RDM endpoint it offers runs on libfabric's native TCP engine (xnet), whose fi_trywait does nothing before libfabric 1.19, so exn could never park on its completion queue; use libfabric 1.17's tcp (tcp;ofi_rxm) or libfabric 1.19 or later", errors.ErrUnsupported, prov)
	}
	if ret != 0 {
		return info{}, fiError("fi_getinfo", C.ssize_t(ret))
	}
	return info{out}, nil
}

// keepUnparkable turns exn_drop_unparkable off for the tests of the
// NIC's own guard; never set outside tests.
func keepUnparkable(on bool) { C.exn_set_keep_unparkable(cbool(on)) }

// libVersion is the running libfabric's version (fi_version), major and
// minor.
func libVersion() (major, minor int) {
	v := uint32(C.fi_version())
	return int(v >> 16), int(v & 0xffff)
}

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

func (i info) free() {
	if i.p != nil {
		C.fi_freeinfo(i.p)
	}
}

// entries lists (provider name, endpoint type, caps) of every entry.
type infoEntry struct {
	prov string
	rdm  bool
	caps uint64
}

func (i info) entries() []infoEntry {
	var out []infoEntry
	for p := i.p; p != nil; p = C.exn_info_next(p) {
		out = append(out, infoEntry{
			prov: C.GoString(C.exn_info_prov(p)),
			rdm:  C.exn_info_type(p) == C.FI_EP_RDM,
			caps: uint64(C.exn_info_caps(p)),
		})
	}
	return out
}

// fab is one opened libfabric stack: fabric, domain, AV, CQ, endpoint.
type fab struct {
	o *C.exn_ofi
}

// openFab opens the stack from the first entry of in, which it consumes.
func openFab(in info, cqSize, avSize int) (*fab, error) {
	var o *C.exn_ofi
	var stage *C.char
	ret := C.exn_open(in.p, C.size_t(cqSize), C.size_t(avSize), &o, &stage)
	if ret != 0 {
		return nil, fiError(C.GoString(stage), C.ssize_t(ret))
	}
	return &fab{o: o}, nil
}

func (f *fab) close() { C.exn_close_all(f.o) }

func (f *fab) provider() string   { return C.GoString(&f.o.prov[0]) }
func (f *fab) mrMode() uint64     { return uint64(f.o.mr_mode) }
func (f *fab) waitable() bool     { return f.o.waitfd >= 0 }
func (f *fab) saw() bool          { return f.o.saw != 0 }
func (f *fab) addrFormat() uint64 { return uint64(f.o.addr_format) }

// addrFormatStr is FI_ADDR_STR: addresses that are strings (shm).
const addrFormatStr = uint64(C.FI_ADDR_STR)

// name returns this endpoint's address (fi_getname).
func (f *fab) name() ([]byte, error) {
	const maxName = 512 // larger than any provider address (sockaddr, shm names, IB GIDs)
	buf := C.malloc(maxName)
	defer C.free(buf)
	n := C.size_t(maxName)
	if ret := C.exn_getname(f.o, buf, &n); ret != 0 {
		return nil, fiError("fi_getname", C.ssize_t(ret))
	}
	return C.GoBytes(buf, C.int(n)), nil
}

// avLookup returns the address inserted as fa (fi_av_lookup): for a
// peer added with its Name, the bytes of that Name.
func (f *fab) avLookup(fa uint64) ([]byte, error) {
	const maxName = 512
	buf := C.malloc(maxName)
	defer C.free(buf)
	n := C.size_t(maxName)
	if ret := C.exn_av_lookup(f.o, C.uint64_t(fa), buf, &n); ret != 0 {
		return nil, fiError("fi_av_lookup", C.ssize_t(ret))
	}
	if n > maxName {
		return nil, fmt.Errorf("fi_av_lookup: address of %d bytes", n)
	}
	return C.GoBytes(buf, C.int(n)), nil
}

func (f *fab) avInsert(addr []byte) (uint64, error) {
	if len(addr) == 0 {
		return 0, fmt.Errorf("fi_av_insert: empty address")
	}
	c := C.CBytes(addr)
	defer C.free(c)
	var fa C.uint64_t
	if ret := C.exn_av_insert(f.o, c, &fa); ret != 0 {
		return 0, fiError("fi_av_insert", C.ssize_t(ret))
	}
	return uint64(fa), nil
}

func (f *fab) avInsertSvc(node, svc string) (uint64, error) {
	cn, cs := C.CString(node), C.CString(svc)
	defer C.free(unsafe.Pointer(cn))
	defer C.free(unsafe.Pointer(cs))
	var fa C.uint64_t
	if ret := C.exn_av_insertsvc(f.o, cn, cs, &fa); ret != 0 {
		return 0, fiError("fi_av_insertsvc", C.ssize_t(ret))
	}
	return uint64(fa), nil
}

// cmem is C memory from mmap: page aligned, never moved by Go, and
// unmapped (so a stale access faults instead of corrupting) on free. Or,
// from callerMem, a caller's buffer: pinned, and only unpinned on free.
type cmem struct {
	p   unsafe.Pointer
	len int
	pin *runtime.Pinner // non-nil: the caller's memory, never unmapped here
}

// callerMem is cmem over buf (non-empty), which stays its caller's: free
// only unpins it. Pin keeps the GC's hands off buf should it be Go memory
// (cgo's rule for a pointer C keeps); it does nothing on an mmap.
func callerMem(buf []byte) cmem {
	p := unsafe.Pointer(unsafe.SliceData(buf))
	pin := new(runtime.Pinner)
	pin.Pin(p)
	return cmem{p: p, len: len(buf), pin: pin}
}

func mmapMem(n int) (cmem, error) {
	p := C.exn_mmap(C.size_t(n))
	if p == nil {
		return cmem{}, fmt.Errorf("mmap %d bytes failed", n)
	}
	return cmem{p: p, len: n}, nil
}

func (m cmem) bytes() []byte { return unsafe.Slice((*byte)(m.p), m.len) }
func (m cmem) addr() uint64  { return uint64(C.exn_ptr(m.p)) }
func (m cmem) at(off int) unsafe.Pointer {
	return unsafe.Add(m.p, off)
}
func (m cmem) free() {
	if m.pin != nil {
		m.pin.Unpin()
		return
	}
	if m.p != nil {
		C.exn_munmap(m.p, C.size_t(m.len))
	}
}

// mr is one memory registration.
type mr struct {
	p    *C.struct_fid_mr
	key  uint64
	desc unsafe.Pointer
}

func (f *fab) mrReg(m cmem, access, key uint64) (mr, error) {
	var r mr
	var k C.uint64_t
	ret := C.exn_mr_reg(f.o, m.p, C.size_t(m.len), C.uint64_t(access), C.uint64_t(key), &r.p, &k, &r.desc)
	if ret != 0 {
		return mr{}, fiError("fi_mr_reg", C.ssize_t(ret))
	}
	r.key = uint64(k)
	return r, nil
}

func (r mr) close() error {
	if r.p == nil {
		return nil
	}
	return fiError("fi_close(mr)", C.ssize_t(C.exn_mr_close(r.p)))
}

func (f *fab) postRecv(buf unsafe.Pointer, n int, desc unsafe.Pointer, ctx uint64) error {
	return fiError("fi_recv", C.exn_recv(f.o, buf, C.size_t(n), desc, C.uint64_t(ctx)))
}

func (f *fab) send(buf unsafe.Pointer, n int, desc unsafe.Pointer, dest, ctx uint64) error {
	return fiError("fi_send", C.exn_send(f.o, buf, C.size_t(n), desc, C.uint64_t(dest), C.uint64_t(ctx)))
}

// rmaVec is the C-side piece list of one operation slot (exn_rmav).
type rmaVec C.exn_rmav

// newRMAVecs allocates n piece lists in C memory (zeroed); freeRMAVecs
// releases them.
func newRMAVecs(n int) []rmaVec {
	return unsafe.Slice((*rmaVec)(C.calloc(C.size_t(n), C.sizeof_exn_rmav)), n)
}

func freeRMAVecs(v []rmaVec) {
	if len(v) > 0 {
		C.free(unsafe.Pointer(&v[0]))
	}
}

// set fills piece i: n bytes between local memory buf and remote address raddr.
func (v *rmaVec) set(i int, buf unsafe.Pointer, raddr uint64, n int) {
	v.laddr[i] = C.uint64_t(uintptr(buf))
	v.raddr[i] = C.uint64_t(raddr)
	v.len[i] = C.uint64_t(n)
}

// iovLimit is the most pieces one rma call may carry on this provider.
func (f *fab) iovLimit() int { return int(f.o.iov_limit) }

// rma issues one RMA operation of k pieces of v (C memory the caller
// owns until the completion), all in the local registration desc and the
// remote region key.
func (f *fab) rma(write, dc bool, v *rmaVec, k int, desc unsafe.Pointer, dest, key, ctx uint64) error {
	op := "fi_readmsg"
	if write {
		op = "fi_writemsg"
	}
	return fiError(op, C.exn_rma(f.o, cbool(write), cbool(dc), (*C.exn_rmav)(v), C.size_t(k), desc, C.uint64_t(dest), C.uint64_t(key), C.uint64_t(ctx)))
}

// cqBatch is a reusable C array of completion entries, source
// addresses, the entries as Go reads them, and a staging copy of each
// received packet (exn_poll reposts the receive buffer at once).
type cqBatch struct {
	ents  *C.struct_fi_cq_msg_entry
	srcs  *C.uint64_t
	out   []C.exn_cqe // views C memory
	stage cmem
	n     int
	err   *C.exn_err
}

func newCQBatch(n int) (*cqBatch, error) {
	stage, err := mmapMem(n * recvSize)
	if err != nil {
		return nil, err
	}
	out := (*C.exn_cqe)(C.calloc(C.size_t(n), C.sizeof_exn_cqe))
	return &cqBatch{
		ents:  (*C.struct_fi_cq_msg_entry)(C.calloc(C.size_t(n), C.sizeof_struct_fi_cq_msg_entry)),
		srcs:  (*C.uint64_t)(C.calloc(C.size_t(n), 8)),
		out:   unsafe.Slice(out, n),
		stage: stage,
		n:     n,
		err:   (*C.exn_err)(C.calloc(1, C.sizeof_exn_err)),
	}, nil
}

func (b *cqBatch) free() {
	C.free(unsafe.Pointer(b.ents))
	C.free(unsafe.Pointer(b.srcs))
	C.free(unsafe.Pointer(&b.out[0]))
	C.free(unsafe.Pointer(b.err))
	b.stage.free()
}

// poll is one progress step (one cgo call): it reads up to a batch of
// completions, copying received packets to the staging area and
// reposting their buffers. It returns the count, or errAvail when an
// error entry is queued.
func (f *fab) poll(b *cqBatch, rx cmem, rxDesc unsafe.Pointer) (int, error) {
	ret := C.exn_poll(f.o, b.ents, b.srcs, &b.out[0], C.size_t(b.n), (*C.char)(b.stage.p), (*C.char)(rx.p), recvSize, rxDesc)
	switch {
	case ret >= 0:
		return int(ret), nil
	case ret == fiEAVAIL:
		return 0, errAvail
	}
	return 0, fiError("fi_cq_read", ret)
}

// repostErrs is how many deferred receive reposts have failed other than
// with -FI_EAGAIN (each is retried on the next poll); progress lock held.
func (f *fab) repostErrs() uint64 { return uint64(f.o.repost_errs) }

// trywait reports whether nothing is pending and the wait fd is armed.
func (f *fab) trywait() bool { return C.exn_trywait(f.o) != 0 }

// pollFD is the non-blocking dup of the CQ wait fd for the netpoller, or
// -1. The NIC wraps it in an *os.File, which then owns it.
func (f *fab) pollFD() int {
	fd := int(f.o.pollfd)
	f.o.pollfd = -1 // owned by the caller from now on
	return fd
}

// injectSize is the largest packet fi_inject takes.
func (f *fab) injectSize() int { return int(f.o.inject) }

// inject sends a packet inline: buf is free on return, no completion.
func (f *fab) inject(buf unsafe.Pointer, n int, dest uint64) error {
	return fiError("fi_inject", C.exn_inject(f.o, buf, C.size_t(n), C.uint64_t(dest)))
}

var errAvail = errors.New("cq error entry available")

// entry returns completion i of the last poll: context, length (capped
// at recvSize), source address, and the repost result of a receive.
func (b *cqBatch) entry(i int) (c opctx, length int, src uint64, repost error) {
	e := &b.out[i]
	if e.rerr != 0 {
		repost = fiError("fi_recv", C.ssize_t(e.rerr))
	}
	return opctx(e.ctx), int(e.len), uint64(e.src), repost
}

// packet returns the staged copy of received completion i.
func (b *cqBatch) packet(i, length int) []byte {
	return unsafe.Slice((*byte)(b.stage.at(i*recvSize)), length)
}

// cqErr is one error completion.
type cqErr struct {
	ctx    uint64
	recv   bool
	code   int
	detail string
}

func (f *fab) cqReadErr(b *cqBatch) (cqErr, bool) {
	if C.exn_cq_readerr(f.o, b.err) != 0 {
		return cqErr{}, false
	}
	e := b.err
	return cqErr{
		ctx:    uint64(e.ctx),
		recv:   uint64(e.flags)&flagRecv != 0,
		code:   int(e.err),
		detail: fmt.Sprintf("%s (err %d, prov_errno %d)", C.GoString(&e.msg[0]), int(e.err), int(e.prov_errno)),
	}, true
}

// signal wakes a node parked on the wait fd (fi_cq_signal).
func (f *fab) signal() { C.exn_cq_signal(f.o) }

// fiAddrNotAvail is FI_ADDR_NOTAVAIL: a completion from a source not in
// the AV.
const fiAddrNotAvail = ^uint64(0)

// The layout of fi_cq_msg_entry stays C's business: Go reads only
// exn_cqe, which exn_poll fills.
var _ = unsafe.Sizeof(C.exn_cqe{})

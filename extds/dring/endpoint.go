package dring

// Endpoint: one side of a direct connection driven from Go.
//
// Stages: Write copies into the outbound ring (direction side) under the
// shared prod_lock and publishes tail; Read copies out of the inbound
// ring (direction 1−side) under cons_lock and publishes head. Each rings
// the peer only when the peer has parked waiters (docs/direct.md,
// "Ringing and parking with one bell"): one byte written into this
// side's own bell makes the peer's end readable. A call that must wait
// spins SpinBudget, then parks on the same bell (park.go): readers and
// writers of this side share it, one goroutine waits on it and the
// others on a condition it broadcasts.
//
// Publishing: every store another process waits on (tail, head, fin,
// rd_closed, rst) is a Swap, not a Store, before the load of the other
// side's waiter count that decides whether to ring (the Dekker pair of
// docs/direct.md). Go's atomics are sequentially consistent, but under
// the race detector a Store is a release store (a plain MOV on amd64)
// that the CPU may reorder after the following load: a lost wake-up
// that hung TestDringCrossLanguage under -race. A Swap is a locked
// exchange in both builds.
//
// Locks (outer first): rdMu and wrMu serialise this process's readers
// and writers (so at most one goroutine per role parks, and the shared
// futex locks are taken by one goroutine of this process at a time);
// live is held for reading by every call that touches the mapping or a
// descriptor, and for writing by Close, which unmaps and closes: Close
// first sets a past read deadline on the bell's netpoller file, which
// makes a parked call return net.ErrClosed, wakes the others, then waits
// for them. pmu guards the bell's files (fs.Bell[side], SetBell; the
// netpoller dup, made on the first park); wmu guards the park state
// (waiting, gen). Neither is held across a wait.

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/exn-project/exn/internal/sys"
)

// SpinBudget is how long a call polls the ring before it parks: the same
// 20 µs as extds' connSpinBudget (docs/wakeup.md), so a ping-pong peer
// that answers within it is met without a system call.
const SpinBudget = 20 * time.Microsecond

// Errors of a connection (wrapped in the calls' errors).
var (
	// ErrReset: either side or an exnd reset the connection.
	ErrReset = errors.New("dring: connection reset")
	// ErrPeerClosed: the peer's reader is gone; a write cannot be read.
	ErrPeerClosed = errors.New("dring: peer closed for reading")
)

type ctl struct {
	tail, head                   *atomic.Uint64
	fin, prodWait, prodLock, rst *atomic.Uint32
	consWait, consLock, rdClosed *atomic.Uint32
	dataRung, spaceRung          *atomic.Uint32
}

func ctlAt(mem []byte, d int) (c ctl, err error) {
	base := ctlBase + ctlSize*d
	u64 := func(off int) *atomic.Uint64 {
		p, e := sys.Uint64At(mem, base+off)
		err = errors.Join(err, e)
		return p
	}
	u32 := func(off int) *atomic.Uint32 {
		p, e := sys.Uint32At(mem, base+off)
		err = errors.Join(err, e)
		return p
	}
	c = ctl{
		tail: u64(cTail), fin: u32(cFin), prodWait: u32(cProdWait), prodLock: u32(cProdLock), rst: u32(cRst),
		head: u64(cHead), consWait: u32(cConsWait), consLock: u32(cConsLock), rdClosed: u32(cRdClosed),
		dataRung: u32(cDataRung), spaceRung: u32(cSpaceRung),
	}
	return c, err
}

// Endpoint is side 0 (connecting) or 1 (accepting) of a direct
// connection. Read, Write, CloseWrite, CloseRead, Reset, SetRelay,
// SetPollOnly, SetBell and Counters are safe for concurrent use (not
// SetRinger); Read calls are serialised among themselves, and Write
// calls likewise.
type Endpoint struct {
	side       int
	ring       uint64
	mem        []byte
	tx, rx     ctl
	txData     []byte
	rxData     []byte
	relay      *atomic.Uint32
	fs         *Files       // Bell[side] once there is one (under pmu), the listener if any; Close closes them
	bell       atomic.Int64 // fs.Bell[side]'s descriptor, -1 while there is none; used under live
	ringer     func()       // rings the peer while there is no bell (SetRinger)
	rdMu, wrMu sync.Mutex
	live       sync.RWMutex
	closed     atomic.Bool
	// woken: Reset or a corrupt buffer set a past deadline on bf to
	// wake this process's bell waiter (the bell cannot ring its own
	// side); it stays past (rst never clears).
	woken    atomic.Bool
	peerGone atomic.Bool // the bell read end of file: every holder of the peer's bell closed it
	pollOnly atomic.Bool // SetPollOnly: park without the bell

	pmu sync.Mutex      // guards fs.Bell[side], bf and brc
	bf  *os.File        // a dup of the bell in the netpoller, made on the first park with a bell
	brc syscall.RawConn // bf's

	wmu     sync.Mutex
	wcond   sync.Cond // on wmu: gen moved
	waiting bool      // a goroutine waits on the bell (the bell waiter)
	gen     uint64    // bumped after each drain of the bell and when the bell waiter stops
	drain   [64]byte  // the bell waiter's (one at a time: waiting)

	// The two waits, made once at Attach so that parking allocates
	// nothing: what each waits for, and its netpoller callback.
	rd, wr waiter
}

// waiter is one role's park state (reader or writer); only the goroutine
// holding that role's mutex uses it.
type waiter struct {
	count *atomic.Uint32 // cons_wait or prod_wait of the direction it waits on
	ready func() bool
	cb    func(fd uintptr) bool
}

// Attach maps fs (which it takes over, also on error) as side side. It
// closes fs.Buf once mapped (the mapping keeps the file) and fs.Bell of
// the other side if set (the peer's: never this side's to use); it keeps
// fs.Bell[side], the side's bell, which may be nil: then the Endpoint
// stores and reads as usual but rings through SetRinger's function (or
// not at all), and a call that must wait polls the ring until SetBell
// gives it the bell (exnd's side of a connection across hosts, whose
// bell the program holds).
func Attach(fs *Files, side int) (_ *Endpoint, err error) {
	if side != 0 && side != 1 {
		fs.Close()
		return nil, fmt.Errorf("dring: side %d", side)
	}
	defer func() {
		if err != nil {
			fs.Close()
		}
	}()
	if fs.Buf == nil {
		return nil, errors.New("dring: no buffer")
	}
	size, err := sys.FileSize(fs.Buf)
	if err != nil {
		return nil, err
	}
	if size < HeaderSize || size > int64(FileSize(MaxRing)) {
		return nil, fmt.Errorf("file of %d bytes: %w", size, ErrCorrupt)
	}
	mem, err := sys.MapShared(fs.Buf, int(size))
	if err != nil {
		return nil, err
	}
	ring, err := checkHeader(mem, size)
	if err != nil {
		sys.Unmap(mem)
		return nil, err
	}
	e := &Endpoint{side: side, ring: uint64(ring), mem: mem, fs: fs}
	fail := func(err error) (*Endpoint, error) {
		sys.Unmap(mem)
		return nil, err
	}
	if e.tx, err = ctlAt(mem, side); err != nil {
		return fail(err)
	}
	if e.rx, err = ctlAt(mem, 1-side); err != nil {
		return fail(err)
	}
	if e.relay, err = sys.Uint32At(mem, offRelay+4*side); err != nil {
		return fail(err)
	}
	e.txData = mem[HeaderSize+side*ring : HeaderSize+(side+1)*ring]
	e.rxData = mem[HeaderSize+(1-side)*ring : HeaderSize+(2-side)*ring]
	e.bell.Store(-1)
	if b := fs.Bell[side]; b != nil {
		fd, err := fdOf(b)
		if err != nil {
			return fail(err)
		}
		e.bell.Store(int64(fd))
	}
	var errs []error
	for _, f := range []**os.File{&fs.Buf, &fs.Bell[1-side]} {
		if *f != nil {
			errs = append(errs, (*f).Close())
			*f = nil
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fail(err)
	}
	e.wcond.L = &e.wmu
	e.rd = waiter{count: e.rx.consWait, ready: e.readable}
	e.wr = waiter{count: e.tx.prodWait, ready: e.writable}
	for _, w := range []*waiter{&e.rd, &e.wr} {
		w.cb = func(fd uintptr) bool { return e.drained(fd, w) }
	}
	return e, nil
}

// fdOf is f's descriptor, without touching its mode (sys.FileFD).
func fdOf(f *os.File) (int, error) {
	fd, err := sys.FileFD(f)
	if err != nil {
		return -1, fmt.Errorf("dring: %w", err)
	}
	return fd, nil
}

// SetRinger makes f the Endpoint's way to ring the peer while it has no
// bell (Attach without one): across hosts exnd's Endpoint and the
// engine that plays the peer live in one process, and f kicks the
// engine. Call it before the Endpoint is shared.
func (e *Endpoint) SetRinger(f func()) { e.ringer = f }

// SetBell gives an Endpoint attached without its side's bell the bell f,
// which it takes over (closed by Close): from now on it rings through f
// and parks on it. An Endpoint that has its bell keeps it and closes f
// (both are descriptors of one bell where exnd holds its own dup);
// after Close it closes f and fails with net.ErrClosed.
func (e *Endpoint) SetBell(f *os.File) error {
	fd, err := fdOf(f)
	if err != nil {
		f.Close()
		return err
	}
	e.live.RLock()
	defer e.live.RUnlock()
	if e.closed.Load() {
		f.Close()
		return net.ErrClosed
	}
	e.pmu.Lock()
	if e.fs.Bell[e.side] != nil {
		e.pmu.Unlock()
		return f.Close()
	}
	e.fs.Bell[e.side] = f
	e.bell.Store(int64(fd))
	e.pmu.Unlock()
	e.bump() // a waiter polling without a bell moves onto it
	return nil
}

func (e *Endpoint) readable() bool {
	t, h, err := e.fill()
	return err != nil || t != h || e.rx.fin.Load() != 0 || e.reset()
}

func (e *Endpoint) writable() bool {
	_, f, err := e.space()
	return err != nil || f > 0 || e.reset() || e.tx.rdClosed.Load() != 0
}

// Ring is the ring size per direction.
func (e *Endpoint) Ring() int { return int(e.ring) }

// fill reads the inbound ring's fill level, checking it.
func (e *Endpoint) fill() (tail, head uint64, err error) {
	tail = e.rx.tail.Load()
	head = e.rx.head.Load()
	if tail-head > e.ring {
		return tail, head, e.fail()
	}
	return tail, head, nil
}

// space reads the outbound ring's free bytes, checking it.
func (e *Endpoint) space() (tail, free uint64, err error) {
	head := e.tx.head.Load()
	tail = e.tx.tail.Load()
	if tail-head > e.ring {
		return tail, 0, e.fail()
	}
	return tail, e.ring - (tail - head), nil
}

// fail marks a corrupt buffer: reset, so both sides stop; the peer is
// rung and this process's waiters woken.
func (e *Endpoint) fail() error {
	e.tx.rst.Swap(1)
	e.rx.rst.Swap(1)
	e.ringPeer()
	e.wakeLocal()
	return fmt.Errorf("cursors out of range: %w", ErrCorrupt)
}

func (e *Endpoint) reset() bool { return e.tx.rst.Load() != 0 || e.rx.rst.Load() != 0 }

// ringPeer writes one byte into this side's bell (the peer's end becomes
// readable), or, without a bell, calls the ringer. A bell whose peer is
// gone (sys.ErrBellGone) is ignored: nobody is left to wake. Called
// under live (read), so the descriptor stays open.
func (e *Endpoint) ringPeer() {
	if fd := e.bell.Load(); fd >= 0 {
		_ = sys.RingSocketBell(int(fd))
	} else if e.ringer != nil {
		e.ringer()
	}
}

func opErr(op string, err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	return &net.OpError{Op: op, Net: "extds-direct", Err: err}
}

// Read copies inbound bytes into p: at least one, waiting for them; 0,
// io.EOF after the peer's fin; ErrReset, ErrCorrupt or net.ErrClosed
// (wrapped in *net.OpError).
func (e *Endpoint) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if err := e.enter("read", &e.rdMu, e.rx.consLock); err != nil {
		return 0, err
	}
	defer e.exit(&e.rdMu, e.rx.consLock)
	for {
		tail, head, err := e.fill()
		if err != nil {
			return 0, opErr("read", err)
		}
		if n := tail - head; n > 0 {
			k := copyOut(p, e.rxData, head, min(n, uint64(len(p))))
			e.rx.head.Swap(head + uint64(k))
			if e.rx.prodWait.Load() > 0 {
				e.ringPeer() // space for the peer's writers
			}
			return k, nil
		}
		if e.reset() {
			return 0, opErr("read", ErrReset)
		}
		if e.rx.fin.Load() != 0 {
			if t, _, _ := e.fill(); t != tail {
				continue // bytes published before fin
			}
			return 0, io.EOF
		}
		if err := e.park(&e.rd); err != nil {
			return 0, opErr("read", err)
		}
	}
}

// Write copies all of p into the outbound ring, waiting for space. It
// fails with ErrPeerClosed, ErrReset, ErrCorrupt or net.ErrClosed, and
// after CloseWrite.
func (e *Endpoint) Write(p []byte) (int, error) {
	if err := e.enter("write", &e.wrMu, e.tx.prodLock); err != nil {
		return 0, err
	}
	defer e.exit(&e.wrMu, e.tx.prodLock)
	done := 0
	for done < len(p) {
		if e.tx.fin.Load() != 0 {
			return done, opErr("write", net.ErrClosed)
		}
		if e.reset() {
			return done, opErr("write", ErrReset)
		}
		if e.tx.rdClosed.Load() != 0 {
			return done, opErr("write", ErrPeerClosed)
		}
		tail, free, err := e.space()
		if err != nil {
			return done, opErr("write", err)
		}
		if free > 0 {
			k := copyIn(e.txData, tail, p[done:done+int(min(free, uint64(len(p)-done)))])
			e.tx.tail.Swap(tail + uint64(k))
			done += k
			if e.tx.consWait.Load() > 0 {
				e.ringPeer() // data for the peer's readers
			}
			continue
		}
		if err := e.park(&e.wr); err != nil {
			return done, opErr("write", err)
		}
	}
	return done, nil
}

// copyOut copies n bytes at stream offset off of ring r into p.
func copyOut(p, r []byte, off, n uint64) int {
	size := uint64(len(r))
	i := off & (size - 1)
	k := copy(p[:n], r[i:])
	if uint64(k) < n {
		k += copy(p[k:n], r[:n-uint64(k)])
	}
	return k
}

// copyIn copies p into ring r at stream offset off.
func copyIn(r []byte, off uint64, p []byte) int {
	size := uint64(len(r))
	i := off & (size - 1)
	k := copy(r[i:], p)
	if k < len(p) {
		k += copy(r, p[k:])
	}
	return k
}

// lock takes a shared futex lock word (0 free, 1 held, 2 held with
// waiters), as shim/dring.c does.
func lock(w *atomic.Uint32) {
	if w.CompareAndSwap(0, 1) {
		return
	}
	for w.Swap(2) != 0 {
		_ = sys.FutexWait(w, 2, 0)
	}
}

func unlock(w *atomic.Uint32) {
	if w.Swap(0) == 2 {
		_, _ = sys.FutexWake(w, 1)
	}
}

// CloseWrite stores fin: the peer reads EOF after the bytes written.
func (e *Endpoint) CloseWrite() {
	e.whileOpen(func() {
		e.tx.fin.Swap(1)
		if e.tx.consWait.Load() > 0 {
			e.ringPeer()
		}
	})
}

// CloseRead stores rd_closed: the peer's writes fail.
func (e *Endpoint) CloseRead() {
	e.whileOpen(func() {
		e.rx.rdClosed.Swap(1)
		if e.rx.prodWait.Load() > 0 {
			e.ringPeer()
		}
	})
}

// Reset stores rst on both directions and wakes both sides: the peer
// through the bell, this process's parked calls directly (wakeLocal).
// Other processes of this side (exnd's program) are not woken here: the
// bell cannot ring its own side (docs/direct.md, "exnd waking its own
// program").
func (e *Endpoint) Reset() {
	e.whileOpen(func() {
		e.tx.rst.Swap(1)
		e.rx.rst.Swap(1)
		e.ringPeer()
		e.wakeLocal()
	})
}

// SetRelay stores relay[side]: this side's processes use their socket as
// a plain one from now on (exnd relays it), and the Endpoint is the
// side's only waiter: it parks on the bell again (SetPollOnly off).
func (e *Endpoint) SetRelay() {
	e.whileOpen(func() {
		e.relay.Store(1)
		e.pollOnly.Store(false)
		e.bump() // a polling waiter moves onto the bell
	})
}

// SetPollOnly makes the Endpoint's parked calls, while on, poll the
// rings (a sleep that doubles up to a millisecond) instead of waiting
// on the bell and draining it: for exnd's Endpoint while its program's
// waiters park on the same bell. Waiters of one side in two processes
// are not supported on the bell (docs/direct.md, "Ringing and parking
// with one bell"): a drain by one may take the byte the other needs.
// The Endpoint still rings the peer through the bell. SetRelay turns it
// off.
func (e *Endpoint) SetPollOnly(on bool) {
	e.pollOnly.Store(on)
	e.bump()
}

// enter is the lock prologue of Read and Write (op): this side's mu, the
// live lock for reading, then the ring's producer or consumer lock ring.
// It fails with net.ErrClosed (wrapped) after Close, holding nothing; else
// the caller calls exit(mu, ring) when done.
func (e *Endpoint) enter(op string, mu *sync.Mutex, ring *atomic.Uint32) error {
	mu.Lock()
	e.live.RLock()
	if e.closed.Load() {
		e.live.RUnlock()
		mu.Unlock()
		return opErr(op, net.ErrClosed)
	}
	lock(ring)
	return nil
}

// exit releases what enter took, in reverse order.
func (e *Endpoint) exit(mu *sync.Mutex, ring *atomic.Uint32) {
	unlock(ring)
	e.live.RUnlock()
	mu.Unlock()
}

// whileOpen runs f, which stores into the shared header, under the read
// side of live unless e is closed: the mapping stays while f runs.
func (e *Endpoint) whileOpen(f func()) {
	e.live.RLock()
	defer e.live.RUnlock()
	if !e.closed.Load() {
		f()
	}
}

// Counters returns the bytes this side has written and read (the
// cursors: they count what the programs moved, not only exnd).
func (e *Endpoint) Counters() (sent, received uint64) {
	e.live.RLock()
	defer e.live.RUnlock()
	if e.closed.Load() {
		return 0, 0
	}
	return e.tx.tail.Load(), e.rx.head.Load()
}

// Close makes blocked calls return net.ErrClosed, waits for them, and
// unmaps the buffer and closes the files. Idempotent.
func (e *Endpoint) Close() error {
	if e.closed.Swap(true) {
		return nil
	}
	// Wake the bell waiter with a past deadline on its netpoller file
	// (not by closing the bell: a call may still ring its descriptor
	// until it returns, and a closed descriptor's number can be reused),
	// and the other parked calls through gen.
	e.pmu.Lock()
	if e.bf != nil {
		_ = e.bf.SetReadDeadline(time.Unix(1, 0))
	}
	e.pmu.Unlock()
	e.bump()
	e.live.Lock()
	defer e.live.Unlock()
	var errs []error
	if e.bf != nil {
		errs = append(errs, e.bf.Close())
	}
	e.bell.Store(-1)
	return errors.Join(append(errs, e.fs.Close(), sys.Unmap(e.mem))...)
}

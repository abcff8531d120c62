package exn

// Zero-copy transmit: the engine lends free transmit slots to a reader
// (the daemon's TAP reader), which reads frames straight into registered
// memory and hands them back with TransmitLent. A rendezvous frame's slot
// becomes its advert's slot, so the frame is never copied by the engine;
// eager, multicast and dropped frames are copied out into fragments (as
// in Transmit) and their slots freed at once.
//
//	Lend ── take free slots (block for the first only: back-pressure),
//	   │    state free → lent, lent count += k
//	TransmitLent(frames, prefixes of lent buffers)
//	   │ check lent ── classify ── flush if the batch is full
//	   │ claim (CAS lent → 0), then as Transmit: advert on the frame's own
//	   │ slot, or fragments copied out and the slot freed
//	   └─ lent count -= consumed, once per call
//	Return ── CAS lent → free, lent count -= k
//
// Close waits (lendMu, lendCond) until the lent count is zero before it
// releases the registered pool, so slot memory never goes away under a
// borrower that is still filling it (a TAP read in progress).

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/vnet"
)

// ErrNotLent is returned by TransmitLent for a frame that does not start a
// buffer currently lent by Lend.
var ErrNotLent = errors.New("exn: frame is not in a lent buffer")

// Lend lends up to len(bufs) free transmit slots: bufs[i] is set to slot
// memory of the engine's largest frame (MTU+EthHeaderLen bytes, or
// vnet.MaxGSOFrame if that is larger and Config.Offload is set; capacity the
// same) for i < n. It takes only slots that are free now; if none is
// and wait is true it blocks for one (that wait is the transmit
// back-pressure), until ctx is done or the engine is closed
// (net.ErrClosed). With wait false it may return 0, nil.
//
// The borrower owns the lent buffers' bytes until it passes a frame (a
// prefix of the buffer) to TransmitLent or gives the buffer back with
// Return; it must do one of the two for every lent buffer, including
// after Close: Close waits for every lent buffer to come back before it
// releases the registered memory. So the borrower must be stopped before
// or during Close — cancel the ctx it passes here and to TransmitLent, and
// end any fill in progress (close the TAP it reads from) — or Close does
// not return. Safe for concurrent use; it does not allocate.
func (e *Engine) Lend(ctx context.Context, bufs [][]byte, wait bool) (int, error) {
	if len(bufs) == 0 {
		return 0, nil
	}
	n := 0
take:
	for n < len(bufs) {
		select {
		case i := <-e.tx.free:
			e.lendSlot(bufs, n, i)
			n++
		default:
			break take
		}
	}
	if n == 0 && wait {
		e.ctr.txSlotWaits.Add(1)
		select {
		case i := <-e.tx.free:
			e.lendSlot(bufs, n, i)
			n++
		case <-e.done:
			return 0, errClosed
		case <-ctx.Done():
			return 0, fmt.Errorf("exn: lend: %w", ctx.Err())
		}
	}
	if n == 0 {
		return 0, nil
	}
	e.lendMu.Lock()
	if e.closed.Load() {
		e.lendMu.Unlock()
		for k := range n {
			slot := e.lentIndex(bufs[k])
			e.tx.slots[slot].state.Store(0)
			e.tx.free <- slot
			bufs[k] = nil
		}
		return 0, errClosed
	}
	e.lent.Add(int64(n))
	e.lendMu.Unlock()
	return n, nil
}

func (e *Engine) lendSlot(bufs [][]byte, k int, slot int32) {
	e.tx.slots[slot].state.Store(slotLent)
	b := e.tx.buf(slot)
	bufs[k] = b[:e.slotMax:e.slotMax]
}

// lentIndex is the slot whose memory f starts, or -1 if f does not start
// a slot or that slot is not lent. It reads only the slot state.
func (e *Engine) lentIndex(f []byte) int32 {
	if cap(f) == 0 || len(e.tx.region.Buf) == 0 {
		return -1
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(e.tx.region.Buf)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(f)))
	if p < base {
		return -1
	}
	off := p - base
	size := uintptr(e.tx.slotSize)
	if off < pushHdrLen || (off-pushHdrLen)%size != 0 || (off-pushHdrLen)/size >= uintptr(len(e.tx.slots)) {
		return -1
	}
	i := int32((off - pushHdrLen) / size)
	if e.tx.slots[i].state.Load() != slotLent {
		return -1
	}
	return i
}

// unlend drops n buffers from the lent count and wakes Close when it
// reaches zero.
func (e *Engine) unlend(n int) {
	if n == 0 {
		return
	}
	e.lendMu.Lock()
	if e.lent.Add(-int64(n)) == 0 {
		e.lendCond.Broadcast()
	}
	e.lendMu.Unlock()
}

// Return gives lent buffers back unused. Each bufs[i] must be a buffer
// (or a prefix of one) that Lend returned and that was neither returned
// nor transmitted since; others are ignored. It never blocks and works
// after Close. It does not allocate.
func (e *Engine) Return(bufs [][]byte) {
	n := 0
	for _, b := range bufs {
		slot := e.lentIndex(b)
		if slot < 0 || !e.tx.slots[slot].state.CompareAndSwap(slotLent, 0) {
			continue
		}
		e.tx.free <- slot
		n++
	}
	e.unlend(n)
}

// TransmitLent is TransmitLentOffload without offload metadata.
func (e *Engine) TransmitLent(ctx context.Context, frames [][]byte) (int, error) {
	return e.TransmitLentOffload(ctx, frames, nil)
}

// TransmitLentOffload is Transmit for frames that are prefixes of buffers
// lent by Lend (frames[i] starts where a lent buffer starts; its length is
// the frame's). It takes the buffers back: a rendezvous frame is
// advertised from its own slot without a copy; an eager or multicast
// frame is copied into fragments and its slot freed; a bad frame is
// dropped and counted (as in Transmit) and its slot freed.
//
// offs[i], if present and not zero, is frame i's virtio-net header
// meaning (offload.go): a frame whose header does not fit it is dropped
// (tx-offload-malformed). A rendezvous frame goes with its metadata to a
// peer that announced the capability it needs; otherwise the engine
// completes its checksum in place, or segments a super-frame (up to
// vnet.MaxGSOFrame) in software into eager frames of the MTU. offs may be
// shorter than frames, or nil.
//
// It returns n, the number of frames consumed: frames[:n] belong to the
// engine again. On error, frames[n:] are still lent to the caller, who
// passes them again or gives them back with Return. A frame that is not
// in a lent buffer stops the call with ErrNotLent (n is its index). It
// blocks like Transmit (a full target mailbox) until ctx is done or the
// engine is closed; see Lend for the Close rule. Safe for concurrent use
// with distinct buffers. It does not allocate (but for the first
// software-GSO segment buffer of a pooled scratch).
func (e *Engine) TransmitLentOffload(ctx context.Context, frames [][]byte, offs []Offload) (int, error) {
	if e.closed.Load() {
		return 0, errClosed
	}
	sc := e.scratch.Get().(*txScratch)
	defer e.scratch.Put(sc)
	for i, f := range frames {
		slot := e.lentIndex(f)
		if slot < 0 {
			return i, e.notLent(ctx, sc, i)
		}
		var o *Offload
		limit := e.maxFrame
		if i < len(offs) && offs[i] != (Offload{}) {
			o = &offs[i]
			if o.GSOType != vnet.GSONone {
				limit = vnet.MaxGSOFrame
			}
		}
		peer, proto, reason := e.classify(f, limit)
		if reason == DropNone && o != nil {
			switch {
			case !o.check(f, e.maxFrame, false):
				reason = DropTxOffload
			case o.Flags&vnet.DataValid != 0:
				// The kernel verified it; a peer's kernel verifies it
				// again rather than trust the claim across the fabric.
				o = nil
			}
		}
		var caps uint8
		if proto == ProtoRendezvous {
			caps = e.peerCaps(peer.Node)
		}
		split := reason == DropNone && o != nil && o.GSOType != vnet.GSONone && caps&o.needs() != o.needs()
		need := 0
		switch {
		case reason != DropNone:
		case split:
			need = numFragments(e.maxFrame)
		case proto == ProtoRendezvous:
			need = 1
		default:
			need = numFragments(len(f))
		}
		if err := e.makeRoom(ctx, sc, need); err != nil {
			e.unlend(i)
			return i, err
		}
		s := &e.tx.slots[slot]
		if !s.state.CompareAndSwap(slotLent, 0) {
			// Returned concurrently by the caller: not ours to send.
			return i, e.notLent(ctx, sc, i)
		}
		switch {
		case reason != DropNone:
			node, _ := e.cfg.MACPrefix.Node(f)
			e.drop(reason, node)
			e.tx.free <- slot
			continue
		case e.cfg.Observer != nil:
			e.cfg.Observer.Observe(f)
		}
		if split {
			err := e.appendSegments(ctx, sc, i, f, o, peer, proto)
			e.tx.free <- slot
			if err != nil {
				e.unlend(i + 1)
				return i + 1, err
			}
			continue
		}
		if o != nil && o.Flags&vnet.NeedsCsum != 0 && caps&CapCsum == 0 {
			vnet.CompleteCsum(f, int(o.CsumStart), int(o.CsumOffset))
			e.ctr.txCsumSW.Add(1)
			o = nil
		}
		if proto != ProtoRendezvous {
			e.appendFragments(sc, i, f, peer, proto, need)
			e.tx.free <- slot
			continue
		}
		var ox *Offload
		if caps != 0 {
			ox = &Offload{}
			if o != nil {
				ox = o
				e.ctr.txOffloaded.Add(1)
			}
		}
		e.addAdvert(sc, i, slot, peer, len(f), ox)
	}
	err := e.flush(ctx, sc)
	e.unlend(len(frames))
	return len(frames), err
}

// appendSegments is software GSO for frame i, the checked super-frame f
// with offload o: each segment is built in the scratch's segment buffer
// and added as eager fragments (copied), flushing as the batch fills.
func (e *Engine) appendSegments(ctx context.Context, sc *txScratch, i int, f []byte, o *Offload, peer fabric.Addr, proto Proto) error {
	if sc.seg == nil {
		sc.seg = make([]byte, e.maxFrame)
	}
	n := segments(f, o)
	if proto == ProtoRendezvous {
		proto = ProtoEager // the segments go eager, whatever their size
	}
	e.ctr.txGSOSplit.Add(1)
	e.ctr.txGSOSegs.Add(uint64(n))
	for k := range n {
		m := segment(sc.seg, f, o, k)
		need := numFragments(m)
		if err := e.makeRoom(ctx, sc, need); err != nil {
			return err
		}
		e.appendFragments(sc, i, sc.seg[:m], peer, proto, need)
	}
	return nil
}

// notLent ends a TransmitLent at frame i, which is not in a lent buffer:
// it sends the frames before it and returns ErrNotLent (or the send
// error).
func (e *Engine) notLent(ctx context.Context, sc *txScratch, i int) error {
	err := e.flush(ctx, sc)
	e.unlend(i)
	if err != nil {
		return err
	}
	return fmt.Errorf("exn: transmit lent frame %d: %w", i, ErrNotLent)
}

package mem

// Endpoint pipeline (one per open VPID):
//
//	Send ──► target mailbox (ring of fabric.Message, mailbox.mu) ──► Recv
//	          │ full: sender parks on mailbox.space (a channel made only
//	          │ when someone waits, closed by Recv when it frees slots)
//	Post ──► inline copy under region.mu read locks ──► localq.NotifyQueue
//	                                                  ──► PollNotifications
//	Wait: localq.Waiter: check the two atomic lengths, then set
//	      sleeping and park on wake; producers signal wake only when
//	      sleeping is set, so the common case costs no channel operation.
//
// Locks: mailbox.mu guards the ring, closed flag and space channel; the
// notification queue and the region table (nic.regs, localq.Table) have
// their own locks (see localq); region.mu guards one region's buffer
// against Deregister. No lock is held while blocked.

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/internal/localq"
)

// waitSpin is how long Wait polls before it parks: localq.DefaultSpin,
// none (see its comment).
const waitSpin = localq.DefaultSpin

type mailbox struct {
	mu     sync.Mutex
	ring   []fabric.Message
	head   int // next slot to read
	n      int // messages queued
	closed bool
	space  chan struct{} // non-nil while a sender waits for room
	length atomic.Int32  // mirror of n for lock-free readiness checks
}

type endpoint struct {
	nic  *nic
	addr fabric.Addr

	mb mailbox
	nq localq.NotifyQueue

	w      localq.Waiter
	done   chan struct{} // closed by Close
	closed atomic.Bool
}

func newEndpoint(n *nic, v fabric.VPID) *endpoint {
	e := &endpoint{
		nic:  n,
		addr: fabric.Addr{Node: n.id, VPID: v},
		mb:   mailbox{ring: make([]fabric.Message, n.c.opts.slots)},
		done: make(chan struct{}),
	}
	e.nq.Init(n.c.opts.notifyDepth)
	e.w.Init(waitSpin, e.ready, &e.closed, e.done)
	return e
}

func (e *endpoint) Addr() fabric.Addr { return e.addr }

func (e *endpoint) errClosed(op string) error {
	return fmt.Errorf("mem: %s on %v: %w", op, e.addr, net.ErrClosed)
}

// signal wakes the consumer if it sleeps in Wait. It must be called after
// the producer made its item visible (length updated).
func (e *endpoint) signal() { e.w.Signal() }

func (e *endpoint) ready() bool { return e.mb.length.Load() > 0 || e.nq.Len() > 0 }

// ---- VELO ----

func (e *endpoint) Send(ctx context.Context, msgs []fabric.Message) (int, error) {
	ctr := &e.nic.ctr
	if e.closed.Load() {
		return 0, e.errClosed("send")
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("mem: send: %w", err)
	}
	for i := range msgs {
		m := &msgs[i]
		if err := fabric.CheckSend(m); err != nil {
			return i, ctr.CountErr(err)
		}
		var err error
		if m.MC {
			err = e.sendMulticast(ctx, m)
		} else {
			err = e.sendUnicast(ctx, m)
		}
		if err != nil {
			return i, ctr.CountErr(err)
		}
		ctr.VELOSent.Add(1)
		ctr.VELOSentBytes.Add(uint64(m.Len))
	}
	return len(msgs), nil
}

func (e *endpoint) sendUnicast(ctx context.Context, m *fabric.Message) error {
	tn, err := e.nic.c.lookup(m.Peer.Node)
	if err != nil {
		return fmt.Errorf("velo send to %v: %w", m.Peer, err)
	}
	dst := tn.eps[m.Peer.VPID].Load()
	if dst == nil {
		return fmt.Errorf("mem: velo send to %v: vpid not open: %w", m.Peer, fabric.ErrUnknownNode)
	}
	return e.deliver(ctx, dst, m)
}

// sendMulticast delivers m to m.Peer.VPID on every member of group
// m.Peer.Node except this node. Members without that VPID open, and
// members that go down while we wait for room, are skipped.
func (e *endpoint) sendMulticast(ctx context.Context, m *fabric.Message) error {
	g := fabric.Group(m.Peer.Node)
	for _, tn := range e.nic.c.live.Load().list {
		if tn == e.nic || !tn.member(g) {
			continue
		}
		dst := tn.eps[m.Peer.VPID].Load()
		if dst == nil {
			continue
		}
		if err := e.deliver(ctx, dst, m); err != nil {
			if isPeerDown(err) {
				continue
			}
			return err
		}
	}
	e.nic.ctr.MulticastSent.Add(1)
	return nil
}

var errPeerGone = fmt.Errorf("mem: velo target closed: %w", fabric.ErrPeerDown)

func isPeerDown(err error) bool { return err == errPeerGone }

// deliver puts one message into dst's mailbox, blocking while it is full.
func (e *endpoint) deliver(ctx context.Context, dst *endpoint, m *fabric.Message) error {
	mb := &dst.mb
	counted := false
	for {
		mb.mu.Lock()
		if mb.closed {
			mb.mu.Unlock()
			return errPeerGone
		}
		if mb.n < len(mb.ring) {
			s := &mb.ring[(mb.head+mb.n)%len(mb.ring)]
			s.Peer = e.addr
			s.MC = m.MC
			s.Tag = m.Tag
			s.Len = m.Len
			copy(s.Data[:m.Len], m.Data[:m.Len])
			mb.n++
			mb.length.Store(int32(mb.n))
			mb.mu.Unlock()
			dst.signal()
			return nil
		}
		if mb.space == nil {
			mb.space = make(chan struct{})
		}
		space := mb.space
		mb.mu.Unlock()
		if !counted {
			e.nic.ctr.SendBlocked.Add(1)
			counted = true
		}
		select {
		case <-space:
		case <-dst.done:
			return errPeerGone
		case <-dst.nic.down:
			return errPeerGone
		case <-e.done:
			return e.errClosed("send")
		case <-e.nic.down:
			return e.errClosed("send")
		case <-ctx.Done():
			return fmt.Errorf("mem: send to %v: %w", dst.addr, ctx.Err())
		}
	}
}

func (e *endpoint) Recv(msgs []fabric.Message) (int, error) {
	mb := &e.mb
	mb.mu.Lock()
	if mb.closed {
		mb.mu.Unlock()
		return 0, e.errClosed("recv")
	}
	k := min(len(msgs), mb.n)
	var bytes uint64
	for i := 0; i < k; i++ {
		s := &mb.ring[mb.head]
		d := &msgs[i]
		d.Peer, d.MC, d.Tag, d.Len = s.Peer, s.MC, s.Tag, s.Len
		copy(d.Data[:s.Len], s.Data[:s.Len])
		bytes += uint64(s.Len)
		mb.head++
		if mb.head == len(mb.ring) {
			mb.head = 0
		}
	}
	mb.n -= k
	mb.length.Store(int32(mb.n))
	if k > 0 && mb.space != nil {
		close(mb.space)
		mb.space = nil
	}
	mb.mu.Unlock()
	if k > 0 {
		e.nic.ctr.VELORecv.Add(uint64(k))
		e.nic.ctr.VELORecvBytes.Add(bytes)
	}
	return k, nil
}

// ---- notifications ----

// notify queues one notification for e. It never blocks: a full queue
// drops it and counts NotifyOverflow; a closed endpoint drops it silently.
func (e *endpoint) notify(n fabric.Notification) {
	switch e.nq.Push(&e.nic.ctr, n) {
	case localq.Queued:
		e.signal()
	case localq.Full:
		e.nic.faults.Warn("fabric notification queue full, dropped", "vpid", e.addr.VPID, "depth", e.nq.Cap())
	}
}

func (e *endpoint) PollNotifications(ns []fabric.Notification) (int, error) {
	k, ok := e.nq.Poll(ns)
	if !ok {
		return 0, e.errClosed("poll notifications")
	}
	return k, nil
}

// ---- waiting ----

func (e *endpoint) Wait(ctx context.Context) error {
	switch e.w.Wait(ctx) {
	case localq.Closed:
		return e.errClosed("wait")
	case localq.Cancelled:
		return fmt.Errorf("mem: wait: %w", ctx.Err())
	}
	return nil
}

// ---- registration ----

func (e *endpoint) Register(size int) (fabric.Region, error) {
	ctr := &e.nic.ctr
	if size <= 0 || uint64(size) > fabric.MaxRegionSize {
		return fabric.Region{}, ctr.CountErr(fmt.Errorf("mem: register %d bytes: %w", size, fabric.ErrInvalid))
	}
	n := e.nic
	n.regs.Lock()
	defer n.regs.Unlock()
	if e.closed.Load() {
		return fabric.Region{}, e.errClosed("register")
	}
	idx, ok := n.regs.ReserveLocked()
	if !ok {
		return fabric.Region{}, ctr.CountErr(fmt.Errorf("mem: register: region indices exhausted: %w", fabric.ErrInvalid))
	}
	r := &region{node: n.id, idx: idx, owner: e, buf: make([]byte, size)}
	n.regs.PutLocked(idx, e, r, uint64(size))
	return fabric.Region{NLA: fabric.MakeNLA(r.idx, 0), Buf: r.buf}, nil
}

func (e *endpoint) Deregister(base fabric.NLA) error {
	n := e.nic
	r, ok := n.regs.Remove(e, base)
	if !ok {
		return n.ctr.CountErr(fmt.Errorf("mem: deregister %v: not a region of %v: %w", base, e.addr, fabric.ErrInvalid))
	}
	kill(r)
	return nil
}

// kill waits for copies in flight on r and marks it dead.
func kill(r *region) {
	r.mu.Lock()
	r.dead = true
	r.mu.Unlock()
}

// ---- RMA ----

func (e *endpoint) Post(reqs []fabric.RMA) (int, error) {
	ctr := &e.nic.ctr
	for i := range reqs {
		if e.closed.Load() {
			return i, e.errClosed("post")
		}
		if err := e.post(&reqs[i]); err != nil {
			return i, ctr.CountErr(err)
		}
	}
	return len(reqs), nil
}

// post runs one request to completion: local checks (returned), remote
// checks (error notification), the copy, and the Table 3.1 notifications.
func (e *endpoint) post(r *fabric.RMA) error {
	if err := fabric.CheckRMA(r); err != nil {
		return err
	}
	local, lerr := e.nic.regs.Check(e, r.Local, uint64(r.Len))
	if lerr != fabric.NErrNone {
		return fmt.Errorf("mem: rma %v local %v len %d: not in a region of %v: %w", r.Op, r.Local, r.Len, e.addr, fabric.ErrInvalid)
	}
	ctr := &e.nic.ctr
	ctr.RMAPosted[r.Op].Add(1)

	remote, peer, nerr := e.resolveRemote(r)
	if nerr != fabric.NErrNone {
		e.errorNotify(r, nerr)
		return nil
	}

	// Lock both regions for reading, in (node, index) order so concurrent
	// posts cannot deadlock against a waiting Deregister.
	first, second := local, remote
	if remote.less(local) {
		first, second = remote, local
	}
	first.mu.RLock()
	if second != first {
		second.mu.RLock()
	}
	ok := !local.dead && !remote.dead
	if ok {
		lo, ro := local.buf[r.Local.Offset():][:r.Len], remote.buf[r.Remote.Offset():][:r.Len]
		if r.Op == fabric.OpPut {
			copy(ro, lo)
		} else {
			copy(lo, ro)
		}
	}
	if second != first {
		second.mu.RUnlock()
	}
	first.mu.RUnlock()
	if !ok {
		// A region went away between lookup and lock.
		if local.dead {
			return fmt.Errorf("mem: rma %v local %v: region deregistered: %w", r.Op, r.Local, fabric.ErrInvalid)
		}
		e.errorNotify(r, fabric.NErrAccess)
		return nil
	}
	ctr.RMABytes.Add(uint64(r.Len))

	localLast := fabric.LastFrame(r.Local, r.Len)
	remoteLast := fabric.LastFrame(r.Remote, r.Len)
	if r.Notify&fabric.NotifyRequester != 0 {
		e.notify(fabric.Notification{Kind: fabric.KindRequester, Op: r.Op, Peer: r.Peer, Len: r.Len, Local: localLast})
	}
	switch r.Op {
	case fabric.OpPut:
		if r.Notify&fabric.NotifyCompleter != 0 {
			peer.notify(fabric.Notification{Kind: fabric.KindCompleter, Op: r.Op, Peer: e.addr, Len: r.Len, Local: remoteLast})
		}
	case fabric.OpGet:
		if r.Notify&fabric.NotifyCompleter != 0 {
			e.notify(fabric.Notification{Kind: fabric.KindCompleter, Op: r.Op, Peer: r.Peer, Len: r.Len, Local: localLast})
		}
		if r.Notify&fabric.NotifyResponder != 0 {
			peer.notify(fabric.Notification{Kind: fabric.KindResponder, Op: r.Op, Peer: e.addr, Len: r.Len, Local: remoteLast})
		}
	}
	return nil
}

// resolveRemote finds the peer endpoint and the remote region, checking
// liveness, VPID ownership and bounds.
func (e *endpoint) resolveRemote(r *fabric.RMA) (*region, *endpoint, fabric.NotifyErr) {
	tn := e.nic.c.live.Load().byID[r.Peer.Node]
	if tn == nil || tn.closed.Load() {
		return nil, nil, fabric.NErrPeerDown
	}
	peer := tn.eps[r.Peer.VPID].Load()
	if peer == nil || peer.closed.Load() {
		return nil, nil, fabric.NErrPeerDown
	}
	reg, nerr := tn.regs.Check(peer, r.Remote, uint64(r.Len))
	if nerr != fabric.NErrNone {
		return nil, nil, nerr
	}
	return reg, peer, fabric.NErrNone
}

func (e *endpoint) errorNotify(r *fabric.RMA, nerr fabric.NotifyErr) {
	e.notify(fabric.Notification{Kind: fabric.KindRequester, Op: r.Op, Err: nerr, Peer: r.Peer, Len: r.Len, Local: r.Local})
}

// ---- close ----

// Close releases the VPID: blocked senders to it get ErrPeerDown, its own
// blocked calls net.ErrClosed; regions are deregistered after copies in
// flight finish; then the VPID may be opened again.
func (e *endpoint) Close() error {
	if e.closed.Swap(true) {
		return nil
	}
	close(e.done)
	e.mb.mu.Lock()
	e.mb.closed = true
	e.mb.n = 0
	e.mb.length.Store(0)
	e.mb.mu.Unlock()
	e.nq.Close()

	n := e.nic
	for _, r := range n.regs.RemoveOwner(e) {
		kill(r)
	}

	n.mu.Lock()
	n.eps[e.addr.VPID].CompareAndSwap(e, nil)
	n.mu.Unlock()
	return nil
}

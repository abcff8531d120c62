package localq

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/ratelog"
)

// Core is the part of a fabric.Endpoint that mem, fabnet and ofi share:
// the notification queue with its overflow accounting, the spin-then-
// sleep Wait, the closed flag and done channel, registration's checks and
// the wording of the errors. A backend embeds a Core in its endpoint and
// keeps what is its own: the mailbox and send path, RMA, the body of
// Close. The promoted Addr, PollNotifications and Wait methods implement
// those of fabric.Endpoint (a backend may shadow Wait, as ofi does to
// drive progress while it spins).
//
// Concurrency: every method is safe for concurrent use once Init has
// returned; Init runs before the endpoint is shared. Done is closed once,
// by Shut.
type Core struct {
	addr   fabric.Addr
	prefix string // error and log prefix: the backend's name
	ctr    *fabric.Counters
	faults *ratelog.Faults
	mbLen  *atomic.Int32 // the backend's mailbox length, read lock-free

	NQ     NotifyQueue
	W      Waiter
	Done   chan struct{} // closed by Shut
	Closed atomic.Bool
}

// Init sets up c for the endpoint at addr: prefix starts its errors and
// log lines ("mem", "fabnet", "ofi"), ctr and faults are the NIC's,
// mbLen is the mailbox length the readiness check reads, depth sizes the
// notification queue and spin is Wait's spin budget.
func (c *Core) Init(addr fabric.Addr, prefix string, ctr *fabric.Counters, faults *ratelog.Faults, mbLen *atomic.Int32, depth int, spin time.Duration) {
	c.addr, c.prefix, c.ctr, c.faults, c.mbLen = addr, prefix, ctr, faults, mbLen
	c.Done = make(chan struct{})
	c.NQ.Init(depth)
	c.W.Init(spin, c.Ready, &c.Closed, c.Done)
}

// Addr returns the endpoint's address (fabric.Endpoint).
func (c *Core) Addr() fabric.Addr { return c.addr }

// ErrClosed is the error of op on a closed endpoint: it wraps
// net.ErrClosed.
func (c *Core) ErrClosed(op string) error {
	return fmt.Errorf("%s: %s on %v: %w", c.prefix, op, c.addr, net.ErrClosed)
}

// Ready reports, lock-free, whether Recv or PollNotifications may find
// something.
func (c *Core) Ready() bool { return c.mbLen.Load() > 0 || c.NQ.Len() > 0 }

// Signal wakes the consumer if it sleeps in Wait. Call it after the item
// was made visible to Ready.
func (c *Core) Signal() { c.W.Signal() }

// Shut marks the endpoint closed and closes Done; false if it already
// was (Close is idempotent: the caller then returns at once).
func (c *Core) Shut() bool {
	if c.Closed.Swap(true) {
		return false
	}
	close(c.Done)
	return true
}

// Notify queues one notification. It never blocks: a full queue drops it,
// counts NotifyOverflow and logs (rate-limited); a closed endpoint drops
// it silently.
func (c *Core) Notify(nt fabric.Notification) {
	switch c.NQ.Push(c.ctr, nt) {
	case Queued:
		c.Signal()
	case Full:
		c.faults.Warn(c.prefix+" notification queue full, dropped", "vpid", c.addr.VPID, "depth", c.NQ.Cap())
	}
}

// ErrorNotify writes the requester-side error notification of r.
func (c *Core) ErrorNotify(r *fabric.RMA, nerr fabric.NotifyErr) {
	c.Notify(fabric.Notification{Kind: fabric.KindRequester, Op: r.Op, Err: nerr, Peer: r.Peer, Len: r.Len, Local: r.Local})
}

// PollNotifications copies up to len(ns) notifications, oldest first
// (fabric.Endpoint). It never blocks.
func (c *Core) PollNotifications(ns []fabric.Notification) (int, error) {
	k, ok := c.NQ.Poll(ns)
	if !ok {
		return 0, c.ErrClosed("poll notifications")
	}
	return k, nil
}

// Wait blocks until Recv or PollNotifications may have something, ctx is
// done or the endpoint closes (fabric.Endpoint).
func (c *Core) Wait(ctx context.Context) error {
	return c.WaitResult(ctx, c.W.Wait(ctx))
}

// WaitResult turns a Waiter result into Wait's error.
func (c *Core) WaitResult(ctx context.Context, r WaitResult) error {
	switch r {
	case Closed:
		return c.ErrClosed("wait")
	case Cancelled:
		return fmt.Errorf("%s: wait: %w", c.prefix, ctx.Err())
	}
	return nil
}

// CountRecv counts k messages of bytes in all taken out by Recv.
func (c *Core) CountRecv(k int, bytes uint64) {
	if k > 0 {
		c.ctr.VELORecv.Add(uint64(k))
		c.ctr.VELORecvBytes.Add(bytes)
	}
}

// CheckRegister checks a Register size: invalid sizes are counted and
// wrapped fabric.ErrInvalid.
func (c *Core) CheckRegister(size int) error {
	if size <= 0 || uint64(size) > fabric.MaxRegionSize {
		return c.ctr.CountErr(fmt.Errorf("%s: register %d bytes: %w", c.prefix, size, fabric.ErrInvalid))
	}
	return nil
}

// ErrExhausted is Register's counted error when the NLA's region indices
// ran out.
func (c *Core) ErrExhausted() error {
	return c.ctr.CountErr(fmt.Errorf("%s: register: region indices exhausted: %w", c.prefix, fabric.ErrInvalid))
}

// ErrNotRegion is Deregister's counted error for a base that is not one
// of this endpoint's regions.
func (c *Core) ErrNotRegion(base fabric.NLA) error {
	return c.ctr.CountErr(fmt.Errorf("%s: deregister %v: not a region of %v: %w", c.prefix, base, c.addr, fabric.ErrInvalid))
}

// ErrNotLocal is Post's error for a local range outside the endpoint's
// regions (the caller counts it with the rest of Post's errors).
func (c *Core) ErrNotLocal(r *fabric.RMA) error {
	return fmt.Errorf("%s: rma %v local %v len %d: not in a region of %v: %w", c.prefix, r.Op, r.Local, r.Len, c.addr, fabric.ErrInvalid)
}

// Register is fabric.Endpoint.Register for backends whose regions are
// plain Go memory: it checks size, allocates the buffer, and publishes
// mk(idx, buf) in t under owner, atomically with the endpoint not being
// closed.
func Register[O comparable, R any](c *Core, t *Table[O, R], owner O, size int, mk func(idx uint32, buf []byte) R) (fabric.Region, error) {
	if err := c.CheckRegister(size); err != nil {
		return fabric.Region{}, err
	}
	return publish(c, t, owner, make([]byte, size), mk)
}

// RegisterBuffer is fabric.BufferRegistrar.RegisterBuffer for the same
// backends: it checks len(buf) as Register checks a size and publishes
// mk(idx, buf) with buf itself, which stays the caller's (the backend's
// retire must not free or unmap it).
func RegisterBuffer[O comparable, R any](c *Core, t *Table[O, R], owner O, buf []byte, mk func(idx uint32, buf []byte) R) (fabric.Region, error) {
	if err := c.CheckRegister(len(buf)); err != nil {
		return fabric.Region{}, err
	}
	return publish(c, t, owner, buf[:len(buf):len(buf)], mk)
}

// publish reserves an index and publishes mk(idx, buf) in t under owner,
// atomically with the endpoint not being closed.
func publish[O comparable, R any](c *Core, t *Table[O, R], owner O, buf []byte, mk func(idx uint32, buf []byte) R) (fabric.Region, error) {
	t.Lock()
	defer t.Unlock()
	if c.Closed.Load() {
		return fabric.Region{}, c.ErrClosed("register")
	}
	idx, ok := t.ReserveLocked()
	if !ok {
		return fabric.Region{}, c.ErrExhausted()
	}
	t.PutLocked(idx, owner, mk(idx, buf), uint64(len(buf)))
	return fabric.Region{NLA: fabric.MakeNLA(idx, 0), Buf: buf}, nil
}

// Deregister unpublishes owner's region at base and hands it to retire
// (which returns once nothing uses it any more); a base that is not
// owner's is a counted error.
func Deregister[O comparable, R any](c *Core, t *Table[O, R], owner O, base fabric.NLA, retire func(R)) error {
	r, ok := t.Remove(owner, base)
	if !ok {
		return c.ErrNotRegion(base)
	}
	retire(r)
	return nil
}

// Regions is registration for a backend whose regions are plain Go
// memory in a NIC's Table (mem, fabnet): embedded in the endpoint, its
// promoted Register, RegisterBuffer and Deregister implement those of
// fabric.Endpoint and fabric.BufferRegistrar through the functions above,
// with the endpoint as owner, mk making a region and retire ending one.
// Init runs before the endpoint is shared; the methods are then safe for
// concurrent use.
type Regions[O comparable, R any] struct {
	c      *Core
	t      *Table[O, R]
	owner  O
	mk     func(idx uint32, buf []byte) R
	retire func(R)
}

// Init binds g to the endpoint's core c, the NIC's table t and owner.
func (g *Regions[O, R]) Init(c *Core, t *Table[O, R], owner O, mk func(idx uint32, buf []byte) R, retire func(R)) {
	g.c, g.t, g.owner, g.mk, g.retire = c, t, owner, mk, retire
}

// Register implements fabric.Endpoint.Register (see Register).
func (g *Regions[O, R]) Register(size int) (fabric.Region, error) {
	return Register(g.c, g.t, g.owner, size, g.mk)
}

// RegisterBuffer implements fabric.BufferRegistrar: the region is buf
// itself, which stays the caller's (see RegisterBuffer).
func (g *Regions[O, R]) RegisterBuffer(buf []byte) (fabric.Region, error) {
	return RegisterBuffer(g.c, g.t, g.owner, buf, g.mk)
}

// Deregister implements fabric.Endpoint.Deregister (see Deregister): it
// returns once retire has.
func (g *Regions[O, R]) Deregister(base fabric.NLA) error {
	return Deregister(g.c, g.t, g.owner, base, g.retire)
}

// SendStart is Send's entry check: the endpoint is open and ctx not done.
func (c *Core) SendStart(ctx context.Context) error {
	if c.Closed.Load() {
		return c.ErrClosed("send")
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: send: %w", c.prefix, err)
	}
	return nil
}

// CountSent counts one VELO message sent.
func (c *Core) CountSent(m *fabric.Message) {
	c.ctr.VELOSent.Add(1)
	c.ctr.VELOSentBytes.Add(uint64(m.Len))
}

// Send is fabric.Endpoint.Send for a backend that sends one message at a
// time: it checks each message (fabric.CheckSend), hands it to unicast or
// (m.MC) multicast and counts it; errors are counted. Neither may keep m.
func (c *Core) Send(ctx context.Context, msgs []fabric.Message, unicast, multicast func(context.Context, *fabric.Message) error) (int, error) {
	if err := c.SendStart(ctx); err != nil {
		return 0, err
	}
	for i := range msgs {
		m := &msgs[i]
		if err := fabric.CheckSend(m); err != nil {
			return i, c.ctr.CountErr(err)
		}
		one := unicast
		if m.MC {
			one = multicast
		}
		if err := one(ctx, m); err != nil {
			return i, c.ctr.CountErr(err)
		}
		c.CountSent(m)
	}
	return len(msgs), nil
}

// Post is fabric.Endpoint.Post: it hands the requests to one in order,
// stops at the first error (counted) and at Close.
func (c *Core) Post(reqs []fabric.RMA, one func(*fabric.RMA) error) (int, error) {
	for i := range reqs {
		if c.Closed.Load() {
			return i, c.ErrClosed("post")
		}
		if err := one(&reqs[i]); err != nil {
			return i, c.ctr.CountErr(err)
		}
	}
	return len(reqs), nil
}

// NotifyDone writes the Table 3.1 notifications of a finished request
// (fabric.Notify): the local ones here, the remote ones through remote
// (the peer endpoint's Notify, or a message to it).
func (c *Core) NotifyDone(r *fabric.RMA, remote func(fabric.Notification)) {
	localLast := fabric.LastFrame(r.Local, r.Len)
	remoteLast := fabric.LastFrame(r.Remote, r.Len)
	if r.Notify&fabric.NotifyRequester != 0 {
		c.Notify(fabric.Notification{Kind: fabric.KindRequester, Op: r.Op, Peer: r.Peer, Len: r.Len, Local: localLast})
	}
	switch r.Op {
	case fabric.OpPut:
		if r.Notify&fabric.NotifyCompleter != 0 {
			remote(fabric.Notification{Kind: fabric.KindCompleter, Op: r.Op, Peer: c.addr, Len: r.Len, Local: remoteLast})
		}
	case fabric.OpGet:
		if r.Notify&fabric.NotifyCompleter != 0 {
			c.Notify(fabric.Notification{Kind: fabric.KindCompleter, Op: r.Op, Peer: r.Peer, Len: r.Len, Local: localLast})
		}
		if r.Notify&fabric.NotifyResponder != 0 {
			remote(fabric.Notification{Kind: fabric.KindResponder, Op: r.Op, Peer: c.addr, Len: r.Len, Local: remoteLast})
		}
	}
}

// Deliver copies m from c's endpoint into the mailbox mb of the endpoint
// dst on the same node, blocking while it has no room: room (called with
// mb.Mu held; nil: any free slot) says whether a local sender may take a
// slot. A blocked send is counted once in SendBlocked. It returns gone if
// dst closes or its node goes down (dstDown; nil if it cannot), c's
// ErrClosed if c's endpoint closes or its node goes down (selfDown), and
// ctx's error.
func (c *Core) Deliver(ctx context.Context, dst *Core, mb *Mailbox, m *fabric.Message, room func() bool, gone error, dstDown, selfDown <-chan struct{}) error {
	counted := false
	for {
		mb.Mu.Lock()
		if mb.ClosedLocked() {
			mb.Mu.Unlock()
			return gone
		}
		if room == nil && mb.NLocked() < mb.Cap() || room != nil && room() {
			mb.PutLocked(c.addr, m)
			mb.Mu.Unlock()
			dst.Signal()
			return nil
		}
		space := mb.SpaceLocked()
		mb.Mu.Unlock()
		if !counted {
			c.ctr.SendBlocked.Add(1)
			counted = true
		}
		if err := c.ParkSender(ctx, dst.addr, space, dst.Done, dstDown, selfDown, gone); err != nil {
			return err
		}
	}
}

// ParkSender blocks a sender to peer that found no room (Deliver) or no
// credit (fabnet's and ofi's send paths) until wake closes: then it
// returns nil and the sender looks again. It returns gone if the peer's
// side ends first (peerGone or peerDown closes), c's ErrClosed if c's
// endpoint closes or its node goes down (selfDown), and ctx's error. A
// nil channel never closes.
func (c *Core) ParkSender(ctx context.Context, peer fabric.Addr, wake, peerGone, peerDown, selfDown <-chan struct{}, gone error) error {
	select {
	case <-wake:
		return nil
	case <-peerGone:
		return gone
	case <-peerDown:
		return gone
	case <-c.Done:
		return c.ErrClosed("send")
	case <-selfDown:
		return c.ErrClosed("send")
	case <-ctx.Done():
		return fmt.Errorf("%s: send to %v: %w", c.prefix, peer, ctx.Err())
	}
}

// Recv is fabric.Endpoint.Recv over mb: it copies up to len(msgs)
// messages out and counts them; freed runs with mb.Mu held when slots
// were freed (wake senders, grant credits). It never blocks.
func (c *Core) Recv(mb *Mailbox, msgs []fabric.Message, freed func()) (int, error) {
	mb.Mu.Lock()
	if mb.ClosedLocked() {
		mb.Mu.Unlock()
		return 0, c.ErrClosed("recv")
	}
	k, bytes := mb.TakeLocked(msgs)
	if k > 0 {
		freed()
	}
	mb.Mu.Unlock()
	c.CountRecv(k, bytes)
	return k, nil
}

// PostLocal is the start of every request Post takes: the request is
// well formed (fabric.CheckRMA) and its local range lies in one of
// owner's regions in t (else ErrNotLocal); then it counts as posted.
func PostLocal[O comparable, R any](c *Core, t *Table[O, R], owner O, r *fabric.RMA) (R, error) {
	var zero R
	if err := fabric.CheckRMA(r); err != nil {
		return zero, err
	}
	local, nerr := t.Check(owner, r.Local, uint64(r.Len))
	if nerr != fabric.NErrNone {
		return zero, c.ErrNotLocal(r)
	}
	c.ctr.RMAPosted[r.Op].Add(1)
	return local, nil
}

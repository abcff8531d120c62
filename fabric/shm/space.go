package shm

// Space bells: a sender blocked on a full mailbox parks in the netpoller
// (docs/wakeup.md, docs/shm-abi.md "Space bell", layout version 4).
//
//	Owner:    a VPID in waitBell mode also has the FIFO <vpid file>.space,
//	          made with the doorbell; the owner holds a raw descriptor on
//	          it (spaceFD). After a Recv batch that freed slots, if
//	          spaceW > 0, it bumps the space futex (futex sleepers: C
//	          senders, VPIDs without the FIFO) and, if it is the first to
//	          swap spaceRung from 0 to 1, writes one byte to the FIFO.
//	Sender:   after its spin (push), it opens its own descriptor on the
//	          target's FIFO (read-write, registered with the netpoller),
//	          counts itself in spaceW, and parks in RawConn.Read. The
//	          callback drains the FIFO, stores spaceRung = 0 and then tries
//	          the push: a sender that fails after the owner freed a slot
//	          finds the byte the owner wrote after it (the Dekker pair of
//	          the doorbell, ring.go, with the roles reversed). Every parked
//	          sender has its own descriptor, so each sees every byte's
//	          edge; whoever drains it, each re-tries.
//	Wake-ups: the owner's Close writes a byte (the state is closed); ctx,
//	          the sender's own Close and its target node's death set a
//	          past read deadline on the sender's descriptor (parked, the
//	          registry of senders a NIC has parked). No timer: a sender
//	          that nobody wakes has nothing to do.
//
// Locks: parkMu guards parked; a leaf lock, never held while waiting.

import (
	"context"
	"errors"
	"math"
	"os"
	"time"

	"github.com/exn-project/exn/internal/sys"
)

// parkedSend is one sender parked on a target's space bell.
type parkedSend struct {
	e *endpoint
	p *peer
	f *os.File
}

// wakeNow ends a parked sender's RawConn.Read (a past deadline).
func (ps *parkedSend) wakeNow() { ps.f.SetReadDeadline(time.Unix(1, 0)) } //nolint:errcheck // pollable: checked at open

// park registers ps; unpark removes it.
func (n *nicT) park(ps *parkedSend) {
	n.parkMu.Lock()
	n.parked[ps] = struct{}{}
	n.parkMu.Unlock()
}

func (n *nicT) unpark(ps *parkedSend) {
	n.parkMu.Lock()
	delete(n.parked, ps)
	n.parkMu.Unlock()
}

// wakeParked wakes every parked sender of endpoint e (nil: any) whose
// target is peer p (nil: any).
func (n *nicT) wakeParked(e *endpoint, p *peer) {
	n.parkMu.Lock()
	defer n.parkMu.Unlock()
	for ps := range n.parked {
		if (e == nil || ps.e == e) && (p == nil || ps.p == p) {
			ps.wakeNow()
		}
	}
}

// parkSend waits on vf's space bell until payload is pushed (nil), or
// until ctx ends, e closes, the target node dies or the target VPID
// closes (their errors). ok is false, with nothing done, when the bell
// cannot be opened: the caller then sleeps on the space futex.
func (e *endpoint) parkSend(ctx context.Context, p *peer, vf *vfile, desc uint64, payload []byte) (err error, ok bool) {
	n := e.nic
	f, _, oerr := sys.OpenBell(vf.spacePath)
	if oerr != nil {
		n.wc.spaceFallback.Add(1)
		n.faults.Warn("shm: no space bell, the sender sleeps on a futex", "path", vf.spacePath, "err", oerr)
		return nil, false
	}
	defer f.Close()
	rc, rerr := f.SyscallConn()
	if rerr != nil {
		n.wc.spaceFallback.Add(1)
		return nil, false
	}
	ps := &parkedSend{e: e, p: p, f: f}
	n.park(ps)
	defer n.unpark(ps)
	stop := context.AfterFunc(ctx, ps.wakeNow)
	defer stop()
	vf.spaceW.Add(1)
	defer vf.spaceW.Add(^uint32(0))
	var buf [64]byte
	pushed := false
	try := func(fd uintptr) bool {
		sys.DrainBell(int(fd), buf[:]) //nolint:errcheck // an empty or failing drain: the push decides
		vf.spaceRung.Store(0)
		pushed = vf.push(desc, n.node, payload)
		return pushed || e.blockedErr(ctx, p, vf) != nil
	}
	for {
		if err := e.blockedErr(ctx, p, vf); err != nil {
			return err, true
		}
		vf.ringDoorbell() // the consumer may be asleep with a full ring
		n.wc.spaceParks.Add(1)
		rerr := rc.Read(try)
		if pushed {
			return nil, true
		}
		if rerr != nil && !errors.Is(rerr, os.ErrDeadlineExceeded) {
			return rerr, true
		}
		if rerr != nil {
			// Woken by a deadline: the checks above say why. A waker
			// whose reason is gone by now (none is: each is final)
			// would leave the deadline set; clear it for the next park.
			f.SetReadDeadline(time.Time{}) //nolint:errcheck // pollable
		}
	}
}

// wakeSenders wakes producers blocked on a full mailbox: futex sleepers
// through the space word, parked ones through the space bell (the first
// ring since a sender cleared spaceRung). The owner calls it after
// freeing slots.
func (v *vfile) wakeSenders() {
	if v.spaceW.Load() == 0 {
		return
	}
	v.space.Add(1)
	sys.FutexWake(v.space, math.MaxInt32) //nolint:errcheck
	if v.spaceFD < 0 || v.spaceRung.Load() != 0 || v.spaceRung.Swap(1) != 0 {
		return
	}
	if sys.RingBell(v.spaceFD) == nil {
		v.wc.spaceRings.Add(1)
		return
	}
	v.wc.ringFailed.Add(1)
	v.spaceRung.Store(0)
}

// makeSpaceBell makes the space FIFO at tmp for a new VPID and opens the
// owner's descriptor on it; -1 when it cannot (senders then sleep on
// the space futex).
func makeSpaceBell(tmp string) int {
	if err := sys.Mkfifo(tmp, 0o600); err != nil {
		return -1
	}
	fd, err := sys.OpenBellWriter(tmp)
	if err != nil {
		os.Remove(tmp)
		return -1
	}
	return fd
}

// ringSpacePath writes one byte to the space FIFO at path, if there is
// one: a VPID that closes wakes the senders parked on it.
func ringSpacePath(path string) {
	fd, err := sys.OpenBellWriter(path)
	if err != nil {
		return
	}
	sys.RingBell(fd) //nolint:errcheck // nobody parked, or they see the state
	sys.CloseFD(fd)  //nolint:errcheck
}

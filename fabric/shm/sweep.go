package shm

// The owner's sweep of the lease table: every monitor period (nic.go) the
// owner reclaims each lease whose holder let go — detached, died (its
// attach file's lock can be taken) or was revoked before it attached: its
// VPID files are marked closed (blocked senders get ErrUnknownNode at
// once) and unlinked, its region entries invalidated and their files
// unlinked, and its slot freed. A grant that is never attached stays
// until the owner revokes it.
//
// Locks: sweepLeases holds n.mu for the whole sweep; the per-slot steps
// ("n.mu is held") take no other lock of the nicT. Taking a holder's
// attach-file lock is non-blocking (flock LOCK_NB).

import (
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/sys"
)

// sweepLeases is the owner's monitor hook: it reclaims every lease whose
// holder let go.
func (n *nicT) sweepLeases() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed.Load() {
		return
	}
	for s := 0; s < maxLeases; s++ {
		if leaseAt(n.nodeMap.b, s).state.Load() != leaseFree {
			n.sweepSlot(s)
		}
	}
}

// sweepSlot reclaims lease s if its holder is gone: detached, dead, or
// (revoked) never attached. n.mu is held.
func (n *nicT) sweepSlot(s int) {
	l := leaseAt(n.nodeMap.b, s)
	st := l.state.Load()
	var lock *os.File // the dead holder's attach file, locked by us
	switch l.hold.Load() {
	case holdNone:
		if st != leaseRevoked {
			return // granted, not attached yet: the owner's policy decides
		}
	case holdAttached:
		f, err := os.OpenFile(n.attachPath(s), os.O_RDWR, 0)
		if err == nil {
			ok, lerr := sys.TryLock(f, true)
			if lerr != nil || !ok {
				f.Close()
				return // the holder is alive
			}
			lock = f
		} else if !errors.Is(err, fs.ErrNotExist) {
			n.faults.Warn("shm: lease sweep: open attach file", "slot", s, "err", err)
			return
		}
		n.lctr.holderDied.Add(1)
		n.log.Info("shm: lease holder died, reclaiming", "slot", s, "holder", l.holder.Load())
	case holdDetached:
	default:
		n.ctr.Corrupt.Add(1)
	}
	n.reclaimLease(s, l)
	if lock != nil {
		os.Remove(n.attachPath(s))
		lock.Close()
	}
	l.hold.Store(holdNone)
	l.holder.Store(0)
	l.secret[0].Store(0)
	l.secret[1].Store(0)
	l.state.Store(leaseFree)
	n.lctr.reclaimed.Add(1)
}

// reclaimLease closes and unlinks whatever a gone holder of lease s left:
// its VPID files (marked closed first, so senders blocked on them stop),
// its region entries and region files.
func (n *nicT) reclaimLease(s int, l leaseView) {
	base, count := int(l.base.Load()), int(l.count.Load())
	if base+count > 256 {
		count = max(0, 256-base)
	}
	for v := base; v < base+count; v++ {
		n.closeStaleVPID(n.vpidPath(n.node, n.inc, fabric.VPID(v)))
	}
	lo := leaseRegionLo(s)
	for idx := lo; idx < lo+leaseRegions; idx++ {
		w0, _ := n.entryWords(n.nodeMap.b, idx)
		if x := w0.Load(); x&regionValid != 0 {
			w0.Store(encodeRegionEntry(regionEntry{Gen: uint32(x >> 32)}))
		}
	}
	ents, err := os.ReadDir(n.dir)
	if err != nil {
		n.faults.Warn("shm: lease reclaim: read dir", "err", err)
		return
	}
	prefix := n.incPrefix(n.node, n.inc)
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok {
			continue
		}
		switch {
		case strings.HasPrefix(rest, "r"):
			i, _, _ := strings.Cut(rest[1:], ".")
			if x, err := strconv.ParseUint(i, 10, 32); err == nil && uint32(x) >= lo && uint32(x) < lo+leaseRegions {
				os.Remove(filepath.Join(n.dir, e.Name()))
			}
		case strings.HasPrefix(rest, "v"):
			// Left by a holder that died in Open or Close: a VPID file's
			// temporary name, its doorbell or space FIFO or their
			// temporary names (the VPID files themselves:
			// closeStaleVPID above).
			num, suffix, _ := strings.Cut(rest[1:], ".")
			switch suffix {
			case "tmp", "bell", "tmp.bell", "space", "tmp.space":
			default:
				continue
			}
			if x, err := strconv.Atoi(num); err == nil && x >= base && x < base+count {
				os.Remove(filepath.Join(n.dir, e.Name()))
			}
		}
	}
}

// closeStaleVPID marks the VPID file at path closed, wakes anyone blocked
// on it and unlinks it, if nobody holds its lock.
func (n *nicT) closeStaleVPID(path string) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return
	}
	defer f.Close()
	if ok, err := sys.TryLock(f, true); err != nil || !ok {
		n.faults.Warn("shm: lease reclaim: vpid file still locked", "path", path)
		return
	}
	if sz, _ := sys.FileSize(f); sz >= vOffMailbox {
		if b, err := sys.MapShared(f, vOffMailbox); err == nil {
			u32(b, vOffState).Store(vpidClosed)
			u32(b, vOffSpace).Add(1)
			sys.FutexWake(u32(b, vOffSpace), math.MaxInt32) //nolint:errcheck
			u32(b, vOffDoorbell).Add(1)
			sys.FutexWake(u32(b, vOffDoorbell), math.MaxInt32) //nolint:errcheck
			sys.Unmap(b)
		}
	}
	os.Remove(path)
	// The holder is gone, so nobody sleeps on its doorbell; senders
	// parked on its space bell see the state once rung. Unlink both.
	os.Remove(path + ".bell")
	ringSpacePath(path + ".space")
	os.Remove(path + ".space")
}

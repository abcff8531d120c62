package shm

// The lease table: how the owner of a node lends a block of VPIDs to
// another process (Lender: Grant, Revoke, Leases). A lease is an entry in
// the node file's header page (layout.go) plus a block of region-table
// indices above the owner's own; attach.go is the borrower's side,
// sweep.go how the owner takes a lease back.
//
// What the token is for. Every process of the same uid can read and
// write the files in /dev/shm, the lease table included, so the token is
// not a security boundary. It makes the lending correct: a process can
// only open VPIDs through Attach that it was granted, a grant is used by
// the process it was made for (the PID check) and by one attachment at a
// time, and a token that was revoked (its lease reclaimed and perhaps
// granted to someone else) opens nothing. A bug in an application cannot
// take over exnd's own VPIDs or another application's block; a hostile
// process of the same uid can do anything anyway.
//
//
// Locks: Grant, Revoke and Leases take n.mu (the nicT's), as the sweep
// does, so the owner changes its table from one place at a time; the
// entry's words are atomics because the attached process reads and
// writes them (hold, holder) without any lock of ours.

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/exn-project/exn/fabric"
)

// Lease states (lOffState) and holder states (lOffHold).
const (
	leaseFree    = 0
	leaseGranted = 1
	leaseRevoked = 2

	holdNone     = 0
	holdAttached = 1
	holdDetached = 2
)

// Grant is a block of VPIDs a node's owner lends to another process. It
// is what exnd's "extds-attach" operation returns; Token carries the lease
// slot, the owner's incarnation and the secret.
type Grant struct {
	Fabric   string        `json:"fabric"` // fabric name (without "shm:")
	Node     fabric.NodeID `json:"node"`
	VPIDBase fabric.VPID   `json:"vpid_base"`
	VPIDs    int           `json:"vpids"`
	Token    string        `json:"token"`
}

// Lease describes one lease-table entry, for the owner.
type Lease struct {
	Grant
	PID      int  // the grantee PID the owner recorded (0: any)
	Holder   int  // the PID that attached (0: none yet)
	Attached bool // a holder is attached now
	Revoked  bool // revoked, waiting for the holder to let go
}

// LeaseStats counts the owner's lending.
type LeaseStats struct {
	Granted    uint64 `json:"granted"`     // leases granted
	Revoked    uint64 `json:"revoked"`     // leases revoked by the owner
	Reclaimed  uint64 `json:"reclaimed"`   // leases whose holder let go, cleaned up and freed
	HolderDied uint64 `json:"holder_died"` // of those, holders that died attached
	Refused    uint64 `json:"refused"`     // Grant and Revoke calls refused
}

type leaseCounters struct {
	granted, revoked, reclaimed, holderDied, refused atomic.Uint64
}

// Lender is implemented by a NIC from Open (the node's owner).
type Lender interface {
	// Grant leases VPIDs base..base+count-1 to process pid (0: any).
	// They must not overlap a VPID the owner has open or another lease.
	Grant(base fabric.VPID, count, pid int) (Grant, error)
	// Revoke ends a lease: the token stops working at once, the holder
	// loses its attachment within a monitor period, and the VPIDs and
	// region block are reclaimed once it has let go. Revoking an unknown
	// or already-revoked token is an error wrapping fabric.ErrInvalid.
	Revoke(g Grant) error
	// Leases lists the lease table.
	Leases() []Lease
	// LeaseStats returns the lending counters.
	LeaseStats() LeaseStats
}

// LeaseStats implements Lender.
func (n *nicT) LeaseStats() LeaseStats {
	c := &n.lctr
	return LeaseStats{Granted: c.granted.Load(), Revoked: c.revoked.Load(), Reclaimed: c.reclaimed.Load(),
		HolderDied: c.holderDied.Load(), Refused: c.refused.Load()}
}

// refuse counts a refused Grant or Revoke.
func (n *nicT) refuse(err error) error {
	n.lctr.refused.Add(1)
	return n.ctr.CountErr(err)
}

// token is a parsed Grant.Token: "s<slot>.<inc, 16 hex>.<secret, 32 hex>".
type token struct {
	slot   int
	inc    uint64
	secret [2]uint64
}

func (t token) String() string {
	return fmt.Sprintf("s%d.%016x.%016x%016x", t.slot, t.inc, t.secret[0], t.secret[1])
}

func parseToken(s string) (token, error) {
	var t token
	bad := func(why string) (token, error) {
		return token{}, fmt.Errorf("shm: token %q: %s: %w", s, why, fabric.ErrInvalid)
	}
	parts := strings.Split(s, ".")
	if len(parts) != 3 || !strings.HasPrefix(parts[0], "s") || len(parts[1]) != 16 || len(parts[2]) != 32 {
		return bad("want s<slot>.<16 hex>.<32 hex>")
	}
	slot, err := strconv.Atoi(parts[0][1:])
	if err != nil || slot < 0 || slot >= maxLeases || strconv.Itoa(slot) != parts[0][1:] {
		return bad("bad lease slot")
	}
	inc, err := hex.DecodeString(parts[1])
	if err != nil {
		return bad("bad incarnation")
	}
	sec, err := hex.DecodeString(parts[2])
	if err != nil {
		return bad("bad secret")
	}
	t.slot = slot
	t.inc = binary.BigEndian.Uint64(inc)
	t.secret[0] = binary.BigEndian.Uint64(sec[:8])
	t.secret[1] = binary.BigEndian.Uint64(sec[8:])
	if t.inc == 0 || t.secret == [2]uint64{} {
		return bad("zero incarnation or secret")
	}
	return t, nil
}

// leaseRegionLo is the first region index of lease slot s.
func leaseRegionLo(s int) uint32 { return maxNodeRegions + 1 + uint32(s)*leaseRegions }

// leaseView addresses lease slot s in a node file mapping b.
type leaseView struct {
	state, hold, base, count, pid, holder *atomic.Uint32
	secret                                [2]*atomic.Uint64
}

func leaseAt(b []byte, s int) leaseView {
	off := nOffLeases + s*leaseEntrySize
	return leaseView{
		state: u32(b, off+lOffState), hold: u32(b, off+lOffHold),
		base: u32(b, off+lOffBase), count: u32(b, off+lOffCount),
		pid: u32(b, off+lOffPID), holder: u32(b, off+lOffHolder),
		secret: [2]*atomic.Uint64{u64(b, off+lOffSecret), u64(b, off+lOffSecret+8)},
	}
}

// matches reports whether the lease carries t's secret (constant time).
func (l leaseView) matches(t token) bool {
	var a, b [16]byte
	binary.BigEndian.PutUint64(a[:8], l.secret[0].Load())
	binary.BigEndian.PutUint64(a[8:], l.secret[1].Load())
	binary.BigEndian.PutUint64(b[:8], t.secret[0])
	binary.BigEndian.PutUint64(b[8:], t.secret[1])
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

func (n *nicT) attachPath(s int) string {
	return filepath.Join(n.dir, n.incPrefix(n.node, n.inc)+"a"+strconv.Itoa(s))
}

// Grant implements Lender.
func (n *nicT) Grant(base fabric.VPID, count, pid int) (Grant, error) {
	if n.att != nil {
		return Grant{}, n.refuse(fmt.Errorf("shm: grant: an attached process cannot lend VPIDs: %w", fabric.ErrInvalid))
	}
	if count < 1 || int(base)+count > 256 || base == fabric.EthVPID || pid < 0 || pid > math.MaxInt32 {
		return Grant{}, n.refuse(fmt.Errorf("shm: grant %d VPIDs from %d to pid %d: want 1..%d VPIDs, none of them 0: %w",
			count, base, pid, 256-int(base), fabric.ErrInvalid))
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed.Load() {
		return Grant{}, net.ErrClosed
	}
	for v := int(base); v < int(base)+count; v++ {
		if n.eps[v] != nil {
			return Grant{}, n.refuse(fmt.Errorf("shm: grant: vpid %d is open here: %w", v, fabric.ErrInUse))
		}
	}
	b := n.nodeMap.b
	slot := -1
	for s := 0; s < maxLeases; s++ {
		l := leaseAt(b, s)
		st := l.state.Load()
		if st == leaseFree {
			if slot < 0 {
				slot = s
			}
			continue
		}
		lb, lc := int(l.base.Load()), int(l.count.Load())
		if int(base) < lb+lc && lb < int(base)+count {
			return Grant{}, n.refuse(fmt.Errorf("shm: grant: vpids %d..%d overlap lease %d (%d..%d): %w",
				base, int(base)+count-1, s, lb, lb+lc-1, fabric.ErrInUse))
		}
	}
	if slot < 0 {
		return Grant{}, n.refuse(fmt.Errorf("shm: grant: all %d leases in use: %w", maxLeases, fabric.ErrInUse))
	}
	t := token{slot: slot, inc: n.inc}
	var rb [16]byte
	for t.secret == [2]uint64{} {
		if _, err := rand.Read(rb[:]); err != nil {
			return Grant{}, fmt.Errorf("shm: grant: %w", err)
		}
		t.secret[0], t.secret[1] = binary.LittleEndian.Uint64(rb[:8]), binary.LittleEndian.Uint64(rb[8:])
	}
	l := leaseAt(b, slot)
	l.hold.Store(holdNone)
	l.base.Store(uint32(base))
	l.count.Store(uint32(count))
	l.pid.Store(uint32(pid))
	l.holder.Store(0)
	l.secret[0].Store(t.secret[0])
	l.secret[1].Store(t.secret[1])
	l.state.Store(leaseGranted) // last: publishes the entry
	n.lctr.granted.Add(1)
	n.log.Debug("shm: lease granted", "slot", slot, "vpids", fmt.Sprintf("%d-%d", base, int(base)+count-1), "pid", pid)
	return Grant{Fabric: n.fab, Node: n.node, VPIDBase: base, VPIDs: count, Token: t.String()}, nil
}

// Revoke implements Lender.
func (n *nicT) Revoke(g Grant) error {
	if n.att != nil {
		return n.refuse(fmt.Errorf("shm: revoke: not the node's owner: %w", fabric.ErrInvalid))
	}
	t, err := parseToken(g.Token)
	if err != nil {
		return n.refuse(err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed.Load() {
		return net.ErrClosed
	}
	l := leaseAt(n.nodeMap.b, t.slot)
	if t.inc != n.inc || l.state.Load() != leaseGranted || !l.matches(t) {
		return n.refuse(fmt.Errorf("shm: revoke: no lease %s: %w", g.Token, fabric.ErrInvalid))
	}
	l.state.Store(leaseRevoked)
	n.lctr.revoked.Add(1)
	n.sweepSlot(t.slot)
	return nil
}

// Leases implements Lender.
func (n *nicT) Leases() []Lease {
	if n.closed.Load() || n.att != nil {
		return nil
	}
	var out []Lease
	for s := 0; s < maxLeases; s++ {
		l := leaseAt(n.nodeMap.b, s)
		st := l.state.Load()
		if st == leaseFree {
			continue
		}
		t := token{slot: s, inc: n.inc, secret: [2]uint64{l.secret[0].Load(), l.secret[1].Load()}}
		out = append(out, Lease{
			Grant:    Grant{Fabric: n.fab, Node: n.node, VPIDBase: fabric.VPID(l.base.Load()), VPIDs: int(l.count.Load()), Token: t.String()},
			PID:      int(l.pid.Load()),
			Holder:   int(l.holder.Load()),
			Attached: l.hold.Load() == holdAttached,
			Revoked:  st == leaseRevoked,
		})
	}
	return out
}

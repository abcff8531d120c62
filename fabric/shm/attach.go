package shm

// Attaching to a node another process owns ("kernel bypass").
//
// The owner of a node (exnd: the process that Opened it and holds its
// node-file lock) lends a block of VPIDs to an application process with
// Lender.Grant. The grant is a lease entry in the node file's header page
// (layout.go: state, hold, VPID base and count, grantee PID, a 128-bit
// random secret) plus a block of leaseRegions region-table indices above
// the owner's own. The application calls Attach with the grant's token:
// it maps the owner's node file (it never locks it), checks the owner is
// alive, the lease is granted with that secret to its PID, takes the
// lease's attach file (exn-F-n<N>.<inc>-a<slot>, created and flocked for
// the attachment's lifetime: one holder per lease), and from then on
// opens VPIDs of the lease (and only those) as endpoints of its own, with
// the owner's incarnation in their file names: to every other process
// they are VPIDs of the node like any other. Data then moves between the
// application and its peers with no hop through the owner.
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
// Lifetimes.
//   - The owner's monitor sweeps the lease table every monitor period
//     (idleLivenessPeriod, livenessPeriod while it has a blocked sender): a
//     lease whose holder detached, died (its attach file's lock can be
//     taken), or was revoked before it attached, is cleaned up — its VPID
//     files marked closed (blocked senders get ErrUnknownNode at once) and
//     unlinked, its region entries invalidated and their files unlinked —
//     and its slot freed. A grant that is never attached stays until the
//     owner revokes it (exnd does, when the grantee PID dies or after a
//     grace period).
//   - The attached process's monitor checks, every monitor period, that
//     the owner still holds its node-file lock, still says alive, and that
//     the lease still carries its secret. If not (the owner died, closed,
//     or revoked the lease) the attachment is lost: every endpoint is
//     closed (calls return net.ErrClosed, Open returns ErrPeerDown), the
//     lease is released, and Done is closed. Nothing waits on the owner.
//     The regions are unpublished and unlinked, but stay mapped until
//     Close: the application may be copying into a Region.Buf right then.
//   - Close releases the attachment's endpoints, regions and attach file
//     (the owner's sweep then frees the slot) and leaves the owner alone.
//
// Locking: attachState.mu guards release; the rest is the nicT's.

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/sys"
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

// ---- Owner side ------------------------------------------------------

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
			// temporary name, its doorbell FIFO or the FIFO's temporary
			// name (the VPID files themselves: closeStaleVPID above).
			num, suffix, _ := strings.Cut(rest[1:], ".")
			if suffix != "tmp" && suffix != "bell" && suffix != "tmp.bell" {
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
	// The holder is gone, so nobody sleeps on its FIFO; unlink it.
	os.Remove(path + ".bell")
}

// ---- Attached side ---------------------------------------------------

// attachState is the attached process's side of a lease.
type attachState struct {
	tok     token
	slot    int
	base    fabric.VPID
	count   int
	lease   leaseView
	afile   *os.File // the attach file, flocked
	apath   string
	lost    atomic.Bool
	done    chan struct{}
	mu      sync.Mutex
	err     error // why the attachment was lost
	release sync.Once
}

// Attached is a process's attachment to a node another process owns: it
// opens the granted VPIDs as ordinary endpoints and satisfies
// extds.Attachment.
type Attached struct{ n *nicT }

// Attach attaches this process to node on fabric fabricName with grant g
// from the node's owner (Lender.Grant, or exnd's "extds-attach"). The
// owner must be alive, the grant current and made for this process, and
// not attached elsewhere. Options: WithSlots and WithNotifyDepth size the
// VPIDs this process opens, WithDir and WithLogger as for Open.
func Attach(fabricName string, node fabric.NodeID, g Grant, opts ...Option) (*Attached, error) {
	if err := validFabricName(fabricName); err != nil {
		return nil, err
	}
	if g.Fabric != fabricName || g.Node != node {
		return nil, fmt.Errorf("shm: attach: grant is for %s node %d, not %s node %d: %w", g.Fabric, g.Node, fabricName, node, fabric.ErrInvalid)
	}
	t, err := parseToken(g.Token)
	if err != nil {
		return nil, err
	}
	if g.VPIDs < 1 || int(g.VPIDBase)+g.VPIDs > 256 || g.VPIDBase == fabric.EthVPID {
		return nil, fmt.Errorf("shm: attach: grant names vpids %d+%d: %w", g.VPIDBase, g.VPIDs, fabric.ErrInvalid)
	}
	o := options{slots: DefaultSlots, depth: fabric.DefaultNotifyDepth, dir: "/dev/shm", log: slog.Default(), backstop: waitSlice}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	lo := leaseRegionLo(t.slot)
	n := &nicT{
		fab: fabricName, node: node, dir: o.dir, opts: o, inc: t.inc,
		log:     o.log.With("fabric", fabricName, "node", node, "attached", t.slot),
		peers:   make(map[fabric.NodeID]*peer),
		gone:    make(map[fabric.NodeID]bool),
		peersCh: make(chan struct{}),
		regions: make(map[uint32]*localRegion),
		gens:    make([]uint32, maxTableRegions+1),
		nextIdx: lo, regLo: lo, regHi: lo + leaseRegions - 1,
		stop: make(chan struct{}), hurry: make(chan struct{}, 1),
	}
	n.faults.Init(n.log, logInterval)
	a := &attachState{tok: t, slot: t.slot, base: g.VPIDBase, count: g.VPIDs, done: make(chan struct{})}
	n.att = a
	if err := n.joinFabric(); err != nil {
		return nil, err
	}
	if err := n.attachNode(g); err != nil {
		n.leaveFabric()
		return nil, err
	}
	for idx := n.regLo; idx <= n.regHi; idx++ {
		w0, _ := n.entryWords(n.nodeMap.b, idx)
		n.gens[idx] = uint32(w0.Load() >> 32)
	}
	n.self = &peer{id: node, inc: n.inc, m: n.nodeMap, groups: n.groups, self: true}
	n.nodeMap.acquire()
	n.hook = n.checkOwner
	n.wg.Add(1)
	go n.monitor()
	n.log.Debug("shm: attached", "vpids", fmt.Sprintf("%d-%d", a.base, int(a.base)+a.count-1))
	return &Attached{n: n}, nil
}

// attachNode maps the owner's node file, checks owner and lease, and takes
// the lease's attach file.
func (n *nicT) attachNode(g Grant) error {
	a := n.att
	path := n.nodePath(n.node)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return n.ctr.CountErr(fmt.Errorf("shm: attach: node %d is not up: %w", n.node, fabric.ErrPeerDown))
		}
		return fmt.Errorf("shm: attach: %w", err)
	}
	fail := func(err error) error {
		f.Close()
		return n.ctr.CountErr(err)
	}
	if dead, err := ownerDead(f); err != nil || dead {
		return fail(fmt.Errorf("shm: attach: node %d has no live owner (%v): %w", n.node, err, fabric.ErrPeerDown))
	}
	if sz, err := sys.FileSize(f); err != nil || sz < nodeFileSize {
		return fail(fmt.Errorf("shm: attach: node %d file size %d (%v): %w", n.node, sz, err, fabric.ErrInvalid))
	}
	b, err := sys.MapShared(f, nodeFileSize)
	if err != nil {
		return fail(err)
	}
	fail = func(err error) error {
		sys.Unmap(b)
		f.Close()
		return n.ctr.CountErr(err)
	}
	h, err := decodeNodeHeader(b, n.node)
	switch {
	case err != nil:
		return fail(fmt.Errorf("shm: attach: %w", err))
	case h.State != nodeAlive:
		return fail(fmt.Errorf("shm: attach: node %d is closing: %w", n.node, fabric.ErrPeerDown))
	case h.Inc != a.tok.inc:
		return fail(fmt.Errorf("shm: attach: grant is for an earlier incarnation of node %d: %w", n.node, fabric.ErrInvalid))
	}
	l := leaseAt(b, a.slot)
	pid := int(l.pid.Load())
	switch {
	case l.state.Load() != leaseGranted || !l.matches(a.tok):
		return fail(fmt.Errorf("shm: attach: token %s is not a current grant of node %d: %w", g.Token, n.node, fabric.ErrInvalid))
	case fabric.VPID(l.base.Load()) != a.base || int(l.count.Load()) != a.count:
		return fail(fmt.Errorf("shm: attach: grant says vpids %d+%d, the lease %d+%d: %w",
			a.base, a.count, l.base.Load(), l.count.Load(), fabric.ErrInvalid))
	case pid != 0 && pid != os.Getpid():
		return fail(fmt.Errorf("shm: attach: the grant is for pid %d, this is pid %d: %w", pid, os.Getpid(), fabric.ErrInvalid))
	}
	a.lease = l
	n.nodeFile, n.nodeMap = f, newMapping(b)
	n.state = u32(b, nOffState)
	n.groups = u64(b, nOffGroups)
	if err := n.takeAttachFile(); err != nil {
		n.nodeMap.release()
		f.Close()
		return n.ctr.CountErr(err)
	}
	l.holder.Store(uint32(os.Getpid()))
	l.hold.Store(holdAttached)
	// Re-check after publishing the hold: a Revoke that raced the checks
	// above is seen now, or its sweep sees us attached.
	if l.state.Load() != leaseGranted || !l.matches(a.tok) {
		n.releaseLease()
		n.nodeMap.release()
		f.Close()
		return n.ctr.CountErr(fmt.Errorf("shm: attach: grant revoked while attaching: %w", fabric.ErrInvalid))
	}
	return nil
}

// ownerDead probes the node file's lock: one we can take means the owner
// is gone. We drop it at once (a restarting owner or a reclaiming peer
// needs it).
func ownerDead(f *os.File) (bool, error) {
	ok, err := sys.TryLock(f, true)
	if err != nil {
		return false, err
	}
	if ok {
		sys.Unlock(f) //nolint:errcheck // closing the file drops it anyway
	}
	return ok, nil
}

// takeAttachFile creates and locks the lease's attach file; one that
// exists and is locked means the grant is attached elsewhere (ErrInUse),
// one that exists unlocked was left by a dead holder and is replaced.
func (n *nicT) takeAttachFile() error {
	a := n.att
	a.apath = n.attachPath(a.slot)
	tmp := a.apath + ".tmp" + strconv.Itoa(os.Getpid())
	for try := 0; try < openRetries; try++ {
		f, err := createFile(tmp, 8)
		if err != nil {
			return fmt.Errorf("shm: attach file: %w", err)
		}
		if ok, err := sys.TryLock(f, true); err != nil || !ok {
			f.Close()
			os.Remove(tmp)
			return fmt.Errorf("shm: lock attach file: %v: %w", err, fabric.ErrInUse)
		}
		err = os.Link(tmp, a.apath)
		os.Remove(tmp)
		if err == nil {
			a.afile = f
			return nil
		}
		f.Close()
		if !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("shm: attach file: %w", err)
		}
		old, err := os.OpenFile(a.apath, os.O_RDWR, 0)
		if err != nil {
			continue // gone meanwhile: retry the link
		}
		ok, err := sys.TryLock(old, true)
		if err != nil || !ok {
			old.Close()
			return fmt.Errorf("shm: attach: grant %d is attached by another process: %w", a.slot, fabric.ErrInUse)
		}
		if same, _ := sys.SameFile(old, a.apath); same {
			os.Remove(a.apath) // a dead holder's, and we hold its lock
		}
		old.Close()
	}
	return fmt.Errorf("shm: attach file %s: %w", a.apath, fabric.ErrInUse)
}

// checkOwner is the attached process's monitor hook.
func (n *nicT) checkOwner() {
	a := n.att
	if a.lost.Load() || n.closed.Load() {
		return
	}
	var why error
	if dead, err := ownerDead(n.nodeFile); err == nil && dead {
		why = fmt.Errorf("shm: owner of node %d died: %w", n.node, fabric.ErrPeerDown)
	} else if n.state.Load() != nodeAlive {
		why = fmt.Errorf("shm: owner of node %d closed it: %w", n.node, fabric.ErrPeerDown)
	} else if a.lease.state.Load() != leaseGranted || !a.lease.matches(a.tok) {
		why = fmt.Errorf("shm: lease %d of node %d revoked: %w", a.slot, n.node, fabric.ErrPeerDown)
	}
	if why != nil {
		n.lose(why)
	}
}

// lose ends a lost attachment: endpoints closed, lease released, Done
// closed. The regions' mappings stay until Close (see nicT.keepMaps).
func (n *nicT) lose(why error) {
	a := n.att
	a.mu.Lock()
	if a.err == nil {
		a.err = why
	}
	a.mu.Unlock()
	if !a.lost.CompareAndSwap(false, true) {
		return
	}
	n.ctr.PeerDown.Add(1)
	n.log.Warn("shm: attachment lost", "err", why)
	n.regMu.Lock()
	n.keepMaps = true // the application may still hold Region.Bufs
	n.regMu.Unlock()
	n.releaseLease()
	close(a.done)
}

// releaseLease closes the attachment's endpoints (they unlink their VPID
// and region files), marks the lease detached and drops the attach file.
// It runs once.
func (n *nicT) releaseLease() {
	a := n.att
	a.release.Do(func() {
		n.mu.Lock()
		eps := n.eps
		n.mu.Unlock()
		for _, ep := range eps {
			if ep != nil {
				ep.Close()
			}
		}
		n.regMu.Lock()
		for idx, r := range n.regions {
			n.dropRegionLocked(idx, r)
		}
		n.regMu.Unlock()
		if a.lease.state != nil && a.lease.hold.Load() == holdAttached && a.lease.matches(a.tok) {
			a.lease.hold.Store(holdDetached)
		}
		if a.afile != nil {
			if same, _ := sys.SameFile(a.afile, a.apath); same {
				os.Remove(a.apath)
			}
			a.afile.Close()
		}
	})
}

// Node returns the node this process is attached to.
func (a *Attached) Node() fabric.NodeID { return a.n.node }

// Grant returns the VPID block this attachment may open.
func (a *Attached) Grant() (base fabric.VPID, count int) { return a.n.att.base, a.n.att.count }

// Open opens VPID v of the grant as an endpoint of this process. A VPID
// outside the grant is ErrInvalid, one already open (here or in another
// process) ErrInUse, and after the attachment was lost ErrPeerDown.
func (a *Attached) Open(v fabric.VPID) (fabric.Endpoint, error) {
	n, st := a.n, a.n.att
	if n.closed.Load() {
		return nil, net.ErrClosed
	}
	if st.lost.Load() {
		return nil, n.ctr.CountErr(fmt.Errorf("shm: open %d:%d: %w", n.node, v, a.Err()))
	}
	if v < st.base || int(v) >= int(st.base)+st.count {
		return nil, n.ctr.CountErr(fmt.Errorf("shm: open %d:%d: not in the grant (%d..%d): %w",
			n.node, v, st.base, int(st.base)+st.count-1, fabric.ErrInvalid))
	}
	if st.lease.state.Load() != leaseGranted || !st.lease.matches(st.tok) {
		return nil, n.ctr.CountErr(fmt.Errorf("shm: open %d:%d: grant revoked: %w", n.node, v, fabric.ErrPeerDown))
	}
	ep, err := n.Open(v)
	if err != nil {
		return nil, err
	}
	if st.lost.Load() { // lost while opening: releaseLease may have missed it
		ep.Close()
		return nil, n.ctr.CountErr(fmt.Errorf("shm: open %d:%d: %w", n.node, v, a.Err()))
	}
	return ep, nil
}

// Alive reports whether node id is up (for this node: whether the owner
// is and the attachment holds).
func (a *Attached) Alive(id fabric.NodeID) error {
	if id == a.n.node {
		if a.n.att.lost.Load() {
			return a.Err()
		}
		if a.n.closed.Load() {
			return fmt.Errorf("shm: node %d: attachment closed: %w", id, fabric.ErrPeerDown)
		}
		return nil
	}
	return a.n.Alive(id)
}

// Peers lists the other live nodes.
func (a *Attached) Peers() []fabric.NodeID { return a.n.Peers() }

// Stats returns this process's fabric counters (not the owner's).
func (a *Attached) Stats() fabric.Stats { return a.n.Stats() }

// WakeStats returns this process's wake-up counters.
func (a *Attached) WakeStats() WakeStats { return a.n.WakeStats() }

// Done is closed when the attachment is lost: the owner died or closed
// the node, or revoked the lease.
func (a *Attached) Done() <-chan struct{} { return a.n.att.done }

// Err says why the attachment was lost (nil while it holds). It wraps
// fabric.ErrPeerDown.
func (a *Attached) Err() error {
	st := a.n.att
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.err
}

// Close closes this process's endpoints and releases the lease (the owner
// reclaims the slot); the owner and its other VPIDs are not touched. It
// is idempotent.
func (a *Attached) Close() error {
	n := a.n
	if !n.closed.CompareAndSwap(false, true) {
		return nil
	}
	n.releaseLease()
	n.regMu.Lock()
	for _, m := range n.orphans {
		m.release()
	}
	n.orphans, n.keepMaps = nil, false
	n.regMu.Unlock()
	close(n.stop)
	n.wg.Wait()
	n.peerMu.Lock()
	for id, p := range n.peers {
		p.drop()
		delete(n.peers, id)
	}
	n.peersChangedLocked()
	n.peerMu.Unlock()
	n.self.drop()
	n.nodeMap.release()
	n.nodeFile.Close()
	n.leaveFabric()
	n.log.Debug("shm: detached")
	return nil
}

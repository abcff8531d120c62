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
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/sys"
)

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
	o, err := applyOptions(opts)
	if err != nil {
		return nil, err
	}
	lo := leaseRegionLo(t.slot)
	n := newNIC(fabricName, node, o, o.log.With("fabric", fabricName, "node", node, "attached", t.slot), lo, lo+leaseRegions-1)
	n.inc = t.inc
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
	n.startMonitor()
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
		n.closeEndpoints()
		n.dropRegions()
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
	n.stopMonitor()
	n.dropPeers()
	n.dropSelf()
	n.log.Debug("shm: detached")
	return nil
}

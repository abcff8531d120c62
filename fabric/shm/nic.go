package shm

// Node lifecycle, discovery and liveness.
//
// Open: take (or reclaim) the node ID, then publish the node file.
//  1. Join the fabric: create or open exn-F-fabric and hold a shared flock
//     on it for the NIC's lifetime; the last node out (the one that can
//     upgrade to exclusive) unlinks it.
//  2. If exn-F-n<N> exists and its lock is held, the node ID is in use
//     (ErrInUse). If the lock can be taken, its owner is dead: unlink its
//     files ("a restarted peer rejoins").
//  3. Create the node file under a temporary name, lock it, write the
//     header, then link(2) it to exn-F-n<N>. link fails if the name exists,
//     so two racing Opens of one node ID cannot both win. Bump the epoch.
//
// Liveness: a monitor goroutine (owned by the NIC, stopped and awaited in
// Close) runs every idleLivenessPeriod, or every livenessPeriod while a
// sender of this process is blocked on a full mailbox (the sender counts
// itself in nic.blocked and kicks the monitor when it is the first). It
// rescans the directory when the
// fabric epoch moved (or every discoveryPeriod), and probes each known
// peer's node-file lock when a peer may have died: a close of one of the
// fabric's files seen by the watcher of the directory (inotify; a dead
// node's files close with its process), a join or leave, a blocked
// sender; or every period where inotify is unavailable. A lock it can take belongs to a dead node: the
// monitor marks the peer down (senders blocked on it see ErrPeerDown on
// their next wait slice), drops the cached mappings, and, still holding
// the lock, unlinks the dead incarnation's files. Holding the lock is what
// makes the unlink safe: a restarting node must take that same lock before
// it can replace the node file, so the names cannot change underneath.
//
// Locking: nic.mu guards eps and the NIC's lifecycle; nic.peerMu guards
// the peers map; peer.mu guards a peer's mapping caches; nic.regMu guards
// the local region table. Order: mu, peerMu, peer.mu, regMu. No lock is
// held across a blocking wait.

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/ratelog"
	"github.com/exn-project/exn/internal/sys"
)

const (
	// livenessPeriod is how often the monitor probes peers' locks while
	// a sender of this process is blocked on a full mailbox: it bounds
	// how long such a sender waits on a SIGKILLed peer before it gets
	// ErrPeerDown. Each probe is one flock(2) per peer (a raw syscall).
	livenessPeriod = 10 * time.Millisecond
	// idleLivenessPeriod is the monitor's period otherwise: the liveness
	// protocol's period, and the only timer of an idle NIC. It bounds how
	// stale Peers and the down marks are when nothing waits on a peer
	// (Alive probes at once; a sender that blocks switches the monitor to
	// livenessPeriod at once), and how late the owner reclaims a dead
	// attached process's lease. An idle period costs one timer wake-up
	// and no probe: peers are probed (one flock(2) each) only after a
	// close event in the fabric's directory (see the top of this file),
	// so an idle node's cost does not grow with its peers; at 100 ms the
	// wake-ups alone were most of an idle exnd's CPU (docs/wakeup.md).
	idleLivenessPeriod = time.Second
	// discoveryPeriod bounds how stale the peer list is when an epoch bump
	// was missed (it never should be; this is a backstop, checked at the
	// monitor's period).
	discoveryPeriod = 5 * time.Second
	// openRetry and openRetries: how long Open waits for a peer that is
	// reclaiming a dead incarnation of the same node ID to finish.
	openRetry   = time.Millisecond
	openRetries = 200
	// logInterval is the least time between two rate-limited fault logs
	// (internal/ratelog): a flood of corrupt slots stays one line a second.
	logInterval = time.Second
)

// nicT is one node on a shm fabric. See the fabric.NIC contract.
type nicT struct {
	fab  string
	node fabric.NodeID
	dir  string
	opts options
	log  *slog.Logger
	inc  uint64
	ctr  fabric.Counters

	fabFile  *os.File
	fabMap   *mapping
	epoch    *atomic.Uint64
	nodeFile *os.File
	nodeMap  *mapping
	state    *atomic.Uint32
	groups   *atomic.Uint64

	mu     sync.Mutex
	eps    [256]*endpoint
	closed atomic.Bool
	folded [numVStats]atomic.Uint64 // header counters of closed endpoints

	peerMu sync.RWMutex
	peers  map[fabric.NodeID]*peer
	gone   map[fabric.NodeID]bool // seen up, now down
	// peersCh is closed and replaced at every change of peers (under
	// peerMu for writing): PeersChanged.
	peersCh   chan struct{}
	seenEpoch uint64
	lastScan  time.Time

	regMu   sync.RWMutex
	regions map[uint32]*localRegion
	// keepMaps and orphans: once an attachment is lost (attach.go, lose)
	// its regions are unpublished and unlinked at once, but their
	// mappings stay until the application closes the attachment: it may
	// still be copying from or into a Region.Buf it was handed (the
	// fabric.Region contract: Buf is valid until the owner's Deregister
	// or Close), and an unmap under it would be a SIGSEGV in the
	// application, not an error. Guarded by regMu.
	keepMaps bool
	orphans  []*mapping
	gens     []uint32 // by region index
	freeIdx  []uint32
	nextIdx  uint32
	// regLo..regHi: the region indices this process allocates from, the
	// owner's 1..maxNodeRegions or an attached process's lease block.
	regLo, regHi uint32

	// att is set on a NIC attached to a node another process owns
	// (attach.go); hook runs once per monitor period (owner: lease sweep,
	// attached: owner and lease check).
	att  *attachState
	hook func()
	lctr leaseCounters

	self *peer

	stop chan struct{}
	wg   sync.WaitGroup
	// blocked counts senders asleep on a full mailbox; the first one
	// kicks hurry (capacity 1), so the monitor probes at livenessPeriod.
	blocked atomic.Int32
	hurry   chan struct{}
	// parked: senders parked on a target's space bell (space.go),
	// under parkMu.
	parkMu sync.Mutex
	parked map[*parkedSend]struct{}
	// closes watches the fabric's directory for closed files (nil if
	// inotify is unavailable: the monitor then probes every period).
	// probeDue is set by the watcher at a close of one of this fabric's
	// files (it also kicks hurry) and cleared by the probe round it asks
	// for.
	closes   *os.File
	probeDue atomic.Bool
	// scanDue is set by the watcher at any event of this fabric's files:
	// with a watcher, the directory is rescanned on events and epoch
	// moves only, not every discoveryPeriod.
	scanDue atomic.Bool

	faults ratelog.Faults // per-message and per-peer faults, one line per logInterval

	wc wakeCounters
}

// WakeStats counts how this process's consumers slept and how its
// producers woke consumers (see the tops of wait.go and endpoint.go).
type WakeStats struct {
	BellSleeps   uint64 `json:"bell_sleeps"`   // Wait sleeps parked on a doorbell FIFO
	FutexSleeps  uint64 `json:"futex_sleeps"`  // Wait sleeps in FUTEX_WAIT (VPIDs without a FIFO)
	Backstops    uint64 `json:"backstops"`     // FIFO sleeps ended by the waitSlice deadline
	BellRings    uint64 `json:"bell_rings"`    // bytes written to other consumers' FIFOs
	RingFailed   uint64 `json:"ring_failed"`   // rings that could not open or write the FIFO
	BellFallback uint64 `json:"bell_fallback"` // VPIDs opened without a FIFO (futex fallback)
	ProbeRounds  uint64 `json:"probe_rounds"`  // monitor rounds that probed every peer's lock
	// Senders blocked on a full mailbox (space.go): parks on a space
	// bell, bytes the consumers of this process wrote to their space
	// bells, and blocked sends that slept on the space futex because
	// the target's space bell could not be opened.
	SpaceParks    uint64 `json:"space_parks"`
	SpaceRings    uint64 `json:"space_rings"`
	SpaceFallback uint64 `json:"space_fallback"`
}

type wakeCounters struct {
	bellSleeps, futexSleeps, backstops, rings, ringFailed, bellFallback, probeRounds atomic.Uint64
	spaceParks, spaceRings, spaceFallback                                            atomic.Uint64
}

// WakeStats returns the wake-up counters of the NIC from Open.
func (n *nicT) WakeStats() WakeStats {
	c := &n.wc
	return WakeStats{BellSleeps: c.bellSleeps.Load(), FutexSleeps: c.futexSleeps.Load(), Backstops: c.backstops.Load(),
		BellRings: c.rings.Load(), RingFailed: c.ringFailed.Load(), BellFallback: c.bellFallback.Load(), ProbeRounds: c.probeRounds.Load(),
		SpaceParks: c.spaceParks.Load(), SpaceRings: c.spaceRings.Load(), SpaceFallback: c.spaceFallback.Load()}
}

// newNIC makes the NIC of Open and Attach before it touches the fabric's
// files: options o, logger log, and its own range of region indexes,
// regLo..regHi (the node's, or a lease's).
func newNIC(fabricName string, node fabric.NodeID, o options, log *slog.Logger, regLo, regHi uint32) *nicT {
	n := &nicT{
		fab: fabricName, node: node, dir: o.dir, opts: o, log: log,
		peers:   make(map[fabric.NodeID]*peer),
		parked:  make(map[*parkedSend]struct{}),
		gone:    make(map[fabric.NodeID]bool),
		peersCh: make(chan struct{}),
		regions: make(map[uint32]*localRegion),
		gens:    make([]uint32, maxTableRegions+1),
		nextIdx: regLo, regLo: regLo, regHi: regHi,
		stop: make(chan struct{}), hurry: make(chan struct{}, 1),
	}
	n.faults.Init(n.log, logInterval)
	return n
}

// Open joins fabric fabricName as node and returns its NIC. The node ID
// must not be open elsewhere (ErrInUse); files of a dead previous owner of
// the ID are reclaimed. The NIC owns one monitor goroutine until Close.
func Open(fabricName string, node fabric.NodeID, opts ...Option) (fabric.NIC, error) {
	if err := validFabricName(fabricName); err != nil {
		return nil, err
	}
	o, err := applyOptions(opts)
	if err != nil {
		return nil, err
	}
	n := newNIC(fabricName, node, o, o.log.With("fabric", fabricName, "node", node), 1, maxNodeRegions)
	n.hook = n.sweepLeases
	var rb [8]byte
	for n.inc == 0 {
		if _, err := rand.Read(rb[:]); err != nil {
			return nil, fmt.Errorf("shm: incarnation: %w", err)
		}
		n.inc = binary.LittleEndian.Uint64(rb[:])
	}
	if err := n.joinFabric(); err != nil {
		return nil, err
	}
	if err := n.claimNode(); err != nil {
		n.leaveFabric()
		return nil, err
	}
	n.self = &peer{id: node, inc: n.inc, m: n.nodeMap, groups: n.groups, self: true}
	n.nodeMap.acquire()
	n.epoch.Add(1)
	n.startMonitor()
	n.log.Debug("shm node up", "inc", fmt.Sprintf("%016x", n.inc))
	return n, nil
}

func validFabricName(s string) error {
	if s == "" || len(s) > maxFabricName || s == "." || s == ".." {
		return fmt.Errorf("shm: fabric name %q: want 1..%d characters: %w", s, maxFabricName, fabric.ErrInvalid)
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.') {
			return fmt.Errorf("shm: fabric name %q: only letters, digits, '_' and '.': %w", s, fabric.ErrInvalid)
		}
	}
	return nil
}

// File names.
func (n *nicT) fabricPath() string { return filepath.Join(n.dir, "exn-"+n.fab+"-fabric") }
func (n *nicT) nodePath(id fabric.NodeID) string {
	return filepath.Join(n.dir, "exn-"+n.fab+"-n"+strconv.Itoa(int(id)))
}

// incPrefix is the name prefix of every file of one incarnation of a node.
func (n *nicT) incPrefix(id fabric.NodeID, inc uint64) string {
	return "exn-" + n.fab + "-n" + strconv.Itoa(int(id)) + "." + fmt.Sprintf("%016x", inc) + "-"
}
func (n *nicT) vpidPath(id fabric.NodeID, inc uint64, v fabric.VPID) string {
	return filepath.Join(n.dir, n.incPrefix(id, inc)+"v"+strconv.Itoa(int(v)))
}
func (n *nicT) regionPath(id fabric.NodeID, inc uint64, idx, gen uint32) string {
	return filepath.Join(n.dir, n.incPrefix(id, inc)+"r"+strconv.Itoa(int(idx))+"."+strconv.Itoa(int(gen)))
}

// parseNodeName returns the node ID a directory entry names, if it is a
// node file of this fabric.
func (n *nicT) parseNodeName(name string) (fabric.NodeID, bool) {
	rest, ok := strings.CutPrefix(name, "exn-"+n.fab+"-n")
	if !ok || rest == "" || len(rest) > 5 {
		return 0, false
	}
	v, err := strconv.ParseUint(rest, 10, 16)
	if err != nil || strconv.FormatUint(v, 10) != rest {
		return 0, false
	}
	return fabric.NodeID(v), true
}

func createFile(path string, size int) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if err := f.Truncate(int64(size)); err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("shm: size %s: %w", path, err)
	}
	return f, nil
}

func (n *nicT) joinFabric() error {
	path := n.fabricPath()
	for try := 0; try < openRetries; try++ {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return fmt.Errorf("shm: open %s: %w", path, err)
		}
		ok, err := sys.TryLock(f, false)
		if err == nil && ok {
			same, serr := sys.SameFile(f, path)
			if serr == nil && same {
				if sz, _ := sys.FileSize(f); sz < pageSize {
					f.Truncate(pageSize) //nolint:errcheck // checked by the mmap below
				}
				b, err := sys.MapShared(f, pageSize)
				if err != nil {
					f.Close()
					return fmt.Errorf("shm: %w", err)
				}
				n.fabFile, n.fabMap = f, newMapping(b)
				u64(b, 0).CompareAndSwap(0, fabricMagic)
				n.epoch = u64(b, 64)
				return nil
			}
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("shm: %w", err)
		}
		time.Sleep(openRetry) // the last node out is unlinking it
	}
	return fmt.Errorf("shm: fabric file %s stays locked: %w", path, fabric.ErrInUse)
}

func (n *nicT) leaveFabric() {
	if ok, _ := sys.TryLock(n.fabFile, true); ok {
		if same, _ := sys.SameFile(n.fabFile, n.fabricPath()); same {
			os.Remove(n.fabricPath())
		}
	}
	n.fabMap.release()
	n.fabFile.Close()
}

func (n *nicT) claimNode() error {
	path := n.nodePath(n.node)
	for try := 0; ; try++ {
		err := n.reclaimStale(path)
		if err == nil {
			break
		}
		if !errors.Is(err, errBusy) || try >= openRetries {
			return n.ctr.CountErr(fmt.Errorf("shm: node %d: %w", n.node, fabric.ErrInUse))
		}
		time.Sleep(openRetry)
	}
	tmp := filepath.Join(n.dir, n.incPrefix(n.node, n.inc)+"tmp")
	f, err := createFile(tmp, nodeFileSize)
	if err != nil {
		return fmt.Errorf("shm: node file: %w", err)
	}
	defer os.Remove(tmp)
	if ok, err := sys.TryLock(f, true); !ok || err != nil {
		f.Close()
		return fmt.Errorf("shm: lock new node file: %v: %w", err, fabric.ErrInUse)
	}
	b, err := sys.MapShared(f, nodeFileSize)
	if err != nil {
		f.Close()
		return fmt.Errorf("shm: %w", err)
	}
	encodeNodeHeader(b, nodeHeader{Node: n.node, PID: uint32(os.Getpid()), State: nodeAlive, Inc: n.inc})
	if err := os.Link(tmp, path); err != nil {
		sys.Unmap(b)
		f.Close()
		if errors.Is(err, fs.ErrExist) {
			return n.ctr.CountErr(fmt.Errorf("shm: node %d: %w", n.node, fabric.ErrInUse))
		}
		return fmt.Errorf("shm: publish node file: %w", err)
	}
	n.nodeFile, n.nodeMap = f, newMapping(b)
	n.state = u32(b, nOffState)
	n.groups = u64(b, nOffGroups)
	return nil
}

var errBusy = errors.New("busy")

// reclaimStale removes a dead owner's node file at path and its files. It
// returns nil if there is (now) no node file, errBusy if a live node or a
// reclaiming peer holds it.
func (n *nicT) reclaimStale(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("shm: open %s: %w", path, err)
	}
	defer f.Close()
	ok, err := sys.TryLock(f, true)
	if err != nil {
		return err
	}
	if !ok {
		return errBusy
	}
	n.reclaimLocked(f, path, n.node, 0)
	return nil
}

// reclaimLocked unlinks the files of a dead node whose node file f we hold
// locked. inc is the dead incarnation if known (0: read it from the file).
// If path still names f, no newer incarnation exists (it would have needed
// our lock), so every file of the node ID goes; otherwise only inc's.
func (n *nicT) reclaimLocked(f *os.File, path string, id fabric.NodeID, inc uint64) {
	if sz, _ := sys.FileSize(f); sz >= nodeFileSize {
		if b, err := sys.MapShared(f, nodeFileSize); err == nil {
			if h, err := decodeNodeHeader(b, id); err == nil && inc == 0 {
				inc = h.Inc
			}
			u32(b, nOffState).Store(nodeReclaiming)
			sys.Unmap(b)
		}
	}
	same, _ := sys.SameFile(f, path)
	prefix := "exn-" + n.fab + "-n" + strconv.Itoa(int(id)) + "."
	if !same {
		if inc == 0 {
			return
		}
		prefix = n.incPrefix(id, inc)
	}
	ents, err := os.ReadDir(n.dir)
	if err != nil {
		n.faults.Warn("shm: reclaim: read dir", "err", err)
		return
	}
	removed := 0
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) && os.Remove(filepath.Join(n.dir, e.Name())) == nil {
			removed++
		}
	}
	if same {
		os.Remove(path)
		removed++
	}
	n.log.Info("shm: reclaimed dead node's files", "peer", id, "files", removed)
}

func (n *nicT) Node() fabric.NodeID { return n.node }

func (n *nicT) Join(g fabric.Group) error {
	if g >= fabric.MaxGroups {
		return n.ctr.CountErr(fmt.Errorf("shm: join group %d: %w", g, fabric.ErrInvalid))
	}
	if n.closed.Load() {
		return net.ErrClosed
	}
	n.groups.Or(1 << g)
	return nil
}

func (n *nicT) Leave(g fabric.Group) error {
	if g >= fabric.MaxGroups {
		return n.ctr.CountErr(fmt.Errorf("shm: leave group %d: %w", g, fabric.ErrInvalid))
	}
	if n.closed.Load() {
		return net.ErrClosed
	}
	if g == fabric.Broadcast {
		return n.ctr.CountErr(fmt.Errorf("shm: leave broadcast: every node is a member: %w", fabric.ErrInvalid))
	}
	n.groups.And(^uint64(1 << g))
	return nil
}

func (n *nicT) Stats() fabric.Stats {
	var hs [numVStats]uint64
	for i := range hs {
		hs[i] = n.folded[i].Load()
	}
	n.mu.Lock()
	for _, ep := range n.eps {
		if ep != nil {
			for i := range hs {
				hs[i] += ep.v.stats[i].Load()
			}
		}
	}
	n.mu.Unlock()
	s := n.ctr.Snapshot()
	s.NotifyOverflow += hs[vstatOverflow]
	s.NotifyRequester += hs[vstatKind+0]
	s.NotifyCompleter += hs[vstatKind+1]
	s.NotifyResponder += hs[vstatKind+2]
	s.NotifyErrAccess += hs[vstatErr+0]
	s.NotifyErrBounds += hs[vstatErr+1]
	s.NotifyErrPeerDown += hs[vstatErr+2]
	return s
}

func (n *nicT) Close() error {
	if !n.closed.CompareAndSwap(false, true) {
		return nil
	}
	// Peers see the node down before they see its VPIDs close, so blocked
	// senders report ErrPeerDown, not ErrUnknownNode.
	n.state.Store(nodeClosed)
	n.closeEndpoints()
	n.stopMonitor()
	n.epoch.Add(1)
	n.dropRegions()
	n.dropPeers()
	if same, _ := sys.SameFile(n.nodeFile, n.nodePath(n.node)); same {
		os.Remove(n.nodePath(n.node))
	}
	n.dropSelf()
	n.log.Debug("shm node closed")
	return nil
}

// closeEndpoints closes every endpoint open now (Close, and an attached
// process's release of its lease).
func (n *nicT) closeEndpoints() {
	n.mu.Lock()
	eps := n.eps
	n.mu.Unlock()
	for _, ep := range eps {
		if ep != nil {
			ep.Close()
		}
	}
}

// dropRegions drops every region still registered.
func (n *nicT) dropRegions() {
	n.regMu.Lock()
	for idx, r := range n.regions {
		n.dropRegionLocked(idx, r)
	}
	n.regMu.Unlock()
}

// dropSelf is the end of Close and Detach: it lets go of this node's own
// mapping and file, then of the fabric.
func (n *nicT) dropSelf() {
	n.self.drop()
	n.nodeMap.release()
	n.nodeFile.Close()
	n.leaveFabric()
}

package shm

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/sys"
)

// peer is this NIC's view of one node (itself included, with self set):
// its locked-file probe handle, its mapped node file, and caches of the
// VPID files and regions it has mapped.
type peer struct {
	id      fabric.NodeID
	inc     uint64
	self    bool
	f       *os.File // node file, for the lock probe (nil for self)
	m       *mapping // node file mapping: header and region table
	groups  *atomic.Uint64
	down    atomic.Bool
	dropped atomic.Bool

	mu      sync.Mutex
	vpids   [256]*vfile
	regions map[uint32]*remoteRegion
}

// remoteRegion is a cached mapping of a peer's region file.
type remoteRegion struct {
	gen  uint32
	size uint64
	m    *mapping
}

// drop releases every cached mapping of p. In-flight users keep theirs
// alive through their own references.
func (p *peer) drop() {
	p.down.Store(true)
	if !p.dropped.CompareAndSwap(false, true) {
		return
	}
	p.mu.Lock()
	for i, v := range p.vpids {
		if v != nil {
			v.m.release()
			p.vpids[i] = nil
		}
	}
	for idx, r := range p.regions {
		r.m.release()
		delete(p.regions, idx)
	}
	if p.f != nil {
		p.f.Close()
	}
	p.mu.Unlock()
	p.m.release()
}

// getPeer returns node id's peer if it is up. It discovers a node it has
// not seen (or whose old incarnation died) by opening its node file.
func (n *nicT) getPeer(id fabric.NodeID) (*peer, error) {
	if id == n.node {
		return n.self, nil
	}
	n.peerMu.RLock()
	p := n.peers[id]
	n.peerMu.RUnlock()
	if p != nil && !p.down.Load() {
		if p.up() {
			return p, nil
		}
		n.markDown(p) // closed; the monitor has not noticed yet
	}
	return n.discover(id)
}

// discover opens node id's node file and adds it as a peer if its owner is
// alive. A file whose lock it can take belongs to a dead node and is
// reclaimed.
func (n *nicT) discover(id fabric.NodeID) (*peer, error) {
	n.peerMu.Lock()
	defer n.peerMu.Unlock()
	if p := n.peers[id]; p != nil && !p.down.Load() {
		return p, nil
	}
	notUp := func() error {
		if n.gone[id] {
			return fmt.Errorf("shm: node %d: %w", id, fabric.ErrPeerDown)
		}
		return fmt.Errorf("shm: node %d: %w", id, fabric.ErrUnknownNode)
	}
	if n.closed.Load() {
		return nil, notUp()
	}
	path := n.nodePath(id)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, notUp()
		}
		return nil, fmt.Errorf("shm: open node %d: %w", id, err)
	}
	ok, err := sys.TryLock(f, true)
	if err != nil {
		f.Close()
		return nil, err
	}
	if ok { // its owner is dead (or still publishing: impossible, it locks first)
		n.reclaimLocked(f, path, id, 0)
		f.Close()
		return nil, notUp()
	}
	sz, err := sys.FileSize(f)
	if err != nil || sz < nodeFileSize {
		f.Close()
		n.ctr.Corrupt.Add(1)
		return nil, fmt.Errorf("shm: node %d file size %d: %w", id, sz, fabric.ErrInvalid)
	}
	b, err := sys.MapShared(f, nodeFileSize)
	if err != nil {
		f.Close()
		return nil, err
	}
	h, err := decodeNodeHeader(b, id)
	if err != nil || h.State != nodeAlive {
		sys.Unmap(b)
		f.Close()
		if err != nil {
			n.ctr.Corrupt.Add(1)
			n.faults.Warn("shm: bad node header", "peer", id, "err", err)
		}
		return nil, notUp()
	}
	p := &peer{id: id, inc: h.Inc, f: f, m: newMapping(b), groups: u64(b, nOffGroups), regions: map[uint32]*remoteRegion{}}
	if old := n.peers[id]; old != nil {
		n.dropPeer(old)
	}
	n.peers[id] = p
	delete(n.gone, id)
	n.peersChangedLocked()
	return p, nil
}

// peersChangedLocked wakes PeersChanged's watchers. peerMu is held for
// writing.
func (n *nicT) peersChangedLocked() {
	close(n.peersCh)
	n.peersCh = make(chan struct{})
}

// dropPeers unmaps every peer and forgets it, waking PeersChanged's
// watchers: the last step of closing a NIC or an attachment, after its
// goroutines have stopped.
func (n *nicT) dropPeers() {
	n.peerMu.Lock()
	defer n.peerMu.Unlock()
	for id, p := range n.peers {
		n.dropPeer(p)
		delete(n.peers, id)
	}
	n.peersChangedLocked()
}

// PeersChanged implements fabric.PeerWatcher.
func (n *nicT) PeersChanged() <-chan struct{} {
	n.peerMu.RLock()
	defer n.peerMu.RUnlock()
	return n.peersCh
}

// up reports whether p's node state says alive (a closed node says so
// before it unlinks anything).
func (p *peer) up() bool {
	if p.down.Load() || !p.m.acquire() {
		return false
	}
	defer p.m.release()
	return u32(p.m.b, nOffState).Load() == nodeAlive
}

// markDown takes p out of the peer table and releases its mappings.
func (n *nicT) markDown(p *peer) {
	n.peerMu.Lock()
	if n.peers[p.id] == p {
		delete(n.peers, p.id)
		n.gone[p.id] = true
		n.peersChangedLocked()
	}
	n.peerMu.Unlock()
	n.dropPeer(p)
}

// dropPeer releases p's mappings and wakes this NIC's senders parked on
// its VPIDs' space bells (space.go), which then see it down.
func (n *nicT) dropPeer(p *peer) {
	p.drop()
	n.wakeParked(nil, p)
}

// isDead reports whether this NIC knows node id to be down.
func (n *nicT) isDead(id fabric.NodeID) bool {
	if id == n.node {
		return false
	}
	n.peerMu.RLock()
	defer n.peerMu.RUnlock()
	return n.gone[id] && n.peers[id] == nil
}

// probe checks one peer's liveness: its node state word and its lock. On
// death it reclaims the peer's files (holding the lock) and marks it down.
func (n *nicT) probe(p *peer) bool {
	// p.mu keeps drop from closing p.f under the flock.
	p.mu.Lock()
	if p.dropped.Load() {
		p.mu.Unlock()
		return false
	}
	ok, err := sys.TryLock(p.f, true)
	if ok {
		n.reclaimLocked(p.f, n.nodePath(p.id), p.id, p.inc)
		n.epoch.Add(1)
	}
	p.mu.Unlock()
	if (err != nil || !ok) && p.up() {
		return true
	}
	n.log.Info("shm: peer down", "peer", p.id)
	n.markDown(p)
	return false
}

// startMonitor starts the NIC's liveness goroutines (Open, Attach):
// the monitor, and the watcher of the fabric directory's close events
// when inotify is available. stopMonitor stops them.
func (n *nicT) startMonitor() {
	n.probeDue.Store(true) // the first period probes the peers found so far
	if f, err := sys.WatchCloses(n.dir); err == nil {
		n.closes = f
		n.wg.Add(1)
		go n.watchCloses()
	} else {
		n.log.Debug("shm: no close events, probing peers every period", "err", err)
	}
	n.wg.Add(1)
	go n.monitor()
}

// stopMonitor stops the goroutines of startMonitor and waits for them
// (Close, Detach).
func (n *nicT) stopMonitor() {
	close(n.stop)
	if n.closes != nil {
		n.closes.Close() // ends watchCloses's Read
	}
	n.wg.Wait()
}

// watchCloses turns close events of this fabric's files into probe
// rounds: a node's files close when its process ends, however it ends,
// so an idle monitor need not probe every peer each period. It returns
// when the watch file is closed.
func (n *nicT) watchCloses() {
	defer n.wg.Done()
	prefix := []byte("exn-" + n.fab + "-")
	buf := make([]byte, 64*sys.CloseEventSize)
	for {
		k, err := n.closes.Read(buf)
		if err != nil {
			return
		}
		due := false
		sys.CloseEventNames(buf[:k], func(name []byte, lost bool) {
			due = due || lost || bytes.HasPrefix(name, prefix)
		})
		if due {
			n.scanDue.Store(true)
			n.probeDue.Store(true)
			select {
			case n.hurry <- struct{}{}:
			default:
			}
		}
	}
}

// monitor is the NIC's liveness loop; see the top of nic.go.
func (n *nicT) monitor() {
	defer n.wg.Done()
	t := time.NewTimer(idleLivenessPeriod)
	defer t.Stop()
	var ps []*peer
	var last time.Time
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		case <-n.hurry:
			if since := time.Since(last); since < livenessPeriod {
				t.Reset(livenessPeriod - since)
				continue
			}
		}
		last = time.Now()
		n.runMonitor(&ps)
		if n.blocked.Load() > 0 {
			t.Reset(livenessPeriod)
		} else {
			t.Reset(idleLivenessPeriod)
		}
	}
}

// runMonitor is one monitor period: rescan if needed, probe every peer
// if needed, run the hook. ps is scratch space kept across periods.
func (n *nicT) runMonitor(ps *[]*peer) {
	n.scan(false)
	if n.probeNeeded() {
		n.probeAll(ps)
	}
	if n.hook != nil {
		n.hook()
	}
}

// probeNeeded reports whether a monitor period must probe every peer's
// lock: when a peer may have died (a close event in the fabric's
// directory), when a sender is blocked on a full mailbox (it must learn
// of a dead peer within livenessPeriod), or always without close
// events. An idle node with a watcher so costs the same beside 2 peers
// as beside 32 (docs/wakeup.md, "Idle").
func (n *nicT) probeNeeded() bool {
	due := n.probeDue.Swap(false)
	return n.closes == nil || n.blocked.Load() > 0 || due
}

// probeAll probes every peer not yet down; ps is scratch space kept
// across periods.
func (n *nicT) probeAll(ps *[]*peer) {
	n.wc.probeRounds.Add(1)
	*ps = (*ps)[:0]
	n.peerMu.RLock()
	for _, p := range n.peers {
		*ps = append(*ps, p)
	}
	n.peerMu.RUnlock()
	for _, p := range *ps {
		if !p.down.Load() {
			n.probe(p)
		}
	}
}

// scan rediscovers peers if the fabric epoch moved, or force, or the
// watcher saw an event of the fabric's files (without a watcher: the last
// scan is older than discoveryPeriod).
func (n *nicT) scan(force bool) {
	e := n.epoch.Load()
	n.peerMu.RLock()
	// With a watcher, its events stand in for the discoveryPeriod
	// backstop: a directory read costs in proportion to the fabric's
	// files, so a periodic one grew an idle node's cost with its peers.
	fresh := e == n.seenEpoch && (n.closes != nil || time.Since(n.lastScan) < discoveryPeriod)
	n.peerMu.RUnlock()
	if fresh && !n.scanDue.Swap(false) && !force {
		return
	}
	ents, err := os.ReadDir(n.dir)
	if err != nil {
		n.faults.Warn("shm: scan", "err", err)
		return
	}
	for _, ent := range ents {
		id, ok := n.parseNodeName(ent.Name())
		if !ok || id == n.node {
			continue
		}
		n.getPeer(id) //nolint:errcheck // a node that is not up is simply not a peer
	}
	n.peerMu.Lock()
	moved := e != n.seenEpoch
	n.seenEpoch, n.lastScan = e, time.Now()
	n.peerMu.Unlock()
	if moved || force {
		// A node joined or left: probe every peer once, the ones just
		// found included (a node killed before this scan looks up until
		// its lock is probed).
		n.probeDue.Store(true)
	}
}

func (n *nicT) Peers() []fabric.NodeID {
	if n.closed.Load() {
		return nil
	}
	n.scan(false)
	n.peerMu.RLock()
	out := make([]fabric.NodeID, 0, len(n.peers))
	for id, p := range n.peers {
		if !p.down.Load() {
			out = append(out, id)
		}
	}
	n.peerMu.RUnlock()
	slices.Sort(out)
	return out
}

func (n *nicT) Alive(id fabric.NodeID) error {
	if id == n.node {
		if n.closed.Load() {
			return fmt.Errorf("shm: node %d closed: %w", id, fabric.ErrPeerDown)
		}
		return nil
	}
	p, err := n.getPeer(id)
	if err != nil {
		return err
	}
	if !n.probe(p) {
		return fmt.Errorf("shm: node %d: %w", id, fabric.ErrPeerDown)
	}
	return nil
}

// vpid returns an acquired view of VPID v's file on p; the caller releases
// it with vf.m.release(). ErrUnknownNode if v is not open there.
func (n *nicT) vpid(p *peer, v fabric.VPID) (*vfile, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down.Load() {
		return nil, fmt.Errorf("shm: node %d: %w", p.id, fabric.ErrPeerDown)
	}
	if vf := p.vpids[v]; vf != nil {
		if vf.state.Load() == vpidOpen && vf.m.acquire() {
			return vf, nil
		}
		vf.m.release()
		p.vpids[v] = nil
	}
	path := n.vpidPath(p.id, p.inc, v)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if !p.self && !p.up() {
				return nil, fmt.Errorf("shm: node %d: %w", p.id, fabric.ErrPeerDown)
			}
			return nil, fmt.Errorf("shm: %d:%d not open: %w", p.id, v, fabric.ErrUnknownNode)
		}
		return nil, fmt.Errorf("shm: open %d:%d: %w", p.id, v, err)
	}
	defer f.Close()
	sz, err := sys.FileSize(f)
	if err != nil {
		return nil, err
	}
	if sz < vOffMailbox {
		n.ctr.Corrupt.Add(1)
		return nil, fmt.Errorf("shm: %d:%d file %d bytes: %w", p.id, v, sz, fabric.ErrInvalid)
	}
	var hb [vOffMailbox]byte
	if _, err := f.ReadAt(hb[:], 0); err != nil {
		return nil, fmt.Errorf("shm: read %d:%d header: %w", p.id, v, err)
	}
	h, err := decodeVPIDHeader(hb[:], fabric.Addr{Node: p.id, VPID: v}, sz)
	if err != nil {
		n.ctr.Corrupt.Add(1)
		return nil, err
	}
	b, err := sys.MapShared(f, vpidFileSize(h.Slots, h.Depth))
	if err != nil {
		return nil, err
	}
	vf := newVFile(newMapping(b), h)
	vf.wc = &n.wc
	if h.Bell {
		vf.bellPath = path + ".bell"
		vf.spacePath = path + ".space"
	}
	vf.m.acquire()
	p.vpids[v] = vf
	return vf, nil
}

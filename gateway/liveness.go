package gateway

// Liveness: a watcher of the fabric's peer set. At every change the NIC
// announces (fabric.PeerWatcher: fabric/shm, fabric/fabnet), or every LivenessInterval
// for a NIC that cannot announce them, it compares nic.Peers() with the
// set it saw last. A peer that left is
// "down": its learned neighbour entries are removed at once (so EXT-DS
// and `exnctl neighbors` stop routing to it; the kernel's own ARP cache
// times out by itself, and frames towards the dead node are dropped and
// counted by the engine as peer-down), it is logged once and counted. A
// peer that (re)appears is logged and counted as up. Learned entries of a
// node that is not up are also swept whenever the table learned something
// new, so an ARP frame of the dead node still queued in a mailbox cannot
// bring its entry back.
//
// The counters are served by the control operation "liveness" (see
// LivenessStats); `exnctl stats` and /metrics have no hook for a part's
// own counters yet.
//
// Rendezvous transmit slots advertised to the dead node are freed by the
// engine's own housekeeping, and EXT-DS connections to it get an error
// from the extds Device's own liveness check: neither needs this part.

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/exn-project/exn/arp"
	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/fabric"
)

// LivenessInterval is how often the liveness part polls the peer set of
// a NIC that cannot announce its changes (fabric/ofi, fabric/mem): 200
// ms, so a peer's death shows here within about 0.2 s of the fabric
// noticing it (docs/wakeup.md). A fabric.PeerWatcher (fabric/shm,
// fabric/fabnet) is not polled at all.
var LivenessInterval = 200 * time.Millisecond

// LivenessStats is the reply to the control operation "liveness".
type LivenessStats struct {
	// Up lists the peers up at the last poll, sorted.
	Up []fabric.NodeID `json:"up"`
	// PeerDown counts up→down transitions seen (a peer that died, closed
	// or became unreachable).
	PeerDown uint64 `json:"peer_down_total"`
	// PeerUp counts peers that appeared after the first poll (joins and
	// rejoins).
	PeerUp uint64 `json:"peer_up_total"`
	// Invalidated counts learned neighbour entries removed because their
	// node was down.
	Invalidated uint64 `json:"neighbors_invalidated_total"`
	// Peers is per peer ever seen: whether it is up, since when (seconds
	// ago), and how often it went down.
	Peers []PeerLiveness `json:"peers"`
}

// PeerLiveness is one peer's row in LivenessStats.
type PeerLiveness struct {
	Node         fabric.NodeID `json:"node"`
	Up           bool          `json:"up"`
	SinceSeconds float64       `json:"since_seconds"`
	Downs        uint64        `json:"downs"`
}

type peerState struct {
	up    bool
	since time.Time
	downs uint64
}

// liveness is the watcher. Its goroutine owns the poll; mu guards what
// the control operation reads.
type liveness struct {
	nic      fabric.NIC
	table    *arp.Table
	self     fabric.NodeID
	log      *slog.Logger
	interval time.Duration

	mu          sync.Mutex
	peers       map[fabric.NodeID]*peerState
	up          []fabric.NodeID
	downs, ups  uint64
	invalidated uint64

	// goroutine only
	learnSeen uint64 // arp Learned+Updated at the last sweep
	first     bool

	stop chan struct{}
	done chan struct{}
}

func newLiveness(nic fabric.NIC, table *arp.Table, self fabric.NodeID, log *slog.Logger, interval time.Duration) *liveness {
	return &liveness{nic: nic, table: table, self: self, log: log, interval: interval,
		peers: map[fabric.NodeID]*peerState{}, first: true,
		stop: make(chan struct{}), done: make(chan struct{})}
}

// startLiveness is the part "liveness" (parts.go).
func startLiveness(d *Daemon) (started, error) {
	l := newLiveness(d.nic, d.arp, d.cfg.Node, d.log.With("part", "liveness"), LivenessInterval)
	l.poll() // the initial peer set, before the control socket serves it
	go l.run()
	ops := map[string]control.HandlerFunc{"liveness": func(_ context.Context, args []string) (any, error) {
		if len(args) != 0 {
			return nil, fmt.Errorf("takes no arguments, have %d", len(args))
		}
		return l.Stats(), nil
	}}
	return started{close: l.Close, ops: ops}, nil
}

func (l *liveness) run() {
	defer close(l.done)
	if w, ok := l.nic.(fabric.PeerWatcher); ok {
		// Event driven (fabric/shm, fabric/fabnet): no timer at all; the fabric's own
		// liveness protocol bounds how late a change shows.
		ch := w.PeersChanged()
		// A change between startLiveness's first poll and this channel
		// would otherwise go unseen until the next one.
		l.poll()
		for {
			select {
			case <-l.stop:
				return
			case <-ch:
				ch = w.PeersChanged() // before Peers: no change is missed
				l.poll()
			}
		}
	}
	every(l.stop, l.interval, l.poll)
}

// every calls fn every d until stop is closed: the loop of a goroutine
// whose owner closes stop and waits for it.
func every(stop <-chan struct{}, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			fn()
		}
	}
}

// Close stops the goroutine and waits for it. It is idempotent.
func (l *liveness) Close() error {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
	return nil
}

// poll compares the fabric's peer set with the last one.
func (l *liveness) poll() {
	now := time.Now()
	cur := l.nic.Peers()
	isUp := make(map[fabric.NodeID]bool, len(cur))
	for _, id := range cur {
		if id != l.self {
			isUp[id] = true
		}
	}
	var wentDown []fabric.NodeID
	l.mu.Lock()
	for id, p := range l.peers {
		if p.up && !isUp[id] {
			p.up, p.since = false, now
			p.downs++
			l.downs++
			wentDown = append(wentDown, id)
		}
	}
	for id := range isUp {
		p := l.peers[id]
		if p == nil {
			p = &peerState{}
			l.peers[id] = p
		}
		if !p.up {
			p.up, p.since = true, now
			if !l.first {
				l.ups++
				l.log.Info("fabric peer up", "node", id, "rejoin", p.downs > 0)
			}
		}
	}
	l.up = slices.Sorted(maps.Keys(isUp))
	l.first = false
	l.mu.Unlock()

	removed := 0
	for _, id := range wentDown {
		n := l.table.InvalidateNode(id)
		removed += n
		l.log.Warn("fabric peer down: neighbour entries invalidated", "node", id, "entries", n)
	}
	// Sweep learned entries of nodes not up when the table learned
	// something since the last sweep (a frame of a dead node that was
	// still queued), or a node just went down.
	st := l.table.Stats()
	if learn := st.Learned + st.Updated; learn != l.learnSeen || len(wentDown) > 0 {
		l.learnSeen = learn
		for _, e := range l.table.Neighbors() {
			// Alive, not isUp: a node that came up since Peers() keeps
			// the entry it was just learned by.
			if e.Source == arp.Learned && e.Node != l.self && l.nic.Alive(e.Node) != nil {
				removed += l.table.InvalidateNode(e.Node)
			}
		}
	}
	if removed > 0 {
		l.mu.Lock()
		l.invalidated += uint64(removed)
		l.mu.Unlock()
	}
}

// Stats is a snapshot of the counters and the peer set.
func (l *liveness) Stats() LivenessStats {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	s := LivenessStats{Up: slices.Clone(l.up), PeerDown: l.downs, PeerUp: l.ups, Invalidated: l.invalidated,
		Peers: make([]PeerLiveness, 0, len(l.peers))}
	if s.Up == nil {
		s.Up = []fabric.NodeID{}
	}
	for _, id := range slices.Sorted(maps.Keys(l.peers)) {
		p := l.peers[id]
		s.Peers = append(s.Peers, PeerLiveness{Node: id, Up: p.up, Downs: p.downs,
			SinceSeconds: float64(now.Sub(p.since).Milliseconds()) / 1000})
	}
	return s
}

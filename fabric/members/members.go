package members

import (
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/exn-project/exn/fabric"
)

// Config configures one node's membership.
type Config struct {
	// Node is this node's fabric ID; it is also its member name.
	Node fabric.NodeID
	// Transport carries the packets and streams (required). Members owns
	// it from New on: Close shuts it down.
	Transport memberlist.Transport
	// Profile tunes the failure detector; the zero value means Fabric.
	Profile Profile
	// Logger receives memberlist's log at debug level; nil discards it.
	Logger *slog.Logger
	// OnChange, if set, is called when a node becomes alive (joined) or
	// not (dead or left), from memberlist's goroutines, one call at a
	// time and in the order the changes happened. It must not block or
	// call back into Members except for Alive and Meta.
	OnChange func(node fabric.NodeID, alive bool)
	// Meta, if set, is this node's metadata (at most
	// memberlist.MetaMaxSize bytes): what it can do, for the others to
	// read with Meta. Fixed for the node's life.
	Meta []byte
}

// Stats counts membership changes this node saw.
type Stats struct {
	Joins  uint64 // nodes that became alive (this node's own join included)
	Leaves uint64 // nodes declared dead or that left
	Alive  int    // nodes alive now, this one included
}

// Members is one node's view of the cluster. Its methods are safe for
// concurrent use.
type Members struct {
	self     fabric.NodeID
	onChange func(fabric.NodeID, bool)
	ml       *memberlist.Memberlist

	mu    sync.Mutex
	alive map[fabric.NodeID][]byte // the alive nodes and their metadata
	st    Stats

	stop    sync.Mutex // serialises Leave and Close
	stopped bool
}

// New starts this node's membership with itself as the only member; Join
// adds the others.
func New(cfg Config) (*Members, error) {
	if cfg.Transport == nil {
		return nil, fmt.Errorf("members: no transport: %w", fabric.ErrInvalid)
	}
	p := cfg.Profile
	if p == (Profile{}) {
		p = Fabric
	}
	if len(cfg.Meta) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("members: %d bytes of metadata > %d: %w", len(cfg.Meta), memberlist.MetaMaxSize, fabric.ErrInvalid)
	}
	m := &Members{self: cfg.Node, onChange: cfg.OnChange, alive: make(map[fabric.NodeID][]byte)}
	c := memberlist.DefaultLANConfig()
	c.Name = Name(cfg.Node)
	c.Transport = cfg.Transport
	c.Events = events{m}
	if cfg.Meta != nil {
		c.Delegate = metaDelegate(slices.Clone(cfg.Meta))
	}
	p.apply(c)
	if cfg.Logger != nil {
		c.Logger = slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug)
	} else {
		c.Logger = log.New(io.Discard, "", 0)
	}
	ml, err := memberlist.Create(c)
	if err != nil {
		return nil, fmt.Errorf("members: node %d: %w", cfg.Node, err)
	}
	m.ml = ml
	return m, nil
}

// Name is the member name of node id.
func Name(id fabric.NodeID) string { return strconv.FormatUint(uint64(id), 10) }

// Join contacts the seeds (transport addresses) and merges their view;
// it returns how many answered. One answer is enough.
func (m *Members) Join(seeds []string) (int, error) {
	n, err := m.ml.Join(seeds)
	if err != nil && n == 0 {
		return 0, fmt.Errorf("members: join: %w", err)
	}
	return n, nil
}

// Alive reports whether node id is a live member (this node is while
// it runs).
func (m *Members) Alive(id fabric.NodeID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.alive[id]
	return ok
}

// Peers lists the live members other than this node, sorted.
func (m *Members) Peers() []fabric.NodeID {
	m.mu.Lock()
	out := make([]fabric.NodeID, 0, len(m.alive))
	for id := range m.alive {
		if id != m.self {
			out = append(out, id)
		}
	}
	m.mu.Unlock()
	slices.Sort(out)
	return out
}

// Stats returns the counters.
func (m *Members) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.st
	s.Alive = len(m.alive)
	return s
}

// Leave tells the others this node is going (they mark it left at once
// instead of suspecting it), waiting at most timeout for the message to
// spread, then stops as Close. After Close it does nothing.
func (m *Members) Leave(timeout time.Duration) error {
	m.stop.Lock()
	defer m.stop.Unlock()
	if m.stopped {
		return nil
	}
	m.stopped = true
	// memberlist panics on a Leave after its Shutdown: stop serialises
	// the two.
	return errors.Join(m.ml.Leave(timeout), m.ml.Shutdown())
}

// Close stops this node's membership without a word to the others, as a
// crash would: they find it dead by probing. It shuts the transport down.
// It is idempotent.
func (m *Members) Close() error {
	m.stop.Lock()
	defer m.stop.Unlock()
	if m.stopped {
		return nil
	}
	m.stopped = true
	return m.ml.Shutdown()
}

// events turns memberlist's events into fabric node IDs.
type events struct{ m *Members }

func (e events) NotifyJoin(n *memberlist.Node)   { e.m.change(n, true) }
func (e events) NotifyLeave(n *memberlist.Node)  { e.m.change(n, false) }
func (e events) NotifyUpdate(n *memberlist.Node) { e.m.updateMeta(n) }

// Meta returns what node id advertised (Config.Meta) while it is alive;
// false for a node not alive. A node that advertised nothing (an older
// exnd) gives an empty slice.
func (m *Members) Meta(id fabric.NodeID) ([]byte, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.alive[id]
	return b, ok
}

func (m *Members) updateMeta(n *memberlist.Node) {
	v, err := strconv.ParseUint(n.Name, 10, 16)
	if err != nil {
		return
	}
	m.mu.Lock()
	if _, ok := m.alive[fabric.NodeID(v)]; ok {
		m.alive[fabric.NodeID(v)] = slices.Clone(n.Meta)
	}
	m.mu.Unlock()
}

// metaDelegate is memberlist.Delegate for a node that only advertises
// metadata: no user messages, broadcasts or state of its own.
type metaDelegate []byte

func (d metaDelegate) NodeMeta(limit int) []byte {
	if len(d) > limit {
		return nil
	}
	return d
}
func (metaDelegate) NotifyMsg([]byte)                {}
func (metaDelegate) GetBroadcasts(int, int) [][]byte { return nil }
func (metaDelegate) LocalState(bool) []byte          { return nil }
func (metaDelegate) MergeRemoteState([]byte, bool)   {}

func (m *Members) change(n *memberlist.Node, alive bool) {
	v, err := strconv.ParseUint(n.Name, 10, 16)
	if err != nil {
		return // not a fabric node: not ours to track
	}
	id := fabric.NodeID(v)
	m.mu.Lock()
	if _, was := m.alive[id]; was == alive {
		m.mu.Unlock()
		return
	}
	if alive {
		m.alive[id] = slices.Clone(n.Meta)
		m.st.Joins++
	} else {
		delete(m.alive, id)
		m.st.Leaves++
	}
	m.mu.Unlock()
	if m.onChange != nil {
		m.onChange(id, alive)
	}
}

// JoinLoop joins the cluster through up to joinSeeds random seeds at a
// time until one answers, somebody joined through this node, or down
// closes, backing off from joinBackoffMin to joinBackoffMax: the first
// node up waits for the others. It returns at once without seeds.
func (m *Members) JoinLoop(seeds []string, down <-chan struct{}) {
	seeds = slices.Clone(seeds)
	if len(seeds) == 0 {
		return
	}
	backoff := joinBackoffMin
	for {
		rand.Shuffle(len(seeds), func(i, j int) { seeds[i], seeds[j] = seeds[j], seeds[i] })
		if k, err := m.Join(seeds[:min(joinSeeds, len(seeds))]); err == nil && k > 0 {
			return
		}
		if len(m.Peers()) > 0 {
			return
		}
		select {
		case <-time.After(backoff):
		case <-down:
			return
		}
		backoff = min(2*backoff, joinBackoffMax)
	}
}

const (
	// joinSeeds is how many random seeds one join attempt asks: any one
	// that answers is enough, and asking all would cost a full-state
	// exchange with each.
	joinSeeds = 3
	// joinBackoffMin and joinBackoffMax bound the wait between join
	// attempts while no seed answered.
	joinBackoffMin = 20 * time.Millisecond
	joinBackoffMax = 5 * time.Second
)

// Report is a backend's membership counters in one value (a backend's
// MembershipStats; the daemon turns it into metrics).
type Report struct {
	Transport TransportStats
	Members   Stats
	// DeclaredDead counts nodes membership declared dead or saw leave.
	DeclaredDead uint64
	// FromDead counts fabric packets dropped because they came from a
	// node membership had declared dead (it comes back through
	// membership).
	FromDead uint64
}

package mem

import (
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/exn-project/exn/fabric"
)

// DefaultMailboxSlots is the default VELO mailbox size per VPID: 1024
// 128-byte slots, 128 KiB. It holds 16 full NAPI budgets (64 messages), so
// a receiver that falls one poll behind never back-pressures its senders,
// while 256 VPIDs on a node still bound mailbox memory to 32 MiB.
const DefaultMailboxSlots = 1024

type options struct {
	slots       int
	notifyDepth int
	log         *slog.Logger
}

// Option configures a Cluster.
type Option func(*options)

// WithMailboxSlots sets the number of VELO slots per VPID mailbox (n >= 1;
// smaller values are ignored). Tests use small mailboxes to exercise
// back-pressure.
func WithMailboxSlots(n int) Option {
	return func(o *options) {
		if n >= 1 {
			o.slots = n
		}
	}
}

// WithNotifyDepth sets the notification queue depth per VPID (n >= 1;
// smaller values are ignored). The contract promises at least
// fabric.DefaultNotifyDepth; smaller depths are for overflow tests.
func WithNotifyDepth(n int) Option {
	return func(o *options) {
		if n >= 1 {
			o.notifyDepth = n
		}
	}
}

// WithLogger sets the logger for node up/down events and rate-limited fault
// reports. The default discards.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.log = l
		}
	}
}

// Cluster is one in-process fabric. Its NICs see each other and nothing
// else. It is safe for concurrent use.
type Cluster struct {
	opts options

	// live is the copy-on-write table of up nodes, read without locks on
	// every Send and Post. It is replaced under mu.
	live atomic.Pointer[liveTable]

	mu   sync.Mutex
	seen map[fabric.NodeID]bool // nodes that were ever up; guarded by mu
}

// liveTable is an immutable snapshot of the up nodes.
type liveTable struct {
	byID map[fabric.NodeID]*nic
	list []*nic // sorted by node ID, for multicast fan-out and Peers
}

// NewCluster returns an empty fabric.
func NewCluster(opts ...Option) *Cluster {
	c := &Cluster{
		opts: options{
			slots:       DefaultMailboxSlots,
			notifyDepth: fabric.DefaultNotifyDepth,
			log:         slog.New(slog.NewTextHandler(io.Discard, nil)),
		},
		seen: make(map[fabric.NodeID]bool),
	}
	for _, o := range opts {
		o(&c.opts)
	}
	c.live.Store(&liveTable{byID: map[fabric.NodeID]*nic{}})
	return c
}

// NewNIC brings node up on the cluster. It fails with fabric.ErrInUse if a
// NIC with that ID is up; the ID of a closed NIC may be reused (a restarted
// peer).
func (c *Cluster) NewNIC(node fabric.NodeID) (fabric.NIC, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.live.Load()
	if _, ok := old.byID[node]; ok {
		return nil, fmt.Errorf("mem: node %d: %w", node, fabric.ErrInUse)
	}
	n := newNIC(c, node)
	c.seen[node] = true
	c.replaceLocked(old, n, nil)
	c.opts.log.Debug("fabric node up", "node", node)
	return n, nil
}

// replaceLocked publishes a new live table with add added and del removed.
func (c *Cluster) replaceLocked(old *liveTable, add, del *nic) {
	t := &liveTable{byID: make(map[fabric.NodeID]*nic, len(old.byID)+1)}
	for id, n := range old.byID {
		if n != del {
			t.byID[id] = n
		}
	}
	if add != nil {
		t.byID[add.id] = add
	}
	for _, n := range t.byID {
		t.list = append(t.list, n)
	}
	sort.Slice(t.list, func(i, j int) bool { return t.list[i].id < t.list[j].id })
	c.live.Store(t)
}

// remove takes n off the live table (NIC.Close).
func (c *Cluster) remove(n *nic) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.live.Load()
	if old.byID[n.id] == n {
		c.replaceLocked(old, nil, n)
	}
	c.opts.log.Debug("fabric node down", "node", n.id)
}

// lookup returns the live NIC for id, or the error a caller of that node
// gets: ErrPeerDown if it was up before, else ErrUnknownNode.
func (c *Cluster) lookup(id fabric.NodeID) (*nic, error) {
	if n := c.live.Load().byID[id]; n != nil {
		return n, nil
	}
	c.mu.Lock()
	seen := c.seen[id]
	c.mu.Unlock()
	if seen {
		return nil, fmt.Errorf("mem: node %d: %w", id, fabric.ErrPeerDown)
	}
	return nil, fmt.Errorf("mem: node %d: %w", id, fabric.ErrUnknownNode)
}

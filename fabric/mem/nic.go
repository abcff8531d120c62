package mem

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/internal/localq"
	"github.com/exn-project/exn/internal/ratelog"
)

// nic is one node. Endpoints are found by VPID through an atomic table, so
// the data path takes no NIC-wide lock.
type nic struct {
	c   *Cluster
	id  fabric.NodeID
	ctr fabric.Counters

	eps    localq.Endpoints[endpoint] // open VPIDs; written under mu
	groups localq.Groups              // multicast membership
	down   chan struct{}              // closed by Close: wakes blocked senders
	closed atomic.Bool

	mu sync.Mutex // serialises Open, Close

	regs localq.Table[*endpoint, *region] // by NLA region index

	faults ratelog.Faults // per-message faults, at most one line per localq.FaultLogInterval
}

func newNIC(c *Cluster, id fabric.NodeID) *nic {
	n := &nic{c: c, id: id, down: make(chan struct{})}
	n.groups.Init("mem", &n.ctr, &n.closed)
	n.regs.Init()
	n.faults.Init(c.opts.log, localq.FaultLogInterval, "node", id)
	return n
}

func (n *nic) Node() fabric.NodeID { return n.id }

func (n *nic) Open(v fabric.VPID) (fabric.Endpoint, error) {
	return localq.Open(&n.eps, &n.mu, &n.closed, &n.ctr, "mem", n.id, v, func() *endpoint { return newEndpoint(n, v) })
}

func (n *nic) Join(g fabric.Group) error { return n.groups.Join(g) }

func (n *nic) Leave(g fabric.Group) error { return n.groups.Leave(g) }

func (n *nic) Peers() []fabric.NodeID {
	t := n.c.live.Load()
	out := make([]fabric.NodeID, 0, len(t.list))
	for _, p := range t.list {
		if p != n {
			out = append(out, p.id)
		}
	}
	return out
}

func (n *nic) Alive(id fabric.NodeID) error {
	if id == n.id && n.closed.Load() {
		return fmt.Errorf("mem: alive: %w", net.ErrClosed)
	}
	_, err := n.c.lookup(id)
	return err
}

func (n *nic) Stats() fabric.Stats { return n.ctr.Snapshot() }

// Close takes the node down: blocked senders to it return ErrPeerDown,
// every endpoint closes (waiting for RMA copies in flight on its regions),
// and the node ID becomes free for a new NIC.
func (n *nic) Close() error {
	if !localq.Shut(&n.mu, &n.closed, func() { close(n.down) }) {
		return nil
	}
	n.eps.Each(func(ep *endpoint) { ep.Close() })
	n.c.remove(n)
	return nil
}

// region is registered memory. mu is held for reading during every RMA
// copy that touches buf and for writing by Deregister, so no copy runs
// against a deregistered region.
type region struct {
	node  fabric.NodeID
	idx   uint32
	owner *endpoint
	buf   []byte

	mu   sync.RWMutex
	dead bool // guarded by mu
}

// less orders regions for multi-region locking.
func (r *region) less(o *region) bool {
	if r.node != o.node {
		return r.node < o.node
	}
	return r.idx < o.idx
}

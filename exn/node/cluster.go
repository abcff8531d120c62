package node

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/mem"
)

// DefaultClusterPrefix is the subnet of an in-process cluster: node i
// (1-based) gets 10.88.0.i/24.
var DefaultClusterPrefix = netip.MustParsePrefix("10.88.0.0/24")

// ClusterOption configures NewCluster.
type ClusterOption func(*clusterOptions)

type clusterOptions struct {
	prefix  netip.Prefix
	fabric  []mem.Option
	configs []func(*Config)
}

// WithPrefix sets the cluster subnet (IPv4); node i gets host i in it.
func WithPrefix(p netip.Prefix) ClusterOption {
	return func(o *clusterOptions) { o.prefix = p }
}

// WithFabricOptions passes options to the mem fabric.
func WithFabricOptions(opts ...mem.Option) ClusterOption {
	return func(o *clusterOptions) { o.fabric = append(o.fabric, opts...) }
}

// WithConfig edits every node's Config before the node starts (NIC and
// Addr are already set; fn may change them).
func WithConfig(fn func(*Config)) ClusterOption {
	return func(o *clusterOptions) { o.configs = append(o.configs, fn) }
}

// Cluster is an in-process cluster: one mem fabric and a Node per member,
// each on its own NIC. Its methods are safe for concurrent use.
type Cluster struct {
	opts clusterOptions
	fab  *mem.Cluster

	mu     sync.Mutex
	nodes  []*Node
	nics   []fabric.NIC
	closed bool
}

// NewCluster starts n nodes with node IDs 1..n and addresses host 1..n of
// the cluster prefix (default 10.88.0.0/24). On error it stops what it
// started.
func NewCluster(n int, opts ...ClusterOption) (*Cluster, error) {
	c := &Cluster{opts: clusterOptions{prefix: DefaultClusterPrefix}}
	for _, o := range opts {
		o(&c.opts)
	}
	p := c.opts.prefix
	if !p.IsValid() || !p.Addr().Is4() {
		return nil, fmt.Errorf("node: cluster prefix %q: want an IPv4 CIDR", p.String())
	}
	p = p.Masked()
	c.opts.prefix = p
	if max := 1<<(32-p.Bits()) - 2; n < 1 || n > max || n > 0xFFFF {
		return nil, fmt.Errorf("node: cluster of %d nodes: want 1..%d for %s", n, min(max, 0xFFFF), p)
	}
	c.fab = mem.NewCluster(c.opts.fabric...)
	for i := 1; i <= n; i++ {
		addr, err := c.hostAddr(i)
		if err == nil {
			_, err = c.AddNode(fabric.NodeID(i), addr)
		}
		if err != nil {
			return nil, errors.Join(err, c.Close())
		}
	}
	return c, nil
}

// hostAddr returns host i of the cluster prefix, with the prefix length.
func (c *Cluster) hostAddr(i int) (netip.Prefix, error) {
	a := c.opts.prefix.Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += uint32(i)
	ip := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	if !c.opts.prefix.Contains(ip) {
		return netip.Prefix{}, fmt.Errorf("node: host %d outside %s", i, c.opts.prefix)
	}
	return netip.PrefixFrom(ip, c.opts.prefix.Bits()), nil
}

// AddNode starts one more node with the given ID and address on the
// cluster's fabric. A node ID already on the fabric is an error
// (fabric.ErrInUse).
func (c *Cluster) AddNode(id fabric.NodeID, addr netip.Prefix) (*Node, error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("node: cluster closed")
	}
	nic, err := c.fab.NewNIC(id)
	if err != nil {
		return nil, fmt.Errorf("node: cluster: node id %d: %w", id, err)
	}
	cfg := Config{NIC: nic, Addr: addr}
	for _, fn := range c.opts.configs {
		fn(&cfg)
	}
	nd, err := New(cfg)
	if err != nil {
		nic.Close()
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.Join(fmt.Errorf("node: cluster closed"), nd.Close(), nic.Close())
	}
	c.nodes = append(c.nodes, nd)
	c.nics = append(c.nics, nic)
	return nd, nil
}

// Nodes returns the running nodes in the order they were added.
func (c *Cluster) Nodes() []*Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Node(nil), c.nodes...)
}

// Node returns the i-th node (0-based, in order of addition), or nil if
// there is no such node (i out of range, or the cluster is closed).
func (c *Cluster) Node(i int) *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i < 0 || i >= len(c.nodes) {
		return nil
	}
	return c.nodes[i]
}

// NIC returns the fabric NIC of the i-th node, or nil if there is no such
// node. Closing it without closing the node simulates the node's crash:
// its peers see it as down.
func (c *Cluster) NIC(i int) fabric.NIC {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i < 0 || i >= len(c.nics) {
		return nil
	}
	return c.nics[i]
}

// Fabric returns the cluster's mem fabric.
func (c *Cluster) Fabric() *mem.Cluster { return c.fab }

// Close closes every node and its NIC, in parallel (a node's Close does
// not wait for its peers). It is idempotent.
func (c *Cluster) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	nodes, nics := c.nodes, c.nics
	c.nodes, c.nics = nil, nil
	c.mu.Unlock()

	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, nd := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = errors.Join(nd.Close(), nics[i].Close())
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

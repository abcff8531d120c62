package extds

// Kernel bypass for application processes (shm fabric).
//
// AttachDevice gives a process other than exnd an EXT-DS Device of its
// own on exnd's node:
//
//	app                                   exnd (control socket)
//	extds-attach PID ───────────────────→ lease a block of 16 VPIDs
//	            ←──── {fabric, node, vpid_base, vpids, token}
//	shm.Attach(token): map the node, open the block's VPIDs itself
//	neighbors ──────────────────────────→ IP → node (the resolver)
//	extds-listen PID BASE PORT ─────────→ exnd's Device answers peers'
//	                                      probes for PORT "listening"
//	... data: app ⇄ fabric ⇄ peer, never through exnd ...
//	extds-detach PID BASE ──────────────→ (Close) lease reclaimed
//
// Probes. A peer learns whether a TCP port has an EXT-DS listener by a
// PROBE to VPID base + (port & 0xF) on the listener's node. Every process
// on a node has a different base, and the prober cannot know which one
// listens, so probes always go to exnd's block (DefaultBaseVPID): an
// attached process registers its listening ports with exnd
// (extds-listen), exnd's Device answers for them, and the rest of the
// handshake runs over the shadow TCP connection, which carries the
// listener's real node and VPID. A Device from NewDevice keeps probing
// its own base (nodes without exnd, tests), so both kinds interoperate
// as long as the node's exnd uses the default block.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/shm"
)

const (
	// resolverTTL: how old the copy of exnd's neighbour table may get
	// before a lookup refreshes it.
	resolverTTL = 2 * time.Second
	// resolverMissEvery: a miss refreshes the table at most this often
	// (a peer just learned by exnd is found within it).
	resolverMissEvery = 100 * time.Millisecond
	// controlTimeout bounds one control call of an attached Device.
	controlTimeout = 5 * time.Second
)

// AttachReply is exnd's answer to "extds-attach PID".
type AttachReply struct {
	Fabric   string        `json:"fabric"` // "shm:NAME"
	Node     fabric.NodeID `json:"node"`
	VPIDBase fabric.VPID   `json:"vpid_base"`
	VPIDs    int           `json:"vpids"`
	Token    string        `json:"token"`
}

// ErrNoBypass: exnd's fabric is not shm, so a process cannot reach it
// directly.
var ErrNoBypass = errors.New("extds: kernel bypass needs the shm fabric")

// AttachDevice returns an EXT-DS Device for this process on the node of
// the exnd serving controlPath: exnd leases it a block of VPIDs, the
// process opens them on the shm fabric itself, and Dial and Listen then
// move data between this process and its peers with no hop through exnd.
// Peer IPs resolve through exnd's neighbour table. opts apply as for
// NewDevice, except that the VPID block is the leased one. Close closes
// the Device and gives the VPIDs back. If exnd dies, the Device's
// connections fail (never hang) and new connections fall back to TCP.
func AttachDevice(ctx context.Context, controlPath string, opts ...Option) (*Device, error) {
	cl, err := control.Dial(ctx, controlPath)
	if err != nil {
		return nil, err
	}
	pid := strconv.Itoa(os.Getpid())
	var g AttachReply
	if err := cl.Call(ctx, &g, "extds-attach", pid); err != nil {
		cl.Close()
		return nil, fmt.Errorf("extds: attach: %w", err)
	}
	base := strconv.Itoa(int(g.VPIDBase))
	detach := func() error {
		c, cancel := context.WithTimeout(context.Background(), controlTimeout)
		defer cancel()
		err := cl.Call(c, nil, "extds-detach", pid, base)
		cl.Close()
		return err
	}
	name, ok := strings.CutPrefix(g.Fabric, "shm:")
	switch {
	case !ok:
		detach()
		return nil, fmt.Errorf("%w (exnd runs %q)", ErrNoBypass, g.Fabric)
	case g.VPIDs < NumVDevs:
		detach()
		return nil, fmt.Errorf("extds: attach: exnd granted %d VPIDs, a Device needs %d", g.VPIDs, NumVDevs)
	}
	att, err := shm.Attach(name, g.Node, shm.Grant{Fabric: name, Node: g.Node, VPIDBase: g.VPIDBase, VPIDs: g.VPIDs, Token: g.Token})
	if err != nil {
		detach()
		return nil, fmt.Errorf("extds: attach: %w", err)
	}
	res := &ctlResolver{cl: cl, self: g.Node}
	hook := func(port uint16) (func(), error) {
		c, cancel := context.WithTimeout(context.Background(), controlTimeout)
		defer cancel()
		p := strconv.Itoa(int(port))
		if err := cl.Call(c, nil, "extds-listen", pid, base, p); err != nil {
			return nil, fmt.Errorf("extds: announce port %d to exnd: %w", port, err)
		}
		return func() {
			c, cancel := context.WithTimeout(context.Background(), controlTimeout)
			defer cancel()
			_ = cl.Call(c, nil, "extds-unlisten", pid, base, p) // after Close: the lease is gone anyway
		}, nil
	}
	var once sync.Once
	var closeErr error
	onClose := func() error {
		once.Do(func() {
			closeErr = errors.Join(att.Close(), detach())
		})
		return closeErr
	}
	all := append([]Option{WithResolver(res)}, opts...)
	all = append(all, func(c *config) {
		c.base, c.probeBase, c.portHook, c.onClose = g.VPIDBase, DefaultBaseVPID, hook, onClose
	})
	dev, err := NewDevice(att, all...)
	if err != nil {
		onClose()
		return nil, err
	}
	return dev, nil
}

// ctlResolver resolves peer IPs through exnd's "neighbors" operation,
// caching the table for resolverTTL and refreshing it on a miss at most
// every resolverMissEvery. This node's own addresses resolve to "not on
// the fabric" (plain loopback TCP), as in exnd.
type ctlResolver struct {
	cl   *control.Client
	self fabric.NodeID

	mu   sync.Mutex
	m    map[netip.Addr]fabric.NodeID
	at   time.Time
	errs int
}

func (r *ctlResolver) Resolve(ip netip.Addr) (fabric.NodeID, bool) {
	ip = ip.Unmap()
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.at) > resolverTTL {
		r.refresh()
	}
	n, ok := r.m[ip]
	if !ok && time.Since(r.at) > resolverMissEvery {
		r.refresh()
		n, ok = r.m[ip]
	}
	if !ok || n == r.self {
		return 0, false
	}
	return n, true
}

// refresh reloads the table; on an error it keeps the old one.
func (r *ctlResolver) refresh() {
	r.at = time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), controlTimeout)
	defer cancel()
	var rows []struct {
		IP   string        `json:"ip"`
		Node fabric.NodeID `json:"node"`
	}
	if err := r.cl.Call(ctx, &rows, "neighbors"); err != nil {
		r.errs++
		return
	}
	m := make(map[netip.Addr]fabric.NodeID, len(rows))
	for _, row := range rows {
		if ip, err := netip.ParseAddr(row.IP); err == nil {
			m[ip.Unmap()] = row.Node
		}
	}
	r.m = m
}

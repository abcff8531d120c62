package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/exn-project/exn/exn"
	"github.com/exn-project/exn/exn/netstack"
	"github.com/exn-project/exn/fabric"
)

// nicID is the stack's only NIC, the netstack counterpart of exn0.
const nicID tcpip.NICID = 1

// closeFlush bounds how long Close waits for the RSTs of aborted
// connections to reach the fabric.
const closeFlush = 200 * time.Millisecond

// Config configures a Node.
type Config struct {
	// NIC is the node's fabric NIC. Required. The Node opens VPID 0
	// (fabric.EthVPID) on it; the NIC itself stays the caller's.
	NIC fabric.NIC
	// Addr is the node's IPv4 address and subnet, e.g. 10.88.0.1/24.
	// Required.
	Addr netip.Prefix
	// Addr6 is an optional IPv6 address and subnet.
	Addr6 netip.Prefix
	// MTU is the IP MTU, netstack.MinMTU..netstack.MaxMTU; 0 means
	// netstack.DefaultMTU (65521, as on exn0).
	MTU int
	// Engine configures the EXT-Eth engine. Its MTU and Logger are taken
	// from this Config when zero; a non-zero Engine.MTU must equal MTU.
	Engine exn.Config
	// Link configures the netstack endpoint beyond MAC and MTU, which the
	// Node sets (TxQueueLen, TxQueueBytes, TxBatch, ChecksumOffload).
	Link netstack.Config
	// TCP holds the TCP settings; zero fields take DefaultTCP's values.
	TCP TCPConfig
	// Logger receives the node's, engine's and endpoint's logs. Nil means
	// slog.Default().
	Logger *slog.Logger
	// External runs the node without an engine of its own: it does not
	// open VPID 0, and the caller moves the frames, pulling outbound ones
	// with Link().ReadFrames and feeding inbound ones to
	// Link().DeliverFrames (exnd's userspace mode, whose daemon owns the
	// engine as it does with a TAP). NIC is still required: it gives the
	// node ID (hence the MAC) and the peers' liveness. Engine() is nil.
	External bool
	// PeerCheck is how often the node asks the fabric whether the peers of
	// its TCP connections are alive; connections to a peer that went down
	// are reset at once instead of waiting for TCP to time out. 0 means
	// DefaultPeerCheck; a negative value turns the check off.
	PeerCheck time.Duration
}

// DefaultPeerCheck is the default Config.PeerCheck.
const DefaultPeerCheck = 100 * time.Millisecond

// BufferRange is a TCP buffer size range in bytes, as Linux's
// tcp_rmem/tcp_wmem triples.
type BufferRange struct{ Min, Default, Max int }

// TCPConfig holds the stack's TCP settings.
type TCPConfig struct {
	// SendBuffer and ReceiveBuffer are the socket buffer ranges. With
	// ModerateReceiveBuffer the receive buffer grows from Default to Max
	// as the connection's bandwidth-delay product demands.
	SendBuffer, ReceiveBuffer BufferRange
	// DisableSACK turns selective acknowledgements off (on by default).
	DisableSACK bool
	// DisableModerateReceiveBuffer turns receive-buffer auto-tuning off.
	DisableModerateReceiveBuffer bool
	// CongestionControl is "cubic" (default) or "reno".
	CongestionControl string
	// MinRTO is the smallest retransmission timeout; 0 keeps gVisor's
	// 200 ms. The fabric never reorders, so loss is only a tx-queue drop.
	MinRTO time.Duration
	// RACK turns on RACK-TLP loss detection (gVisor's default). It is off
	// by default: gVisor's tail-loss probe fires after 2×SRTT with no
	// floor (Linux keeps 10 ms), and SRTT over the fabric is tens of
	// microseconds, so any scheduling hiccup of the receiver made the
	// sender retransmit a 64 KiB segment that was not lost and enter
	// recovery (20-40 spurious retransmits per 20 benchmark transfers,
	// none of them a drop). Without it, loss is found by SACK duplicate
	// ACKs and the RTO, which is all a fabric that never reorders needs.
	RACK bool
}

// DefaultTCP is the TCP tuning a Node uses unless told otherwise. The
// buffers are larger than gVisor's defaults (1 MiB default, 4 MiB max) so
// one flow keeps several 64 KiB segments in flight through the
// rendezvous path while the receiver is busy; see docs/netstack.md for the
// measurements behind them.
var DefaultTCP = TCPConfig{
	SendBuffer:        BufferRange{Min: 4 << 10, Default: 4 << 20, Max: 8 << 20},
	ReceiveBuffer:     BufferRange{Min: 4 << 10, Default: 4 << 20, Max: 8 << 20},
	CongestionControl: "cubic",
}

func (t TCPConfig) withDefaults() (TCPConfig, error) {
	fill := func(r *BufferRange, d BufferRange) {
		if r.Min == 0 {
			r.Min = d.Min
		}
		if r.Default == 0 {
			r.Default = d.Default
		}
		if r.Max == 0 {
			r.Max = d.Max
		}
	}
	fill(&t.SendBuffer, DefaultTCP.SendBuffer)
	fill(&t.ReceiveBuffer, DefaultTCP.ReceiveBuffer)
	if t.CongestionControl == "" {
		t.CongestionControl = DefaultTCP.CongestionControl
	}
	for _, r := range []struct {
		name string
		r    BufferRange
	}{{"send", t.SendBuffer}, {"receive", t.ReceiveBuffer}} {
		if r.r.Min < 1 || r.r.Min > r.r.Default || r.r.Default > r.r.Max {
			return t, fmt.Errorf("tcp %s buffer %d/%d/%d: want 0 < min <= default <= max", r.name, r.r.Min, r.r.Default, r.r.Max)
		}
	}
	if t.CongestionControl != "cubic" && t.CongestionControl != "reno" {
		return t, fmt.Errorf("tcp congestion control %q: want cubic or reno", t.CongestionControl)
	}
	if t.MinRTO < 0 {
		return t, fmt.Errorf("tcp min rto %v < 0", t.MinRTO)
	}
	return t, nil
}

// Node is one userspace exn node: engine, netstack endpoint and gVisor
// stack. Its methods are safe for concurrent use.
type Node struct {
	log    *slog.Logger
	nic    fabric.NIC
	ep     fabric.Endpoint
	eng    *exn.Engine
	link   *netstack.Endpoint
	stack  *stack.Stack
	addr   netip.Prefix
	addr6  netip.Prefix
	mac    net.HardwareAddr
	mtu    int
	tcpCfg TCPConfig

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // the peer watcher

	peerResets atomic.Uint64 // connections reset because their peer died

	mu        sync.Mutex
	closed    bool
	closers   map[closer]struct{} // listeners and packet conns to close
	closeErr  error
	closeDone chan struct{}
}

type closer interface{ Close() error }

// New brings a node up: it validates cfg, opens VPID 0 on cfg.NIC, starts
// the engine and the netstack, and assigns the addresses. On error
// everything it started is stopped again.
func New(cfg Config) (*Node, error) {
	if cfg.NIC == nil {
		return nil, errors.New("node: config: nil NIC")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := checkPrefix(cfg.Addr, false); err != nil {
		return nil, fmt.Errorf("node: addr: %w", err)
	}
	if cfg.Addr6.IsValid() || cfg.Addr6 != (netip.Prefix{}) {
		if err := checkPrefix(cfg.Addr6, true); err != nil {
			return nil, fmt.Errorf("node: addr6: %w", err)
		}
	}
	if cfg.MTU == 0 {
		cfg.MTU = netstack.DefaultMTU
	}
	if cfg.MTU < netstack.MinMTU || cfg.MTU > netstack.MaxMTU {
		return nil, fmt.Errorf("node: mtu %d not in %d..%d (largest frame the fabric link carries: %d bytes)",
			cfg.MTU, netstack.MinMTU, netstack.MaxMTU, netstack.MaxMTU+exn.EthHeaderLen)
	}
	if cfg.Engine.MTU != 0 && cfg.Engine.MTU != cfg.MTU {
		return nil, fmt.Errorf("node: engine mtu %d differs from mtu %d", cfg.Engine.MTU, cfg.MTU)
	}
	tcpCfg, err := cfg.TCP.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	cfg.Engine.MTU = cfg.MTU
	if cfg.Engine.Logger == nil {
		cfg.Engine.Logger = cfg.Logger
	}
	prefix := cfg.Engine.MACPrefix
	if prefix == (fabric.MACPrefix{}) {
		prefix = fabric.DefaultMACPrefix
	}
	if err := prefix.Validate(); err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	id := cfg.NIC.Node()
	n := &Node{
		log:       cfg.Logger.With("node", id),
		nic:       cfg.NIC,
		addr:      cfg.Addr,
		addr6:     cfg.Addr6,
		mac:       prefix.MAC(id),
		mtu:       cfg.MTU,
		tcpCfg:    tcpCfg,
		closers:   make(map[closer]struct{}),
		closeDone: make(chan struct{}),
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())

	lcfg := cfg.Link
	lcfg.MAC = n.mac
	lcfg.MTU = uint32(cfg.MTU)
	if lcfg.Logger == nil {
		lcfg.Logger = n.log
	}
	n.link, err = netstack.New(lcfg)
	if err != nil {
		return nil, fmt.Errorf("node %d: %w", id, err)
	}
	if !cfg.External {
		n.ep, err = cfg.NIC.Open(fabric.EthVPID)
		if err != nil {
			n.link.Close()
			return nil, fmt.Errorf("node %d: open vpid %d: %w", id, fabric.EthVPID, err)
		}
		n.eng, err = exn.New(cfg.NIC, n.ep, n.link, cfg.Engine)
		if err != nil {
			n.link.Close()
			n.ep.Close()
			return nil, fmt.Errorf("node %d: %w", id, err)
		}
		if err := n.link.Start(n.eng); err != nil {
			n.teardown()
			return nil, fmt.Errorf("node %d: %w", id, err)
		}
	}
	n.stack, err = newStack(tcpCfg)
	if err != nil {
		n.teardown()
		return nil, fmt.Errorf("node %d: %w", id, err)
	}
	if err := n.configure(); err != nil {
		n.teardown()
		return nil, fmt.Errorf("node %d: %w", id, err)
	}
	if cfg.PeerCheck == 0 {
		cfg.PeerCheck = DefaultPeerCheck
	}
	if cfg.PeerCheck > 0 {
		n.wg.Add(1)
		go n.watchPeers(cfg.PeerCheck)
	}
	n.log.Debug("node up", "addr", cfg.Addr, "addr6", cfg.Addr6, "mac", n.mac, "mtu", cfg.MTU)
	return n, nil
}

// checkPrefix rejects a prefix that is not a usable host address of the
// wanted family.
func checkPrefix(p netip.Prefix, v6 bool) error {
	switch {
	case !p.IsValid():
		return fmt.Errorf("%q: invalid CIDR (want e.g. 10.88.0.1/24)", p.String())
	case v6 && !p.Addr().Is6():
		return fmt.Errorf("%s: not an IPv6 prefix", p)
	case !v6 && !p.Addr().Is4():
		return fmt.Errorf("%s: not an IPv4 prefix", p)
	case p.Addr().IsUnspecified() || p.Addr().IsMulticast() || p.Addr().IsLoopback():
		return fmt.Errorf("%s: not a unicast host address", p)
	case p.Bits() == 0:
		return fmt.Errorf("%s: prefix length 0", p)
	}
	if !v6 && p.Bits() <= 30 {
		host := p.Addr().As4()
		net4 := p.Masked().Addr().As4()
		if host == net4 {
			return fmt.Errorf("%s: network address, not a host", p)
		}
		bcast := net4
		for i := p.Bits(); i < 32; i++ {
			bcast[i/8] |= 0x80 >> (i % 8)
		}
		if host == bcast {
			return fmt.Errorf("%s: broadcast address, not a host", p)
		}
	}
	return nil
}

// newStack builds a gVisor stack with the protocols and TCP tuning a node
// uses. The benchmarks build their direct baseline with it too, so both
// sides of a comparison run the same TCP.
func newStack(t TCPConfig) (*stack.Stack, error) {
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4, icmp.NewProtocol6},
		HandleLocal:        true,
	})
	sack := tcpip.TCPSACKEnabled(!t.DisableSACK)
	moderate := tcpip.TCPModerateReceiveBufferOption(!t.DisableModerateReceiveBuffer)
	cc := tcpip.CongestionControlOption(t.CongestionControl)
	opts := []tcpip.SettableTransportProtocolOption{
		&sack,
		&moderate,
		&cc,
		&tcpip.TCPSendBufferSizeRangeOption{Min: t.SendBuffer.Min, Default: t.SendBuffer.Default, Max: t.SendBuffer.Max},
		&tcpip.TCPReceiveBufferSizeRangeOption{Min: t.ReceiveBuffer.Min, Default: t.ReceiveBuffer.Default, Max: t.ReceiveBuffer.Max},
	}
	recovery := tcpip.TCPRecovery(0)
	if t.RACK {
		recovery = tcpip.TCPRACKLossDetection
	}
	opts = append(opts, &recovery)
	if t.MinRTO > 0 {
		rto := tcpip.TCPMinRTOOption(t.MinRTO)
		opts = append(opts, &rto)
	}
	for _, o := range opts {
		if err := s.SetTransportProtocolOption(tcp.ProtocolNumber, o); err != nil {
			s.Destroy()
			return nil, fmt.Errorf("tcp option %T: %s", o, err)
		}
	}
	return s, nil
}

// configure attaches the link to the stack and assigns addresses and
// on-link routes.
func (n *Node) configure() error {
	return attach(n.stack, ethernet.New(n.link), n.addr, n.addr6)
}

// attach adds link as the stack's NIC with the given addresses (invalid
// prefixes are skipped) and an on-link route for each.
func attach(s *stack.Stack, link stack.LinkEndpoint, prefixes ...netip.Prefix) error {
	if err := s.CreateNICWithOptions(nicID, link, stack.NICOptions{Name: "exn0"}); err != nil {
		return fmt.Errorf("create nic: %s", err)
	}
	routes := []tcpip.Route{}
	for _, p := range prefixes {
		if !p.IsValid() {
			continue
		}
		proto := ipv4.ProtocolNumber
		if p.Addr().Is6() {
			proto = ipv6.ProtocolNumber
		}
		pa := tcpip.ProtocolAddress{
			Protocol:          proto,
			AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFromSlice(p.Addr().AsSlice()), PrefixLen: p.Bits()},
		}
		if err := s.AddProtocolAddress(nicID, pa, stack.AddressProperties{}); err != nil {
			return fmt.Errorf("add address %s: %s", p, err)
		}
		routes = append(routes, tcpip.Route{Destination: pa.AddressWithPrefix.Subnet(), NIC: nicID})
	}
	s.SetRouteTable(routes)
	return nil
}

// Addr returns the node's IPv4 prefix (address and subnet).
func (n *Node) Addr() netip.Prefix { return n.addr }

// Addr6 returns the node's IPv6 prefix, or the zero Prefix.
func (n *Node) Addr6() netip.Prefix { return n.addr6 }

// MAC returns the node's MAC, which encodes its node ID.
func (n *Node) MAC() net.HardwareAddr { return n.mac }

// MTU returns the IP MTU.
func (n *Node) MTU() int { return n.mtu }

// TCP returns the TCP settings in force.
func (n *Node) TCP() TCPConfig { return n.tcpCfg }

// Engine returns the node's EXT-Eth engine, nil for an External node.
func (n *Node) Engine() *exn.Engine { return n.eng }

// NIC returns the node's fabric NIC.
func (n *Node) NIC() fabric.NIC { return n.nic }

// Link returns the netstack endpoint (for its counters).
func (n *Node) Link() *netstack.Endpoint { return n.link }

// Stack returns the gVisor stack, for what the Node does not wrap. Its
// lifetime is the Node's.
func (n *Node) Stack() *stack.Stack { return n.stack }

func (n *Node) isClosed() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.closed
}

// track registers c to be closed by Close; it fails (closing c) if the
// node is already closed.
func (n *Node) track(c closer) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		c.Close()
		return net.ErrClosed
	}
	n.closers[c] = struct{}{}
	return nil
}

func (n *Node) untrack(c closer) {
	n.mu.Lock()
	delete(n.closers, c)
	n.mu.Unlock()
}

// Close stops the node: it aborts every connection (peers get a reset),
// closes listeners and packet conns, pushes the resets out, and stops the
// stack, the engine and the VPID 0 endpoint, waiting for their goroutines.
// Blocked calls on the node's conns return errors; later calls on the node
// return net.ErrClosed. The NIC stays open. Close is idempotent; every call
// returns the first call's result once it is complete.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		<-n.closeDone
		return n.closeErr
	}
	n.closed = true
	cs := n.closers
	n.closers = nil
	n.mu.Unlock()
	n.cancel()
	n.wg.Wait() // the peer watcher

	for c := range cs {
		c.Close()
	}
	// Abort every endpoint: TCP sends RSTs through the link.
	n.stack.Close()
	ctx, cancel := context.WithTimeout(context.Background(), closeFlush)
	if err := n.link.Flush(ctx); err != nil && !errors.Is(err, net.ErrClosed) {
		n.log.Debug("close: resets not flushed", "err", err)
	}
	cancel()
	n.closeErr = n.teardownStarted()
	close(n.closeDone)
	return n.closeErr
}

// teardown stops what New started, before the peer watcher exists.
func (n *Node) teardown() {
	n.cancel()
	if n.stack != nil {
		n.stack.Close()
	}
	n.teardownStarted()
}

// teardownStarted stops the stack (which closes the link endpoint and
// waits for it), the engine and the endpoint.
func (n *Node) teardownStarted() error {
	var errs []error
	if n.stack != nil {
		n.stack.Wait() // removes the NIC: closes and waits for the link
	}
	n.link.Close()
	if n.eng != nil {
		if err := n.eng.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("engine: %w", err))
		}
	}
	if n.ep != nil {
		if err := n.ep.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("vpid %d: %w", fabric.EthVPID, err))
		}
	}
	return errors.Join(errs...)
}

package extds

// What a Device is made of and tuned by: the Attachment (its fabric),
// the Resolver (peer IP → node), the options and the tunables with their
// reasons. Nothing here runs; NewDevice (device.go) checks the values.

import (
	"log/slog"
	"net/netip"
	"time"

	"github.com/exn-project/exn/fabric"
)

// Tunables, with why.
const (
	// rxBudget is the NAPI budget: messages (and, separately, notifications)
	// taken per poll. 64 as in EXT-Eth: one poll then costs at most ~8 KiB
	// of copying before the loop looks at the other queue.
	rxBudget = 64
	// ctrlQueue bounds RESETs waiting for the control sender. A RESET is
	// only sent on a protocol violation or to a peer writing into a closed
	// conn; 256 outstanding means something is flooding us, and dropping
	// (counted) is better than blocking the rx loop.
	ctrlQueue = 256
	// ctrlSendTimeout bounds one control Send: a peer whose mailbox stays
	// full that long is treated as gone.
	ctrlSendTimeout = time.Second
	// NumVDevs is the size of the reserved VPID block (equation 5.3).
	NumVDevs = 16
	// DefaultBaseVPID is the first VPID of the EXT-DS block: above EXT-Eth's
	// VPID 0, leaving 1..15 for other node services.
	DefaultBaseVPID fabric.VPID = 16
	// DefaultRingSize is each connection's RMA receive ring. The sender
	// mirrors it, so a connection registers 2 MiB (plus the 64 KiB eager
	// buffer); on shm the pages are touched only as data flows. With
	// RMA_AVAIL at 1/4 that is 256 KiB per credit message. Between two
	// processes on shm, 1 MiB streamed 16 KiB..1 MiB writes 1.05–1.6×
	// faster than 512 KiB and about 2× faster than 256 KiB; 2 MiB was
	// slower again (0.4–0.6× of 1 MiB: the rings and mirrors no longer
	// fit the caches). docs/extds.md, "Numbers".
	DefaultRingSize = 1 << 20
	// DefaultEagerWindow is the receive buffer for VELO data per
	// connection: 64 KiB = 565 fragments, about half a default mem mailbox,
	// so eager data alone never fills the vdev's mailbox for long.
	DefaultEagerWindow = 64 << 10
	// DefaultThreshold is the eager/rendezvous switch. A write of up to 480
	// bytes is at most five VELO fragments; above that one PUT plus one
	// RMA_INFO (two operations and a notification) is cheaper than the
	// fragment train. Same value as EXT-Eth (§5.4.6.2). See docs/extds.md
	// for the measurement.
	DefaultThreshold = 480
	// DefaultZCopyThreshold: WriteBuffer below this uses BCopy; the
	// rendezvous round trip of ZCopy only pays off for large transfers.
	DefaultZCopyThreshold = 64 << 10
	// zcChunk is the receiver's ZCopy sink region: one GET or PUT moves at
	// most this much, so a huge write does not pin a huge sink.
	zcChunk = 1 << 20
	// DefaultTick is the housekeeping period: peer-death detection for idle
	// connections is bounded by it.
	DefaultTick = 200 * time.Millisecond
	// DefaultDrainTimeout bounds how long a closed connection keeps its
	// ring waiting for the peer to read outstanding data.
	DefaultDrainTimeout = 30 * time.Second
	// DefaultProbeTimeout bounds the wait for a listener probe's answer.
	// The peer's rx loop answers within microseconds when it has a CPU,
	// but on a loaded 2-vCPU host a probe went unanswered for more than
	// 50 ms (TestNetperfShim under the race tests: the connection fell
	// back and the address was then cached as plain TCP for negativeTTL).
	// A probe that gets no answer (a node without EXT-DS on that vdev)
	// costs this once per address and negativeTTL. No answer = no
	// listener: the connection stays plain TCP.
	DefaultProbeTimeout = 250 * time.Millisecond
	// noConnLimit is the most NOCONN replies a Device sends per second.
	// One reply is enough to fail the sender's connection; the limit only
	// matters under a flood of forged or stale data messages.
	noConnLimit = 256
	// DefaultShadowGrace: after the shadow TCP conn breaks, how long a
	// connection waits for the fabric SHUTDOWN that normally precedes it.
	DefaultShadowGrace = time.Second
	// DefaultHandshakeTimeout is the default bound on the shadow
	// handshake (WithHandshakeTimeout); an acceptor whose claim was
	// agreed waits this long for the client's hello.
	DefaultHandshakeTimeout = time.Second
)

// Attachment is what a Device needs from the fabric: fabric.NIC satisfies
// it. exnd will later hand app processes an Attachment that obtains their
// endpoints over its control socket.
type Attachment interface {
	Node() fabric.NodeID
	Open(v fabric.VPID) (fabric.Endpoint, error)
	Alive(n fabric.NodeID) error
}

// Resolver maps a peer IP to its fabric node (exnd's neighbour table:
// IP → MAC → node). ok is false for a peer not on the fabric.
type Resolver interface {
	Resolve(ip netip.Addr) (node fabric.NodeID, ok bool)
}

// ResolverFunc adapts a function, e.g. around arp.Table.Lookup:
//
//	extds.ResolverFunc(func(ip netip.Addr) (fabric.NodeID, bool) {
//		e, ok := tbl.Lookup(ip)
//		return e.Node, ok
//	})
type ResolverFunc func(ip netip.Addr) (fabric.NodeID, bool)

func (f ResolverFunc) Resolve(ip netip.Addr) (fabric.NodeID, bool) { return f(ip) }

// StaticResolver is a fixed IP → node map.
type StaticResolver map[netip.Addr]fabric.NodeID

func (s StaticResolver) Resolve(ip netip.Addr) (fabric.NodeID, bool) {
	n, ok := s[ip.Unmap()]
	return n, ok
}

type config struct {
	base           fabric.VPID
	ringSize       int
	eagerWin       int
	threshold      int
	zcThreshold    int
	zcMode         ZCopyMode
	tick           time.Duration
	drainTimeout   time.Duration
	shadowGrace    time.Duration
	keepShadow     bool
	resolver       Resolver
	log            *slog.Logger
	handshakeTO    time.Duration
	peekTO         time.Duration
	negativeTTL    time.Duration
	probeTO        time.Duration
	claimTO        time.Duration
	lazyOpen       bool
	creditFraction int
	// probeBase is the first VPID of the block that answers listener
	// probes on peer nodes (0: base). An attached process (AttachDevice)
	// has a VPID block of its own but probes exnd's (see attach.go).
	probeBase fabric.VPID
	// portHook, if set, also announces a registered port elsewhere (an
	// attached process tells exnd); its unregister runs with the port's.
	portHook func(port uint16) (unregister func(), err error)
	// onClose runs at the end of Close (an attached process detaches).
	onClose func() error
}

// Option configures a Device.
type Option func(*config)

// WithBaseVPID sets the first VPID of the 16-VPID EXT-DS block.
func WithBaseVPID(v fabric.VPID) Option { return func(c *config) { c.base = v } }

// WithRingSize sets the per-connection RMA ring (minimum 4 KiB, maximum 64
// MiB).
func WithRingSize(n int) Option { return func(c *config) { c.ringSize = n } }

// WithEagerWindow sets the per-connection VELO receive buffer.
func WithEagerWindow(n int) Option { return func(c *config) { c.eagerWin = n } }

// WithThreshold sets the BCopy eager/rendezvous threshold in bytes.
func WithThreshold(n int) Option { return func(c *config) { c.threshold = n } }

// WithZCopy sets the ZCopy mode and the smallest WriteBuffer that uses it.
func WithZCopy(m ZCopyMode, threshold int) Option {
	return func(c *config) { c.zcMode, c.zcThreshold = m, threshold }
}

// WithResolver sets the resolver Dial uses to decide whether a peer is on
// the fabric.
func WithResolver(r Resolver) Option { return func(c *config) { c.resolver = r } }

// WithLogger sets the logger (rate-limited for per-message events).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// WithTick sets the housekeeping period (peer-death detection bound).
func WithTick(d time.Duration) Option { return func(c *config) { c.tick = d } }

// WithDrainTimeout bounds background draining after Close.
func WithDrainTimeout(d time.Duration) Option { return func(c *config) { c.drainTimeout = d } }

// WithShadow says whether the shadow TCP connection stays open after the
// handshake as a liveness aid (default true). Closing it saves one fd and
// one goroutine per connection; peer death is then detected by fabric
// liveness alone.
func WithShadow(keep bool) Option { return func(c *config) { c.keepShadow = keep } }

// WithHandshakeTimeout bounds the client's wait for the server's reply
// and the server's wait for the rest of a hello; WithPeekTimeout bounds
// the server's wait for the first bytes of a client (see docs/extds.md
// for the trade-off).
func WithHandshakeTimeout(d time.Duration) Option { return func(c *config) { c.handshakeTO = d } }

// WithPeekTimeout: see WithHandshakeTimeout.
func WithPeekTimeout(d time.Duration) Option { return func(c *config) { c.peekTO = d } }

// WithProbeTimeout bounds the client's wait for the answer to a listener
// probe (default DefaultProbeTimeout); no answer means no listener.
func WithProbeTimeout(d time.Duration) Option { return func(c *config) { c.probeTO = d } }

// WithClaimTimeout bounds the client's wait for the server's agreement
// (default DefaultClaimTimeout).
func WithClaimTimeout(dur time.Duration) Option { return func(c *config) { c.claimTO = dur } }

// WithEagerOpen opens all 16 endpoints in NewDevice instead of on first use.
func WithEagerOpen() Option { return func(c *config) { c.lazyOpen = false } }

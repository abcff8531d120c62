package exn

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/exn-project/exn/fabric"
)

// Frame geometry.
const (
	// EthHeaderLen is the Ethernet header: destination MAC, source MAC,
	// EtherType. It is the shortest frame the engine carries. There is no
	// FCS: the fabric is reliable and checks its own CRCs.
	EthHeaderLen = 14
	// MaxMTU is the largest IP MTU: a frame must fit the 16-bit IP total
	// length plus the Ethernet header.
	MaxMTU = 65535
	// MinMTU is the IPv4 minimum (RFC 791).
	MinMTU = 68
)

// Defaults. The rationale of each is in its comment and in
// docs/ext-eth-engine.md.
const (
	// DefaultMTU is the largest MTU Linux accepts on a TAP (65536 is
	// refused), so TCP segments are as large as the kernel makes them.
	DefaultMTU = 65521
	// DefaultEagerThreshold is four full VELO payloads (§5.4.6.2): up to
	// there the eager protocol's copies cost less than a rendezvous round
	// trip (advert, GET, two notifications).
	DefaultEagerThreshold = 4 * fabric.MaxVELOPayload
	// DefaultRxBudget and DefaultNotifyBudget are the NAPI weights: the
	// most VELO messages and notifications handled per poll round, so one
	// busy source cannot starve delivery of completed frames.
	DefaultRxBudget     = 64
	DefaultNotifyBudget = 64
	// DefaultTxSlots is the rendezvous transmit pool: 64 slots of a max
	// frame each (4 MiB at the default MTU). 64 outstanding 64 KiB frames
	// cover the bandwidth-delay product of a GET round trip many times
	// over, and a full pool frees within one notification budget.
	DefaultTxSlots = 64
	// DefaultRxSlots is the number of registered receive buffers, i.e. the
	// most GETs in flight. Same size and reasoning as DefaultTxSlots.
	DefaultRxSlots = 64
	// DefaultAdvertTimeout frees the transmit slot of an advert that was
	// never pulled. A live receiver pulls within microseconds; two seconds
	// only ever expire for a dead or wedged peer.
	DefaultAdvertTimeout = 2 * time.Second
	// maxBudget bounds RxBudget and NotifyBudget: the per-round scratch
	// arrays are allocated once at this size at most.
	maxBudget = 4096
)

// Config configures an Engine. The zero value of every field selects its
// default.
type Config struct {
	// MACPrefix is the first four octets of every node's MAC (Figure
	// 5.13). Default fabric.DefaultMACPrefix.
	MACPrefix fabric.MACPrefix
	// MTU is the IP MTU, MinMTU..MaxMTU, default DefaultMTU. The largest
	// frame carried is MTU+EthHeaderLen (no FCS, no VLAN tag).
	MTU int
	// EagerThreshold: unicast frames up to this many bytes go eager, larger
	// ones by rendezvous. EthHeaderLen..MTU+EthHeaderLen, default
	// DefaultEagerThreshold.
	EagerThreshold int
	// RxBudget is the most VELO messages handled per poll round, 1..4096.
	RxBudget int
	// NotifyBudget is the most notifications handled per poll round,
	// 1..4096.
	NotifyBudget int
	// TxSlots is the size of the rendezvous transmit pool. TxSlots+RxSlots
	// must not exceed fabric.DefaultNotifyDepth, so the notifications this
	// engine can have outstanding never overflow its queue.
	TxSlots int
	// RxSlots is the number of registered receive buffers, the most GETs
	// in flight.
	RxSlots int
	// AdvertTimeout frees the transmit slot of an advert that was never
	// pulled (the receiver died). It is measured with Now.
	AdvertTimeout time.Duration
	// Observer, if set, sees every frame sent (before it is sent) and
	// every frame delivered (before the Link). It must not retain the
	// slice and must be fast: it runs on the data path (the ARP/NDP
	// snooper).
	Observer interface{ Observe(frame []byte) }
	// Offload is the capability (CapCsum, CapTSO, CapUSO) this node
	// announces to its peers in hellos: frames with offload metadata it
	// takes through its Link, which must then be an OffloadLink. Zero
	// (the default) announces none, so peers send complete frames.
	// Transmit-side offload (TransmitLentOffload) works either way.
	Offload uint8
	// Push turns on receiver-granted PUT (push.go): this engine grants rx
	// buffers to sources that push, and pushes rendezvous frames into
	// the grants of its peers if its endpoint places PUTs before later
	// sends (fabric.PutOrderer). Peers without it, or without such an
	// endpoint, keep advert and GET. Default false; exnd sets it.
	Push bool
	// Logger receives rate-limited drop reports. Default: discard.
	Logger *slog.Logger
	// Now is the clock for the advert timeout. Default time.Now.
	Now func() time.Time
}

var errConfig = errors.New("invalid config")

// withDefaults returns c with defaults filled in, or an error naming the
// first bad field.
func (c Config) withDefaults() (Config, error) {
	if c.MACPrefix == (fabric.MACPrefix{}) {
		c.MACPrefix = fabric.DefaultMACPrefix
	}
	if err := c.MACPrefix.Validate(); err != nil {
		return c, fmt.Errorf("exn: MACPrefix: %w", err)
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.MTU, DefaultMTU)
	def(&c.EagerThreshold, DefaultEagerThreshold)
	def(&c.RxBudget, DefaultRxBudget)
	def(&c.NotifyBudget, DefaultNotifyBudget)
	def(&c.TxSlots, DefaultTxSlots)
	def(&c.RxSlots, DefaultRxSlots)
	if c.AdvertTimeout == 0 {
		c.AdvertTimeout = DefaultAdvertTimeout
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	maxFrame := c.MTU + EthHeaderLen
	switch {
	case c.MTU < MinMTU || c.MTU > MaxMTU:
		return c, fmt.Errorf("exn: MTU %d not in %d..%d: %w", c.MTU, MinMTU, MaxMTU, errConfig)
	case maxFrame > fabric.MaxRMALen:
		return c, fmt.Errorf("exn: MTU %d: frame exceeds one RMA (%d): %w", c.MTU, fabric.MaxRMALen, errConfig)
	case c.EagerThreshold < EthHeaderLen || c.EagerThreshold > maxFrame:
		return c, fmt.Errorf("exn: EagerThreshold %d not in %d..%d (MTU+%d): %w", c.EagerThreshold, EthHeaderLen, maxFrame, EthHeaderLen, errConfig)
	case c.RxBudget < 1 || c.RxBudget > maxBudget:
		return c, fmt.Errorf("exn: RxBudget %d not in 1..%d: %w", c.RxBudget, maxBudget, errConfig)
	case c.NotifyBudget < 1 || c.NotifyBudget > maxBudget:
		return c, fmt.Errorf("exn: NotifyBudget %d not in 1..%d: %w", c.NotifyBudget, maxBudget, errConfig)
	case c.TxSlots < 1:
		return c, fmt.Errorf("exn: TxSlots %d < 1: %w", c.TxSlots, errConfig)
	case c.RxSlots < 1:
		return c, fmt.Errorf("exn: RxSlots %d < 1: %w", c.RxSlots, errConfig)
	case c.TxSlots+c.RxSlots > fabric.DefaultNotifyDepth:
		return c, fmt.Errorf("exn: TxSlots+RxSlots %d > notification depth %d: %w", c.TxSlots+c.RxSlots, fabric.DefaultNotifyDepth, errConfig)
	case c.AdvertTimeout < 0:
		return c, fmt.Errorf("exn: AdvertTimeout %v < 0: %w", c.AdvertTimeout, errConfig)
	}
	return c, nil
}

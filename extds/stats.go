package extds

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/exn-project/exn/extds/internal/agree"
)

// DropReason says why an incoming message or notification was dropped.
type DropReason uint8

const (
	DropMalformed    DropReason = iota // undecodable payload (bad tag, length, conn 0)
	DropUnknownConn                    // no connection with that ID (closed, stale or forged)
	DropPeerMismatch                   // conn exists but the fabric source is not its peer
	DropProtocol                       // decodable but illegal for the conn's state; conn reset
	DropNotify                         // RMA notification matching no transfer
	DropCtrlQueue                      // control message (RESET) not sent: queue full
	DropProbe                          // agreement message that matches nothing (stale, forged, wrong vdev): the Agent's
	numDropReasons
)

var dropNames = [numDropReasons]string{"malformed", "unknown_conn", "peer_mismatch", "protocol", "notify", "ctrl_queue", "probe"}

func (r DropReason) String() string { return label(dropNames[:], r) }

// FallbackReason says why a connection runs over plain TCP.
type FallbackReason uint8

const (
	FallbackNoRoute     FallbackReason = iota // no device, or the resolver does not know the peer
	FallbackHandshake                         // peer did not answer the handshake (plain TCP server)
	FallbackPeerNoFab                         // peer is EXT-DS aware but could not attach
	FallbackPlainPeer                         // server side: the client sent no EXT-DS hello
	FallbackCached                            // address known not to speak EXT-DS
	FallbackNoListener                        // the peer node's Device has no EXT-DS listener on the port (probe)
	FallbackNoClaim                           // a listener is registered but no EXT-DS acceptor claimed the connection in time
	FallbackDeclined                          // the server declined the claim (acceptor went TCP, table full, address mismatch)
	FallbackDirectAbort                       // a direct connection was agreed but the client could not open it (internal/agree/claimdirect.go)
	FallbackShortLived                        // the server's port is on hold: its connections are too short to gain (internal/agree/hold.go)
	FallbackPeerFDLimit                       // server side: the client said it stays TCP, its shim short of descriptors (Device.Forgo)
	numFallbackReasons
)

var fallbackNames = [numFallbackReasons]string{"no_route", "handshake", "peer_no_fabric", "plain_client", "cached", "no_listener", "no_claim", "declined", "direct_abort", "short_lived", "peer_fd_limit"}

func (r FallbackReason) String() string { return label(fallbackNames[:], r) }

// label is the name of reason r, one of names, or "unknown" past their end.
func label[R ~uint8](names []string, r R) string {
	if int(r) < len(names) {
		return names[r]
	}
	return "unknown"
}

// counters is the atomic block behind Stats.
type counters struct {
	connsEXTDS, connsTCP     atomic.Uint64
	active                   atomic.Int64
	fallbacks                [numFallbackReasons]atomic.Uint64
	txVELO, txRMA, txZCopy   atomic.Uint64 // payload bytes sent by path
	rxBytes                  atomic.Uint64 // payload bytes delivered to Read
	veloMsgs, rmaPuts        atomic.Uint64
	ringFull                 atomic.Uint64 // large-write chunks sent by VELO because the ring was full
	creditMsgs, creditBytes  atomic.Uint64 // RMA_AVAIL sent and bytes they returned
	creditWaits              atomic.Uint64 // writes that blocked for credits
	resetsSent, resetsRecv   atomic.Uint64
	peerDown                 atomic.Uint64
	drops                    [numDropReasons]atomic.Uint64
	handshakeErr             atomic.Uint64
	zcopyReads, zcopyWrites  atomic.Uint64 // ZCopy transfers by mode
	lingerExpired, reaped    atomic.Uint64
	shadowLost, notifyErrors atomic.Uint64
	noConnSent, noConnLimit  atomic.Uint64 // NOCONN replies sent / suppressed by the rate limit
	waitsSpun, waitsParked   atomic.Uint64 // Read/Write waits that ended in their spin / parked (spin.go)
	// Probes, claims and direct agreements are counted by the Agent
	// (agree.Stats), and so are the DropProbe drops and the
	// HandshakeErrors of a direct agreement.
}

// Stats is a snapshot of a Device's counters.
type Stats struct {
	ConnsEXTDS, ConnsTCP uint64 // connections established, by mode
	Active               int64  // EXT-DS connections currently open
	Fallbacks            map[string]uint64
	TxVELOBytes          uint64 // BCopy eager bytes
	TxRMABytes           uint64 // BCopy rendezvous (ring PUT) bytes
	TxZCopyBytes         uint64
	RxBytes              uint64
	VELOMsgs, RMAPuts    uint64
	RingFullFallbacks    uint64 // large-write chunks that went by VELO: ring full
	CreditMsgs           uint64 // RMA_AVAIL messages sent
	CreditBytes          uint64 // bytes of credit they returned
	CreditWaits          uint64
	ResetsSent           uint64
	ResetsRecv           uint64
	PeerDown             uint64
	Drops                map[string]uint64
	HandshakeErrors      uint64
	ZCopyReads           uint64 // receiver GETs (read mode)
	ZCopyWrites          uint64 // sender write-mode transfers
	LingerExpired        uint64
	Reaped               uint64 // closed conns released by the drain timeout
	ShadowLost           uint64
	NotifyErrors         uint64 // RMA error notifications
	NoConnSent           uint64 // NOCONN replies to data for unknown connections
	NoConnLimited        uint64 // NOCONN replies suppressed by the rate limit
	Probes               uint64 // listener probes sent
	ProbeTimeouts        uint64 // probes without an answer in ProbeTimeout
	ProbesServed         uint64 // probes from peers answered
	DirectAgreed         uint64 // direct connections agreed over the fabric, counted where accepted
	WaitsSpun            uint64 // Read/Write waits that ended within their spin (spin.go)
	WaitsParked          uint64 // Read/Write waits that parked
}

// snapshot is c's Stats with the Agent's counters a.
func (c *counters) snapshot(a agree.Stats) Stats {
	s := Stats{
		ConnsEXTDS: c.connsEXTDS.Load(), ConnsTCP: c.connsTCP.Load(), Active: c.active.Load(),
		Fallbacks: make(map[string]uint64), Drops: make(map[string]uint64),
		TxVELOBytes: c.txVELO.Load(), TxRMABytes: c.txRMA.Load(), TxZCopyBytes: c.txZCopy.Load(),
		RxBytes: c.rxBytes.Load(), VELOMsgs: c.veloMsgs.Load(), RMAPuts: c.rmaPuts.Load(),
		RingFullFallbacks: c.ringFull.Load(), CreditMsgs: c.creditMsgs.Load(), CreditBytes: c.creditBytes.Load(),
		CreditWaits: c.creditWaits.Load(), ResetsSent: c.resetsSent.Load(), ResetsRecv: c.resetsRecv.Load(),
		PeerDown: c.peerDown.Load(), HandshakeErrors: c.handshakeErr.Load() + a.HandshakeErrors,
		ZCopyReads: c.zcopyReads.Load(), ZCopyWrites: c.zcopyWrites.Load(),
		LingerExpired: c.lingerExpired.Load(), Reaped: c.reaped.Load(),
		ShadowLost: c.shadowLost.Load(), NotifyErrors: c.notifyErrors.Load(),
		NoConnSent: c.noConnSent.Load(), NoConnLimited: c.noConnLimit.Load(),
		Probes: a.Probes, ProbeTimeouts: a.ProbeTimeouts, ProbesServed: a.ProbesServed,
		DirectAgreed: a.DirectAgreed,
		WaitsSpun:    c.waitsSpun.Load(), WaitsParked: c.waitsParked.Load(),
	}
	for i := range c.fallbacks {
		s.Fallbacks[FallbackReason(i).String()] = c.fallbacks[i].Load()
	}
	for i := range c.drops {
		s.Drops[DropReason(i).String()] = c.drops[i].Load()
	}
	s.Drops[DropProbe.String()] += a.Drops
	return s
}

// TotalDrops sums s.Drops.
func (s Stats) TotalDrops() uint64 {
	var n uint64
	for _, v := range s.Drops {
		n += v
	}
	return n
}

// rateLimit is a lock-free one-second-window counter: allow reports
// whether one more event fits in this second's budget.
type rateLimit struct {
	window atomic.Int64
	n      atomic.Int64
}

func (r *rateLimit) allow(limit int64) bool {
	now := time.Now().Unix()
	if w := r.window.Load(); w != now && r.window.CompareAndSwap(w, now) {
		r.n.Store(0)
	}
	return r.n.Add(1) <= limit
}

// logLimit is the most per-message log lines a Device writes per second;
// the rest are counted only. Bad input arrives at fabric rate, and a
// flood of forged messages must not become a flood of log lines.
const logLimit = 10

// rateLog is a lock-free one-second-window limiter.
type rateLog struct {
	log    *slog.Logger
	window atomic.Int64 // unix second of the current window
	n      atomic.Int64
}

func (r *rateLog) warn(msg string, args ...any) {
	now := time.Now().Unix()
	if w := r.window.Load(); w != now && r.window.CompareAndSwap(w, now) {
		r.n.Store(0)
	}
	if r.n.Add(1) > logLimit {
		return
	}
	r.log.Log(context.Background(), slog.LevelWarn, msg, args...)
}

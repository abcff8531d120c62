package exn

import (
	"sync/atomic"
)

// DropReason says why the engine dropped a frame or a message. Every drop
// is counted under exactly one reason.
type DropReason uint8

// Drop reasons. Transmit side first, then receive side.
const (
	DropNone DropReason = iota
	// Transmit.
	DropRunt        // frame shorter than the Ethernet header
	DropOversize    // frame longer than MTU+14
	DropForeignMAC  // unicast destination outside our MAC prefix
	DropUnknownNode // destination node was never on the fabric
	DropPeerDown    // destination node is gone (before or during the send)
	DropSelf        // unicast to our own MAC: not looped back (see docs)
	DropTxAborted   // send cut short by ctx or Close
	// Receive, eager.
	DropBadTag         // reserved tag value
	DropBadSource      // message from a VPID other than EthVPID
	DropSelfEcho       // our own multicast came back
	DropOrphanFragment // continuation with no first fragment
	DropFragmentSeq    // fragment index gap or duplicate: partial dropped
	DropFragmentLen    // non-last fragment not full, or empty fragment
	DropTruncated      // a new first fragment cut a partial frame short
	DropRxRunt         // reassembled frame shorter than the header
	DropRxOversize     // reassembled frame longer than our max frame
	DropWrongDest      // frame's destination MAC is not ours / not a group
	DropNoBuffer       // reassembly buffer pool exhausted
	DropQueueFull      // per-source in-order queue full
	// Receive, rendezvous.
	DropAdvertMalformed // advert of the wrong size, reserved bits, NLA 0, or multicast
	DropAdvertLength    // advertised length outside 14..max frame
	DropGetPost         // the fabric refused the GET locally
	DropGetAccess       // GET error notification: NLA not the sender's memory
	DropGetBounds       // GET error notification: range past its region
	DropGetPeerDown     // GET error notification: sender gone
	DropGetMismatch     // completion whose length or peer does not match
	DropPeerGone        // partial or queued frames of a peer that died
	// Offload (offload.go, caps.go).
	DropTxOffload      // virtio-net header from the Link that does not fit its frame
	DropOffloadForged  // offload advert from the fabric that is malformed or not asked for
	DropHelloMalformed // hello too short or of version 0
	// Push (push.go).
	DropPushForged     // announcement for a buffer not granted to its source, busy, or malformed
	DropPushStale      // the buffer's push header does not match: the PUT did not land
	DropPushFailed     // our PUT's requester error notification
	DropGrantMalformed // grant of the wrong size, a bad NLA, or to an engine that does not push
	NumDropReasons
)

var dropNames = [NumDropReasons]string{
	DropNone:            "none",
	DropRunt:            "runt",
	DropOversize:        "oversize",
	DropForeignMAC:      "foreign-mac",
	DropUnknownNode:     "unknown-node",
	DropPeerDown:        "peer-down",
	DropSelf:            "self",
	DropTxAborted:       "tx-aborted",
	DropBadTag:          "bad-tag",
	DropBadSource:       "bad-source",
	DropSelfEcho:        "self-echo",
	DropOrphanFragment:  "orphan-fragment",
	DropFragmentSeq:     "fragment-seq",
	DropFragmentLen:     "fragment-len",
	DropTruncated:       "truncated",
	DropRxRunt:          "rx-runt",
	DropRxOversize:      "rx-oversize",
	DropWrongDest:       "wrong-dest",
	DropNoBuffer:        "no-buffer",
	DropQueueFull:       "queue-full",
	DropAdvertMalformed: "advert-malformed",
	DropAdvertLength:    "advert-length",
	DropGetPost:         "get-post",
	DropGetAccess:       "get-access",
	DropGetBounds:       "get-bounds",
	DropGetPeerDown:     "get-peer-down",
	DropGetMismatch:     "get-mismatch",
	DropPeerGone:        "peer-gone",
	DropTxOffload:       "tx-offload-malformed",
	DropOffloadForged:   "offload-malformed",
	DropHelloMalformed:  "hello-malformed",
	DropPushForged:      "push-forged",
	DropPushStale:       "push-stale",
	DropPushFailed:      "push-failed",
	DropGrantMalformed:  "grant-malformed",
}

// String returns the reason's metric label, e.g. "foreign-mac".
func (r DropReason) String() string {
	if r < NumDropReasons {
		return dropNames[r]
	}
	return "unknown"
}

// Proto is how a frame travelled.
type Proto uint8

const (
	ProtoEager      Proto = iota // unicast VELO fragments
	ProtoRendezvous              // advert + RMA GET
	ProtoMulticast               // VELO multicast fragments to group 63
	ProtoPush                    // PUT into a granted rx buffer + announcement (push.go)
	NumProtos
)

var protoNames = [NumProtos]string{"eager", "rendezvous", "multicast", "push"}

func (p Proto) String() string {
	if p < NumProtos {
		return protoNames[p]
	}
	return "unknown"
}

// Stats is a snapshot of an Engine's counters. Arrays are indexed by Proto
// and DropReason; iterate them with NumProtos and NumDropReasons.
type Stats struct {
	TxFrames, TxBytes [NumProtos]uint64
	RxFrames, RxBytes [NumProtos]uint64
	Drops             [NumDropReasons]uint64

	// TxSlotsInUse is the transmit pool in use: frames copied and
	// advertised but not yet pulled.
	TxSlotsInUse int
	// TxSlotsLent is transmit slots lent by Engine.Lend and not yet
	// transmitted or returned (empty buffers a TAP reader holds); they are
	// not counted in TxSlotsInUse.
	TxSlotsLent int
	// RxSlotsInUse is receive buffers holding a GET in flight or a frame
	// waiting for delivery.
	RxSlotsInUse int
	// OutstandingAdverts is adverts sent and not yet pulled (sender).
	OutstandingAdverts int64
	// PendingGets is GETs posted and not yet completed (receiver).
	PendingGets int64
	// WaitingAdverts is adverts queued for a free receive buffer.
	WaitingAdverts int64

	AdvertTimeouts  uint64 // transmit slots reclaimed by AdvertTimeout
	AdvertsRefused  uint64 // transmit slots freed by a receiver's refusal
	RefusalsSent    uint64 // adverts this receiver dropped and sent back
	RefusalsLost    uint64 // refusals not sent (queue full, peer gone); the sender times out
	LateResponders  uint64 // responder notifications matching no outstanding slot
	UnmatchedNotify uint64 // notifications matching no buffer at all
	AdvertSeqGaps   uint64 // advert sequence discontinuities (peer restart)
	TxSlotWaits     uint64 // Transmit and Lend calls that waited for a free slot
	LinkErrors      uint64 // DeliverFrames errors

	Hellos      uint64 // capability hellos received (caps.go)
	TxOffloaded uint64 // frames sent with their offload metadata (no software work)
	TxCsumSW    uint64 // needs-checksum frames completed in software for a peer
	TxGSOSplit  uint64 // super-frames segmented in software for a peer
	TxGSOSegs   uint64 // segments those made
	RxOffloaded uint64 // frames delivered with offload metadata
	GrantsSent  uint64 // rx buffers granted to pushing sources (push.go)
	GrantsRecv  uint64 // rx buffers receivers granted us
	RxViewed    uint64 // rendezvous frames delivered in place from the sender's memory (view.go)
}

// counters is the engine's atomic counter block; Stats snapshots it.
type counters struct {
	txFrames, txBytes [NumProtos]atomic.Uint64
	rxFrames, rxBytes [NumProtos]atomic.Uint64
	drops             [NumDropReasons]atomic.Uint64

	outstandingAdverts atomic.Int64
	pendingGets        atomic.Int64
	waitingAdverts     atomic.Int64
	rxSlotsInUse       atomic.Int64

	advertTimeouts  atomic.Uint64
	advertsRefused  atomic.Uint64
	refusalsSent    atomic.Uint64
	refusalsLost    atomic.Uint64
	lateResponders  atomic.Uint64
	unmatchedNotify atomic.Uint64
	advertSeqGaps   atomic.Uint64
	txSlotWaits     atomic.Uint64
	linkErrors      atomic.Uint64

	hellos, txOffloaded, txCsumSW, txGSOSplit, txGSOSegs, rxOffloaded atomic.Uint64
	grantsSent, grantsRecv, rxViewed                                  atomic.Uint64
}

func (c *counters) snapshot() Stats {
	var s Stats
	for p := range NumProtos {
		s.TxFrames[p] = c.txFrames[p].Load()
		s.TxBytes[p] = c.txBytes[p].Load()
		s.RxFrames[p] = c.rxFrames[p].Load()
		s.RxBytes[p] = c.rxBytes[p].Load()
	}
	for r := range NumDropReasons {
		s.Drops[r] = c.drops[r].Load()
	}
	s.OutstandingAdverts = c.outstandingAdverts.Load()
	s.PendingGets = c.pendingGets.Load()
	s.WaitingAdverts = c.waitingAdverts.Load()
	s.RxSlotsInUse = int(c.rxSlotsInUse.Load())
	s.AdvertTimeouts = c.advertTimeouts.Load()
	s.AdvertsRefused = c.advertsRefused.Load()
	s.RefusalsSent = c.refusalsSent.Load()
	s.RefusalsLost = c.refusalsLost.Load()
	s.LateResponders = c.lateResponders.Load()
	s.UnmatchedNotify = c.unmatchedNotify.Load()
	s.AdvertSeqGaps = c.advertSeqGaps.Load()
	s.TxSlotWaits = c.txSlotWaits.Load()
	s.LinkErrors = c.linkErrors.Load()
	s.Hellos = c.hellos.Load()
	s.TxOffloaded = c.txOffloaded.Load()
	s.TxCsumSW = c.txCsumSW.Load()
	s.TxGSOSplit = c.txGSOSplit.Load()
	s.TxGSOSegs = c.txGSOSegs.Load()
	s.RxOffloaded = c.rxOffloaded.Load()
	s.GrantsSent = c.grantsSent.Load()
	s.GrantsRecv = c.grantsRecv.Load()
	s.RxViewed = c.rxViewed.Load()
	return s
}

// TotalDrops sums Drops.
func (s Stats) TotalDrops() uint64 {
	var t uint64
	for _, v := range s.Drops {
		t += v
	}
	return t
}

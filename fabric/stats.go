package fabric

import "sync/atomic"

// Counters is the atomic counter block every backend embeds. Stats reads
// it without locks. Field names match Stats.
type Counters struct {
	VELOSent, VELORecv           atomic.Uint64
	VELOSentBytes, VELORecvBytes atomic.Uint64
	MulticastSent                atomic.Uint64
	SendBlocked                  atomic.Uint64    // sends that waited on a full mailbox
	RMAPosted                    [3]atomic.Uint64 // by Op (index 1 put, 2 get)
	RMABytes                     atomic.Uint64
	Notifications                [4]atomic.Uint64            // by NotifyKind
	NotifyErrors                 [numNotifyErr]atomic.Uint64 // by NotifyErr (index 0 unused)
	Invalid                      atomic.Uint64               // ErrInvalid returned to a local caller
	PeerDown                     atomic.Uint64               // ErrPeerDown returned to a local caller
	UnknownNode                  atomic.Uint64               // ErrUnknownNode returned to a local caller
	InUse                        atomic.Uint64               // ErrInUse returned (second Open of a VPID)
	Corrupt                      atomic.Uint64               // undecodable slot, notification or frame dropped
	NotifyOverflow               atomic.Uint64               // notification dropped: its queue was full
}

// Stats is a point-in-time copy of Counters.
type Stats struct {
	VELOSent, VELORecv           uint64
	VELOSentBytes, VELORecvBytes uint64
	MulticastSent                uint64
	SendBlocked                  uint64
	RMAPut, RMAGet               uint64
	RMABytes                     uint64
	NotifyRequester              uint64
	NotifyCompleter              uint64
	NotifyResponder              uint64
	NotifyErrAccess              uint64
	NotifyErrBounds              uint64
	NotifyErrPeerDown            uint64
	Invalid, PeerDown            uint64
	UnknownNode, InUse, Corrupt  uint64
	NotifyOverflow               uint64
}

// Snapshot copies the counters.
func (c *Counters) Snapshot() Stats {
	return Stats{
		VELOSent: c.VELOSent.Load(), VELORecv: c.VELORecv.Load(),
		VELOSentBytes: c.VELOSentBytes.Load(), VELORecvBytes: c.VELORecvBytes.Load(),
		MulticastSent: c.MulticastSent.Load(), SendBlocked: c.SendBlocked.Load(),
		RMAPut: c.RMAPosted[OpPut].Load(), RMAGet: c.RMAPosted[OpGet].Load(),
		RMABytes:          c.RMABytes.Load(),
		NotifyRequester:   c.Notifications[KindRequester].Load(),
		NotifyCompleter:   c.Notifications[KindCompleter].Load(),
		NotifyResponder:   c.Notifications[KindResponder].Load(),
		NotifyErrAccess:   c.NotifyErrors[NErrAccess].Load(),
		NotifyErrBounds:   c.NotifyErrors[NErrBounds].Load(),
		NotifyErrPeerDown: c.NotifyErrors[NErrPeerDown].Load(),
		Invalid:           c.Invalid.Load(), PeerDown: c.PeerDown.Load(),
		UnknownNode: c.UnknownNode.Load(), InUse: c.InUse.Load(), Corrupt: c.Corrupt.Load(),
		NotifyOverflow: c.NotifyOverflow.Load(),
	}
}

// CountErr bumps the counter matching a sentinel error and returns err, so
// a backend can write `return n, c.CountErr(err)`.
func (c *Counters) CountErr(err error) error {
	switch {
	case err == nil:
	case isErr(err, ErrInvalid):
		c.Invalid.Add(1)
	case isErr(err, ErrPeerDown):
		c.PeerDown.Add(1)
	case isErr(err, ErrUnknownNode):
		c.UnknownNode.Add(1)
	case isErr(err, ErrInUse):
		c.InUse.Add(1)
	}
	return err
}

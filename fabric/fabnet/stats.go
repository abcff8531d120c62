package fabnet

import "sync/atomic"

// netCounters are the transport's own counters, beside fabric.Counters.
type netCounters struct {
	handshakeRejected atomic.Uint64
	badFrames         atomic.Uint64
	oversized         atomic.Uint64
	heartbeatTimeouts atomic.Uint64
	sessionsUp        atomic.Uint64
	sessionsDown      atomic.Uint64
	staleVELO         atomic.Uint64
	dials, dialErrors atomic.Uint64
	framesIn          atomic.Uint64
	writes, bytesOut  atomic.Uint64
	swimIn, swimOut   atomic.Uint64
	swimStreams       atomic.Uint64
	swimForeign       atomic.Uint64
	swimDropped       atomic.Uint64
	swimDown          atomic.Uint64
}

// NetStats is a snapshot of the transport counters.
type NetStats struct {
	// HandshakeRejected: connections refused before a session began (bad
	// magic, wrong version, unknown or wrong node, handshake timeout, too
	// many handshakes at once).
	HandshakeRejected uint64
	// BadFrames: sessions closed because the peer broke the frame
	// protocol; Oversized is the subset refused for a frame length over
	// the limit. Each also counts in fabric.Stats.Corrupt.
	BadFrames, Oversized uint64
	// HeartbeatTimeouts: sessions closed because the peer fell silent.
	HeartbeatTimeouts uint64
	// SessionsUp and SessionsDown count session starts and ends.
	SessionsUp, SessionsDown uint64
	// StaleVELO: messages dropped because they were sent to a VPID that
	// closed while they were in flight.
	StaleVELO uint64
	// Dials and DialErrors count outgoing connection attempts.
	Dials, DialErrors uint64
	// FramesIn counts frames received; Writes the writev calls and
	// BytesOut the bytes they sent (FramesIn/Writes hints at batching).
	FramesIn, Writes, BytesOut uint64
	// Under LivenessSWIM: membership datagrams received and sent, streams
	// opened either way, datagrams and streams refused for coming from
	// an address outside the peers table, datagrams and streams dropped
	// because membership had not taken the earlier ones yet, and
	// sessions killed because membership declared their node dead.
	SWIMIn, SWIMOut, SWIMStreams, SWIMForeign, SWIMDropped, SWIMDown uint64
	// Members is how many nodes membership knows alive, this one
	// included (0 under LivenessHeartbeat).
	Members int
}

// NetStats returns the transport counters.
func (n *NIC) NetStats() NetStats {
	c := &n.nctr
	members := 0
	if n.members != nil {
		members = n.members.Stats().Alive
	}
	return NetStats{
		Members:           members,
		HandshakeRejected: c.handshakeRejected.Load(),
		BadFrames:         c.badFrames.Load(), Oversized: c.oversized.Load(),
		HeartbeatTimeouts: c.heartbeatTimeouts.Load(),
		SessionsUp:        c.sessionsUp.Load(), SessionsDown: c.sessionsDown.Load(),
		StaleVELO: c.staleVELO.Load(),
		Dials:     c.dials.Load(), DialErrors: c.dialErrors.Load(),
		FramesIn: c.framesIn.Load(), Writes: c.writes.Load(), BytesOut: c.bytesOut.Load(),
		SWIMIn: c.swimIn.Load(), SWIMOut: c.swimOut.Load(), SWIMStreams: c.swimStreams.Load(),
		SWIMForeign: c.swimForeign.Load(), SWIMDropped: c.swimDropped.Load(), SWIMDown: c.swimDown.Load(),
	}
}

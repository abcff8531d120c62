package fabnet

import (
	"sync/atomic"

	"github.com/exn-project/exn/fabric/members"
)

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
	datagramForeign   atomic.Uint64 // lazy.go's datagrams from the wrong IP
	swimDown          atomic.Uint64
	// lazy sessions (lazy.go)
	activated                     atomic.Uint64
	connectWaits, connectTimeouts atomic.Uint64
	dialAsks, dialAsked           atomic.Uint64
	mcastOut, mcastIn             atomic.Uint64
	mcastDropped, badDatagrams    atomic.Uint64
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
	// because membership had not taken the earlier ones yet, and nodes
	// membership declared dead or saw leave (their session, if any, is
	// killed).
	SWIMIn, SWIMOut, SWIMStreams, SWIMForeign, SWIMDropped, SWIMDown uint64
	// Members is how many nodes membership knows alive, this one
	// included (0 under LivenessHeartbeat).
	Members int
	// Sessions is how many sessions are up now.
	Sessions int
	// Under SessionsLazy (lazy.go): Activated counts peers whose
	// session keeper started (first use, either side); ConnectWaits the
	// Sends and Posts that waited for a first session and
	// ConnectTimeouts those that gave up after connectWait; DialAsks the
	// dial requests sent to lower peers (counted as they are handed to
	// the socket) and DialAsked those received; MulticastOut and
	// MulticastIn the multicast datagrams sent to (likewise) and taken
	// from members without a session, and MulticastDropped those
	// that found the mailbox full; BadDatagrams the dial requests and
	// multicast datagrams refused as malformed or from a node that may
	// not send them (a wrong source IP counts in SWIMForeign).
	Activated, ConnectWaits, ConnectTimeouts, DialAsks, DialAsked uint64
	MulticastOut, MulticastIn, MulticastDropped, BadDatagrams     uint64
}

// NetStats returns the transport counters.
func (n *NIC) NetStats() NetStats {
	c := &n.nctr
	r, _ := n.MembershipStats() // zero under heartbeat liveness
	ts, alive := r.Transport, r.Members.Alive
	sessions := 0
	for _, s := range *n.sessions.Load() {
		if !s.isDead() {
			sessions++
		}
	}
	return NetStats{
		Members:      alive,
		Sessions:     sessions,
		Activated:    c.activated.Load(),
		ConnectWaits: c.connectWaits.Load(), ConnectTimeouts: c.connectTimeouts.Load(),
		DialAsks: c.dialAsks.Load(), DialAsked: c.dialAsked.Load(),
		MulticastOut: c.mcastOut.Load(), MulticastIn: c.mcastIn.Load(),
		MulticastDropped: c.mcastDropped.Load(), BadDatagrams: c.badDatagrams.Load(),
		HandshakeRejected: c.handshakeRejected.Load(),
		BadFrames:         c.badFrames.Load(), Oversized: c.oversized.Load(),
		HeartbeatTimeouts: c.heartbeatTimeouts.Load(),
		SessionsUp:        c.sessionsUp.Load(), SessionsDown: c.sessionsDown.Load(),
		StaleVELO: c.staleVELO.Load(),
		Dials:     c.dials.Load(), DialErrors: c.dialErrors.Load(),
		FramesIn: c.framesIn.Load(), Writes: c.writes.Load(), BytesOut: c.bytesOut.Load(),
		SWIMIn: ts.In, SWIMOut: ts.Out, SWIMStreams: ts.Streams,
		SWIMForeign: ts.Foreign, SWIMDropped: ts.Dropped, SWIMDown: c.swimDown.Load(),
	}
}

// MembershipStats reports membership's counters in the form every
// backend with membership shares (the daemon's metrics); false under
// heartbeat liveness. The lazy sessions' own counters are in NetStats.
func (n *NIC) MembershipStats() (members.Report, bool) {
	if n.members == nil {
		return members.Report{}, false
	}
	ts := n.swim.Stats()
	ts.Foreign += n.nctr.datagramForeign.Load()
	return members.Report{Transport: ts, Members: n.members.Stats(), DeclaredDead: n.nctr.swimDown.Load()}, true
}

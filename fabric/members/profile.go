package members

import (
	"time"

	"github.com/hashicorp/memberlist"
)

// Profile is the tuning of the failure detector. The zero Profile means
// Fabric.
type Profile struct {
	// ProbeInterval is how often a node probes one peer. It sets the
	// idle cost (one ping and one ack sent and received per interval)
	// and the first term of the detection time.
	ProbeInterval time.Duration
	// ProbeTimeout is how long a direct probe waits for its ack before
	// the indirect probes go out; it must exceed the fabric's round trip
	// under load.
	ProbeTimeout time.Duration
	// IndirectChecks is how many peers probe on a node's behalf when its
	// direct probe went unanswered (SWIM's k).
	IndirectChecks int
	// SuspicionMult scales the suspicion timeout: SuspicionMult ·
	// max(1, log10 n) · ProbeInterval at the least (memberlist's
	// suspicionTimeout); Lifeguard starts it at SuspicionMaxTimeoutMult
	// times that and lowers it towards the least as SuspicionMult−2
	// independent confirmations arrive.
	SuspicionMult           int
	SuspicionMaxTimeoutMult int
	// GossipInterval and GossipNodes: how often, and to how many peers,
	// pending state changes are gossiped (nothing is sent when none are
	// pending). A GossipInterval equal to ProbeInterval costs no wake-up
	// of its own: memberlist starts both tickers together
	// (memberlist state.go, schedule), so they fire together.
	GossipInterval time.Duration
	GossipNodes    int
	// RetransmitMult: each state change is piggy-backed RetransmitMult ·
	// ceil(log10(n+1)) times.
	RetransmitMult int
	// PushPullInterval is the full state exchange with one random peer
	// (anti-entropy), scaled up by memberlist above 32 nodes.
	PushPullInterval time.Duration
	// StreamTimeout bounds one stream exchange (a join's or
	// anti-entropy's full state, the TCP fallback probe).
	StreamTimeout time.Duration
}

// Fabric is the profile exnd uses. Against memberlist's LAN profile
// (probe 1 s, timeout 500 ms, suspicion ×4, gossip 200 ms to 3) it
// probes four times as often, to find a dead node within the bounds of
// issue #36 (every peer knows within 3 s at 24 nodes, 100 of 1,000 dead
// within 5 s), at a cost that stays constant per node. The figures
// behind each value are in docs/membership.md.
var Fabric = Profile{
	ProbeInterval:           250 * time.Millisecond,
	ProbeTimeout:            125 * time.Millisecond,
	IndirectChecks:          3,
	SuspicionMult:           3,
	SuspicionMaxTimeoutMult: 2,
	// Gossip on the probe's ticks, to five peers: the same 20 gossip
	// messages a second as every 200 ms to four, and no ticks of its
	// own. Each tick of an idle Go process wakes two threads twice here
	// (docs/membership.md, "Timer ticks and compression"): gossip on its
	// own ticker was a quarter of an idle node's wake-ups.
	GossipInterval: 250 * time.Millisecond,
	GossipNodes:    5,
	RetransmitMult: 4,
	// Anti-entropy every 5 s (memberlist's LAN profile: 30 s): a node
	// whose gossip missed a join learns it within one period. In the
	// simulation (sim_test.go) one node in six runs of 16 still missed
	// two joins after 30 s with 30 s.
	PushPullInterval: 5 * time.Second,
	// memberlist's LAN profile waits 10 s: a join through a node whose
	// process is not up yet (its port accepts, nobody answers) would
	// hold the joiner that long. The full state of 1,000 nodes moves in
	// well under a second.
	StreamTimeout: 2 * time.Second,
}

// apply writes p into a memberlist configuration, with compression off.
func (p Profile) apply(c *memberlist.Config) {
	c.ProbeInterval = p.ProbeInterval
	c.ProbeTimeout = p.ProbeTimeout
	c.IndirectChecks = p.IndirectChecks
	c.SuspicionMult = p.SuspicionMult
	c.SuspicionMaxTimeoutMult = p.SuspicionMaxTimeoutMult
	c.GossipInterval = p.GossipInterval
	c.GossipNodes = p.GossipNodes
	c.RetransmitMult = p.RetransmitMult
	c.PushPullInterval = p.PushPullInterval
	c.TCPTimeout = p.StreamTimeout
	// No LZW: memberlist compresses every message it sends and keeps the
	// result only when it is smaller, which a 20–60 byte probe or ack
	// never is; each try allocated and cleared the LZW writer's 64 KiB
	// table, 7 % of an idle node's CPU with the collections it caused
	// (docs/membership.md, "Timer ticks and compression").
	c.EnableCompression = false
}

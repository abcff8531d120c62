package ofi

import (
	"errors"
	"log/slog"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/members"
	"github.com/exn-project/exn/fabric/peers"
)

// Defaults of Config. Each is the smallest value that keeps the common
// case off the slow path; see docs/fabric-ofi.md.
const (
	// DefaultMailboxSlots is the initial VELO mailbox size per VPID: 1024
	// slots of 128 B, as in fabric/mem (16 NAPI budgets of 64).
	DefaultMailboxSlots = 1024
	// DefaultCredits is the send window of one (sender VPID, target VPID)
	// pair: a whole NAPI budget plus as much again in flight, so a
	// receiver one poll behind never throttles a sender.
	DefaultCredits = 128
	// DefaultRecvSlots is the number of pre-posted 128-byte receive
	// buffers: enough for every credit window of a few busy pairs at once
	// (the provider queues unexpected messages beyond them; nothing drops).
	DefaultRecvSlots = 1024
	// DefaultSendSlots is the number of VELO send buffers in flight.
	DefaultSendSlots = 512
	// DefaultPort is the port the ofi backend listens on when a peers-file
	// address has none (sockaddr providers such as tcp and verbs).
	DefaultPort = 7471
	// MembershipPortOffset puts a node's membership (Config.Liveness =
	// LivenessSWIM) at its fabric port plus this, UDP and TCP: the tcp
	// provider holds the fabric port's TCP side, and nodes of one host
	// are given nearby fabric ports, so the offset is larger than a
	// host's node count is expected to be.
	MembershipPortOffset = 100
	// LivenessSWIM (Config.Liveness) runs membership beside the
	// provider.
	LivenessSWIM = "swim"
)

// Config selects and tunes one node's libfabric NIC.
type Config struct {
	// Provider is the libfabric provider: "tcp", "shm", "verbs", "efa",
	// "cxi", ... It is matched as fi_getinfo's prov_name, so "tcp" also
	// selects the "tcp;ofi_rxm" stack. Required.
	Provider string
	// Node is this node's fabric ID.
	Node fabric.NodeID
	// Peers is the peers file: every other node's address, inserted into
	// the address vector with fi_av_insertsvc (host and port, DefaultPort
	// if none). The line for Node, if any, is the local bind address.
	// In-process fabrics leave it empty and exchange addresses with
	// (*NIC).Name and (*NIC).AddPeer instead.
	Peers []peers.Peer
	// Bind, if set, is the local "host:port" (or provider-specific node
	// name) to bind, overriding Node's line in Peers.
	Bind string
	// MailboxSlots is the initial mailbox size per VPID (default
	// DefaultMailboxSlots).
	MailboxSlots int
	// Credits is the send window per (sender VPID, target VPID) pair
	// (default DefaultCredits, at least 2).
	Credits int
	// NotifyDepth is the notification queue depth per VPID (default and
	// minimum fabric.DefaultNotifyDepth).
	NotifyDepth int
	// RecvSlots and SendSlots size the pre-posted receive and the send
	// buffer pools (defaults DefaultRecvSlots, DefaultSendSlots).
	RecvSlots, SendSlots int
	// RMAMerge is the most requests of one Post that may travel as one
	// provider operation (rma.go): 0 means as many as the provider's iov
	// limits allow, up to 4; 1 turns merging off.
	RMAMerge int
	// NoBundles sends every VELO message as its own provider message
	// (bundle.go); the node still takes bundles from its peers.
	NoBundles bool
	// Liveness: LivenessSWIM runs membership (fabric/members: SWIM over
	// UDP and TCP on this node's peers-file IP at its port plus
	// MembershipPortOffset), so a peer that froze or vanished while idle
	// is found within seconds and its callers released; it needs an IP
	// literal in every peers-file line. Anything else (the default) keeps
	// the backend's own liveness only: a goodbye from a closing peer, a
	// failed send (docs/fabric-ofi.md, "Membership").
	Liveness string
	// SWIM tunes membership (the zero value: members.Fabric).
	SWIM members.Profile
	// Logger receives the backend's log lines; nil means slog.Default().
	Logger *slog.Logger
}

// ErrNotBuilt is returned by Open in a build without the ofi tag.
var ErrNotBuilt = errors.New("ofi: libfabric backend not in this build; rebuild with cgo and `go build -tags ofi` (needs libfabric-dev)")

func (c *Config) setDefaults() {
	if c.MailboxSlots <= 0 {
		c.MailboxSlots = DefaultMailboxSlots
	}
	if c.Credits <= 0 {
		c.Credits = DefaultCredits
	}
	c.Credits = max(c.Credits, 2)
	if c.NotifyDepth < fabric.DefaultNotifyDepth {
		c.NotifyDepth = fabric.DefaultNotifyDepth
	}
	if c.RecvSlots <= 0 {
		c.RecvSlots = DefaultRecvSlots
	}
	if c.SendSlots <= 0 {
		c.SendSlots = DefaultSendSlots
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

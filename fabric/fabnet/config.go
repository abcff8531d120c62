package fabnet

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/members"
	"github.com/exn-project/exn/fabric/peers"
)

// Defaults. Each is a trade-off named here once.
const (
	// DefaultPort is the fabric port used for a peers-file address that
	// has none.
	DefaultPort = "7947"

	// DefaultHeartbeat is how often every connection carries a heartbeat
	// frame. 200 ms costs 40 bytes/s per peer and, with
	// DefaultDeadAfter, bounds detection of a dead or half-open peer to
	// under a second.
	DefaultHeartbeat = 200 * time.Millisecond
	// DefaultDeadAfter is how long a connection may stay silent (no frame
	// at all, heartbeats included) before the peer is declared down:
	// three missed heartbeats, so one delayed heartbeat on a loaded host
	// is not a false failure.
	DefaultDeadAfter = 3 * DefaultHeartbeat

	// DefaultMailboxSlots is the VELO mailbox size per VPID, as in mem:
	// 1024 slots of 128 B.
	DefaultMailboxSlots = 1024

	// handshakeTimeout bounds the hello exchange, so a connection that
	// never speaks (a port scanner, a half-open socket) holds a handshake
	// goroutine for at most this long.
	handshakeTimeout = 2 * time.Second
	// maxHandshakes bounds concurrent unauthenticated connections; more
	// are closed at once and counted, so a flood cannot exhaust
	// goroutines or fds.
	maxHandshakes = 32
	// dialTimeout bounds one connection attempt.
	dialTimeout = 2 * time.Second
	// backoffMin and backoffMax bound the reconnect backoff. It doubles
	// per failed attempt and resets after a session was up, so a restarted
	// peer is found within backoffMax and a dead one costs at most one
	// SYN per second.
	backoffMin = 20 * time.Millisecond
	backoffMax = time.Second
	// connectWait bounds how long a first Send or Post to a peer waits
	// for the session made on first use (lazy.go): a dial request, a
	// TCP handshake and the hellos take well under a millisecond on a
	// LAN, and a peer that cannot be reached in a dial's own timeout is
	// down for this caller.
	connectWait = dialTimeout
)

// Sessions names when sessions are made (Config.Sessions).
type Sessions string

const (
	// SessionsLazy: a session is made when a peer is first used, by
	// either side (lazy.go), and kept up from then on.
	SessionsLazy Sessions = "lazy"
	// SessionsEager: every pair at start, the lower ID dialling.
	SessionsEager Sessions = "eager"
)

// Liveness names a way to find dead peers (Config.Liveness).
type Liveness string

const (
	LivenessSWIM      Liveness = "swim"
	LivenessHeartbeat Liveness = "heartbeat"
)

// Config configures one node's NIC.
type Config struct {
	// Node is this node's ID.
	Node fabric.NodeID
	// Listen is the TCP address to listen on, e.g. ":7947" or
	// "127.0.0.1:0". Ignored when Listener is set; when both are empty
	// the node's own entry in Peers is used.
	Listen string
	// Listener, if set, is used instead of listening on Listen; the NIC
	// owns it and closes it. Tests use it to learn every port before any
	// node starts.
	Listener net.Listener
	// Peers maps every node of the fabric to its fabric address
	// (host:port). It may include this node. A connection from a node not
	// in Peers, or from an IP other than its entry's (when the entry is an
	// IP literal), is refused. Nodes with a lower ID dial nodes with a
	// higher ID.
	Peers map[fabric.NodeID]string
	// Liveness chooses how dead peers are found: LivenessSWIM (the
	// default: membership by SWIM, swim.go, a constant cost per node at
	// any cluster size) or LivenessHeartbeat (a heartbeat on every
	// session every Heartbeat, dead after DeadAfter of silence: a cost
	// per node that grows with the cluster). Every node of a fabric must
	// use the same.
	Liveness Liveness
	// Sessions chooses when sessions are made under LivenessSWIM:
	// SessionsLazy (the default: when a peer is first used, so a node
	// that talks to 10 of 1,000 peers holds 10 sessions; lazy.go) or
	// SessionsEager (every pair at start). LivenessHeartbeat is always
	// eager: its heartbeats need a session to every peer.
	Sessions Sessions
	// SWIM tunes the failure detector under LivenessSWIM (the zero value:
	// members.Fabric).
	SWIM members.Profile
	// Heartbeat is the heartbeat interval (DefaultHeartbeat if 0) and
	// DeadAfter the silence after which a peer is down (DefaultDeadAfter
	// if 0; at least 2 × Heartbeat). Under LivenessSWIM no heartbeats are
	// sent; DeadAfter still bounds each session write.
	Heartbeat, DeadAfter time.Duration
	// MailboxSlots is the VELO mailbox size per VPID
	// (DefaultMailboxSlots if 0).
	MailboxSlots int
	// NotifyDepth is the notification queue depth per VPID
	// (fabric.DefaultNotifyDepth if 0).
	NotifyDepth int
	// Logger receives connection events and rate-limited fault reports;
	// nil discards.
	Logger *slog.Logger
	// Now is the clock for liveness; nil means time.Now. Tests inject a
	// clock to expire a silent peer without waiting.
	Now func() time.Time
}

func (c *Config) setDefaults() error {
	switch c.Liveness {
	case "":
		c.Liveness = LivenessSWIM
	case LivenessSWIM, LivenessHeartbeat:
	default:
		return fmt.Errorf("fabnet: liveness %q (swim or heartbeat): %w", c.Liveness, fabric.ErrInvalid)
	}
	switch c.Sessions {
	case "":
		c.Sessions = SessionsLazy
	case SessionsLazy, SessionsEager:
	default:
		return fmt.Errorf("fabnet: sessions %q (lazy or eager): %w", c.Sessions, fabric.ErrInvalid)
	}
	if c.Liveness == LivenessHeartbeat {
		c.Sessions = SessionsEager
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.DeadAfter <= 0 {
		c.DeadAfter = 3 * c.Heartbeat
	}
	if c.DeadAfter < 2*c.Heartbeat {
		return fmt.Errorf("fabnet: dead-after %v < 2 × heartbeat %v: %w", c.DeadAfter, c.Heartbeat, fabric.ErrInvalid)
	}
	if c.MailboxSlots <= 0 {
		c.MailboxSlots = DefaultMailboxSlots
	}
	if c.NotifyDepth <= 0 {
		c.NotifyDepth = fabric.DefaultNotifyDepth
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// PeerAddrs turns a parsed peers file into Config.Peers. An address
// without a port gets port (DefaultPort if empty).
func PeerAddrs(ps []peers.Peer, port string) map[fabric.NodeID]string {
	if port == "" {
		port = DefaultPort
	}
	m := make(map[fabric.NodeID]string, len(ps))
	for _, p := range ps {
		if _, _, err := net.SplitHostPort(p.Addr); err == nil {
			m[p.Node] = p.Addr
		} else {
			m[p.Node] = net.JoinHostPort(p.Addr, port)
		}
	}
	return m
}

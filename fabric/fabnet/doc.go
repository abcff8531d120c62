// Package fabnet is the fabric backend for nodes on different hosts: one
// TCP connection per node pair carries VELO messages, RMA requests and
// data, credits and heartbeats, in the shape of libfabric's tcp provider.
//
// Open starts a node from a Config (node ID, listen address, the peers
// table). The node with the lower ID dials; every connection starts with a
// hello (magic, protocol version, node ID, incarnation) checked against
// the peers table, then carries length-prefixed frames (wire.go). Frame
// sizes are checked from the 8-byte prefix before anything else is read.
//
// VELO: a sender spends a credit per message; credits are mailbox slots
// the receiving node granted for that (node, VPID), so a full mailbox
// back-pressures the sender and the receiver never drops or stalls its
// connection. Order per (source, target VPID) is TCP order.
//
// RMA: PUT streams the data in 64 KiB chunks, read straight from the
// requester's region and written straight into the target region after
// the target checks VPID ownership and bounds; an ack brings completion
// back. GET is a request the target checks and answers with data chunks
// that land straight in the requester's region. Completion is
// asynchronous and reported only by notifications (Table 3.1, LastFrame
// local addresses, error notifications to the requester).
//
// Sessions: under membership liveness (the default) a session is made
// when a peer is first used, by either side (lazy.go: the higher ID asks
// the lower to dial by a datagram), and multicast reaches members
// without one by datagram; Config.Sessions = SessionsEager makes every
// pair at start.
//
// Liveness: membership by SWIM (swim.go, fabric/members), the default;
// or heartbeats every Config.Heartbeat, where a peer silent for
// Config.DeadAfter (dead, or the connection half-open) is down: blocked
// senders get fabric.ErrPeerDown, outstanding RMA an NErrPeerDown
// notification. The dialler reconnects with backoff, so a restarted peer
// rejoins without restarting the others.
//
// docs/fabric-net.md has the protocol, the design choices and the
// measurements.
//
// # Ownership and imports
//
// fabnet owns the TCP sessions, the wire format and the peer liveness of
// this backend. It may import fabric, fabric/internal/localq, fabric/peers,
// internal/sys, internal/ratelog and the standard library, never another
// backend. The folder was fabric/net until issue #17; the backend's spec
// name is still "net".
package fabnet

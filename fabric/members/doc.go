// Package members is cluster membership and failure detection for the
// fabric's nodes whose cost per node does not grow with the cluster
// (issue #36): SWIM with Lifeguard, as hashicorp/memberlist implements it
// (Consul and Serf build on it), tuned for a fabric (profile.go).
//
// Each node probes one peer per ProbeInterval (indirectly through
// IndirectChecks others when the direct probe gets no answer), suspects a
// peer that answers neither, and declares it dead when nobody refuted the
// suspicion within a timeout that grows with log10 of the cluster size;
// joins, suspicions and deaths travel piggy-backed on the probes and on
// gossip to GossipNodes peers per GossipInterval. A node therefore sends
// and receives a constant number of messages per period at any cluster
// size, and a death reaches every node in a time that grows only
// logarithmically. The choice, its measured cost and its detection times
// are in docs/membership.md.
//
// The transport is the caller's (memberlist.Transport): packets and
// streams between nodes by address. Transport (transport.go) is the one
// the backends share: a UDP socket and TCP streams, every datagram and
// stream checked against the peers' IPs, streams through the backend's
// own port (fabric/fabnet) or the Transport's own listener (fabric/ofi).
// Nodes are named by their fabric node ID in decimal.
//
// # Ownership and imports
//
// members owns the memberlist instance of one node, its tuning, the
// translation of its events into fabric node IDs, the shared transport
// and the join loop. It imports fabric, internal/ratelog, internal/sys,
// x/sys/unix and hashicorp/memberlist; fabric backends import it, never the reverse.
package members

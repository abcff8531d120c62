// Package mem is the in-process fabric backend: every node of a Cluster is a
// fabric.NIC in the same Go process, VELO mailboxes are bounded rings of
// fabric.Message values, registered regions are Go byte slices, and RMA is a
// single copy done by the requesting goroutine.
//
// It implements the whole fabric contract (back-pressure, ordering, Table
// 3.1 notifications with LastFrame local addresses, error notifications,
// VPID isolation, multicast, liveness) and passes fabric/fabrictest. It is
// the backend for unit tests and for the in-process N-node cluster.
//
// Lock order (outer first): Cluster.mu → nic.mu → nic.regMu → region.mu
// (several regions: ascending (node, index)) → mailbox.mu / notifyQueue.mu.
// No lock is held while a sender blocks on a full mailbox.
//
// # Ownership and imports
//
// mem owns only what is in-process: the Cluster, its mailboxes and the
// copying RMA. It may import fabric, fabric/internal/localq,
// internal/ratelog and the standard library, never another backend.
package mem

// Package fabric is the contract of the emulated Extoll NIC.
//
// It defines the types every backend shares — node IDs, VPIDs, network
// logical addresses (NLAs), VELO messages, RMA requests and notifications —
// and the two interfaces a backend implements: NIC (one per node) and
// Endpoint (one per VPID on that node).
//
// The semantics follow the dissertation's §3.2, as docs/design.md "The
// emulated NIC" sets them out:
//
//   - VELO is two-sided. A message is an 8-byte descriptor plus at most
//     MaxVELOPayload (120) bytes. It lands in the target VPID's mailbox, a
//     ring of SlotSize (128) byte slots. Delivery is reliable and in order per
//     (source node, source VPID, target VPID). A full mailbox back-pressures
//     the sender; nothing is dropped silently.
//   - RMA moves up to MaxRMALen (8 MiB) per request between registered
//     regions. Data moves in RMAMTU (496) byte packets, and a notification's
//     local address is that of the last packet (equations 5.1/5.2, see
//     LastFrame). A request outside a region registered to the addressed
//     VPID produces an error notification and touches no memory.
//   - Multicast is VELO only, to at most 64 groups; group 63 (Broadcast) is
//     every node.
//   - A peer that disappears becomes ErrPeerDown for its callers; a sender
//     blocked on it returns.
//
// Optional interfaces say more than the contract promises: PeerWatcher
// (a NIC announces changes of its peer set), PutOrderer (an Endpoint
// places its PUTs before its later VELO messages to the same node, which
// exn's receiver-granted PUT needs) and BufferRegistrar (an Endpoint
// registers memory its caller owns, such as a mapping shared with
// another process). One says less: BestEffortMulticaster (an Endpoint's
// multicast may reach some members unordered and droppable, as a
// datagram; EXT-Eth's broadcasts need neither order nor back-pressure).
//
// Backends live in sub-packages (fabric/mem, fabric/shm, ...) and all pass
// the conformance suite in fabric/fabrictest.
//
// # Ownership and imports
//
// fabric owns the contract: the types, the NIC and Endpoint interfaces,
// the wire forms of descriptors and notifications, the MAC scheme, the
// shared counters and errors. It imports only the standard library, and
// every other exn package that touches the fabric imports it.
package fabric

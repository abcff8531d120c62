// Package ofi is the libfabric backend of the emulated Extoll NIC: each
// node is one libfabric reliable-datagram (FI_EP_RDM) endpoint, on any
// provider that offers FI_MSG, FI_RMA, FI_SOURCE and send-after-send
// ordering — tcp and shm here, verbs, efa or cxi on clusters.
//
// It is built only with cgo and the build tag ofi (`go build -tags ofi`,
// libfabric-dev installed). Without the tag the package still compiles
// and Open returns ErrNotBuilt.
//
// Mapping of the fabric contract (details in docs/fabric-ofi.md):
//
//   - One libfabric endpoint per node; VPIDs are demultiplexed in
//     software. Every packet is at most one 128-byte mailbox slot: an
//     8-byte header (the VELO descriptor plus target VPID, epoch and
//     packet type) and up to 120 bytes; except a bundle (bundle.go), up
//     to 1 KiB: several VELO messages of one Send to one pair, sent only
//     to a target that said it takes them (Config.NoBundles: never).
//   - VELO: sends into pre-posted 1 KiB receive buffers. The sending
//     NIC code writes the source node and VPID; the receiver checks the
//     node against the libfabric source address (FI_SOURCE) and drops a
//     packet that disagrees. Back-pressure is credit based per (sender
//     VPID, target VPID): the first send asks the target whether the VPID
//     is open and gets a window; the receiver returns credits as Recv
//     frees slots, so a receiver never drops.
//   - RMA: fi_read and fi_write (FI_DELIVERY_COMPLETE) on regions of mmap
//     memory registered with fi_mr_reg, one registration per region; up
//     to four requests of one Post that share op, peer, flags and regions
//     travel as one operation (Config.RMAMerge). The
//     NLA layout is the contract's; the requester learns a region's key,
//     base and size with one query round trip and caches it. The target
//     hands a key out only for a region owned by the VPID addressed, and
//     the requester checks owner and bounds before it issues anything.
//   - Notifications: requester and (GET) completer notifications come
//     from the local completion queue; completer (PUT) and responder
//     (GET) notifications reach the target as a control packet after the
//     transfer completed, those of one operation in one packet.
//   - Multicast and broadcast fan out in software to every other node and
//     are filtered by membership where they land.
//   - Liveness: a node that closes says goodbye (and waits for the
//     acknowledgement); a failed send marks its peer down.
//
// Open takes a Config. Addresses come from the peers file (Config.Peers,
// fi_av_insertsvc) or, for fabrics built in one process, from Name and
// AddPeer.
package ofi

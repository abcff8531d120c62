// Package arp keeps the neighbour table (IP → MAC → node) learned by
// watching ARP and IPv6 NDP.
//
// exnd calls Table.Observe on every Ethernet frame in both directions: the
// frames the kernel writes to exn0 (our own replies and solicitations) and
// the frames arriving from the fabric (the peers'). Observe learns:
//
//   - ARP request and reply (IPv4 over Ethernet): sender IP → sender MAC.
//     Probes (sender IP 0.0.0.0) teach nothing.
//   - NDP Neighbor Solicitation, Router Solicitation and Router
//     Advertisement: IPv6 source → Source Link-Layer Address option. DAD
//     solicitations (source ::) teach nothing.
//   - NDP Neighbor Advertisement: target → Target Link-Layer Address
//     option, or the Ethernet source when the option is absent (Linux omits
//     it answering a unicast solicitation).
//
// Only MACs with the fabric prefix are learned; the node is decoded from
// the MAC (fabric.MACPrefix.Node). Other MACs are counted as foreign and
// ignored. Frames that claim to be ARP or NDP but do not parse — truncated,
// wrong sizes, bad option lengths, a bad ICMPv6 checksum or a hop limit
// other than 255 — are counted as malformed and ignored; nothing in a frame
// can make Observe panic or allocate per frame.
//
// An IP that moves to another MAC is a conflict: it is counted and logged
// (rate-limited), and for a learned entry the newer MAC wins, as in the
// kernel's own neighbour cache. Static entries (Seed, from the peers file)
// are configuration: observations never change them, a disagreeing one is
// only counted as a conflict.
//
// Observe is safe to call from several goroutines (exnd's rx and tx paths)
// while others call Lookup and Neighbors. Frames that are not ARP or ICMPv6
// leave after reading two header fields, without locks, atomics or
// allocation. Lookups take a read lock.
//
// # Ownership and imports
//
// arp owns the neighbour table and the parsing of ARP and NDP frames it
// learns from; it does not send or answer anything (the kernel does). It may
// import fabric (node IDs, the MAC scheme), fabric/peers (static entries),
// internal/ratelog and the standard library. The daemon (which also hands
// its Lookup to EXT-DS) and metrics use it; it never imports the engine,
// the TAP or a backend.
package arp

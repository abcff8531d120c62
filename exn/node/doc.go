// Package node brings up one exn node in userspace: an EXT-Eth engine on
// VPID 0 of a fabric.NIC, and a gVisor network stack (IPv4, IPv6, ARP,
// NDP, TCP, UDP, ICMP) attached to it through an exn/netstack endpoint in
// place of the TAP. Go code then dials and listens through gonet:
//
//	n, err := node.New(node.Config{NIC: nic, Addr: netip.MustParsePrefix("10.88.0.1/24")})
//	c, err := n.DialContext(ctx, "tcp", "10.88.0.2:5001")
//
// Cluster builds an in-process N-node cluster on fabric/mem (nodes 1..N,
// addresses 10.88.0.1..N/24); exnperf and the tests use it.
//
// Ownership: a Node owns its engine, its netstack and the VPID 0 endpoint
// it opened, and closes them in Close; the NIC belongs to the caller
// (Cluster owns the NICs it created).
package node

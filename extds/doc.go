// Package extds is EXT-DS: stream sockets that bypass TCP between peers on
// the fabric (§5.5 of the dissertation).
//
// A Device attaches one node to the fabric: it owns the 16 endpoints of
// the reserved VPID block (virtual device = port & 0xF), runs a NAPI-style
// rx loop per endpoint and demultiplexes messages to connections by a
// connection ID carried in every message. Dial / Dialer and Listen /
// Listener set up a connection over a shadow TCP connection (kernel
// sockets over exn0, or any net.Conn, e.g. a netstack's), exchange node,
// VPID, RMA ring addresses and credits, and from then on move data only
// over the fabric: BCopy (eager VELO fragments up to a threshold, RMA PUT
// into the peer's ring above it, credits returned in batches with
// RMA_AVAIL) and ZCopy (WriteBuffer from fabric-registered memory, by
// RMA GET or PUT). A *Conn is a net.Conn with deadlines, CloseWrite and
// SetLinger; a peer not on the fabric, or not speaking EXT-DS, gets a
// plain TCP connection without an error (Conn.Mode, Stats.Fallbacks).
// Before its hello, a client probes the peer node's Device over the fabric
// for a listener on the port (Device.RegisterPort), so a plain server
// never receives EXT-DS bytes. Dialer.Upgrade and Device.AcceptShadow run
// the same set-up over a socket connected or accepted elsewhere; package
// shimsrv uses them for exnd's LD_PRELOAD shim.
//
// Wire formats, choices and numbers: docs/extds.md.
package extds

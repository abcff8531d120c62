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
//
// Where things are: conn.go is the Conn type and the one place its mode
// is dispatched; fallback.go the TCP fallback; stream*.go the EXT-DS data
// path (stream.go shared machinery, stream_write.go, stream_read.go,
// stream_rx.go the rx loop's handlers, stream_close.go), copy.go
// ReadFrom/WriteTo, zcopy.go ZCopy; handshake.go the set-up over the
// shadow connection, dial.go the Dialer, listen.go the Listener, claim.go
// the out-of-band agreement, probe.go the listener probe and other
// node-level messages; device.go the Device and its rx pipeline,
// config.go its options and tunables; attach.go a process attached
// through exnd; wire.go the message formats. Each file opens with its
// locks.
//
// # Ownership and imports
//
// extds owns the EXT-DS protocol: the Device (the virtual-device VPIDs,
// their rx loops, the connection table), the handshake and the fallback
// decision, the claim and probe exchanges, Conn and Listener, and the
// wire formats of all its messages. The fabric (its contract and
// counters) belongs to fabric, the control socket and its framing to
// control, the shim's operations to extds/shimsrv. It may import fabric,
// fabric/shm (only to attach a separate process to an shm fabric,
// AttachDevice), control and the standard library; never exn, tap or a
// daemon package. extds/shimsrv, metrics, perf and the daemon import it.
package extds

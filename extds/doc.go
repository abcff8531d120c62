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
// shadow connection, direct.go its direct offer, dial.go the Dialer,
// listen.go the Listener; device.go the Device, its rx pipeline and demux
// (NOCONN included), config.go its options and tunables, stats.go its
// counters; agreement.go the Device's side of the out-of-band agreement;
// attach.go a process attached through exnd; wire.go the part of the wire
// formats that is API (tags, ErrProtocol). Each file opens with its
// locks.
//
// Two internal packages hold what does not need the Device's internals:
//
//   - internal/wire, the wire formats of every message (fabric messages,
//     the agreement's bodies, the handshake records) and the fuzz targets
//     of their decoders. It imports nothing of extds.
//   - internal/agree, the out-of-band agreement between nodes: listener
//     probes and port registrations, claims, direct agreements over the
//     fabric, holds for short connections, the client's negative and hold
//     caches. One agree.Agent per Device (Device.agree). The dependency
//     is one-way: the Agent sees the Device only through agree.Host, five
//     methods that agreeHost (agreement.go) implements —
//     Open(vdev) error, Closed() bool, Send(ctx, vdev, msg) error,
//     Queue(vdev, wire.Ctl) for the control sender, Warn(msg, args) for
//     the rate-limited log — and names a vdev by its index. The Device
//     calls the Agent in three places: dispatch hands it the messages it
//     owns (agree.Handles: PROBE, PROBE_REPLY, CLAIM, CLAIM_REPLY,
//     CLAIM_DIRECT, COMMIT), tickLoop runs Agent.Sweep, and Stats adds
//     Agent.Stats; dial.go asks it (Offer, the negative cache), and the
//     exported methods of agreement.go hand their calls to it. An outcome
//     that makes a Conn (Claim.AgreeDirect aborted, AcceptHeld) is made
//     here, from what the Agent reports. An internal package rather than
//     a type in extds, so that the compiler keeps the agreement out of
//     the Device's and Conn's fields.
//
// # Ownership and imports
//
// extds owns the EXT-DS protocol: the Device (the virtual-device VPIDs,
// their rx loops, the connection table), the handshake and the fallback
// decision, Conn and Listener; through internal/agree the claim and probe
// exchanges, and through internal/wire the wire formats of all its
// messages. The fabric (its contract and counters) belongs to fabric,
// the control socket and its framing to control, the shim's operations
// to extds/shimsrv. It may import fabric, fabric/shm (only to attach a
// separate process to an shm fabric, AttachDevice), control, its
// internal packages and the standard library; never exn, tap or a daemon
// package. extds/shimsrv, metrics, perf and the daemon import it.
package extds

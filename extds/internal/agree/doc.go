// Package agree is the out-of-band agreement between the EXT-DS Devices
// of two nodes, over the fabric, before anything is written into a
// shadow TCP connection: the listener probe (probe.go), the claim of an
// accepted connection and its answer (claim.go), the direct agreement
// riding on it (claimdirect.go), and holds for short-lived connections
// (hold.go). One Agent per Device holds all of it: the registered ports,
// the claim table, the questions waiting for their answers, and the
// client's caches (negative, held peers).
//
// It sees its Device only through Host: open a virtual device (vdev),
// is it closed, send a message now, queue one for the control sender,
// log. A vdev is named by its index (a port's low 4 bits). The Device
// hands the Agent the messages it owns (Handles, Handle: PROBE,
// PROBE_REPLY, CLAIM, CLAIM_REPLY, CLAIM_DIRECT, COMMIT) from its rx
// loop, calls Sweep on its housekeeping tick, and adds Stats to its own.
// Everything a connection is (Conn, the rings, the handshake, the
// fallback) stays in extds: where an outcome makes a Conn (a direct
// agreement the client aborted), the Agent says so and extds makes it.
//
// Ownership and imports: agree owns the agreement's state and its state
// machines (docs/extds.md, "Negotiation", "Short connections"); the
// messages' bytes are extds/internal/wire's. It imports wire, fabric,
// internal/sys (the kernel's view of a TCP connection, hold.go) and the
// standard library; never extds (which imports it) or a daemon package.
// Only extds uses it; extds re-exports what its users need
// (TupleKey, DirectInfo, the constants).
package agree

// Package rdirect carries EXT-DS direct connections across hosts
// (issue #38; docs/direct.md, "Across hosts"). A program under the shim
// keeps the ABI of a direct connection exactly as on one host: it maps a
// connection buffer (extds/dring, layout version 3) and rings its bell
// B_S, one end of a socket pair whose other end B_{1−S} the engine
// holds (docs/direct.md, "One bell per side"). Each host has its own
// copy of the buffer, and on each host an Engine
// plays the peer side (1−S) in the local copy: it PUTs the bytes its
// program writes straight from the local buffer (registered with the
// fabric, fabric.BufferRegistrar) into the same offsets of the peer's
// copy, and sends the cursors in small VELO messages (CDC, wire.go) that
// the peer Engine stores in its own copy, as the peer program would.
//
// # What it owns
//
// The Engine (engine.go: its endpoint on VPID, the connection table, the
// goroutines), a connection's state across hosts (conn.go: start, reset,
// close, the receive side's checks), the transmit pump and its park on
// the connections' bells (pump.go), the receive loop (rx.go), the
// cursor message (wire.go) and the upgrade word's bits, which it carries
// between the copies and grants (upgrade.go; docs/shim.md, "Upgrade"). It does not own the buffer's files, bells or
// mapping (the caller, exnd's shim server, makes, maps, closes and unmaps
// them) nor the agreement that
// exchanges LocalID and LocalNLA (extds/internal/agree).
//
// # Imports
//
// fabric, extds/dring, internal/sys, internal/ratelog and the standard
// library; never extds itself, extds/shimsrv or gateway (they import
// this package).
package rdirect

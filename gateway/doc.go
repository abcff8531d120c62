// Package gateway is one exn node as a library: the gateway that joins a
// TAP (or, with --netstack, a userspace gVisor stack) to the EXT-Eth
// engine and the fabric, and the optional parts around it. cmd/exnd only
// wires it (Configure, then Run); a Go program may embed a node the same
// way, or call Start and Close itself.
//
// # What it owns
//
//   - configuration: flags, the --config file, validation (config.go);
//   - start-up and shut-down of one node in a fixed order, written out in
//     one place (Start in daemon.go, the optional parts in parts.go;
//     nothing registers itself from init());
//   - the daemon's control operations and metrics endpoint (ops.go);
//   - userspace access under --netstack: the SOCKS5 server, --forward and
//     --expose (access.go, the SOCKS5 protocol in socks5.go);
//   - the EXT-DS device and shim server wiring (extds.go) and the
//     kernel-bypass lease service for attached processes (extds_attach.go);
//   - peer liveness: polling the fabric's peer set and invalidating
//     neighbours of dead peers (liveness.go).
//
// The TAP pump (the reader that feeds the TAP's frames to the engine, and
// the engine's link that writes received frames to the TAP) is not here:
// it is exn/taplink, which Start constructs on the TAP (or the userspace
// stack's device) and the engine, starts, and closes before the engine.
//
// The parts stay in this one package for now: each uses the node's NIC,
// neighbour table and logger through *Daemon. docs/architecture.md says
// how they would split.
//
// # Imports
//
// gateway may import every exn library package (fabric and its backends
// through fabric/backend, fabric/fping, fabric/peers, fabric/shm for the
// lease service's shm.Lender, tap, exn, exn/taplink, exn/node,
// arp, extds, extds/shimsrv, control, metrics, internal/sys,
// internal/ratelog) and, of external modules, the Prometheus client. It
// must not import anything under cmd/, perf/ or integration/, and no
// library package below it may import gateway.
package gateway

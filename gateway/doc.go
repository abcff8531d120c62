// # Ownership and imports
//
// daemon owns exnd's configuration (flags, file, validation) and the
// wiring of one node: which parts start, in which order, and how they stop.
// Today it also holds logic that issue #17 moves into library packages
// (the TAP pump, the SOCKS5 and forward servers, leases, liveness; see
// docs/architecture.md). It may import every exn library package (fabric
// and its backends through fabric/backend, tap, exn, arp, extds,
// extds/shimsrv, control, metrics, internal/sys) but nothing under cmd/,
// and no library package may import it.
package gateway

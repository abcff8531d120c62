// Package shimsrv serves the LD_PRELOAD shim's control operations inside
// exnd; the protocol, goroutines and locks are described after this
// section (shimsrv.go).
//
// # Ownership and imports
//
// shimsrv owns the server side of the shim's control operations and the
// splice goroutines of switched connections. The EXT-DS protocol itself
// belongs to extds, the socket and its credentials to control, and the C
// side to shim/libextds.c. It may import extds, control, internal/sys and
// the standard library; only the daemon and metrics import it.
package shimsrv

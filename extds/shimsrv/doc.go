// Package shimsrv is exnd's side of the LD_PRELOAD shim (libextds.so): the
// control-socket operations through which the shim registers listening
// sockets and hands over connected TCP sockets, and the splice that moves
// a switched connection's bytes between an AF_UNIX socketpair end (which
// the shim dup3's over the application's descriptor) and an extds.Conn.
//
// Protocol (version 5, Version; control lines "OP ARGS\n", one JSON
// response line {"ok":..,"data":..,"error":..}, descriptors as
// SCM_RIGHTS; no request names a PID: the kernel says who calls, by
// SO_PEERCRED):
//
//	shim-hello 5              → {"version":5}
//	shim-listen   + socket    → {"port":P}  register the listening socket
//	shim-unlisten PORT        → {}          drop the caller's gone sockets
//	shim-connect  + fd        → {"mode":"extds","id":N} + socketpair end
//	  [direct|fd_limit]       | {"mode":"direct","id":N,"side":S,"ring":R}
//	                            + V, the buffer, the side's bell (direct.go)
//	                          | {"mode":"tcp","reason":R}  (no fd; R short_lived
//	                            also gives hold_ms, hold.go)
//	shim-accept   + fd        → same as shim-connect (claimed out of band)
//	shim-relay    + V, bell   → {}          relay a direct side (before exec)
//
// Any failure is {"ok":false,"error":"..."}; the shim then keeps plain
// TCP. docs/extds.md ("Shim server") has the behaviour in detail.
//
// Where things are: shimsrv.go (the Server, its counters and Close),
// listen.go (the listen registry and its sweeper), switch.go
// (shim-connect / shim-accept), splice.go (the bytes of a switched
// connection), owner.go (which registration covers an accept), state.go
// (registrations across exnd restarts), direct.go and dpool.go (direct
// connections), remote.go (direct connections across hosts, joined by the
// extds/rdirect engine), hold.go (holds for short connections). Each file opens with its
// goroutines and locks.
//
// # Ownership and imports
//
// shimsrv owns the server side of the shim's control operations and the
// splice goroutines of switched connections. The EXT-DS protocol itself
// belongs to extds, the socket and its credentials to control, and the C
// side to shim/ (libextds.c and its units), the moving of direct bytes
// across hosts to extds/rdirect. It may import extds, extds/dring,
// extds/rdirect, control, internal/sys and the standard library; only the daemon and metrics import it.
package shimsrv

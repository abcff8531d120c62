// Package control is exnd's control socket: a unix stream socket that
// carries one request line ("OP ARGS\n") and one JSON response line per
// call, with file descriptors passed as SCM_RIGHTS in either direction.
// Server dispatches operations to registered handlers, identifies every
// client from the kernel (SO_PEERCRED, never from the message) and applies
// the operator's access Policy; Client is the Go side of the protocol that
// exnctl and tests use; Format prints responses for people.
//
// # Ownership and imports
//
// control owns the transport, the framing and its limits (line length,
// descriptors per request, connections, timeouts), peer identification
// and the access policy. What an operation does belongs to the package
// that registers it (the daemon, extds, extds/shimsrv). It may import
// internal/sys (credentials, descriptor passing) and the standard library,
// and must not import any other exn package, so that every layer can
// register operations on it.
package control

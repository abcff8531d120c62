// Command exnctl talks to a running exnd over its control socket.
//
//	exnctl [--control PATH] [--json] [--timeout D] status|neighbors|stats|conns|ping NODE [-c COUNT]
//
// # Ownership and imports
//
// cmd/exnctl owns only argument parsing and output formatting; every
// operation is a request to exnd's control socket. It may import control
// and the standard library, nothing else of exn, so that it cannot grow
// logic of its own.
package main

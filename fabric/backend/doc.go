// Package backend opens a fabric.NIC from a backend spec string, the
// argument of exnd's --fabric flag:
//
//	mem              the in-process backend (needs Options.Mem)
//	shm:NAME         processes on one host, files /dev/shm/exn-NAME-*
//	net:LISTEN_ADDR  hosts over TCP (needs Options.Peers)
//	ofi:PROVIDER     libfabric (build tag ofi; else a clear error naming it)
//
// It is the one place that knows every backend, so commands and tests
// choose a fabric by string.
//
// # Ownership and imports
//
// backend owns the spec syntax (Parse, Spec, Kind) and the choice of
// backend (Open); the backends own everything else. It may import fabric,
// every backend package (fabric/mem, fabric/shm, fabric/fabnet,
// fabric/ofi) and fabric/peers. Backends never import it; commands, the
// daemon and tests do.
package backend

// Package shm is the fabric backend for separate OS processes on one host.
//
// Every node is a set of files under a directory (default /dev/shm), mode
// 0600, all named exn-<fabric>-…:
//
//	exn-F-fabric            fabric epoch: bumped on every join and leave
//	exn-F-n<N>              node file: header (magic, version, pid, node,
//	                        incarnation, state, multicast groups) and the
//	                        node's region table
//	exn-F-n<N>.<I>-v<V>     one per open VPID: header, VELO mailbox ring,
//	                        notification queue
//	exn-F-n<N>.<I>-v<V>.bell  the VPID's doorbell FIFO (mkfifo, 0600)
//	exn-F-n<N>.<I>-v<V>.space its space bell: senders blocked on a full
//	                        mailbox park on it (mkfifo, 0600; space.go)
//	exn-F-n<N>.<I>-r<X>.<G> one per registered region X, generation G
//
// where I is the node's incarnation, a random 64-bit number chosen at Open,
// so a restarted node never reuses a dead one's names.
//
// VELO is a multi-producer, single-consumer ring of 128-byte slots in the
// target's VPID file: senders in any process write into it directly, the
// owner reads. RMA is a single copy done by the requester, which maps the
// peer's region file (lazily, cached, checked against the region's
// generation on every request). So a region must be such a file, and
// endpoints do not implement fabric.BufferRegistrar (memory a caller
// owns is not one). Waiting spins (while waits are short),
// sleeps on a shared futex for a short slice (while the exchange is hot),
// then parks its goroutine in the Go netpoller on the VPID's doorbell
// FIFO, so an idle consumer holds no thread in a blocking system call;
// senders wake a consumer only when it has said it is asleep, and the way
// it said it sleeps (wait.go, ring.go). A sender blocked on a full
// mailbox parks the same way on the target's space bell, rung by the
// consumer when it frees slots (space.go).
//
// Liveness rests on flock: a node holds an exclusive lock on its node file
// (and on each VPID file) for its lifetime, and the kernel drops the lock
// when the process dies, however it dies, and the process's files close.
// Every NIC watches the fabric's directory for closed files (inotify) and
// then probes its peers' locks; also every livenessPeriod while one of its
// senders is blocked on a full mailbox, and every idleLivenessPeriod where
// inotify is unavailable. A lock it can take belongs to a dead node,
// whose files it then unlinks. See ring.go for the ring protocol and nic.go for
// discovery and reclamation; docs/fabric-shm.md has the measurements.
//
// # Ownership and imports
//
// shm owns the files, their layout (docs/shm-abi.md), the rings, the
// doorbells and the flock liveness. It may import fabric, internal/sys
// (futex, mmap, flock, FIFOs), internal/ratelog and the standard library,
// never another backend; extds imports it to attach processes to a fabric.
package shm

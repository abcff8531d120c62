// Package sys holds exn's raw system calls (futex, mmap, flock, ioctls), so
// no other package imports golang.org/x/sys/unix for them.
//
// The shared-memory helpers (futex.go, mmap.go, flock.go) serve
// fabric/shm: every futex here is a shared (not FUTEX_PRIVATE) futex, since
// the words live in MAP_SHARED files that several processes map.
//
// The socket helpers (sock_linux.go, sockdiag_linux.go) serve exnd's
// EXT-DS side: a peeked hello, a connection's age, and the kernel's
// sock_diag view of one TCP connection (accepted yet, last ACK); and
// the socket bells of direct connections (sockbell_linux.go: one
// AF_UNIX stream pair per connection, rung with send and drained to
// EAGAIN, made by socketpair or by a 0600 listener in the buffers'
// directory).
//
// # Ownership and imports
//
// sys owns every raw system call and ioctl exn makes; the callers own
// the policy around them. It imports golang.org/x/sys/unix and the standard
// library and may be imported by any package of exn.
package sys

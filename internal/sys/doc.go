// Package sys holds exn's raw system calls (futex, mmap, flock, ioctls), so
// no other package imports golang.org/x/sys/unix for them.
//
// The shared-memory helpers (futex.go, mmap.go, flock.go) serve
// fabric/shm: every futex here is a shared (not FUTEX_PRIVATE) futex, since
// the words live in MAP_SHARED files that several processes map.
//
// # Ownership and imports
//
// sys owns every raw system call and ioctl exn makes; the callers own
// the policy around them. It imports golang.org/x/sys/unix and the standard
// library and may be imported by any package of exn.
package sys

// Package sys holds exn's raw system calls (futex, mmap, flock, ioctls), so
// no other package imports golang.org/x/sys/unix for them.
//
// The shared-memory helpers (futex.go, mmap.go, flock.go) serve
// fabric/shm: every futex here is a shared (not FUTEX_PRIVATE) futex, since
// the words live in MAP_SHARED files that several processes map.
package sys

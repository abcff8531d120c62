// Package sys holds exn's raw system calls (futex, mmap, flock, ioctls), so
// no other package imports golang.org/x/sys/unix for them.
package sys

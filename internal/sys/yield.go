package sys

import "golang.org/x/sys/unix"

// Yield gives up the calling thread's CPU to any other runnable thread
// (sched_yield(2)). runtime.Gosched only lets other goroutines of this
// process run; a poll loop that waits for another process, or for the
// kernel's network stack, on a host with few cores must yield the CPU
// itself or it delays what it waits for.
func Yield() {
	unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) //nolint:errcheck // cannot fail
}

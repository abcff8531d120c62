package sys

import "golang.org/x/sys/unix"

// MonoNow returns CLOCK_MONOTONIC in nanoseconds: the clock every process
// of the host shares (Go's own monotonic readings are not comparable
// across processes), for deadlines that exnd hands to the C shim, which
// reads the same clock (shim/hold.c). 0 if the clock cannot be read.
func MonoNow() uint64 {
	var t unix.Timespec
	if unix.ClockGettime(unix.CLOCK_MONOTONIC, &t) != nil {
		return 0
	}
	return uint64(t.Sec)*1e9 + uint64(t.Nsec)
}

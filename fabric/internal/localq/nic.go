package localq

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exn-project/exn/fabric"
)

// FaultLogInterval bounds a NIC's fault logging: faults that can happen
// per message or per frame (a peer's malformed input, a notification
// overflow) are always counted and logged at most once per interval
// (internal/ratelog).
const FaultLogInterval = time.Second

// SelfAlive is fabric.NIC.Alive for the NIC's own node: nil while the
// NIC is open, net.ErrClosed (errors starting with prefix) once closed is
// set.
func SelfAlive(prefix string, closed *atomic.Bool) error {
	if closed.Load() {
		return fmt.Errorf("%s: alive: %w", prefix, net.ErrClosed)
	}
	return nil
}

// Each calls f for every open endpoint, in VPID order (a NIC's Close,
// or telling every endpoint that a peer went away). Endpoints opened or
// closed while it runs may or may not be seen.
func (t *Endpoints[E]) Each(f func(*E)) {
	for i := range t {
		if e := t[i].Load(); e != nil {
			f(e)
		}
	}
}

// ClosedChan reports, without blocking, whether ch is closed.
func ClosedChan(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Shut is the start of a NIC's Close: under mu (the lock that serialises
// Open and Close) it sets closed and runs f, if not nil, so no Open can
// slip in between. It reports false, running nothing, if the NIC was
// already closed: Close is idempotent.
func Shut(mu *sync.Mutex, closed *atomic.Bool, f func()) bool {
	mu.Lock()
	defer mu.Unlock()
	if closed.Swap(true) {
		return false
	}
	if f != nil {
		f()
	}
	return true
}

// AsNIC is a backend's exported Open around its own open: n as a
// fabric.NIC, or a nil interface (never a typed nil pointer) with err.
func AsNIC[N fabric.NIC](n N, err error) (fabric.NIC, error) {
	if err != nil {
		return nil, err
	}
	return n, nil
}

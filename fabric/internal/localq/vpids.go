package localq

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/exn-project/exn/fabric"
)

// Endpoints is a NIC's table of open VPIDs, read lock-free on the data
// path (an atomic pointer per VPID) and written under mu.
type Endpoints[E any] [256]atomic.Pointer[E]

// Open is fabric.NIC.Open's bookkeeping, shared by mem, fabnet and ofi:
// under mu it refuses a closed NIC (net.ErrClosed) and a VPID in use
// (fabric.ErrInUse, counted in ctr), else publishes mk() under v. prefix
// starts the errors ("mem", ...).
func Open[E any, P interface {
	*E
	fabric.Endpoint
}](eps *Endpoints[E], mu *sync.Mutex, closed *atomic.Bool, ctr *fabric.Counters, prefix string, node fabric.NodeID, v fabric.VPID, mk func() P) (fabric.Endpoint, error) {
	mu.Lock()
	defer mu.Unlock()
	if closed.Load() {
		return nil, fmt.Errorf("%s: open vpid %d: %w", prefix, v, net.ErrClosed)
	}
	if eps[v].Load() != nil {
		return nil, ctr.CountErr(fmt.Errorf("%s: open vpid %d on node %d: %w", prefix, v, node, fabric.ErrInUse))
	}
	e := mk()
	eps[v].Store((*E)(e))
	return e, nil
}

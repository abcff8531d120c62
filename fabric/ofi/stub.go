//go:build !(ofi && cgo)

package ofi

import (
	"fmt"

	"github.com/exn-project/exn/fabric"
)

// Built reports whether this binary has the libfabric backend.
const Built = false

// Open reports that this build has no libfabric backend. Build with cgo
// and `-tags ofi` (libfabric-dev installed) to get it.
func Open(cfg Config) (fabric.NIC, error) {
	return nil, fmt.Errorf("ofi: open provider %q for node %d: %w", cfg.Provider, cfg.Node, ErrNotBuilt)
}

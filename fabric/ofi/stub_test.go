//go:build !(ofi && cgo)

package ofi_test

import (
	"testing"

	"github.com/exn-project/exn/fabric/ofi"
)

// Without the build tag, Open must fail with ErrNotBuilt and say how to
// get the backend.
func TestOpenWithoutTag(t *testing.T) {
	openRefused(t, ofi.Config{Provider: "tcp", Node: 1}, ofi.ErrNotBuilt, "-tags ofi")
}

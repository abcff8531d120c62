//go:build !(ofi && cgo)

package ofi_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/exn-project/exn/fabric/ofi"
)

// Without the build tag, Open must fail with ErrNotBuilt and say how to
// get the backend.
func TestOpenWithoutTag(t *testing.T) {
	nic, err := ofi.Open(ofi.Config{Provider: "tcp", Node: 1})
	if nic != nil || !errors.Is(err, ofi.ErrNotBuilt) {
		t.Fatalf("Open = %v, %v; want nil, ErrNotBuilt", nic, err)
	}
	if !strings.Contains(err.Error(), "-tags ofi") {
		t.Fatalf("error %q does not name the build tag", err)
	}
}

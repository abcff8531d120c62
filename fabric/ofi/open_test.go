package ofi_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/exn-project/exn/fabric/ofi"
)

// openRefused checks that ofi.Open(cfg) fails, with an error that is want
// (unless want is nil) and whose text mentions every string of mentions.
// It serves the tests of Open with and without the ofi build tag.
func openRefused(t *testing.T, cfg ofi.Config, want error, mentions ...string) {
	t.Helper()
	nic, err := ofi.Open(cfg)
	if nic != nil || err == nil || want != nil && !errors.Is(err, want) {
		t.Fatalf("Open(%+v) = %v, %v; want nil and an error (%v)", cfg, nic, err, want)
	}
	for _, m := range mentions {
		if !strings.Contains(err.Error(), m) {
			t.Errorf("error %q does not mention %q", err, m)
		}
	}
}

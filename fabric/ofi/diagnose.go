package ofi

import (
	"fmt"
	"strings"
)

// Capability bits explain passes to its probe. They are libfabric's
// FI_MSG, FI_RMA and FI_SOURCE values (fabric.h), kept here so the
// explanation logic builds and is tested without cgo; cgo.go checks
// they match.
const (
	probeMsg    uint64 = 1 << 1
	probeRMA    uint64 = 1 << 2
	probeSource uint64 = 1 << 57
)

// explain names why a provider cannot carry the fabric, from the first
// requirement it fails: existing at all, an FI_EP_RDM endpoint with
// FI_MSG, FI_RMA, FI_SOURCE, and last send-after-send ordering with
// thread safety. probe asks libfabric for the provider with the given
// caps (rdm: endpoint type RDM; order: FI_ORDER_SAS); available lists the
// providers libfabric offers.
func explain(prov string, cause error, probe func(caps uint64, rdm, order bool) bool, available func() []string) error {
	switch {
	case !probe(0, false, false):
		return fmt.Errorf("ofi: provider %q not found (%v); available: %s (see `fi_info -l`; FI_PROVIDER filters them)",
			prov, cause, strings.Join(available(), ", "))
	case !probe(probeMsg, true, false):
		return fmt.Errorf("ofi: provider %q has no reliable datagram (FI_EP_RDM) endpoint with FI_MSG: %w", prov, cause)
	case !probe(probeMsg|probeRMA, true, false):
		return fmt.Errorf("ofi: provider %q lacks FI_RMA, which RMA PUT/GET needs: %w", prov, cause)
	case !probe(probeMsg|probeRMA|probeSource, true, false):
		return fmt.Errorf("ofi: provider %q lacks FI_SOURCE, which checking VELO source addresses needs: %w", prov, cause)
	}
	return fmt.Errorf("ofi: provider %q lacks send-after-send ordering (FI_ORDER_SAS) or FI_THREAD_SAFE: %w", prov, cause)
}

package backend

import (
	"fmt"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/ofi"
)

// openOFI opens a libfabric NIC. In a build without the ofi tag,
// ofi.Open fails with ofi.ErrNotBuilt, whose message names the tag.
// libfabric's own FI_* environment variables pass through untouched.
func openOFI(s Spec, node fabric.NodeID, opts Options) (fabric.NIC, error) {
	// ofi has no heartbeat: anything but swim keeps its own liveness
	// (docs/fabric-ofi.md "Membership"). Without a peers file (a node
	// alone) there is nobody to watch.
	live := ""
	if opts.Liveness == "" || opts.Liveness == ofi.LivenessSWIM {
		if len(opts.Peers) > 0 {
			live = ofi.LivenessSWIM
		}
	}
	nic, err := ofi.Open(ofi.Config{Provider: s.Arg, Node: node, Peers: opts.Peers, Logger: opts.Logger, Liveness: live})
	if err != nil {
		return nil, fmt.Errorf("fabric %s: node %d: %w", s, node, err)
	}
	return nic, nil
}

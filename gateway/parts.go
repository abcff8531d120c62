package gateway

// The optional parts of a node and the one place they are started.
//
// Start (daemon.go) brings a node up in this fixed order; Close (teardown
// in daemon.go) takes it down front doors first (metrics, control
// socket), then the parts in reverse, then ping, TAP, engine and NIC:
//
//  1. the fabric NIC and VPID 0, the TAP (or the userspace stack of
//     --netstack, netstack.go) and the engine, then the TAP reader;
//  2. the fabric ping service on VPID 1;
//  3. the optional parts, in the order of stdParts below;
//  4. the metrics endpoint, then the control socket, which serves the
//     daemon's own operations (ops.go) and every operation the parts
//     returned, all registered before the socket accepts.
//
// A part runs in Start's goroutine with the engine, the neighbour table
// and the NIC already up; it may set the daemon's conns, extdsStats,
// shimStats and attachStats hooks and returns its control operations and
// its closer, which startParts registers here. Nothing is registered
// from init().

import (
	"fmt"

	"github.com/exn-project/exn/control"
)

// started is what a part hands back: its closer (nil if nothing to close)
// and the control operations it serves.
type started struct {
	close func() error
	ops   map[string]control.HandlerFunc
	fdOps map[string]control.FDHandlerFunc
}

// part is one optional subsystem of a node.
type part struct {
	name  string
	start func(d *Daemon) (started, error)
}

// stdParts are exnd's optional parts, in start order. It is the order
// they had when each registered itself from init() (file-name order:
// extds.go, liveness.go, netstack.go), kept so that start-up, the closers'
// reverse order and the logs stay as they were. The userspace services
// come last: their listeners accept only once the other parts are up.
func stdParts() []part {
	return []part{
		{name: "extds", start: startEXTDS},                        // extds.go, extds_attach.go
		{name: "liveness", start: startLiveness},                  // liveness.go
		{name: "netstack services", start: startNetstackServices}, // netstack.go
	}
}

// startParts starts ps in order and registers what each returns: its
// closer (Close runs them in reverse) and its control operations. An
// operation name a part gives twice, or that an earlier part gave, fails
// Start; so does a part that fails, naming it. On error Start's teardown
// closes the parts already started.
func (d *Daemon) startParts(ps []part) error {
	for _, p := range ps {
		s, err := p.start(d)
		if err != nil {
			return fmt.Errorf("start %s: %w", p.name, err)
		}
		if s.close != nil {
			d.partClosers = append(d.partClosers, s.close)
		}
		for op, h := range s.ops {
			if _, dup := d.extraHandlers[op]; dup {
				return fmt.Errorf("start %s: control operation %q registered twice", p.name, op)
			}
			d.extraHandlers[op] = h
		}
		for op, h := range s.fdOps {
			if _, dup := d.extraFDHandlers[op]; dup {
				return fmt.Errorf("start %s: control operation %q registered twice", p.name, op)
			}
			d.extraFDHandlers[op] = h
		}
	}
	return nil
}

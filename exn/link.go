package exn

// Link is the host side of the EXT-Eth engine: a TAP device (tap/) or a
// gVisor netstack endpoint (netstack mode). The engine owns the fabric
// side; the Link owns the host side.
//
// The engine calls DeliverFrames from its receive goroutine with a batch of
// complete Ethernet frames, in arrival order (per source, in send order).
// The frames and the slice are valid only during the call; the Link copies
// what it keeps. DeliverFrames must not block for long: it is the engine's
// receive path. An error is counted and logged by the engine; it does not
// stop the engine.
type Link interface {
	DeliverFrames(frames [][]byte) error
}

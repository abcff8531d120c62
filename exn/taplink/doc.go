// Package taplink is the TAP host side of the EXT-Eth engine: the pump
// that carries whole Ethernet frames between a tap.Device (exn0, or any
// device with its contract) and an exn.Engine. It is the sibling of
// exn/netstack, which does the same for a userspace gVisor stack.
//
//	l := taplink.New(dev, taplink.Config{Fatal: onFatal}) // l owns dev
//	eng, _ := exn.New(nic, vpid0, l, exn.Config{Offload: l.Offload(), ...})
//	l.Start(eng)  // the reader: TAP → engine
//	...
//	l.Close()     // stops the reader and closes dev; then
//	eng.Close()
//
// # What it owns
//
//   - the reader goroutine (Start), which reads up to ReadBatch frames at a
//     time straight into transmit slots the engine lends (exn.Engine.Lend)
//     and hands them to the engine (TransmitLentOffload); with no slot
//     free it waits: that is the transmit back-pressure;
//   - the engine's Link (DeliverFrames, DeliverFramesOffload), which writes
//     received frames to the device, skipping a frame the kernel refuses;
//   - the device, from New to Close: Close stops the reader, closes the
//     device (which ends a read or write in progress) and waits for the
//     reader to give back every lent buffer, so that the engine's Close,
//     which waits for those buffers, can follow;
//   - the virtio-net header mapping: on a tap.OffloadDevice the frames'
//     headers become exn.Offload (the same struct) and back, and Offload
//     says what the engine may then deliver.
//
// The device's counters (tap.Stats) stay the device's: the daemon exports
// them; taplink counts nothing of its own.
//
// # Limits
//
// ReadBatch frames per read; a read fails MaxReadErrors times in a row
// before the reader gives up and reports the device dead (Config.Fatal).
// Nothing is allocated per frame (pump.go).
//
// # Imports
//
// taplink may import exn, tap and internal/...; never gateway, which
// imports it and only wires it (constructs, starts and closes one Link
// per node, in its start-up order).
package taplink

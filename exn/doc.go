// Package exn is the EXT-Eth engine: it carries Ethernet frames between a
// host-side Link (a TAP or a gVisor netstack endpoint) and the fabric.
// Frames up to the eager threshold travel as VELO fragments; larger frames
// by rendezvous (a VELO advert, then an RMA GET by the receiver), or, where
// the receiver granted buffers and the fabric places a PUT before a later
// message, by push (one PUT by the sender, then a VELO announcement;
// push.go).
package exn

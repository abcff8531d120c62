// Package netstack is the userspace host side of the EXT-Eth engine: a
// gVisor stack.LinkEndpoint that carries whole Ethernet frames between a
// gVisor network stack and an exn.Engine, in place of the TAP. Its
// sibling exn/taplink is the TAP's host side; exnd's --netstack mode runs
// taplink's pump over this endpoint (ReadFrames and DeliverFrames, through
// the gateway's tap.Device adapter) instead of Start.
//
// An Endpoint is the inner, header-less link endpoint. Wrap it in gVisor's
// Ethernet link (gvisor.dev/gvisor/pkg/tcpip/link/ethernet) before adding it
// to a stack, so that the Ethernet header, ARP and NDP are done by netstack
// exactly as the kernel does them on exn0:
//
//	ep, _ := netstack.New(netstack.Config{MAC: mac})
//	eng, _ := exn.New(nic, vpid0, ep, exn.Config{...}) // ep is the exn.Link
//	ep.Start(eng)                                      // eng is the Transmitter
//	s.CreateNIC(1, ethernet.New(ep))
//
// Outbound: WritePackets copies each packet (link header included) into a
// pooled frame buffer and queues it; it never blocks, because the stack may
// call it from the engine's receive goroutine (an ACK sent while a segment
// is delivered) and Transmit may wait for that same goroutine to reap
// rendezvous completions. One transmit goroutine drains the queue in
// batches into Transmitter.Transmit, which may block on back-pressure. A
// full queue drops the packet and counts it, like a NIC's full TX ring; TCP
// recovers.
//
// Inbound: DeliverFrames (the exn.Link method, called on the engine's
// receive goroutine) copies each frame into a gVisor buffer and dispatches
// it inline; gVisor's TCP hands segments on to its own processor
// goroutines, so the receive path stays short.
//
// Allocation: the endpoint allocates nothing per frame in steady state
// (frame buffers are pooled, batches reuse their slices). gVisor allocates
// its PacketBuffer and buffer chunk per inbound frame from its own pools.
package netstack

// Package tap opens and configures the exn0 TAP device and moves Ethernet
// frames through it in batches.
//
// Device is the contract the EXT-Eth engine's TAP pump (exn/taplink)
// codes against; *TAP is the Linux implementation and tap/taptest has an
// in-memory one. Both pass taptest.RunContract.
//
// # Opening
//
// Open does not use github.com/songgao/water (go.mod no longer requires it).
// water (v0.0.0-20200317203138) opens /dev/net/tun non-blocking, so its
// *os.File is in the runtime poller, but it opens it without O_CLOEXEC (the
// fd leaks into every child exnd starts), leaks the fd when TUNSETIFF fails,
// has no way to ask for IFF_VNET_HDR (its flags are fixed to TAP|NO_PI and
// an optional MULTI_QUEUE), and adds nothing beyond that one ioctl. So
// internal/sys.OpenTAP opens
// /dev/net/tun with O_NONBLOCK|O_CLOEXEC and issues TUNSETIFF with
// IFF_TAP|IFF_NO_PI itself; tap wraps the fd with os.NewFile, which
// registers a non-blocking fd with the poller. Read and Write run their
// batch inside one syscall.RawConn callback, so a blocked Read parks in the
// poller and Close wakes it with net.ErrClosed. rtnetlink
// (github.com/vishvananda/netlink) sets the MAC, MTU, queue length and
// addresses and brings the link up. IPv6 addresses get IFA_F_NODAD (see
// Config.Addrs). The TAP is not persistent: Close removes the interface.
//
// # Frames
//
// Frames are plain Ethernet. The MTU defaults to MaxMTU, 65521: the
// kernel's TAP max_mtu is 65535 less the 14-byte header, and it refuses
// 65522 and 65536 (TestMTULimit). read(2) on a TAP silently truncates a
// frame longer than the buffer and returns the truncated length, so Read
// reads with readv into the buffer plus a one-byte spill to detect it; such
// frames are dropped and counted, never returned cut short.
//
// # Offloads
//
// With Config.Offload (exnd's --offload, on by default) Open sets
// IFF_VNET_HDR (internal/sys.OpenTAPVnet) and asks TUNSETOFFLOAD for
// checksum offload, TSO4/TSO6 with ECN, and USO4/USO6 where the kernel
// has them (Linux 6.2; otherwise it retries without USO); Offloads reports
// the TUN_F_* bits the kernel took. Every frame then travels behind a
// 10-byte virtio-net header (VnetHdr, vnet.go): the kernel hands the
// reader TCP and UDP super-frames of up to vnet.MaxGSOFrame bytes
// regardless of the MTU, and frames whose checksum it left partial, and
// takes the same on write. Such a TAP is an OffloadDevice: ReadVnet and
// WriteVnet carry each frame's header, which exn/taplink passes to and
// from the engine as exn.Offload (the same struct). Read and Write stay
// plain on it: Read completes a partial checksum itself and drops a
// super-frame (counted, GSODropped), Write sends complete frames. A header
// that is short, or has flags or a GSO type this package does not know,
// drops its frame (BadVnet).
//
// Without Offload the TAP is plain: one syscall per frame each way and
// the kernel checksums everything. BenchmarkEcho (ICMP echo through the
// kernel, 2 vCPUs) measured about 4.3 µs per 64-byte frame round trip in
// batches of 64 (5-7 µs unbatched) and 15-18 µs per 65 KB frame, about
// 4 GB/s each way.
package tap

// Package vnet is the virtio-net header ABI (include/uapi/linux/virtio_net.h)
// that a TAP opened with IFF_VNET_HDR puts before every frame, written
// once for the two layers that use it: tap (which reads and writes the
// header) and exn (which carries its meaning over the fabric, as
// exn.Offload). It owns the flag and GSO-type values, the largest
// super-frame, and the checksum completion both layers need. It imports
// only the standard library.
package vnet

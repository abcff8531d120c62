package taplink

// The pump between one tap.Device and one engine: two paths that share
// nothing but the device.
//
//	TAP ──▶ reader goroutine (readLoop: one per Link, from Start to Close)
//	   │ Lend      up to ReadBatch empty transmit slots, kept across
//	   │           reads; it waits only with none in hand (back-pressure)
//	   │ Read / ReadVnet  straight into the slots; the headers land in
//	   │           offs, whose memory they are (vnetHdrs)
//	   └ transmit  TransmitLentOffload; a frame the engine refuses is
//	               given back (Return), the rest of the batch still goes
//	engine receive goroutine ──▶ DeliverFrames / DeliverFramesOffload
//	   └ Write / WriteVnet to the TAP; a refused frame is skipped
//	     (writeAll) and the first error returned, for the engine to count
//
// Locks: none on either path. The reader's slices are its goroutine's
// own, and it is the device's only reader (tap.Device allows one); the
// device takes writes concurrently with the read and with each other
// (tap's readMu and writeMu). Link.mu (link.go) guards only the Start and
// Close state. Close cancels the reader's ctx (a Lend or
// TransmitLentOffload waiting on back-pressure returns), closes the
// device (a Read in progress returns net.ErrClosed) and waits on Link.wg
// for the reader, which gives back every buffer it holds on the way out.
//
// Allocation: nothing per frame. The reader makes its four slices once;
// DeliverFrames* write the frames in place and convert offs without a
// copy.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"
	"unsafe"

	"github.com/exn-project/exn/exn"
	"github.com/exn-project/exn/tap"
)

// exn.Offload and tap.VnetHdr are the same struct (this conversion only
// compiles while their fields are), so a slice of one is a slice of the
// other.
var _ = tap.VnetHdr(exn.Offload{})

func vnetHdrs(offs []exn.Offload) []tap.VnetHdr {
	if len(offs) == 0 {
		return []tap.VnetHdr{}
	}
	return unsafe.Slice((*tap.VnetHdr)(unsafe.Pointer(&offs[0])), len(offs))
}

// errNoVnet is DeliverFramesOffload's answer on a device without
// virtio-net headers: an engine built with Offload() (0) never calls it.
var errNoVnet = errors.New("taplink: offload metadata for a device without virtio-net headers")

// DeliverFrames implements exn.Link: it writes frames to the device. A
// frame the kernel refuses is skipped (the TAP counts and logs it) so the
// rest of the batch still goes out; the first such error is returned.
// Once the device is closed it returns net.ErrClosed.
func (l *Link) DeliverFrames(frames [][]byte) error { return writeAll(frames, l.dev.Write) }

// DeliverFramesOffload implements exn.OffloadLink: as DeliverFrames, with
// each frame's offload metadata written as its virtio-net header, so the
// kernel takes a partial checksum or a super-frame as the sending kernel
// made it. It needs a device with virtio-net headers (Offload != 0).
func (l *Link) DeliverFramesOffload(frames [][]byte, offs []exn.Offload) error {
	if l.od == nil {
		return errNoVnet
	}
	hdrs := vnetHdrs(offs)
	return writeAll(frames, func(frames [][]byte) (int, error) {
		n, err := l.od.WriteVnet(frames, hdrs)
		hdrs = hdrs[min(n+1, len(hdrs)):]
		return n, err
	})
}

// writeAll writes frames with write, skipping a refused frame.
func writeAll(frames [][]byte, write func([][]byte) (int, error)) error {
	var first error
	for len(frames) > 0 {
		n, err := write(frames)
		frames = frames[n:]
		if err == nil {
			continue
		}
		if errors.Is(err, net.ErrClosed) {
			return err
		}
		if first == nil {
			first = err
		}
		if len(frames) > 0 {
			frames = frames[1:] // the refused frame
		}
	}
	return first
}

// readLoop moves frames from the device to eng, ReadBatch at a time,
// reading straight into transmit slots the engine lends (exn.Engine.Lend),
// so a rendezvous frame is never copied again before the receiver pulls
// it. It keeps the buffers it did not fill for the next read and tops up
// the rest without waiting; only with none left does it wait for a slot
// (the transmit back-pressure). On exit it gives every lent buffer back,
// which Engine.Close waits for: Close closes the device, which ends a
// read in progress.
func (l *Link) readLoop(ctx context.Context, eng Engine) {
	defer l.wg.Done()
	bufs := make([][]byte, ReadBatch)
	sizes := make([]int, ReadBatch)
	frames := make([][]byte, ReadBatch)
	offs := make([]exn.Offload, ReadBatch)
	hdrs := vnetHdrs(offs) // the same memory: headers read are offs
	have := 0              // bufs[:have] are lent and empty
	defer func() { eng.Return(bufs[:have]) }()
	errRun := 0
	for {
		k, err := eng.Lend(ctx, bufs[have:], have == 0)
		if err != nil {
			return // closing: ctx done or engine closed
		}
		have += k
		var n int
		if l.od != nil {
			n, err = l.od.ReadVnet(bufs[:have], sizes, hdrs)
		} else {
			n, err = l.dev.Read(bufs[:have], sizes)
		}
		for i := 0; i < n; i++ {
			frames[i] = bufs[i][:sizes[i]]
		}
		// bufs[:n] now belong to frames; keep the empty ones in front.
		have = copy(bufs, bufs[n:have])
		o := offs[:n]
		if l.od == nil {
			o = nil
		}
		if !l.transmit(ctx, eng, frames[:n], o) {
			return
		}
		switch {
		case err == nil:
			errRun = 0
		case errors.Is(err, net.ErrClosed) || ctx.Err() != nil:
			return
		default:
			if errRun++; errRun >= MaxReadErrors {
				if l.fatal != nil {
					l.fatal(fmt.Errorf("tap read: %d errors in a row, last: %w", errRun, err))
				}
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// transmit hands frames read into lent buffers to eng. Frames to dead or
// unknown nodes are the engine's to drop and count; an error it returns
// for one frame skips (and gives back) that frame, never the rest of the
// batch. It reports false once the engine or the Link is closing, after
// giving back the frames not sent.
func (l *Link) transmit(ctx context.Context, eng Engine, frames [][]byte, offs []exn.Offload) bool {
	for len(frames) > 0 {
		n, err := eng.TransmitLentOffload(ctx, frames, offs)
		frames = frames[n:]
		if offs != nil {
			offs = offs[n:]
		}
		if err == nil {
			continue
		}
		if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
			eng.Return(frames)
			return false
		}
		l.log.Debug("transmit", "err", err)
		if len(frames) > 0 {
			eng.Return(frames[:1])
			frames = frames[1:]
			if offs != nil {
				offs = offs[1:]
			}
		}
	}
	return true
}

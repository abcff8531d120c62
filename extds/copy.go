package extds

// io.ReaderFrom and io.WriterTo: io.Copy into or out of an EXT-DS
// connection without the copy through io.Copy's buffer (exnd's shim
// splice, proxies).
//
// ReadFrom (holds wsem for the whole call, wmu except in the source Read):
//
//	reserve contiguous free space in the tx mirror ring (wait for RMA_AVAIL
//	  as Write does when there is none)
//	→ r.Read straight into the mirror (wmu released, tx ring pinned)
//	→ ≤ threshold bytes and eager credit: VELO fragments from the mirror,
//	  the space stays free; else commit the space, PUT + RMA_INFO
//
// WriteTo (holds rmu):
//
//	ready head segment → w.Write(eager FIFO slice or rx ring slice) with
//	  mu released (rx ring pinned) → consume what w took → return credits
//	  in batches as Read does → … → EOF: final credits, return nil.
//	  ZCopy segments go through Read with a buffer allocated on first use.
//
// Order: one writer slot (wsem) keeps ReadFrom's reserved space its own
// while wmu is released; the receive segment queue is consumed in order
// as by Read. Locks and pins: see the top of conn.go and stream_write.go.

import (
	"errors"
	"io"
	"net"
	"os"

	"github.com/exn-project/exn/extds/internal/wire"
)

// readFromChunk is the most ReadFrom asks of one source Read: a chunk
// becomes readable at the peer only when its PUT is whole, so one Read of
// a whole 1 MiB ring would leave the reader idle meanwhile; a quarter of
// the default ring is the credit batch the reader returns at once.
const readFromChunk = DefaultRingSize / 4

// srcErr marks an error of ReadFrom's source, returned unwrapped.
type srcErr struct{ err error }

func (e srcErr) Error() string { return e.err.Error() }

// copyErr is what ReadFrom and WriteTo return for err: the source's or
// destination's own error unwrapped, else c's *net.OpError for op.
func (c *Conn) copyErr(op string, err error) error {
	var se srcErr
	if errors.As(err, &se) {
		return se.err
	}
	return c.opErr(op, err)
}

// readFrom is ReadFrom on an EXT-DS connection.
func (c *Conn) readFrom(r io.Reader) (int64, error) {
	c.wsem.Lock()
	defer c.wsem.Unlock()
	c.wmu.Lock()
	n, err := c.readFromLocked(r)
	c.wmu.Unlock()
	return n, c.copyErr("readfrom", err)
}

// readFromLocked is ReadFrom with wsem and wmu held (wmu is released
// around r.Read).
func (c *Conn) readFromLocked(r io.Reader) (int64, error) {
	var total int64
	for {
		c.mu.Lock()
		if err := c.wrCheckLocked(); err != nil {
			c.mu.Unlock()
			return total, err
		}
		end := c.peerRingSize - c.txWpos
		contig := min(c.txFree, end)
		if contig == 0 || contig < minPutChunk && contig != end && c.ringWaitLocked() {
			// No room worth a read: wait for RMA_AVAIL like Write.
			c.dev.ctr.creditWaits.Add(1)
			free := c.txFree
			err := c.spinWaitLocked(&c.wrSpin, c.wrWake, &c.wrDL, func() bool {
				return c.txFree != free || c.closed || c.err != nil || c.wrShut || isClosedChan(c.wrDL.wait())
			})
			c.mu.Unlock()
			if err != nil {
				return total, err
			}
			continue
		}
		want := min(contig, readFromChunk)
		off := c.txWpos
		c.txPin = true
		c.mu.Unlock()

		c.wmu.Unlock()
		k, rerr := r.Read(c.txRing.Buf[off : off+want])
		c.wmu.Lock()

		c.mu.Lock()
		var err error
		switch {
		case k < 0 || k > int(want):
			err = srcErr{errors.New("extds: readfrom: source returned an invalid count")}
			k = 0
		case k == 0:
		case c.closed:
			err = net.ErrClosed
		case c.err != nil:
			err = c.err
		case c.wrShut:
			err = errWriteShut
		}
		if err != nil || k == 0 {
			c.unpinTxLocked()
			c.mu.Unlock()
			if err != nil {
				return total, err
			}
		} else {
			n := uint32(k)
			eager := k <= c.cfg.threshold && k <= sendBatch*wire.FragData && n <= c.txEager
			if eager {
				c.txEager -= n // the mirror space stays free
			} else {
				c.txWpos = (c.txWpos + n) % c.peerRingSize
				c.txFree -= n
			}
			c.mu.Unlock()
			if eager {
				err = c.sendFrags(c.txRing.Buf[off:off+n], true)
			} else {
				err = c.putMirror(off, n)
			}
			c.mu.Lock()
			c.unpinTxLocked()
			c.mu.Unlock()
			if err != nil {
				return total, err
			}
			total += int64(k)
		}
		if rerr == io.EOF {
			return total, nil
		}
		if rerr != nil {
			return total, srcErr{rerr}
		}
	}
}

// writeTo is WriteTo on an EXT-DS connection.
func (c *Conn) writeTo(w io.Writer) (int64, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	n, err := c.writeToLocked(w)
	return n, c.copyErr("writeto", err)
}

func (c *Conn) writeToLocked(w io.Writer) (int64, error) {
	var total int64
	var zbuf []byte // ZCopy segments only
	for {
		c.mu.Lock()
		switch {
		case c.closed:
			c.mu.Unlock()
			return total, net.ErrClosed
		case c.err != nil:
			err := c.err
			c.mu.Unlock()
			return total, err
		case isClosedChan(c.rdDL.wait()):
			c.mu.Unlock()
			return total, os.ErrDeadlineExceeded
		}
		s := c.segs.peek()
		if s == nil || s.kind == segRMA && !s.ready {
			err := c.spinWaitLocked(&c.rdSpin, c.rdWake, &c.rdDL, c.readableLocked)
			c.mu.Unlock()
			if err != nil {
				return total, err
			}
			continue
		}
		var p []byte
		switch s.kind {
		case segVELO:
			p = c.eager[c.eHead:min(int(c.eHead)+int(s.n), len(c.eager))]
		case segRMA:
			p = c.rxRing.Buf[s.off : s.off+s.n]
			c.rxPin = true
		case segEOF:
			c.mu.Unlock()
			c.flushCredits(true)
			return total, nil
		default: // ZCopy: Read drives it
			c.mu.Unlock()
			if zbuf == nil {
				zbuf = make([]byte, zcWriteToBuf)
			}
			n, err := c.readLocked(zbuf)
			if n > 0 {
				c.dev.ctr.rxBytes.Add(uint64(n))
				k, werr := w.Write(zbuf[:n])
				total += int64(k)
				if werr == nil && k < n {
					werr = io.ErrShortWrite
				}
				if werr != nil {
					return total, srcErr{werr}
				}
			}
			if err != nil {
				return total, err
			}
			continue
		}
		c.mu.Unlock()

		k, werr := w.Write(p)
		if k < 0 || k > len(p) {
			k, werr = 0, errors.New("extds: writeto: writer returned an invalid count")
		}

		c.mu.Lock()
		if s.kind == segRMA {
			c.unpinRxLocked()
		}
		if k > 0 && !c.released {
			// The head is still the segment written from: only this
			// reader pops; re-peek, a push may have moved the queue.
			s = c.segs.peek()
			c.consumeLocked(s, uint32(k))
		}
		c.mu.Unlock()
		if k > 0 {
			total += int64(k)
			c.dev.ctr.rxBytes.Add(uint64(k))
			c.flushCredits(false)
		}
		if werr == nil && k < len(p) {
			werr = io.ErrShortWrite
		}
		if werr != nil {
			return total, srcErr{werr}
		}
	}
}

// zcWriteToBuf is WriteTo's buffer for ZCopy segments, which only Read
// can take (it drives GETs or sink adverts): one zcChunk would pin 1 MiB
// per WriteTo; 64 KiB keeps the calls to w large.
const zcWriteToBuf = 64 << 10

// consumeLocked marks the first n bytes of the head segment s (VELO or
// ready RMA) read, as Read does after copying them.
func (c *Conn) consumeLocked(s *seg, n uint32) {
	switch s.kind {
	case segVELO:
		c.eHead = uint32((int(c.eHead) + int(n)) % len(c.eager))
		c.eLen -= n
		c.freedEager += n
	case segRMA:
		s.off += n
		c.rxUsed -= n
		c.freedRing += n
	}
	s.n -= n
	if s.n == 0 {
		c.segs.pop()
	}
}

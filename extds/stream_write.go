package extds

// The EXT-DS send path: Write, CloseWrite, SetLinger (BCopy; ReadFrom is
// copy.go, ZCopy WriteBuffer zcopy.go).
//
//	write ≤ threshold                 → VELO fragments (eager credit)
//	write > threshold, ring has room  → copy into the tx mirror ring at the
//	                                    peer's write offset, RMA PUT into
//	                                    the peer's ring, then RMA_INFO
//	ring short, ≤ ringFullVELOMax of  → VELO fragments (eager credit)
//	  the write left
//	ring short, more left             → wait for RMA_AVAIL (spin, then
//	                                    park: spinWaitLocked), then PUT
//
// Locks: a writer takes wsem (the writer slot, held for the whole call),
// then wmu (orders its messages against CloseWrite and Close, guards
// wbatch and wrma), then mu only to check state and reserve credits and
// ring space; mu is released before every fabric Send or Post. Space
// reserved in the tx mirror is pinned (txPin) while the writer copies
// into it without mu; unpinTxLocked deregisters a ring released meanwhile.

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"github.com/exn-project/exn/extds/internal/wire"
	"github.com/exn-project/exn/fabric"
)

var errWriteShut = fmt.Errorf("write after CloseWrite: %w", syscall.EPIPE)

// ringWaitLocked says whether a large write that finds too little room in
// the peer's ring should wait for RMA_AVAIL instead of going on as VELO
// fragments: when at least half the ring is outstanding, its credits are
// due (the reader returns them at 1/creditFraction = 1/4), so waiting
// cannot deadlock.
func (c *Conn) ringWaitLocked() bool {
	return 2*(c.peerRingSize-c.txFree) >= c.peerRingSize
}

// wrCheckLocked returns why a write cannot proceed, if it cannot.
func (c *Conn) wrCheckLocked() error {
	switch {
	case c.closed:
		return net.ErrClosed
	case c.err != nil:
		return c.err
	case c.wrShut:
		return errWriteShut
	case isClosedChan(c.wrDL.wait()):
		return os.ErrDeadlineExceeded
	}
	return nil
}

// write is Write on an EXT-DS connection.
func (c *Conn) write(p []byte) (int, error) {
	c.wsem.Lock()
	defer c.wsem.Unlock()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	n, err := c.writeLocked(p)
	return n, c.opErr("write", err)
}

func (c *Conn) writeLocked(p []byte) (int, error) {
	total := 0
	large := len(p) > c.cfg.threshold
	for len(p) > 0 {
		c.mu.Lock()
		if err := c.wrCheckLocked(); err != nil {
			c.mu.Unlock()
			return total, err
		}
		put := false
		var chunk, off uint32
		if large && c.peerRingSize > 0 {
			want := uint32(min(len(p), fabric.MaxRMALen))
			contig := min(c.txFree, c.peerRingSize-c.txWpos)
			chunk = min(want, contig)
			if chunk > 0 && (chunk == want || chunk >= minPutChunk || chunk == c.peerRingSize-c.txWpos) &&
				uint64(c.peerRingSize-c.txFree) < maxPutsInFlight*uint64(chunk) {
				put = true
				off = c.txWpos
				c.txWpos = (c.txWpos + chunk) % c.peerRingSize
				c.txFree -= chunk
				c.txPin = true
			}
		}
		if !put {
			// A large write waits for ring credits rather than go on as
			// VELO fragments, except for its last ringFullVELOMax bytes
			// (see ringWaitLocked).
			if c.txEager == 0 || large && len(p) > ringFullVELOMax && c.ringWaitLocked() {
				c.dev.ctr.creditWaits.Add(1)
				free, eager := c.txFree, c.txEager
				if err := c.spinWaitLocked(&c.wrSpin, c.wrWake, &c.wrDL, func() bool {
					return c.txFree != free || c.txEager != eager || c.closed || c.err != nil || c.wrShut || isClosedChan(c.wrDL.wait())
				}); err != nil {
					c.mu.Unlock()
					return total, err
				}
				c.mu.Unlock()
				continue
			}
			chunk = uint32(min(len(p), sendBatch*wire.FragData, int(c.txEager)))
			c.txEager -= chunk
			if large {
				c.dev.ctr.ringFull.Add(1)
			}
		}
		c.mu.Unlock()
		var err error
		if put {
			err = c.putChunk(p[:chunk], off)
			c.mu.Lock()
			c.unpinTxLocked()
			c.mu.Unlock()
		} else {
			err = c.sendFrags(p[:chunk], int(chunk) == len(p))
		}
		if err != nil {
			return total, err
		}
		p = p[chunk:]
		total += int(chunk)
	}
	return total, nil
}

// sendFrags sends p (≤ sendBatch fragments) as VELO data.
func (c *Conn) sendFrags(p []byte, last bool) error {
	k := 0
	for len(p) > 0 {
		n := min(len(p), wire.FragData)
		wire.EncData(&c.wbatch[k], c.peerAddr, c.peerID, last && n == len(p), p[:n])
		p = p[n:]
		k++
	}
	if err := c.send(c.wbatch[:k]); err != nil {
		return err
	}
	c.dev.ctr.veloMsgs.Add(uint64(k))
	for i := 0; i < k; i++ {
		c.dev.ctr.txVELO.Add(uint64(c.wbatch[i].Len) - wire.HdrLen)
	}
	return nil
}

// putChunk copies p into the tx mirror at off (reserved and pinned by the
// caller), PUTs it to the same offset of the peer's ring and announces it
// with RMA_INFO.
func (c *Conn) putChunk(p []byte, off uint32) error {
	copy(c.txRing.Buf[off:], p)
	return c.putMirror(off, uint32(len(p)))
}

// putMirror PUTs n bytes at off of the tx mirror to the same offset of the
// peer's ring and announces them with RMA_INFO. wmu is held.
func (c *Conn) putMirror(off, n uint32) error {
	c.wrma[0] = fabric.RMA{
		Op: fabric.OpPut, Peer: c.peerAddr,
		Local: c.txRing.NLA + fabric.NLA(off), Remote: c.peerRing + fabric.NLA(off),
		Len: n, Notify: fabric.NotifyCompleter,
	}
	if _, err := c.vd.ep.Post(c.wrma[:]); err != nil {
		return c.sendErr(err)
	}
	wire.EncTwo(&c.wbatch[0], c.peerAddr, TagRMAInfo, c.peerID, off, n)
	if err := c.send(c.wbatch[:1]); err != nil {
		return err
	}
	c.dev.ctr.rmaPuts.Add(1)
	c.dev.ctr.txRMA.Add(uint64(n))
	return nil
}

// unpinTxLocked ends a writer's use of txRing.Buf outside mu; if the
// connection was released meanwhile, the ring is deregistered now.
func (c *Conn) unpinTxLocked() {
	c.txPin = false
	if c.txDeregLate {
		c.txDeregLate = false
		_ = c.vd.ep.Deregister(c.txRing.NLA) // fails only if the endpoint is gone, which frees it too
	}
}

// closeWrite is CloseWrite on an EXT-DS connection.
func (c *Conn) closeWrite() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	if err := c.wrCheckLocked(); err != nil {
		c.mu.Unlock()
		if errors.Is(err, syscall.EPIPE) {
			return nil
		}
		return c.opErr("close", err)
	}
	c.wrShut = true
	c.mu.Unlock()
	wire.EncCtl(&c.wbatch[0], c.peerAddr, TagShutdown, c.peerID)
	return c.opErr("close", c.send(c.wbatch[:1]))
}

// setLinger is SetLinger on an EXT-DS connection.
func (c *Conn) setLinger(sec int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.opErr("set", net.ErrClosed)
	}
	c.linger = sec
	return nil
}

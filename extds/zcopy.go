package extds

// ZCopy (§5.5.3.3): blocking writes from fabric-registered memory.
//
// Read mode:  writer → ZC_SRC{nla,len}; the reader, when the segment
//             reaches the head of its queue, GETs chunks of at most
//             zcChunk into its sink region and copies them out; at the end
//             it sends ZC_DONE and the writer returns.
// Write mode: writer → ZC_WANT{len}; the reader advertises ZC_SINK{nla,
//             chunk} per chunk; the writer PUTs straight from its buffer
//             into the sink and sends ZC_PUT{chunk}; the chunk is readable
//             once both ZC_PUT and the PUT's completer notification are in;
//             ZC_DONE at the end.
//
// The writer's side never copies. The reader copies once, from the sink
// to the Read buffer (the same single copy BCopy makes from its ring).
// Only one ZCopy transfer is in flight per direction (writes are
// serialised by wmu and a ZCopy write blocks until ZC_DONE).
// Locks: as in conn.go; zc* fields are under Conn.mu.

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/exn-project/exn/extds/internal/wire"
	"github.com/exn-project/exn/fabric"
)

// zcAction is what a reader must do outside Conn.mu.
type zcAction struct {
	get     fabric.RMA
	doGet   bool
	sink    bool
	sinkNLA fabric.NLA
	sinkLen uint32
	done    bool
}

func (a *zcAction) pending() bool { return a.doGet || a.sink || a.done }

// zcReadLocked advances the ZCopy segment s at the head of the queue.
func (c *Conn) zcReadLocked(p []byte, s *seg, act *zcAction) (int, error) {
	if c.zcRdLen == 0 && c.zcPending != 0 {
		if s.kind == segZCSrc && c.zcGot || s.kind == segZCWant && c.zcPutLen != 0 && c.zcPutNote {
			c.zcRdPos, c.zcRdLen = 0, c.zcPending
			s.n -= c.zcPending
			c.zcPending, c.zcGot, c.zcPutLen, c.zcPutNote = 0, false, 0, false
		}
	}
	if c.zcRdLen > 0 {
		n := copy(p, c.zcSink.Buf[c.zcRdPos:c.zcRdPos+c.zcRdLen])
		c.zcRdPos += uint32(n)
		c.zcRdLen -= uint32(n)
		if c.zcRdLen == 0 && s.n == 0 {
			c.segs.pop()
			act.done = true
		}
		return n, nil
	}
	if c.zcPending != 0 {
		return 0, nil // transfer in flight
	}
	if c.zcSink.NLA == 0 {
		r, err := c.vd.ep.Register(zcChunk)
		if err != nil {
			return 0, fmt.Errorf("register zcopy sink: %w", err)
		}
		c.zcSink = r
		c.dev.addRegion(r.NLA.Region(), c)
	}
	chunk := min(s.n, zcChunk)
	c.zcPending = chunk
	if s.kind == segZCSrc {
		act.doGet = true
		act.get = fabric.RMA{
			Op: fabric.OpGet, Peer: c.peerAddr, Local: c.zcSink.NLA, Remote: s.nla,
			Len: chunk, Notify: fabric.NotifyCompleter,
		}
		s.nla += fabric.NLA(chunk)
	} else {
		act.sink, act.sinkNLA, act.sinkLen = true, c.zcSink.NLA, chunk
	}
	return 0, nil
}

// zcStep performs a reader's ZCopy action (no lock held).
func (c *Conn) zcStep(a *zcAction) error {
	var fm [1]fabric.Message
	switch {
	case a.doGet:
		rq := [1]fabric.RMA{a.get}
		if _, err := c.vd.ep.Post(rq[:]); err != nil {
			c.fail(fmt.Errorf("zcopy get: %w", err), true)
			return err
		}
		c.dev.ctr.zcopyReads.Add(1)
		return nil
	case a.sink:
		wire.EncNLA(&fm[0], c.peerAddr, TagZCSink, c.peerID, a.sinkNLA, a.sinkLen)
	case a.done:
		wire.EncCtl(&fm[0], c.peerAddr, TagZCDone, c.peerID)
	}
	return c.send(fm[:])
}

// Buffer is memory the fabric can reach, registered on a connection's
// endpoint: the only memory a ZCopy write can use (the fabric contract
// allocates registered memory; it cannot pin arbitrary Go memory).
type Buffer struct {
	c   *Conn
	reg fabric.Region
	b   []byte
}

// registeredBuffer is RegisteredBuffer on an EXT-DS connection.
func (c *Conn) registeredBuffer(size int) (*Buffer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.released {
		return nil, c.opErr("register", net.ErrClosed)
	}
	r, err := c.vd.ep.Register(size)
	if err != nil {
		return nil, c.opErr("register", err)
	}
	c.bufs = append(c.bufs, r)
	c.dev.addRegion(r.NLA.Region(), c)
	return &Buffer{c: c, reg: r, b: r.Buf}, nil
}

// Bytes returns the buffer's memory. It stays valid until Release or the
// connection's Close.
func (b *Buffer) Bytes() []byte { return b.b }

// Release deregisters the buffer. It must not be in a WriteBuffer call.
func (b *Buffer) Release() error {
	if b.reg.NLA == 0 {
		return nil
	}
	c := b.c
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, r := range c.bufs {
		if r.NLA == b.reg.NLA {
			c.bufs = append(c.bufs[:i], c.bufs[i+1:]...)
			c.dev.delRegion(r.NLA.Region())
			b.reg = fabric.Region{}
			return c.vd.ep.Deregister(r.NLA)
		}
	}
	return nil // released with the connection
}

// writeBuffer is a ZCopy WriteBuffer.
func (c *Conn) writeBuffer(b *Buffer, off, n int) (int, error) {
	c.wsem.Lock()
	defer c.wsem.Unlock()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	err := c.zcWrite(b, uint32(off), uint32(n))
	if err != nil {
		return 0, c.opErr("write", err)
	}
	return n, nil
}

func (c *Conn) zcWrite(b *Buffer, off, n uint32) error {
	c.mu.Lock()
	if err := c.wrCheckLocked(); err != nil {
		c.mu.Unlock()
		return err
	}
	c.zcActive, c.zcDone, c.zcSinkLen = true, false, 0
	mode := c.cfg.zcMode
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.zcActive = false
		c.mu.Unlock()
	}()
	if mode == ZCopyRead {
		wire.EncNLA(&c.wbatch[0], c.peerAddr, TagZCSrc, c.peerID, b.reg.NLA+fabric.NLA(off), n)
	} else {
		wire.EncLen(&c.wbatch[0], c.peerAddr, TagZCWant, c.peerID, n)
	}
	if err := c.send(c.wbatch[:1]); err != nil {
		return err
	}
	sent := uint32(0)
	c.mu.Lock()
	for !c.zcDone {
		if mode == ZCopyWrite && c.zcSinkLen != 0 {
			chunk, nla := c.zcSinkLen, c.zcSinkNLA
			c.zcSinkLen = 0
			if chunk > n-sent {
				c.protoErr("zc_sink larger than the rest of the write")
				err := c.err
				c.mu.Unlock()
				return err
			}
			c.mu.Unlock()
			c.wrma[0] = fabric.RMA{
				Op: fabric.OpPut, Peer: c.peerAddr, Local: b.reg.NLA + fabric.NLA(off+sent),
				Remote: nla, Len: chunk, Notify: fabric.NotifyCompleter,
			}
			if _, err := c.vd.ep.Post(c.wrma[:]); err != nil {
				return c.sendErr(err)
			}
			wire.EncLen(&c.wbatch[0], c.peerAddr, TagZCPut, c.peerID, chunk)
			if err := c.send(c.wbatch[:1]); err != nil {
				return err
			}
			sent += chunk
			c.mu.Lock()
			continue
		}
		if c.err != nil {
			err := c.err
			c.mu.Unlock()
			return err
		}
		if err := c.waitLocked(c.wrWake, &c.wrDL); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				// The peer may still be reading b: the stream cannot
				// continue consistently.
				c.failLocked(fmt.Errorf("zcopy write timed out: %w", os.ErrDeadlineExceeded), true)
			}
			c.mu.Unlock()
			return err
		}
	}
	c.mu.Unlock()
	c.dev.ctr.txZCopy.Add(uint64(n))
	if mode == ZCopyWrite {
		c.dev.ctr.zcopyWrites.Add(1)
	}
	return nil
}

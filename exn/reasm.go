package exn

import "github.com/exn-project/exn/fabric"

// Eager reassembly. It runs only on the receive goroutine, so nothing here
// is locked.
//
// Reassembly buffers come in two classes: small (the eager threshold, at
// least a standard 1514-byte frame) and large (a max frame, for multicast
// frames and peers with a higher threshold). A partial frame starts small
// and moves to a large buffer if it outgrows it. Both classes are bounded,
// so a flood of partial frames from many sources costs bounded memory and
// is dropped (DropNoBuffer) beyond it.

const (
	// minSmallBuf keeps a standard Ethernet frame (1514 B, e.g. an IPv6
	// multicast) in the small class.
	minSmallBuf = 1536
	// maxSmallBufs bounds small reassembly buffers in use: partial frames
	// (one per source and kind), frames queued behind a GET (at most
	// maxSourceQueue per source) and one delivery batch. 4096 × ~1.5 KiB
	// is 6 MiB at most.
	maxSmallBufs = 4096
	// maxLargeBufs bounds max-frame buffers (64 KiB each): large eager
	// frames are rare (multicast of jumbo frames), 32 is 2 MiB.
	maxLargeBufs = 32
)

// frameBuf is one reassembly buffer.
type frameBuf struct {
	b     []byte
	large bool
}

// bufClass is the free list of one class of buffers, cap bytes each, at
// most max allocated.
type bufClass struct {
	cap, max int
	large    bool
	free     []*frameBuf
	n        int // allocated
}

// get takes a free buffer, or allocates one while under max; nil if the
// class is exhausted.
func (c *bufClass) get() *frameBuf {
	if n := len(c.free); n > 0 {
		b := c.free[n-1]
		c.free = c.free[:n-1]
		return b
	}
	if c.n < c.max {
		c.n++
		return &frameBuf{b: make([]byte, c.cap), large: c.large}
	}
	return nil
}

// bufPool is a free list per class. Buffers are allocated lazily up to the
// class limit and then reused, so the steady state allocates nothing.
type bufPool struct {
	small, large bufClass
	inUse        int
}

func newBufPool(smallCap, largeCap int) *bufPool {
	return &bufPool{
		small: bufClass{cap: smallCap, max: maxSmallBufs, free: make([]*frameBuf, 0, 64)},
		large: bufClass{cap: largeCap, max: maxLargeBufs, large: true, free: make([]*frameBuf, 0, maxLargeBufs)},
	}
}

// get returns a buffer of at least need bytes, or nil if the class is
// exhausted or need exceeds the large class.
func (p *bufPool) get(need int) *frameBuf {
	var b *frameBuf
	switch {
	case need <= p.small.cap:
		b = p.small.get()
	case need <= p.large.cap:
		b = p.large.get()
	}
	if b != nil {
		p.inUse++
	}
	return b
}

func (p *bufPool) put(b *frameBuf) {
	p.inUse--
	if b.large {
		p.large.free = append(p.large.free, b)
	} else {
		p.small.free = append(p.small.free, b)
	}
}

// reasm is the eager reassembly state of one (source, unicast|multicast)
// stream: idle (buf == nil) or a partial frame of n bytes expecting
// fragment index next.
type reasm struct {
	buf  *frameBuf
	n    int
	next fabric.Tag
}

func (r *reasm) reset(p *bufPool) {
	if r.buf != nil {
		p.put(r.buf)
	}
	*r = reasm{}
}

// feed handles one eager fragment (tag has tagEager set). truncated
// reports that a first fragment cut a partial frame short (one drop);
// drop is a drop of this fragment (and of the partial it belonged to);
// done[:n] is a completed frame, owned by the caller, who returns it to p.
// maxFrame is the largest frame accepted.
func (r *reasm) feed(p *bufPool, tag fabric.Tag, data []byte, maxFrame int) (done *frameBuf, n int, drop DropReason, truncated bool) {
	first, last, idx := tag&tagFirst != 0, tag&tagLast != 0, tag&tagIdxMask
	if first {
		if r.buf != nil {
			truncated = true
			r.reset(p)
		}
		if idx != 0 {
			return nil, 0, DropFragmentSeq, truncated
		}
	} else {
		if r.buf == nil {
			return nil, 0, DropOrphanFragment, truncated
		}
		if idx != r.next {
			r.reset(p)
			return nil, 0, DropFragmentSeq, truncated
		}
	}
	if len(data) == 0 || (!last && len(data) != fragLen) {
		r.reset(p)
		return nil, 0, DropFragmentLen, truncated
	}
	if r.n+len(data) > maxFrame {
		r.reset(p)
		return nil, 0, DropRxOversize, truncated
	}
	if r.buf == nil {
		need := p.small.cap
		if last {
			need = len(data)
		}
		if r.buf = p.get(need); r.buf == nil {
			return nil, 0, DropNoBuffer, truncated
		}
	} else if r.n+len(data) > len(r.buf.b) {
		big := p.get(p.large.cap)
		if big == nil {
			r.reset(p)
			return nil, 0, DropNoBuffer, truncated
		}
		copy(big.b, r.buf.b[:r.n])
		p.put(r.buf)
		r.buf = big
	}
	r.n += copy(r.buf.b[r.n:], data)
	r.next = (idx + 1) & tagIdxMask
	if !last {
		return nil, 0, DropNone, truncated
	}
	done, n = r.buf, r.n
	*r = reasm{}
	if n < EthHeaderLen {
		p.put(done)
		return nil, 0, DropRxRunt, truncated
	}
	return done, n, DropNone, truncated
}

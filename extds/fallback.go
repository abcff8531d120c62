package extds

// The TCP fallback: a Conn in ModeTCP is a plain socket behind the
// exported API (conn.go dispatches every call here when c.fb is set).
//
// A connection falls back when the peer is not on the fabric, does not
// listen for EXT-DS, cannot attach, or did not answer the handshake (the
// reason is counted in Stats.Fallbacks and kept in FallbackReason). Its
// stream is exactly what the application would see over TCP: nothing is
// written into it, and bytes a server peeked to classify the client are
// replayed before the socket is read again (replayConn).
//
// Locks: none of its own. The kernel socket serialises its callers; the
// only shared state, replayConn's unread prefix, is guarded by its mu.
// Nothing here takes Conn or Device locks.

import (
	"io"
	"net"
	"sync"
	"time"
)

// tcpPath is the fallback half of a Conn; fixed once made.
type tcpPath struct {
	rd   net.Conn // reads and writes (may replay peeked bytes)
	raw  net.Conn // the socket itself (deadlines, CloseWrite, SetLinger, Close)
	why  FallbackReason
	fell bool // why is set: a Device chose TCP
}

// tcpConn wraps a socket as a ModeTCP Conn; reader (nil: raw) replays
// peeked bytes.
func tcpConn(raw, reader net.Conn) *Conn {
	if reader == nil {
		reader = raw
	}
	return &Conn{fb: &tcpPath{rd: reader, raw: raw}, laddr: raw.LocalAddr(), raddr: raw.RemoteAddr()}
}

// fallback is tcpConn for a Device's decision, counted by reason.
func (d *Device) fallback(raw, reader net.Conn, why FallbackReason) *Conn {
	d.ctr.fallbacks[why].Add(1)
	d.ctr.connsTCP.Add(1)
	c := tcpConn(raw, reader)
	c.fb.why, c.fb.fell = why, true
	return c
}

func (t *tcpPath) Read(p []byte) (int, error)  { return t.rd.Read(p) }
func (t *tcpPath) Write(p []byte) (int, error) { return t.rd.Write(p) }
func (t *tcpPath) Close() error                { return t.raw.Close() }

func (t *tcpPath) SetDeadline(d time.Time) error      { return t.raw.SetDeadline(d) }
func (t *tcpPath) SetReadDeadline(d time.Time) error  { return t.raw.SetReadDeadline(d) }
func (t *tcpPath) SetWriteDeadline(d time.Time) error { return t.raw.SetWriteDeadline(d) }

// closeWrite half-closes the socket; ok is false when it cannot.
func (t *tcpPath) closeWrite() (err error, ok bool) {
	if cw, ok := t.raw.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite(), true
	}
	return nil, false
}

// setLinger sets SO_LINGER where the socket has it, else does nothing.
func (t *tcpPath) setLinger(sec int) error {
	if l, ok := t.raw.(interface{ SetLinger(int) error }); ok {
		return l.SetLinger(sec)
	}
	return nil
}

// readFrom copies r to the socket (its own ReadFrom, e.g. splice).
func (t *tcpPath) readFrom(r io.Reader) (int64, error) { return io.Copy(t.raw, r) }

// writeTo copies the stream to w (the socket's own WriteTo, e.g. splice).
func (t *tcpPath) writeTo(w io.Writer) (int64, error) { return io.Copy(w, t.rd) }

// replayConn returns bytes peeked during classification before reading
// the socket again.
type replayConn struct {
	net.Conn
	mu  sync.Mutex
	pre []byte
}

func (r *replayConn) Read(p []byte) (int, error) {
	r.mu.Lock()
	if len(r.pre) > 0 {
		n := copy(p, r.pre)
		r.pre = r.pre[n:]
		r.mu.Unlock()
		return n, nil
	}
	r.mu.Unlock()
	return r.Conn.Read(p)
}

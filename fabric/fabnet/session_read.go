package fabnet

// Session reader (see session.go for the whole pipeline):
//
//	socket ──► rawReader (raw read(2)s on a TCP socket) ──► bufio reader
//	   ──► readLoop: decodePrefix (size checked before any read) ──►
//	   dispatch ──► rxVELO (credit-checked delivery into the target
//	   mailbox), rxCreditReq / rxCredit (grants, closed notices), and the
//	   RMA frames of session_rma.go. Replies are queued (replyLater) and
//	   kicked only when the reader is about to block (readFull, discard).
//
// Locks: the reader goroutine alone touches putFail, rxMsg and the
// ackedClosed epochs; it takes cmu for sender-side credit state and the
// target endpoint's mailbox mu for delivery. It never blocks on an
// application.

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"syscall"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/sys"
)

// rawReader reads a socket with raw read(2)s (sys.Read) through
// RawConn.Read, which waits for readability in the netpoller and honours
// the read deadline: the reader's copies, straight into regions for RMA
// chunks, then do not make sysmon retake its P (see sys.Writev). The
// reader goroutine only; it does not allocate per call.
type rawReader struct {
	rc  syscall.RawConn
	fn  func(fd uintptr) bool // r.read, bound once
	p   []byte
	n   int
	err error
}

func newRawReader(rc syscall.RawConn) *rawReader {
	r := &rawReader{rc: rc}
	r.fn = r.read
	return r
}

func (r *rawReader) read(fd uintptr) bool {
	n, err := sys.Read(int(fd), r.p)
	if err == sys.EAGAIN {
		return false
	}
	r.n, r.err = n, err
	return true
}

// Read implements io.Reader: io.EOF at the end of the stream.
func (r *rawReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r.p = p
	err := r.rc.Read(r.fn)
	r.p = nil
	switch {
	case err != nil:
		return 0, err
	case r.err != nil:
		return 0, fmt.Errorf("read: %w", r.err)
	case r.n == 0:
		return 0, io.EOF
	}
	return r.n, nil
}

// ---- reader ----

// readFull reads len(b) bytes. If that may block (not all of them are
// buffered), the replies the reader queued go out first: the reader never
// sleeps on the socket with frames of its own unsent.
func (s *session) readFull(br *bufio.Reader, b []byte) error {
	if s.replyDue && br.Buffered() < len(b) {
		s.replyDue = false
		s.kick()
	}
	if _, err := io.ReadFull(br, b); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	return nil
}

func (s *session) readLoop(br *bufio.Reader) error {
	var pb [prefixSize]byte
	for {
		if err := s.readFull(br, pb[:]); err != nil {
			return err
		}
		p, err := decodePrefix(pb[:])
		if err != nil {
			return err
		}
		body := s.bodyBuf[:fixedSize[p.typ]]
		if err := s.readFull(br, body); err != nil {
			return err
		}
		s.race.afterRead()
		s.framesIn.Add(1)
		s.n.nctr.framesIn.Add(1)
		if err := s.dispatch(br, p, body); err != nil {
			return err
		}
	}
}

func (s *session) dispatch(br *bufio.Reader, p prefix, body []byte) error {
	switch p.typ {
	case tHeartbeat:
		return nil
	case tVELO:
		return s.rxVELO(br, p, body)
	case tCreditReq:
		return s.rxCreditReq(p)
	case tGrant, tNoVPID, tClosed:
		return s.rxCredit(p, body)
	case tPutData:
		return s.rxPutData(br, p, body)
	case tPutAck:
		return s.rxPutAck(p, body)
	case tGetReq:
		return s.rxGetReq(p, body)
	case tGetData:
		return s.rxGetData(br, p, body)
	case tGetDone:
		return s.rxGetDone(body)
	}
	return fmt.Errorf("frame type %d: %w", p.typ, errProto)
}

func (s *session) rxVELO(br *bufio.Reader, p prefix, body []byte) error {
	d, err := fabric.DecodeDescriptor(binary.LittleEndian.Uint64(body))
	if err != nil {
		return fmt.Errorf("%w: %w", err, errProto)
	}
	if int(d.Len) != p.payloadLen() || d.VPID != p.b || (!d.MC && d.Node != 0) {
		return fmt.Errorf("velo descriptor %+v disagrees with frame: %w", d, errProto)
	}
	m := &s.rxMsg
	if err := s.readFull(br, m.Data[:d.Len]); err != nil {
		return err
	}
	m.Peer = fabric.Addr{Node: s.peer, VPID: p.a}
	m.MC, m.Tag, m.Len = d.MC, d.Tag, d.Len
	fenced := uint8(s.sentClosed[p.b].Load()) != s.ackedClosed[p.b]
	ep := s.n.eps[p.b].Load()
	if ep == nil {
		if fenced {
			s.n.nctr.staleVELO.Add(1)
			return nil
		}
		return fmt.Errorf("velo to vpid %d without credit: %w", p.b, errProto)
	}
	return ep.deliverRemote(s, m, fabric.Group(d.Node), fenced)
}

func (s *session) rxCreditReq(p prefix) error {
	v := p.b
	if p.flags != uint8(s.sentClosed[v].Load()) {
		return nil // sent before the peer saw our closed frame: it expects no answer
	}
	s.ackedClosed[v] = p.flags
	ep := s.n.eps[v].Load()
	if ep == nil || !ep.creditRequest(s) {
		s.queueCtl(tNoVPID, 0, 0, v, nil)
		s.replyLater()
	}
	return nil
}

// rxCredit handles the answers to our credit requests.
func (s *session) rxCredit(p prefix, body []byte) error {
	v := p.b
	s.cmu.Lock()
	t := &s.tx[v]
	switch p.typ {
	case tGrant:
		g := binary.LittleEndian.Uint32(body)
		if g == 0 || g > uint32(s.n.cfg.MailboxSlots) || !t.requested {
			s.cmu.Unlock()
			return fmt.Errorf("grant of %d for vpid %d (requested %v): %w", g, v, t.requested, errProto)
		}
		t.credits += int32(g)
		t.lastGrant = int32(g)
		t.granted = true
	case tNoVPID:
		if !t.requested {
			// Our request crossed the closed frame: already answered.
			s.cmu.Unlock()
			return nil
		}
		t.noVPID++
	case tClosed:
		t.credits = 0
		t.epoch++
		t.closedGen++
	}
	t.requested = false
	if s.cwait != nil {
		close(s.cwait)
		s.cwait = nil
	}
	s.cmu.Unlock()
	return nil
}

func (s *session) discard(br *bufio.Reader, n int) error {
	if s.replyDue && br.Buffered() < n {
		s.replyDue = false
		s.kick()
	}
	if _, err := br.Discard(n); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	return nil
}

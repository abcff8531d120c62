package fabnet

import (
	"net"
	"testing"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/testenv"
)

// TestFlushKeepsPendingBatch: while the rest of an earlier flush's batch
// waits in s.out for the writer goroutine (the socket was full), a later
// flush must neither replace it nor write ahead of it: it leaves its
// frames queued and kicks the writer. (Before, it took a new batch over
// the pending one: the rest of the first was lost and the stream broke
// mid-frame.)
func TestFlushKeepsPendingBatch(t *testing.T) {
	rc, err := testenv.DialTCP(t, listen(t)).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	s := &session{rc: rc, wake: make(chan struct{}, 1)}
	rest := []byte("the rest of an earlier batch")
	s.out.bufs = net.Buffers{rest}
	s.outPending = true

	m := fabric.Message{Peer: fabric.Addr{VPID: 1}, Len: 8}
	s.queueVELO(1, &m)
	queued := len(s.ctl)
	s.flush()

	if len(s.out.bufs) != 1 || &s.out.bufs[0][0] != &rest[0] {
		t.Errorf("flush replaced the pending batch: %q", s.out.bufs)
	}
	if !s.outPending {
		t.Error("flush cleared outPending")
	}
	if len(s.ctl) != queued {
		t.Errorf("flush took the queued frame (%d bytes queued, %d before)", len(s.ctl), queued)
	}
	select {
	case <-s.wake:
	default:
		t.Error("flush did not kick the writer")
	}
}

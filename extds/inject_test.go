package extds

import (
	"context"
	"encoding/binary"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
	"github.com/exn-project/exn/internal/testenv"
)

func rawMsg(to fabric.Addr, tag fabric.Tag, payload ...byte) fabric.Message {
	var m fabric.Message
	m.Peer, m.Tag = to, tag
	m.SetPayload(payload)
	return m
}

func le32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }

// TestForgedMessagesFromStranger: a raw endpoint on the client's node
// sends garbage and forgeries to the server's vdev. Each is a counted
// drop; the real connection is untouched.
func TestForgedMessagesFromStranger(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t)
	c, s := p.openConns(t)
	raw := fabrictest.OpenEP(t, p.nicA, 200)
	to := s.vd.ep.Addr()
	valid := le32(s.id)
	msgs := []struct {
		m    fabric.Message
		drop DropReason
	}{
		{rawMsg(to, 0x01, valid...), DropMalformed},                                         // EXT-Eth tag
		{rawMsg(to, TagVELO, 1, 2), DropMalformed},                                          // short
		{rawMsg(to, TagVELO, 0, 0, 0, 0, 'x'), DropMalformed},                               // conn 0
		{rawMsg(to, TagVELO, valid...), DropMalformed},                                      // empty fragment
		{rawMsg(to, TagRMAInfo, append(valid, 1, 2, 3)...), DropMalformed},                  // bad length
		{rawMsg(to, TagVELO, append(le32(s.id+1000), 'x')...), DropUnknownConn},             // unknown conn
		{rawMsg(to, TagVELO, append(append([]byte{}, valid...), 'x')...), DropPeerMismatch}, // right conn, wrong source
		{rawMsg(to, TagReset, valid...), DropPeerMismatch},
	}
	for i := range msgs {
		before := p.devB.Stats().Drops[msgs[i].drop.String()]
		if _, err := raw.Send(context.Background(), []fabric.Message{msgs[i].m}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, "drop "+msgs[i].drop.String(), 2*time.Second, func() bool {
			return p.devB.Stats().Drops[msgs[i].drop.String()] == before+1
		})
	}
	transfer(t, c, s, []int{10, 5000, 100}, c.Write)
}

// TestProtocolViolationFromPeer: the connection's own peer address breaks
// the protocol. Only that connection is reset; a sibling on the same
// vdev pair keeps working.
func TestProtocolViolationFromPeer(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	tests := []struct {
		name    string
		payload func(s *Conn) (fabric.Tag, []byte)
	}{
		{"credit-overflow", func(s *Conn) (fabric.Tag, []byte) {
			return TagRMAAvail, append(append(le32(s.id), le32(1)...), le32(0)...)
		}},
		{"rma-info-outside-ring", func(s *Conn) (fabric.Tag, []byte) {
			return TagRMAInfo, append(append(le32(s.id), le32(0)...), le32(s.ringSize+1)...)
		}},
		{"rma-info-wrong-offset", func(s *Conn) (fabric.Tag, []byte) {
			return TagRMAInfo, append(append(le32(s.id), le32(64)...), le32(10)...)
		}},
		{"eager-overflow", nil},
		{"unexpected-zc-done", func(s *Conn) (fabric.Tag, []byte) { return TagZCDone, le32(s.id) }},
		{"duplicate-shutdown", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, WithEagerWindow(1024))
			c, s := p.openConns(t)
			c2, s2 := p.conns(t) // sibling: same server port, so same server vdev
			defer c2.Close()
			defer s2.Close()
			from := c.vd.ep // the real peer address of s
			var batch []fabric.Message
			switch tc.name {
			case "eager-overflow":
				for i := 0; i < 1024/fragData+2; i++ {
					var m fabric.Message
					encData(&m, s.vd.ep.Addr(), s.id, false, make([]byte, fragData))
					batch = append(batch, m)
				}
			case "duplicate-shutdown":
				for i := 0; i < 2; i++ {
					var m fabric.Message
					encCtl(&m, s.vd.ep.Addr(), TagShutdown, s.id)
					batch = append(batch, m)
				}
			default:
				tag, pl := tc.payload(s)
				batch = append(batch, rawMsg(s.vd.ep.Addr(), tag, pl...))
			}
			if _, err := from.Send(context.Background(), batch); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, "protocol drop", 2*time.Second, func() bool { return p.devB.Stats().Drops["protocol"] == 1 })
			buf := make([]byte, 4096)
			s.SetReadDeadline(time.Now().Add(5 * time.Second))
			for {
				if _, err := s.Read(buf); err != nil {
					if !errors.Is(err, ErrProtocol) {
						t.Fatalf("server read: %v, want ErrProtocol", err)
					}
					break
				}
			}
			// The peer is told with RESET.
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Read(buf); !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("client read: %v, want ECONNRESET", err)
			}
			transfer(t, c2, s2, []int{1, 1000, 70000}, c2.Write)
		})
	}
}

package fping

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/ratelog"
)

// VPID is the management VPID exnd reserves for ping.
const VPID fabric.VPID = 1

// Message tags of the ping protocol.
const (
	TagPing fabric.Tag = 0x50
	TagPong fabric.Tag = 0x51
)

// payloadLen is the ping payload: an 8-byte sequence number and an 8-byte
// send timestamp, padded to a full VELO payload so ping measures the
// 120-byte message the performance targets name.
const payloadLen = fabric.MaxVELOPayload

// batch is how many messages one Recv takes; ping traffic is light.
const batch = 16

// replySpin is how long Ping polls the endpoint itself for the answer
// before it leaves the receiving to the receive loop (which parks). A
// warm round trip between two exnds on shm takes 3–5 µs, well inside
// it, so back-to-back pings never pay the pinger's own wake-up. It is
// short because a spinning pinger holds its CPU: on two vCPUs the kernel
// often wakes the target on that very CPU, where it waits for the spin to
// end. Cold pings (after 1 s of quiet) on the development VM, medians of
// 15 from a client process that stays up (perf/cold-ping.sh): 158–281 µs
// with a 200 µs spin, 129–133 µs with 50 µs, 119–120 µs with none; warm
// p50 3 µs with 50 µs or 200 µs (docs/wakeup.md, "Sixth session").
const replySpin = 50 * time.Microsecond

// Service answers pings on ep and runs pings from it. It owns one
// goroutine, the receive loop, started by New and stopped by Close.
//
// Locking: mu guards waiters, the map from sequence number to the channel
// of an outstanding Ping.
type Service struct {
	ep  fabric.Endpoint
	log *slog.Logger
	// replyFaults limits "ping reply failed" (zero value: one line a
	// second): any node can send pings faster than a slow or dead peer's
	// replies fail.
	replyFaults ratelog.Limiter

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	seq     uint64
	waiters map[uint64]chan time.Time
}

// New starts a ping service on ep, which it owns and closes on Close.
func New(ep fabric.Endpoint, log *slog.Logger) *Service {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{ep: ep, log: log, ctx: ctx, cancel: cancel, done: make(chan struct{}), waiters: make(map[uint64]chan time.Time)}
	go s.loop()
	return s
}

// Close stops the receive loop, waits for it and closes the endpoint.
func (s *Service) Close() error {
	s.cancel()
	err := s.ep.Close()
	<-s.done
	return err
}

func (s *Service) loop() {
	defer close(s.done)
	msgs := make([]fabric.Message, batch)
	for {
		n, err := s.receive(msgs)
		if err != nil {
			return
		}
		if n == 0 {
			if err := s.ep.Wait(s.ctx); err != nil {
				return
			}
		}
	}
}

// receive takes what is in the mailbox and handles it (the loop, and a
// Ping spinning for its answer: Recv serialises the two). It returns how
// many messages it took.
func (s *Service) receive(msgs []fabric.Message) (int, error) {
	n, err := s.ep.Recv(msgs)
	for i := range msgs[:n] {
		s.handle(&msgs[i])
	}
	return n, err
}

func (s *Service) handle(m *fabric.Message) {
	switch m.Tag {
	case TagPing:
		reply := *m
		reply.Tag = TagPong
		reply.MC = false
		// Answer without blocking the loop forever on a dead or
		// congested peer.
		ctx, cancel := context.WithTimeout(s.ctx, time.Second)
		_, err := s.ep.Send(ctx, []fabric.Message{reply})
		cancel()
		if err != nil {
			s.replyFaults.Log(s.log, slog.LevelDebug, "ping reply failed", "peer", m.Peer, "err", err)
		}
	case TagPong:
		if m.Len < 16 {
			return
		}
		seq := binary.LittleEndian.Uint64(m.Data[:8])
		s.mu.Lock()
		ch := s.waiters[seq]
		delete(s.waiters, seq)
		s.mu.Unlock()
		if ch != nil {
			ch <- time.Now()
		}
	}
}

// Ping sends one 120-byte ping to node's management VPID and returns the
// round-trip time. It fails if ctx ends first or the node is down.
func (s *Service) Ping(ctx context.Context, node fabric.NodeID) (time.Duration, error) {
	ch := make(chan time.Time, 1)
	s.mu.Lock()
	s.seq++
	seq := s.seq
	s.waiters[seq] = ch
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.waiters, seq)
		s.mu.Unlock()
	}()

	var m fabric.Message
	m.Peer = fabric.Addr{Node: node, VPID: VPID}
	m.Tag = TagPing
	m.Len = payloadLen
	binary.LittleEndian.PutUint64(m.Data[:8], seq)
	start := time.Now()
	binary.LittleEndian.PutUint64(m.Data[8:16], uint64(start.UnixNano()))
	if _, err := s.ep.Send(ctx, []fabric.Message{m}); err != nil {
		return 0, fmt.Errorf("ping node %d: %w", node, err)
	}
	if t, ok := s.spinFor(ch, start); ok {
		return t.Sub(start), nil
	}
	select {
	case t := <-ch:
		return t.Sub(start), nil
	case <-ctx.Done():
		return 0, fmt.Errorf("ping node %d: %w", node, ctx.Err())
	case <-s.done:
		return 0, fmt.Errorf("ping node %d: %w", node, net.ErrClosed)
	}
}

// spinFor polls the endpoint for up to replySpin after start, handling
// what it receives as the receive loop would (Recv serialises the two),
// until the answer on ch has come. It reports the answer's arrival time.
func (s *Service) spinFor(ch chan time.Time, start time.Time) (time.Time, bool) {
	var msgs [batch]fabric.Message
	for time.Since(start) < replySpin {
		select {
		case t := <-ch:
			return t, true
		default:
		}
		if _, err := s.receive(msgs[:]); err != nil {
			break
		}
	}
	return time.Time{}, false
}

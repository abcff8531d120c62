package shimsrv

// A pool of ready-made connection buffers for the accepting side of
// direct connections (issue #15). Making one (on one host the buffer
// file and a listening AF_UNIX socket at NAME.b in the fabric's
// directory, which the connecting exnd connects side 0's bell to;
// across hosts the buffer alone, docs/direct.md) costs about 0.2 ms of
// system calls, and it sits on the critical path of every connection
// setup: between the client's CLAIM and the answer that names the
// buffer. With the pool, the answer takes one that was made before, and
// the filler makes its replacement off that path. A pooled buffer holds
// two descriptors on one host (buffer and listener), one across hosts.
//
// Stages and locks: directCreate takes from ready (a buffered channel,
// never blocking: an empty pool makes the buffer inline, as before) and
// nudges the filler through want (capacity 1). The filler is one
// goroutine, started with the first direct accept and owned by the
// Server (s.wg; it ends with s.ctx), that tops ready up to poolSize and
// then parks on want: no timer, nothing while nobody accepts. Close
// removes what is left in the pool (closePool, after s.wg.Wait).

import (
	"log/slog"
	"time"

	"github.com/exn-project/exn/extds/dring"
)

// poolSize is how many buffers wait ready. An accept takes one and the
// filler makes one in about 0.2 ms, so 4 covers a burst of 4 accepts
// faster than that (netperf TCP_CRR accepts one at a time); a longer
// burst makes the rest inline. Their cost: 4 files of 4 KiB + 2 rings in
// tmpfs, whose pages exist only once touched, and their listeners.
const poolSize = 4

// pooled is a buffer made ahead: its files (one host: the buffer and
// its bell's listener, names still in the directory) and the ID in its
// name.
type pooled struct {
	fs   *dring.Files
	name string
	id   uint64
}

type ringPool struct {
	ready   chan pooled
	want    chan struct{}
	started bool // under s.mu
}

// makeBuf makes one buffer with a fresh ID.
func (s *Server) makeBuf() (pooled, error) {
	s.mu.Lock()
	s.dnext++
	id := s.dnext
	s.mu.Unlock()
	id = id<<16 | uint64(time.Now().UnixNano()&0xFFFF) // unique across exnd restarts too
	name := dring.Name(s.directCfg.Fabric, s.directCfg.Node, id)
	if s.directCfg.Engine != nil {
		// Across hosts nobody opens a buffer by its name (remote.go),
		// and the bells come from a socketpair: no listener, and the
		// name goes at once, so an exnd that dies leaves nothing in
		// the directory (the kernel frees the file with its last
		// descriptor).
		fs, err := dring.CreateBuffer(s.directCfg.Dir, name, s.directCfg.Ring)
		if err != nil {
			return pooled{}, err
		}
		if err := dring.Remove(s.directCfg.Dir, name); err != nil {
			fs.Close()
			return pooled{}, err
		}
		return pooled{fs: fs, name: name, id: id}, nil
	}
	fs, err := dring.Create(s.directCfg.Dir, name, s.directCfg.Ring)
	if err != nil {
		return pooled{}, err
	}
	return pooled{fs: fs, name: name, id: id}, nil
}

// takeBuf returns a ready buffer, or makes one. It starts the filler
// the first time.
func (s *Server) takeBuf() (pooled, error) {
	s.mu.Lock()
	if !s.pool.started && !s.closed {
		s.pool.started = true
		s.wg.Add(1)
		go s.fillPool()
	}
	s.mu.Unlock()
	select {
	case b := <-s.pool.ready:
		select {
		case s.pool.want <- struct{}{}:
		default:
		}
		return b, nil
	default:
	}
	return s.makeBuf()
}

// fillPool keeps the pool full until the server closes.
func (s *Server) fillPool() {
	defer s.wg.Done()
	for {
		for len(s.pool.ready) < cap(s.pool.ready) && s.ctx.Err() == nil {
			b, err := s.makeBuf()
			if err != nil {
				// Accepts make theirs inline (and fail the same way,
				// which they report); try again at the next take.
				s.logConn(slog.LevelWarn, "extds shim: cannot make a direct buffer ahead", "err", err)
				break
			}
			s.pool.ready <- b // never blocks: only this goroutine adds
		}
		select {
		case <-s.pool.want:
		case <-s.ctx.Done():
			return
		}
	}
}

// closePool removes the buffers left in the pool (Close, once the filler
// has ended).
func (s *Server) closePool() {
	for {
		select {
		case b := <-s.pool.ready:
			b.fs.Close()
			if err := dring.Remove(s.directCfg.Dir, b.name); err != nil {
				s.log.Warn("extds shim: remove pooled direct buffer", "err", err)
			}
		default:
			return
		}
	}
}

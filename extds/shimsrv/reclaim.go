package shimsrv

// Rings that shrink when idle (issue #32; docs/direct.md, "Rings that
// shrink when idle"). A direct connection's buffer file is sparse, so a
// ring grows with its traffic, page by page; the reclaimer gives the
// pages back once the direction has moved no byte for a whole period.
//
// Stages and locks: one goroutine (reclaimer), owned by the Server
// (s.wg, ends with s.ctx), runs while direct connections exist, started
// by enterDirect beside directLiveness and ended at the first tick that
// finds none (reclaimOn, under s.mu). Each tick it copies s.dconns under
// s.mu and then, without it, looks at each connection's outbound tail
// (the direction its program writes; the peer's exnd does the other on
// one host, and across hosts the inbound ring is the peer engine's to
// write by RMA, which no lock here excludes, so it is never punched):
//   - moved since the last tick: busy, remember it;
//   - unchanged and nothing written since its last reclaim (or ever):
//     nothing to give back;
//   - unchanged since the last tick and written since the last reclaim:
//     idle for at least one period, dring.Endpoint.ReclaimTx.
// A direction so waits between one and two periods before its pages go.
// The tick that finds no connection ends the goroutine, and after a run
// of many connections gives their Go heap back first (freeOSPeak).
// dconn.rcl is this goroutine's alone.
//
// The tick is the one timer: "idle" needs a clock, and the data path
// keeps none (docs/wakeup.md). It costs one wake-up per period while
// direct connections exist, and two atomic loads per connection.

import (
	"log/slog"
	"runtime/debug"
	"time"
)

// DefaultReclaimIdle is exnd's DirectConfig.ReclaimIdle
// (--extds-reclaim-idle), how long a direction of a direct connection
// moves no byte before its ring's pages go back (at most twice that): long
// enough that a connection pausing between requests keeps its pages
// (a refault costs about 1 µs a page, 256 for a 1 MiB ring), short
// enough that a server's idle connections hold only their header page
// within seconds.
const DefaultReclaimIdle = 5 * time.Second

// freeOSPeak: when the last direct connection of a run of at least this
// many has ended, the reclaimer hands the Go heap they used back to the
// kernel (debug.FreeOSMemory: a collection and a scavenge, some ms of
// CPU once). Without it the heap of 10,000 connections (about 16 KiB
// each: the dconn, its watch goroutine's stack, the endpoint) stays in
// exnd's RSS until the runtime's forced collection and background
// scavenger get to it, minutes later (measured: twice the RSS before the
// first connection, 0.5 s after the last close; 1.25 times 30 s after
// 1,000). Below this the run's heap is a few MiB, not worth a pause.
const freeOSPeak = 256

// reclaimState is the reclaimer's view of one connection's outbound
// direction: the tail at the last tick, and at its last reclaim.
type reclaimState struct {
	seen, done uint64
}

// startReclaimLocked starts the reclaimer if it should run (s.mu held).
func (s *Server) startReclaimLocked() {
	if s.directCfg.ReclaimIdle <= 0 || s.reclaimOn {
		return
	}
	s.reclaimOn = true
	s.wg.Add(1)
	go s.reclaimer()
}

func (s *Server) reclaimer() {
	defer s.wg.Done()
	t := time.NewTicker(s.directCfg.ReclaimIdle)
	defer t.Stop()
	var dcs []*dconn
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		peak := 0
		var ok bool
		if dcs, ok = s.dconnsOrStop(dcs, func() { s.reclaimOn, peak, s.dpeak = false, s.dpeak, 0 }); !ok {
			if peak >= freeOSPeak {
				debug.FreeOSMemory()
				s.logConn(slog.LevelDebug, "extds shim: the last direct connection ended, heap handed back", "peak", peak)
			}
			return
		}
		for _, dc := range dcs {
			s.reclaimOne(dc)
		}
		clear(dcs)
	}
}

// reclaimOne looks at dc's outbound direction once (see the file's head).
func (s *Server) reclaimOne(dc *dconn) {
	if dc.rem != nil && !s.directCfg.ReclaimRemote {
		return
	}
	tail := dc.ep.TxCursor()
	r := &dc.rcl
	if tail != r.seen {
		r.seen = tail
		return
	}
	if tail == r.done {
		return
	}
	freed, err := dc.ep.ReclaimTx()
	if err != nil {
		s.logConn(slog.LevelWarn, "extds shim: cannot give an idle ring back", "id", dc.id, "err", err)
		r.done = tail // do not try again until it moves
		return
	}
	if freed {
		r.done = tail
		s.reclaims.Add(1)
	}
}

package shimsrv

// Holds for short-lived connections, the half that learns (issue #15;
// extds/hold.go has the half on the fabric, docs/shim.md "Short
// connections" the reasoning and the measurements).
//
// Every accepted connection that was switched (relayed or direct) is
// timed from its switch to its end. shortRun of them in a row on one
// listener port, each shorter than shortLife, put the port on hold for
// the configured time (WithShortHold, exnd --extds-short-hold): until
// then its connections stay plain TCP, and nobody asks anybody. A
// shim-accept on a held port is answered "tcp", reason short_lived,
// with hold_ms, the time the shim may skip asking; a shim-connect whose
// server announced a hold likewise. When the hold ends, the next
// connections are set up again and timed: the port is held again only if
// they are short again.
//
// Locks: holdMu guards runs; a leaf lock.

import (
	"log/slog"
	"net"
	"time"

	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/internal/sys"
)

const (
	// shortLife: an accepted connection that ends within this time of
	// its switch is short. Setting one up costs about 1 ms here
	// (docs/shim.md): a connection shorter than ten times that spent
	// more than a tenth of its life being set up.
	shortLife = 10 * time.Millisecond
	// shortRun short connections in a row on a port hold it; a longer
	// one starts the count again. 4: one short connection among long
	// ones holds nothing, and the probe after a hold costs at most four
	// setups.
	shortRun = 4
	// DefaultShortHold is exnd's hold (--extds-short-hold): the probe
	// after it (shortRun setups, about 4 ms) costs under 1 % of it, and
	// a port whose connections turned long waits at most this long to
	// be accelerated again.
	DefaultShortHold = time.Second
)

// WithShortHold sets how long a listener port whose connections are
// short stays on hold (0, the default of New: never). It is clamped to
// extds.MaxHold.
func WithShortHold(d time.Duration) Option {
	return func(s *Server) { s.shortHold = min(d, extds.MaxHold) }
}

// connEnded times an accepted connection of listener port, switched at
// since, that just ended, and holds the port after shortRun short ones.
func (s *Server) connEnded(side string, port uint16, since time.Time) {
	if s.shortHold <= 0 || side != sideAccept || port == 0 {
		return
	}
	short := time.Since(since) < shortLife
	s.holdMu.Lock()
	n := 0
	if short {
		s.runs[port]++
		n = s.runs[port]
	}
	if !short || n >= shortRun {
		delete(s.runs, port)
	}
	s.holdMu.Unlock()
	if n >= shortRun {
		s.dev.HoldPort(port, s.shortHold)
		s.holds.Add(1)
		s.logConn(slog.LevelDebug, "extds shim: port on hold (short connections)", "port", port, "hold", s.shortHold)
	}
}

// heldAccept is shim-accept's answer for the connection key on a held
// port, ok false if the port is not held (extds.Device.AcceptOnHold
// settles the connection's claim).
func (s *Server) heldAccept(key extds.TupleKey) (SwitchResult, bool) {
	if s.shortHold <= 0 {
		return SwitchResult{}, false
	}
	left := s.dev.AcceptOnHold(key)
	if left <= 0 {
		return SwitchResult{}, false
	}
	return s.shortLived(left), true
}

// shortLived is the answer "tcp", reason short_lived, for a hold of
// left (hold_ms rounded down, and hold_end: now plus left on the host's
// monotonic clock), counted. A shim that read the answer late (a
// descheduled server under load) would otherwise skip asking for longer
// than exnd declines, and meet a claim that waits for it (the
// server-first case of integration TestNetperfShimShortHold saw it).
func (s *Server) shortLived(left time.Duration) SwitchResult {
	why := extds.FallbackShortLived.String()
	s.fallback(why)
	left = max(left, 0)
	r := SwitchResult{Mode: "tcp", Reason: why, HoldMS: uint64(left.Milliseconds())}
	if now := sys.MonoNow(); now != 0 {
		r.HoldEnd = now + uint64(left)
	}
	return r
}

// peerHold is how long the shim may skip asking for connections to the
// server at a (a hold its exnd announced).
func (s *Server) peerHold(a net.Addr) time.Duration {
	ap, ok := tcpAddrPort(a)
	if !ok {
		return 0
	}
	return s.dev.PeerHold(ap)
}

package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of a Limiter that Init was not called on: one line a second,
// the rate at which exn's fault logs stay readable during a flood.
const (
	DefaultPeriod = time.Second
	DefaultBurst  = 1
)

// Limiter allows Burst events per Period and counts the rest. The zero
// value allows DefaultBurst events per DefaultPeriod; Init sets other
// values and must not run concurrently with other methods. It is safe for
// concurrent use.
//
// Concurrency: a suppressed event (the common case in a flood) costs a
// clock read and three atomic operations, no lock; the mutex is taken only
// to open a new period or to let an event through.
type Limiter struct {
	mu     sync.Mutex
	now    func() time.Time
	period time.Duration
	burst  int64

	// start (unix ns) and n, the events let through since start, are
	// written under mu: n before start, so a reader that loads start and
	// then n never pairs a new period with the old count.
	start      atomic.Int64
	n          atomic.Int64
	suppressed atomic.Uint64
}

// Init sets the clock (nil: time.Now), the period and the burst (values
// below 1 select the defaults).
func (l *Limiter) Init(now func() time.Time, period time.Duration, burst int) {
	l.now, l.period, l.burst = now, period, int64(burst)
}

func (l *Limiter) params() (now time.Time, period int64, burst int64) {
	if l.now != nil {
		now = l.now()
	} else {
		now = time.Now()
	}
	period, burst = int64(l.period), l.burst
	if period <= 0 {
		period = int64(DefaultPeriod)
	}
	if burst <= 0 {
		burst = DefaultBurst
	}
	return now, period, burst
}

// Allow reports whether to log now, and how many events were suppressed
// since the last one allowed.
func (l *Limiter) Allow() (suppressed uint64, ok bool) {
	t, period, burst := l.params()
	now := t.UnixNano()
	// Fast path: inside the current period with the burst spent.
	if start := l.start.Load(); now-start < period && now >= start && l.n.Load() >= burst {
		l.suppressed.Add(1)
		return 0, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if start := l.start.Load(); now-start >= period || now < start {
		l.n.Store(0)
		l.start.Store(now)
	}
	if l.n.Load() >= burst {
		l.suppressed.Add(1)
		return 0, false
	}
	l.n.Add(1)
	return l.suppressed.Swap(0), true
}

// Log logs msg at level on log if l allows it, adding a "suppressed" count
// when earlier lines were held back. args are slog's: alternating keys and
// values, or slog.Attr. Nothing is counted or logged when log does not
// enable level.
func (l *Limiter) Log(log *slog.Logger, level slog.Level, msg string, args ...any) {
	ctx := context.Background()
	if !log.Enabled(ctx, level) {
		return
	}
	if s, ok := l.Allow(); ok {
		if s > 0 {
			args = append(args[:len(args):len(args)], slog.Uint64("suppressed", s))
		}
		log.Log(ctx, level, msg, args...)
	}
}

// Warn logs msg at warning level on log if l allows it, adding a
// "suppressed" count when earlier lines were held back. It costs nothing
// beyond an Enabled check when warnings are off.
func (l *Limiter) Warn(log *slog.Logger, msg string, attrs ...slog.Attr) {
	if !log.Enabled(context.Background(), slog.LevelWarn) {
		return
	}
	if s, ok := l.Allow(); ok {
		if s > 0 {
			attrs = append(attrs, slog.Uint64("suppressed", s))
		}
		log.LogAttrs(context.Background(), slog.LevelWarn, msg, attrs...)
	}
}

// Faults is the fault log of one owner (a NIC, a node, a service): the
// events a peer or a corrupt input can cause once per message. Each is
// counted by its owner and logged here at warning level, at most Burst
// lines per Period across all of the owner's faults, with the owner's
// attributes (such as its node ID) on every line.
//
// Init must run before use and not concurrently with Warn; Warn is safe
// for concurrent use. A Faults with no logger discards.
type Faults struct {
	Limiter
	log   *slog.Logger
	attrs []any
}

// Init sets the logger (nil discards), the period (0: DefaultPeriod) and
// the attributes added to every line (slog's alternating keys and values,
// or slog.Attr). Burst is DefaultBurst.
func (f *Faults) Init(log *slog.Logger, period time.Duration, attrs ...any) {
	f.Limiter.Init(nil, period, DefaultBurst)
	f.log, f.attrs = log, attrs
}

// Warn logs a fault at warning level if the limiter allows it. A
// suppressed fault allocates nothing here.
func (f *Faults) Warn(msg string, args ...any) {
	ctx := context.Background()
	if f.log == nil || !f.log.Enabled(ctx, slog.LevelWarn) {
		return
	}
	s, ok := f.Allow()
	if !ok {
		return
	}
	args = append(args[:len(args):len(args)], f.attrs...)
	if s > 0 {
		args = append(args, slog.Uint64("suppressed", s))
	}
	f.log.Log(ctx, slog.LevelWarn, msg, args...)
}

package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Limiter allows Burst events per Period and counts the rest. The zero
// value is not usable; call Init. It is safe for concurrent use.
type Limiter struct {
	mu         sync.Mutex
	now        func() time.Time
	period     time.Duration
	burst      int
	start      time.Time
	n          int
	suppressed uint64
}

// Init sets the clock (nil: time.Now), the period and the burst.
func (l *Limiter) Init(now func() time.Time, period time.Duration, burst int) {
	if now == nil {
		now = time.Now
	}
	l.now, l.period, l.burst = now, period, burst
}

// Allow reports whether to log now, and how many events were suppressed
// since the last one allowed.
func (l *Limiter) Allow() (suppressed uint64, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if now.Sub(l.start) >= l.period {
		l.start, l.n = now, 0
	}
	if l.n >= l.burst {
		l.suppressed++
		return 0, false
	}
	l.n++
	s := l.suppressed
	l.suppressed = 0
	return s, true
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

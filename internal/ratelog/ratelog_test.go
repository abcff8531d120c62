package ratelog

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestLimiter(t *testing.T) {
	now := time.Unix(0, 0)
	var l Limiter
	l.Init(func() time.Time { return now }, time.Second, 2)
	var got []bool
	for range 5 {
		_, ok := l.Allow()
		got = append(got, ok)
	}
	if want := []bool{true, true, false, false, false}; !equal(got, want) {
		t.Fatalf("allow = %v, want %v", got, want)
	}
	now = now.Add(time.Second)
	if s, ok := l.Allow(); !ok || s != 3 {
		t.Fatalf("after the period: allow %v, suppressed %d; want true, 3", ok, s)
	}
}

func TestWarn(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	now := time.Unix(0, 0)
	var l Limiter
	l.Init(func() time.Time { return now }, time.Second, 1)
	for range 3 {
		l.Warn(log, "dropped", slog.Int("node", 2))
	}
	now = now.Add(2 * time.Second)
	l.Warn(log, "dropped")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], "suppressed=2") {
		t.Fatalf("log:\n%s", buf.String())
	}
	off := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelError}))
	buf.Reset()
	l.Warn(off, "quiet")
	if buf.Len() != 0 {
		t.Fatalf("logged below the handler's level: %s", buf.String())
	}
}

// The zero value allows DefaultBurst events per DefaultPeriod.
func TestZeroValue(t *testing.T) {
	var l Limiter
	if _, ok := l.Allow(); !ok {
		t.Fatal("first event refused")
	}
	if _, ok := l.Allow(); ok {
		t.Fatal("second event within a second allowed")
	}
}

// A clock that steps back (a fake clock reset, or a wall clock adjusted)
// opens a new period rather than suppressing until the old one ends.
func TestClockBack(t *testing.T) {
	now := time.Unix(100, 0)
	var l Limiter
	l.Init(func() time.Time { return now }, time.Second, 1)
	l.Allow()
	now = time.Unix(50, 0)
	if _, ok := l.Allow(); !ok {
		t.Fatal("clock stepped back: event refused")
	}
}

// Under concurrent use exactly Burst events per period get through and
// every other one is counted as suppressed.
func TestConcurrent(t *testing.T) {
	var now atomic.Int64
	var l Limiter
	l.Init(func() time.Time { return time.Unix(0, now.Load()) }, time.Second, 3)
	var allowed, suppressed atomic.Uint64
	run := func() {
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 1000 {
					s, ok := l.Allow()
					if ok {
						allowed.Add(1)
					}
					suppressed.Add(s)
				}
			})
		}
		wg.Wait()
	}
	run()
	if a := allowed.Load(); a != 3 {
		t.Fatalf("allowed %d in one period, want 3", a)
	}
	now.Add(int64(time.Second))
	run()
	// The first event of the second period reports the first period's
	// 7997 suppressed; the second period's own are still pending.
	if a, s := allowed.Load(), suppressed.Load(); a != 6 || s != 8000-3 {
		t.Fatalf("after two periods: allowed %d (want 6), suppressed reported %d (want 7997)", a, s)
	}
}

func TestLog(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	now := time.Unix(0, 0)
	var l Limiter
	l.Init(func() time.Time { return now }, time.Second, 1)
	for range 4 {
		l.Log(log, slog.LevelDebug, "ping reply failed", "peer", 7)
	}
	now = now.Add(time.Second)
	l.Log(log, slog.LevelDebug, "ping reply failed", "peer", 8)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "level=DEBUG") || !strings.Contains(lines[0], "peer=7") ||
		!strings.Contains(lines[1], "peer=8 suppressed=3") {
		t.Fatalf("log:\n%s", buf.String())
	}
	// A level the handler drops is neither logged nor counted.
	buf.Reset()
	quiet := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	now = now.Add(time.Second)
	l.Log(quiet, slog.LevelDebug, "hidden")
	if _, ok := l.Allow(); !ok || buf.Len() != 0 {
		t.Fatalf("disabled level: logged %q or spent the burst", buf.String())
	}
}

func TestFaults(t *testing.T) {
	var buf bytes.Buffer
	var f Faults
	f.Init(slog.New(slog.NewTextHandler(&buf, nil)), time.Hour, "node", 3)
	args := make([]any, 2, 8) // spare capacity: Warn must not write into it
	args[0], args[1] = "vpid", 9
	for range 3 {
		f.Warn("notification queue full, dropped", args...)
	}
	if got := strings.TrimSpace(buf.String()); strings.Count(got, "\n") != 0 ||
		!strings.Contains(got, "level=WARN") || !strings.Contains(got, "vpid=9 node=3") {
		t.Fatalf("log:\n%s", buf.String())
	}
	if extra := args[:4]; extra[2] != nil || extra[3] != nil {
		t.Fatalf("Warn wrote into the caller's slice: %v", extra)
	}
	if s, ok := f.Allow(); ok || s != 0 {
		t.Fatal("the period is an hour: no event may pass")
	}
	// No logger: discards without panicking.
	var none Faults
	none.Init(nil, 0)
	none.Warn("x")
}

// A suppressed fault allocates nothing inside Warn.
func TestFaultsNoAlloc(t *testing.T) {
	var f Faults
	f.Init(slog.New(slog.NewTextHandler(io.Discard, nil)), time.Hour, "node", 3) // enabled at warning level
	f.Warn("first")
	if n := testing.AllocsPerRun(100, func() { f.Warn("again") }); n != 0 {
		t.Fatalf("suppressed Warn: %v allocs", n)
	}
}

func BenchmarkAllowSuppressed(b *testing.B) {
	var l Limiter
	l.Allow()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l.Allow()
		}
	})
}

func equal(a, b []bool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

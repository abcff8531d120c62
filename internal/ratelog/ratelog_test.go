package ratelog

import (
	"bytes"
	"log/slog"
	"strings"
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

package sys

import (
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func tempFile(t testing.TB, size int64) *os.File {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(t.TempDir(), "f"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestFlockConflicts(t *testing.T) {
	f := tempFile(t, 0)
	g, err := os.OpenFile(f.Name(), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	tests := []struct {
		name       string
		first, snd bool // exclusive?
		want       bool
	}{
		{"ex-ex", true, true, false},
		{"sh-sh", false, false, true},
		{"sh-ex", false, true, false},
		{"ex-sh", true, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if ok, err := TryLock(f, tt.first); !ok || err != nil {
				t.Fatalf("first lock: %v %v", ok, err)
			}
			ok, err := TryLock(g, tt.snd)
			if err != nil || ok != tt.want {
				t.Fatalf("second lock = %v, %v; want %v", ok, err, tt.want)
			}
			Unlock(g)
			Unlock(f)
		})
	}
}

func TestMapSharedAndFutex(t *testing.T) {
	f := tempFile(t, 4096)
	a, err := MapShared(f, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer Unmap(a)
	b, err := MapShared(f, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer Unmap(b)
	wa, err := Uint32At(a, 64)
	if err != nil {
		t.Fatal(err)
	}
	wb, _ := Uint32At(b, 64)
	if _, err := Uint32At(a, 63); err == nil {
		t.Fatal("misaligned view accepted")
	}
	if _, err := Uint64At(a, 4096); err == nil {
		t.Fatal("out-of-range view accepted")
	}
	// A write through one mapping is a wake-up through the other: the futex
	// is keyed on the file, not the address.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for wb.Load() == 0 {
			if err := FutexWait(wb, 0, time.Second); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	time.Sleep(10 * time.Millisecond)
	wa.Store(1)
	if _, err := FutexWake(wa, 1); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("futex waiter not woken")
	}
	// Timeout path returns nil.
	var w atomic.Uint32
	start := time.Now()
	if err := FutexWait(&w, 0, 5*time.Millisecond); err != nil || time.Since(start) > time.Second {
		t.Fatalf("timed wait: %v after %v", err, time.Since(start))
	}
	if ok, err := SameFile(f, f.Name()); !ok || err != nil {
		t.Fatalf("SameFile = %v, %v", ok, err)
	}
	if sz, err := FileSize(f); sz != 4096 || err != nil {
		t.Fatalf("FileSize = %d, %v", sz, err)
	}
}

// TestFDRoom: the room shrinks by what is opened and comes back when it
// is closed.
func TestFDRoom(t *testing.T) {
	r0, lim, err := FDRoom()
	if err != nil || r0 <= 10 || lim < r0 {
		t.Fatalf("FDRoom: %d, %v", r0, err)
	}
	var fds []int
	for range 10 {
		fd, err := unix.Open("/", unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		fds = append(fds, fd)
	}
	if r1, _, _ := FDRoom(); r1 > r0-10 {
		t.Errorf("room %d after opening 10, was %d", r1, r0)
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	if r2, _, _ := FDRoom(); r2 != r0 {
		t.Errorf("room %d after closing them, was %d", r2, r0)
	}
}

package sys

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
)

func TestBellRingAndDrain(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bell")
	if err := Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Mkfifo(path, 0o600); err == nil {
		t.Fatal("second mkfifo of one path succeeded")
	}
	f, fd, err := OpenBell(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := OpenBellWriter(path)
	if err != nil {
		t.Fatal(err)
	}
	defer CloseFD(w)
	buf := make([]byte, 4)
	if n, err := DrainBell(fd, buf); n != 0 || err != nil {
		t.Fatalf("drain of an empty bell: %d, %v", n, err)
	}
	for i := 0; i < 10; i++ {
		if err := RingBell(w); err != nil {
			t.Fatal(err)
		}
	}
	// buf is smaller than what is queued: DrainBell keeps reading.
	if n, err := DrainBell(fd, buf); n != 10 || err != nil {
		t.Fatalf("drain: %d, %v; want 10", n, err)
	}
	// A full FIFO is still "rung": RingBell does not fail.
	for i := 0; i < 1<<17; i++ {
		if err := RingBell(w); err != nil {
			t.Fatalf("ring %d: %v", i, err)
		}
	}
	big := make([]byte, 4096)
	if n, err := DrainBell(fd, big); n < 4096 || err != nil {
		t.Fatalf("drain of a full FIFO: %d, %v", n, err)
	}
	if n, _ := DrainBell(fd, big); n != 0 {
		t.Fatalf("not drained: %d more", n)
	}
}

// newBell makes a FIFO bell in a temporary directory and opens its reader,
// closed when t ends.
func newBell(t testing.TB) (string, *os.File) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bell")
	if err := Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	f, _, err := OpenBell(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return path, f
}

// TestBellParksInNetpoller: a RawConn.Read on the bell parks until a
// writer rings, and a read deadline ends it.
func TestBellParksInNetpoller(t *testing.T) {
	path, f := newBell(t)
	rc, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	drain := func(fd uintptr) bool {
		n, _ := DrainBell(int(fd), buf)
		return n > 0
	}
	done := make(chan error, 1)
	go func() { done <- rc.Read(drain) }()
	select {
	case err := <-done:
		t.Fatalf("read returned before a ring: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	w, err := OpenBellWriter(path)
	if err != nil {
		t.Fatal(err)
	}
	defer CloseFD(w)
	RingBell(w)
	if err := testenv.Within(t, "the reader after a ring", done, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	f.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	if err := rc.Read(drain); !os.IsTimeout(err) {
		t.Fatalf("read past the deadline: %v", err)
	}
}

func TestBellRefusesNonFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if f, _, err := OpenBell(path); err == nil {
		f.Close()
		t.Fatal("OpenBell of a regular file succeeded")
	}
	if fd, err := OpenBellWriter(path); err == nil {
		CloseFD(fd)
		t.Fatal("OpenBellWriter of a regular file succeeded")
	}
	if _, err := OpenBellWriter(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("OpenBellWriter of a missing file succeeded")
	}
}

// TestTryLockKeepsNonblocking: TryLock must not switch a pollable file to
// blocking mode (f.Fd() would), or a RawConn.Read on it blocks a thread.
func TestTryLockKeepsNonblocking(t *testing.T) {
	_, f := newBell(t)
	if ok, err := TryLock(f, true); !ok || err != nil {
		t.Fatalf("lock: %v %v", ok, err)
	}
	if err := Unlock(f); err != nil {
		t.Fatal(err)
	}
	// Still in the netpoller: a deadline still works.
	if err := f.SetReadDeadline(time.Now().Add(time.Millisecond)); err != nil {
		t.Fatalf("after TryLock: %v", err)
	}
	rc, _ := f.SyscallConn()
	if err := rc.Read(func(uintptr) bool { return false }); !os.IsTimeout(err) {
		t.Fatalf("read: %v, want a timeout", err)
	}
	closed := tempFile(t, 0)
	closed.Close()
	if _, err := TryLock(closed, true); err == nil {
		t.Fatal("TryLock of a closed file succeeded")
	}
}

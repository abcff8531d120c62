package sys

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func rawFD(t *testing.T, f *os.File) int {
	t.Helper()
	rc, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	if err := rc.Control(func(d uintptr) { fd = int(d) }); err != nil {
		t.Fatal(err)
	}
	return fd
}

// checkBell requires a bell file to be non-blocking, close-on-exec and
// out of the netpoller (a deadline needs the netpoller).
func checkBell(t *testing.T, f *os.File) {
	t.Helper()
	fd := rawFD(t, f)
	if nb, err := Nonblocking(fd); err != nil || !nb {
		t.Fatalf("%s: non-blocking %v, %v", f.Name(), nb, err)
	}
	if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil || fl&unix.FD_CLOEXEC == 0 {
		t.Fatalf("%s: close-on-exec flag %#x, %v", f.Name(), fl, err)
	}
	if err := f.SetReadDeadline(time.Time{}); err == nil {
		t.Fatalf("%s: in the netpoller", f.Name())
	}
}

// bellPair makes a connected pair either way the package offers.
func bellPair(t *testing.T, how string) (a, b *os.File) {
	t.Helper()
	if how == "socketpair" {
		a, b, err := SocketBellPair("t")
		if err != nil {
			t.Fatal(err)
		}
		return a, b
	}
	dir := t.TempDir()
	if how == "long path" {
		dir = filepath.Join(dir, strings.Repeat("d", 100))
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "x.b")
	ln, err := ListenSocketBell(path, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	checkBell(t, ln)
	if st, err := os.Lstat(path); err != nil || st.Mode().Perm() != 0o600 || st.Mode()&os.ModeSocket == 0 {
		t.Fatalf("listener's name: %v, %v; want a 0600 socket", st.Mode(), err)
	}
	if _, err := AcceptSocketBell(ln); !errors.Is(err, ErrNothingQueued) {
		t.Fatalf("accept with nothing queued: %v", err)
	}
	if a, err = ConnectSocketBell(path); err != nil {
		t.Fatal(err)
	}
	if b, err = AcceptSocketBell(ln); err != nil {
		a.Close()
		t.Fatal(err)
	}
	return a, b
}

func TestSocketBell(t *testing.T) {
	for _, how := range []string{"socketpair", "listener", "long path"} {
		t.Run(how, func(t *testing.T) {
			a, b := bellPair(t, how)
			defer a.Close()
			defer b.Close()
			checkBell(t, a)
			checkBell(t, b)
			fa, fb := rawFD(t, a), rawFD(t, b)
			buf := make([]byte, 16)
			if n, eof, err := DrainSocketBell(fb, buf); n != 0 || eof || err != nil {
				t.Fatalf("drain of a quiet bell: %d, %v, %v", n, eof, err)
			}
			// Rings past what the socket holds never fail or wait, and
			// one drain takes them all.
			rings := 0
			for t0 := time.Now(); rings < 5000 && time.Since(t0) < 2*time.Second; rings++ {
				if err := RingSocketBell(fa); err != nil {
					t.Fatalf("ring %d: %v", rings, err)
				}
			}
			n, eof, err := DrainSocketBell(fb, buf)
			if n == 0 || n > rings || eof || err != nil {
				t.Fatalf("drain after %d rings: %d, %v, %v", rings, n, eof, err)
			}
			if n, _, _ := DrainSocketBell(fb, buf); n != 0 {
				t.Fatalf("second drain: %d bytes", n)
			}
			if err := RingSocketBell(fb); err != nil { // the other way
				t.Fatal(err)
			}
			if n, _, _ := DrainSocketBell(fa, buf); n != 1 {
				t.Fatalf("drain the other way: %d bytes", n)
			}
			// One end closes, with a ring unread: the other reads end of
			// file (after the bytes it has), and its rings are refused.
			if err := RingSocketBell(fb); err != nil {
				t.Fatal(err)
			}
			if err := RingSocketBell(fa); err != nil {
				t.Fatal(err)
			}
			a.Close()
			if n, eof, err := DrainSocketBell(fb, buf); n != 1 || !eof || err != nil {
				t.Fatalf("drain after the other end closed: %d, %v, %v; want 1, end of file", n, eof, err)
			}
			if _, eof, _ := DrainSocketBell(fb, buf); !eof {
				t.Fatal("end of file is not sticky")
			}
			if err := RingSocketBell(fb); !errors.Is(err, ErrBellGone) {
				t.Fatalf("ring with the other end gone: %v, want ErrBellGone", err)
			}
		})
	}
}

// A connection queued on a listener that closes without accepting it
// ends that bell (the accepting exnd gave up).
func TestSocketBellListenerClosed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "y.b")
	ln, err := ListenSocketBell(path, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ListenSocketBell(path, 1); err == nil {
		t.Fatal("second listener on one name")
	}
	c, err := ConnectSocketBell(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ln.Close()
	if _, eof, err := DrainSocketBell(rawFD(t, c), make([]byte, 4)); !eof || err != nil {
		t.Fatalf("drain: %v, %v; want end of file", eof, err)
	}
	os.Remove(path)
	if c2, err := ConnectSocketBell(path); err == nil {
		c2.Close()
		t.Fatal("connect without a listener succeeded")
	}
}

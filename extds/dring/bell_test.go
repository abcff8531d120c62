package dring

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/sys"
	"github.com/exn-project/exn/internal/testenv"
)

// The one-host agreement's files: Create makes the buffer and a 0600
// listener, Accept takes only what Open queued, Remove takes both names,
// and closing a listener with a connection queued ends that bell.
func TestFilesCreateOpenAccept(t *testing.T) {
	testenv.VerifyNoFDLeaks(t)
	for _, tc := range []struct {
		name string
		do   func(t *testing.T, dir, name string, fs1 *Files)
	}{
		{"accept without open", func(t *testing.T, dir, name string, fs1 *Files) {
			if err := fs1.Accept(); !errors.Is(err, sys.ErrNothingQueued) || !fs1.Listening() {
				t.Fatalf("accept: %v (listening %v), want ErrNothingQueued and the listener kept", err, fs1.Listening())
			}
		}},
		{"open then accept", func(t *testing.T, dir, name string, fs1 *Files) {
			fs0, err := Open(dir, name)
			if err != nil {
				t.Fatal(err)
			}
			defer fs0.Close()
			if fs0.Bell[0] == nil || fs0.Bell[1] != nil {
				t.Fatalf("open: bells %v", fs0.Bell)
			}
			if err := fs1.Accept(); err != nil || fs1.Bell[1] == nil || fs1.Listening() {
				t.Fatalf("accept: %v, bell %v, listening %v", err, fs1.Bell[1], fs1.Listening())
			}
			ringAndDrain(t, fs0.Bell[0], fs1.Bell[1])
			ringAndDrain(t, fs1.Bell[1], fs0.Bell[0])
		}},
		{"listener closed with a queued bell", func(t *testing.T, dir, name string, fs1 *Files) {
			fs0, err := Open(dir, name)
			if err != nil {
				t.Fatal(err)
			}
			defer fs0.Close()
			fs1.Close() // the accepting exnd gives up
			if _, eof, _ := sys.DrainSocketBell(fdOfT(t, fs0.Bell[0]), make([]byte, 8)); !eof {
				t.Fatal("the connecting side's bell does not read end of file after the listener closed")
			}
		}},
		{"open after the names went", func(t *testing.T, dir, name string, fs1 *Files) {
			if err := Remove(dir, name); err != nil {
				t.Fatal(err)
			}
			if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
				t.Fatalf("left after Remove: %v", left)
			}
			if fs, err := Open(dir, name); err == nil {
				fs.Close()
				t.Fatal("open of removed names succeeded")
			}
		}},
		{"full backlog does not wait", func(t *testing.T, dir, name string, fs1 *Files) {
			var held []*Files
			defer func() {
				for _, fs := range held {
					fs.Close()
				}
			}()
			t0 := time.Now()
			for range 4 {
				fs, err := Open(dir, name)
				if err != nil {
					break
				}
				held = append(held, fs)
			}
			if len(held) == 4 || len(held) == 0 || time.Since(t0) > time.Second {
				t.Fatalf("%d opens queued in %v; want a refusal without waiting", len(held), time.Since(t0))
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			name := Name("t", 3, uint64(rand.Uint32()))
			fs1, err := Create(dir, name, MinRing)
			if err != nil {
				t.Fatal(err)
			}
			defer fs1.Close()
			defer Remove(dir, name)
			for _, n := range []string{name, name + bellSuffix} {
				st, err := os.Lstat(filepath.Join(dir, n))
				if err != nil {
					t.Fatal(err)
				}
				if st.Mode().Perm() != 0o600 {
					t.Fatalf("%s: mode %v, want 0600", n, st.Mode())
				}
			}
			if _, err := Create(dir, name, MinRing); err == nil {
				t.Fatal("create over existing names succeeded")
			}
			tc.do(t, dir, name, fs1)
		})
	}
}

func fdOfT(t *testing.T, f *os.File) int {
	t.Helper()
	fd, err := fdOf(f)
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

// ringAndDrain rings through a and expects b to read the ring.
func ringAndDrain(t *testing.T, a, b *os.File) {
	t.Helper()
	if err := sys.RingSocketBell(fdOfT(t, a)); err != nil {
		t.Fatal(err)
	}
	if n, eof, err := sys.DrainSocketBell(fdOfT(t, b), make([]byte, 8)); n != 1 || eof || err != nil {
		t.Fatalf("drain: %d, %v, %v; want one byte", n, eof, err)
	}
}

// One Endpoint's reader and writer park at the same time on the one
// bell (an empty inbound ring, a full outbound one); the peer then
// gives each what it waits for, in either order or both at once, and
// both wake.
func TestReaderAndWriterParkTogether(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	for _, tc := range []struct {
		name string
		wake func(t *testing.T, b *Endpoint)
	}{
		{"data then space", func(t *testing.T, b *Endpoint) { peerWrite(t, b); peerDrain(t, b) }},
		{"space then data", func(t *testing.T, b *Endpoint) { peerDrain(t, b); peerWrite(t, b) }},
		{"both at once", func(t *testing.T, b *Endpoint) {
			done := testenv.Go(func() { peerWrite(t, b) })
			peerDrain(t, b)
			<-done
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 20 {
				a, b := pair(t, MinRing)
				if _, err := a.Write(make([]byte, MinRing)); err != nil { // fill the ring
					t.Fatal(err)
				}
				rerr, werr := make(chan error, 1), make(chan error, 1)
				go func() {
					buf := make([]byte, 16)
					_, err := io.ReadFull(a, buf)
					if err == nil && string(buf) != "0123456789abcdef" {
						err = errors.New("wrong bytes: " + string(buf))
					}
					rerr <- err
				}()
				go func() { _, err := a.Write([]byte("more")); werr <- err }()
				testenv.Eventually(t, "both calls of one side to park", 5*time.Second, func() bool {
					return a.rx.consWait.Load() == 1 && a.tx.prodWait.Load() == 1
				})
				tc.wake(t, b)
				if err := testenv.Within(t, "parked read", rerr, 5*time.Second); err != nil {
					t.Fatalf("read: %v", err)
				}
				if err := testenv.Within(t, "parked write", werr, 5*time.Second); err != nil {
					t.Fatalf("write: %v", err)
				}
				a.Close()
				b.Close()
			}
		})
	}
}

// peerWrite gives the parked reader its 16 bytes.
func peerWrite(t *testing.T, b *Endpoint) {
	if _, err := b.Write([]byte("0123456789abcdef")); err != nil {
		t.Error(err)
	}
}

// peerDrain consumes the full ring and the parked writer's 4 bytes.
func peerDrain(t *testing.T, b *Endpoint) {
	if _, err := io.ReadFull(b, make([]byte, MinRing+4)); err != nil {
		t.Error(err)
	}
}

// The peer's bell closed everywhere (end of file): a parked call of a
// connection the peer had not finished gets ErrReset; one whose peer
// stored rd_closed and fin first (exnd at its program's last close; here
// without ringing, so that only the end of file wakes it) is not reset:
// it reads the bytes and EOF, and its writes find rd_closed.
func TestBellEndOfFile(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	read := func(a *Endpoint) error { _, err := a.Read(make([]byte, 1)); return err }
	write := func(a *Endpoint) error {
		_, err := a.Write(make([]byte, 2*MinRing))
		return err
	}
	finish := func(b *Endpoint) { b.rx.rdClosed.Swap(1); b.tx.fin.Swap(1) }
	for _, tc := range []struct {
		name      string
		park      func(a *Endpoint) error
		peer      func(b *Endpoint)
		want      error
		readAfter string
	}{
		{"reader, peer vanished", read, func(b *Endpoint) {}, ErrReset, ""},
		{"writer, peer vanished", write, func(b *Endpoint) {}, ErrReset, ""},
		{"reader, peer finished", read, finish, io.EOF, ""},
		{"writer, peer finished after writing", write, func(b *Endpoint) {
			if _, err := b.Write([]byte("last words")); err != nil { // a's reader is not parked: no ring
				t.Error(err)
			}
			finish(b)
		}, ErrPeerClosed, "last words"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := pair(t, MinRing)
			errc := make(chan error, 1)
			go func() { errc <- tc.park(a) }()
			testenv.Eventually(t, "the call to park", 5*time.Second, func() bool {
				return a.rx.consWait.Load()+a.tx.prodWait.Load() == 1
			})
			tc.peer(b)
			b.Close() // the peer's bell: its only holder
			if err := testenv.Within(t, "parked call", errc, 5*time.Second); !errors.Is(err, tc.want) {
				t.Fatalf("parked call: %v, want %v", err, tc.want)
			}
			if tc.want == ErrReset {
				return
			}
			got, err := io.ReadAll(a)
			if err != nil || string(got) != tc.readAfter {
				t.Fatalf("read after the peer finished: %q, %v; want %q, EOF", got, err, tc.readAfter)
			}
			if _, err := a.Write([]byte("y")); !errors.Is(err, ErrPeerClosed) {
				t.Fatalf("write after the peer finished: %v, want ErrPeerClosed", err)
			}
		})
	}
}

// Close and Reset end every parked call of this process: the bell
// waiter's and the one waiting for its broadcast.
func TestCloseAndResetWakeBoth(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	for _, tc := range []struct {
		name string
		do   func(a *Endpoint)
		want error
	}{
		{"close", func(a *Endpoint) { a.Close() }, net.ErrClosed},
		{"reset", func(a *Endpoint) { a.Reset() }, ErrReset},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, _ := pair(t, MinRing)
			if _, err := a.Write(make([]byte, MinRing)); err != nil {
				t.Fatal(err)
			}
			errc := make(chan error, 2)
			go func() { _, err := a.Read(make([]byte, 1)); errc <- err }()
			go func() { _, err := a.Write([]byte("x")); errc <- err }()
			testenv.Eventually(t, "both calls to park", 5*time.Second, func() bool {
				return a.rx.consWait.Load() == 1 && a.tx.prodWait.Load() == 1
			})
			tc.do(a)
			for range 2 {
				if err := testenv.Within(t, "parked call", errc, 5*time.Second); !errors.Is(err, tc.want) {
					t.Fatalf("parked call: %v, want %v", err, tc.want)
				}
			}
		})
	}
}

// An Endpoint attached without its bell (exnd across hosts) rings
// through its ringer and, parked, polls until the bytes come; SetBell
// then gives it the bell, and a second SetBell is refused quietly.
func TestWithoutBell(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	dir := t.TempDir()
	fs0, fs1, err := CreatePair(dir, "nb", MinRing)
	if err != nil {
		t.Fatal(err)
	}
	Remove(dir, "nb")
	bell0 := fs0.Bell[0]
	fs0.Bell[0] = nil
	a, err := Attach(fs0, 0)
	if err != nil {
		bell0.Close()
		fs1.Close()
		t.Fatal(err)
	}
	defer a.Close()
	var rings atomic.Int32
	a.SetRinger(func() { rings.Add(1) })
	b, err := Attach(fs1, 1)
	if err != nil {
		bell0.Close()
		t.Fatal(err)
	}
	defer b.Close()

	got := make(chan []byte, 1)
	go func() {
		buf := make([]byte, 5)
		n, _ := io.ReadFull(a, buf)
		got <- buf[:n]
	}()
	testenv.Eventually(t, "the reader to park", 5*time.Second, func() bool { return a.rx.consWait.Load() == 1 })
	if _, err := b.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if g := testenv.Within(t, "bell-less read", got, 5*time.Second); string(g) != "hello" {
		t.Fatalf("read %q", g)
	}
	rerr := make(chan error, 1)
	go func() { _, err := b.Read(make([]byte, 1)); rerr <- err }()
	testenv.Eventually(t, "the peer's reader to park", 5*time.Second, func() bool { return b.rx.consWait.Load() == 1 })
	if _, err := a.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if rings.Load() == 0 {
		t.Fatal("the ringer was not called for a parked peer")
	}
	// The peer is not woken (nothing rang its bell): its reader still
	// waits until the bell comes and a ring goes through it.
	if err := a.SetBell(bell0); err != nil {
		t.Fatal(err)
	}
	a.CloseWrite() // rings through the bell now
	if err := testenv.Within(t, "peer's read", rerr, 5*time.Second); err != nil {
		t.Fatalf("peer's read: %v", err)
	}
	other, _, err := NewBells()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.SetBell(other); err != nil { // has one: closes other
		t.Fatal(err)
	}
	if _, err := fdOf(other); err == nil {
		t.Fatal("second SetBell kept its file open")
	}
}

// Go writes layout version 4 and never touches the pwait words (the
// shim's): a buffer after a stream both ways and a reset still has them
// zero.
func TestPwaitWordsUntouched(t *testing.T) {
	a, b := pair(t, MinRing)
	for _, e := range []*Endpoint{a, b} {
		if v := binary.LittleEndian.Uint32(e.mem[offVersion:]); v != Version {
			t.Fatalf("version %d, want %d", v, Version)
		}
	}
	done := testenv.Go(func() { a.Write(bytes.Repeat([]byte("p"), 3*MinRing)); a.CloseWrite() })
	if n, err := io.Copy(io.Discard, b); err != nil || n != 3*MinRing {
		t.Fatalf("copy: %d, %v", n, err)
	}
	<-done
	b.Reset()
	if p := a.mem[offPwait : offPwait+8]; !bytes.Equal(p, make([]byte, 8)) {
		t.Fatalf("pwait words %x, want zero", p)
	}
}

// With SetPollOnly (exnd's Endpoint while its program parks on the same
// bell) a parked call finds its bytes by polling and leaves the ring on
// the bell for the program; after SetRelay it parks on the bell again.
func TestPollOnly(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	a, b := pair(t, MinRing)
	a.SetPollOnly(true)
	fd := int(a.bell.Load())
	for _, relay := range []bool{false, true} {
		if relay {
			a.SetRelay()
		}
		got := make(chan error, 1)
		go func() { _, err := io.ReadFull(a, make([]byte, 3)); got <- err }()
		testenv.Eventually(t, "the reader to park", 5*time.Second, func() bool { return a.rx.consWait.Load() == 1 })
		if _, err := b.Write([]byte("abc")); err != nil {
			t.Fatal(err)
		}
		if err := testenv.Within(t, "parked read", got, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		n, err := sys.RecvPeek(fd, make([]byte, 8))
		if relay && !sys.IsEAGAIN(err) {
			t.Fatalf("relayed: %d bytes left on the bell (%v), want it drained", n, err)
		}
		if !relay && (err != nil || n == 0) {
			t.Fatalf("poll-only: bell peek %d, %v; want the ring left for the program", n, err)
		}
	}
}

// The upgrade word: UpgradeWord is header +80 of the mapping, 0 in a new
// buffer, and Endpoint never touches it; the Upg constants are
// shim/upgrade.h's UPG_* bits.
func TestUpgradeWord(t *testing.T) {
	a, b := pair(t, MinRing)
	w, err := UpgradeWord(a.mem)
	if err != nil {
		t.Fatal(err)
	}
	if got := w.Load(); got != 0 {
		t.Fatalf("new buffer's upgrade word %#x, want 0", got)
	}
	w.Store(UpgAtt | UpgReq<<1 | UpgXHost)
	if v := binary.LittleEndian.Uint32(b.mem[offUpgrade:]); v != UpgAtt|UpgReq<<1|UpgXHost {
		t.Fatalf("the peer's mapping reads %#x at +%d", v, offUpgrade)
	}
	done := testenv.Go(func() { a.Write([]byte("upg")); a.CloseWrite() })
	if _, err := io.Copy(io.Discard, b); err != nil {
		t.Fatal(err)
	}
	<-done
	b.Reset()
	if v := w.Load(); v != UpgAtt|UpgReq<<1|UpgXHost {
		t.Fatalf("upgrade word %#x after a stream and a reset: Endpoint touched it", v)
	}
	if _, err := UpgradeWord(a.mem[:HeaderSize-1]); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("UpgradeWord of a short mapping: %v", err)
	}

	src, err := os.ReadFile("../../shim/upgrade.h")
	if err != nil {
		t.Skipf("shim/upgrade.h: %v", err)
	}
	want := map[string]uint32{
		"UPG_ATT(s)": UpgAtt, "UPG_MOV(s)": UpgMov, "UPG_WSH(s)": UpgWsh, "UPG_DET(s)": UpgDet,
		"UPG_REQ(s)": UpgReq, "UPG_XHOST": UpgXHost, "UPG_GONE": UpgGone,
	}
	re := regexp.MustCompile(`(?m)^#define (UPG_[A-Z]+(?:\(s\))?) \((\d+)u << (\d+|\(s\))\)$`)
	for _, m := range re.FindAllStringSubmatch(string(src), -1) {
		v, ok := want[m[1]]
		if !ok {
			t.Errorf("shim/upgrade.h defines %s, which Go does not name", m[1])
			continue
		}
		delete(want, m[1])
		n, _ := strconv.Atoi(m[2])
		sh := 0
		if m[3] != "(s)" {
			sh, _ = strconv.Atoi(m[3])
		}
		if uint32(n)<<sh != v {
			t.Errorf("%s is %#x in shim/upgrade.h, %#x in Go", m[1], uint32(n)<<sh, v)
		}
	}
	for name := range want {
		t.Errorf("%s: not in shim/upgrade.h", name)
	}
}

package check

// shim/dring.c, the C side of the connection buffer (docs/direct.md):
// TestDringC runs its own C test program, and the cross tests pair it
// with the Go side (extds/dring) on one buffer.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/exn-project/exn/extds/dring"
	"github.com/exn-project/exn/internal/testenv"
)

// TestDringC builds shim/test/dring_test.c with shim/dring.c (with ASan
// and UBSan where gcc has them) and runs it: the connection buffer of
// docs/direct.md between forked processes, the test playing exnd (byte
// streams both ways with wraparound, a reader and a writer thread of one
// process on the one bell, wake-ups on data, space, fin, rst, poll and
// epoll readiness, forged cursors, a SIGKILLed peer, exnd's death and
// its own reset, a peer whose bell is gone, the relay flag, two forked
// writers under prod_lock, shutdown waking its own process's parked
// threads through the fan-out).
func TestDringC(t *testing.T) {
	testenv.NeedGCC(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "dring_test")
	if err := testenv.CCSanitized("-O2", "-g", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-pthread", "-o", bin,
		testenv.ModulePath("shim", "test", "dring_test.c"), testenv.ModulePath("shim", "dring.c")); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "TMPDIR="+dir)
	timer := time.AfterFunc(2*time.Minute, func() {
		if cmd.Process != nil {
			cmd.Process.Kill()
		}
	})
	defer timer.Stop()
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("dring_test: %v", err)
	}
	for _, name := range []string{"attach", "streams", "streams_big", "duplex", "semantics", "wake", "forged",
		"kill_rst", "kill_close", "exnd_death", "relay", "lock", "exnd_reset", "peer_gone", "selfwake", "upg_wait", "space_wait", "reclaim_lock", "reclaim_dead"} {
		if !strings.Contains(string(out), "ok "+name+"\n") {
			t.Errorf("test %s did not pass", name)
		}
	}
}

var peerBuilt testenv.Built

// dringPeer builds shim/test/dring_peer.c with shim/dring.c, once.
func dringPeer(t *testing.T) string {
	t.Helper()
	testenv.NeedGCC(t)
	return peerBuilt.Path(t, func() (string, error) {
		bin := filepath.Join(binDir, "dring_peer")
		return bin, testenv.CC("-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-o", bin,
			testenv.ModulePath("shim", "test", "dring_peer.c"), testenv.ModulePath("shim", "dring.c"))
	})
}

// crossPair is one connection: the Go endpoint on side gs, the C program
// on the other, and what the test holds as the C side's exnd (its files
// and V's other end).
type crossPair struct {
	ep       *dring.Endpoint
	cmd      *exec.Cmd
	out      *bytes.Buffer
	dir      string
	name     string
	cside    int
	vExnd    *os.File
	exndFS   *dring.Files // the C side's exnd's copies of the buffer and the C side's bell
	waitDone chan struct{}
}

// dupFile duplicates f's descriptor (close-on-exec) without touching its
// mode (f.Fd() would make a non-blocking descriptor blocking).
func dupFile(t *testing.T, f *os.File) *os.File {
	t.Helper()
	rc, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	nfd, derr := -1, error(nil)
	if err := rc.Control(func(fd uintptr) { nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }); err != nil || derr != nil {
		t.Fatal(err, derr)
	}
	return os.NewFile(uintptr(nfd), f.Name())
}

func startCross(t *testing.T, gs, ring int, mode string, args ...string) *crossPair {
	t.Helper()
	bin := dringPeer(t)
	dir := t.TempDir()
	name := dring.Name("x", 1, rand.Uint64())
	fs0, fs1, err := dring.CreatePair(dir, name, ring)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dring.Remove(dir, name) })
	gfs, cfs := fs0, fs1
	if gs == 1 {
		gfs, cfs = fs1, fs0
	}
	defer cfs.Close() // the child has its copies
	cs := 1 - gs
	// What the C side's exnd keeps: its own copies of the buffer and of
	// the C side's bell (docs/direct.md, "Close and death").
	exndFS := &dring.Files{Buf: dupFile(t, cfs.Buf)}
	exndFS.Bell[cs] = dupFile(t, cfs.Bell[cs])
	ep, err := dring.Attach(gfs, gs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ep.Close() })
	sp, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	v, vExnd := os.NewFile(uintptr(sp[0]), "V"), os.NewFile(uintptr(sp[1]), "E")
	defer v.Close()
	t.Cleanup(func() { vExnd.Close() })
	cmd := exec.Command(bin, append([]string{strconv.Itoa(cs), strconv.Itoa(ring), mode}, args...)...)
	cmd.ExtraFiles = []*os.File{cfs.Buf, cfs.Bell[cs], v}
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	go func() { cmd.Wait(); close(done) }()
	p := &crossPair{ep: ep, cmd: cmd, out: out, dir: dir, name: name, cside: cs, vExnd: vExnd, exndFS: exndFS}
	t.Cleanup(func() { p.exndFS.Close() })
	p.waitDone = done
	return p
}

func (p *crossPair) wait(t *testing.T) string {
	t.Helper()
	select {
	case <-p.waitDone:
	case <-time.After(time.Minute):
		t.Fatalf("C peer did not finish: %s", p.out.String())
	}
	return strings.TrimSpace(p.out.String())
}

func crossPat(i int64) byte { return byte(i*7 + (i >> 13)) }

func crossData(off int64, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = crossPat(off + int64(i))
	}
	return b
}

// TestDringCrossLanguage holds the Go (extds/dring) and C (shim/dring.c)
// implementations of docs/direct.md together: streams both ways on both
// sides with wraparound, fin as EOF, a forged cursor failing the C side
// with EIO and resetting the Go side, and a C peer SIGKILLed mid-transfer
// whose "exnd" (the test) closes its side: the Go writer fails, no hang.
func TestDringCrossLanguage(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	const n = 3<<20 + 12345
	for _, gs := range []int{0, 1} {
		t.Run(fmt.Sprintf("go-side-%d", gs), func(t *testing.T) {
			t.Run("go-to-c", func(t *testing.T) {
				p := startCross(t, gs, 64<<10, "recv", strconv.Itoa(n))
				for off := 0; off < n; {
					k := min(n-off, 1+rand.IntN(200000))
					if _, err := p.ep.Write(crossData(int64(off), k)); err != nil {
						t.Fatal(err)
					}
					off += k
				}
				p.ep.CloseWrite()
				if out := p.wait(t); !strings.HasPrefix(out, "ok received") {
					t.Fatal(out)
				}
			})
			t.Run("c-to-go", func(t *testing.T) {
				p := startCross(t, gs, 64<<10, "send", strconv.Itoa(n))
				got, err := io.ReadAll(bufio.NewReaderSize(p.ep, 100000))
				if err != nil || !bytes.Equal(got, crossData(0, n)) {
					t.Fatalf("read %d bytes, %v; want %d pattern bytes", len(got), err, n)
				}
				if out := p.wait(t); !strings.HasPrefix(out, "ok sent") {
					t.Fatal(out)
				}
			})
			t.Run("echo", func(t *testing.T) {
				p := startCross(t, gs, 4096, "echo")
				errc := make(chan error, 1)
				go func() {
					for off := 0; off < n; off += 70000 {
						if _, err := p.ep.Write(crossData(int64(off), min(70000, n-off))); err != nil {
							errc <- err
							return
						}
					}
					p.ep.CloseWrite()
					errc <- nil
				}()
				got, err := io.ReadAll(p.ep)
				if err != nil || !bytes.Equal(got, crossData(0, n)) {
					t.Fatalf("echo: %d bytes, %v", len(got), err)
				}
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
				if out := p.wait(t); out != fmt.Sprintf("ok echoed %d", n) {
					t.Fatal(out)
				}
			})
			t.Run("forged-cursor", func(t *testing.T) {
				p := startCross(t, gs, 4096, "eio")
				// A pattern byte: the C side may read it before the
				// forged cursor lands, and checks what it reads (CI
				// once saw "FAIL recv: byte 0" after an "x").
				if _, err := p.ep.Write(crossData(0, 1)); err != nil {
					t.Fatal(err)
				}
				// Forge the tail of the direction the C side reads.
				f, err := os.OpenFile(filepath.Join(p.dir, p.name), os.O_RDWR, 0)
				if err != nil {
					t.Fatal(err)
				}
				var b [8]byte
				binary.LittleEndian.PutUint64(b[:], 1<<40)
				if _, err := f.WriteAt(b[:], int64(1024+1024*gs)); err != nil {
					t.Fatal(err)
				}
				f.Close()
				p.ep.CloseWrite() // rings the C side
				if out := p.wait(t); !strings.HasPrefix(out, "ok eio") {
					t.Fatal(out)
				}
				if _, err := p.ep.Read(make([]byte, 1)); !errors.Is(err, dring.ErrReset) && !errors.Is(err, dring.ErrCorrupt) {
					t.Fatalf("Go read after the C side saw a forged cursor: %v, want reset or corrupt", err)
				}
			})
			t.Run("c-killed", func(t *testing.T) {
				p := startCross(t, gs, 4096, "recv", strconv.Itoa(1<<40))
				if _, err := p.ep.Write(crossData(0, 100000)); err != nil {
					t.Fatal(err)
				}
				p.cmd.Process.Kill()
				p.wait(t)
				// The C side's exnd sees V's last close: it stores
				// rd_closed and fin for that side and rings the Go
				// side with its copy of the C side's bell.
				fs := p.exndFS
				p.exndFS = &dring.Files{} // Attach takes it over
				exnd, err := dring.Attach(fs, p.cside)
				if err != nil {
					t.Fatal(err)
				}
				defer exnd.Close()
				werr := make(chan error, 1)
				go func() {
					_, err := p.ep.Write(make([]byte, 1<<20))
					werr <- err
				}()
				exnd.CloseRead()
				exnd.CloseWrite()
				if err := <-werr; !errors.Is(err, dring.ErrPeerClosed) {
					t.Fatalf("Go write to a killed C peer: %v, want ErrPeerClosed", err)
				}
				if _, err := p.ep.Read(make([]byte, 1)); err != io.EOF {
					t.Fatalf("Go read: %v, want EOF", err)
				}
			})
		})
	}
}

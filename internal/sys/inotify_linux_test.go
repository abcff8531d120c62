package sys

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// event encodes one inotify event as the kernel does: the name padded
// with NULs to pad bytes.
func event(mask uint32, name string, pad int) []byte {
	b := make([]byte, unix.SizeofInotifyEvent+pad)
	binary.NativeEndian.PutUint32(b[4:8], mask)
	binary.NativeEndian.PutUint32(b[12:16], uint32(pad))
	copy(b[unix.SizeofInotifyEvent:], name)
	return b
}

func TestCloseEventNames(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		want []string // "!" for lost events
	}{
		{"one", event(unix.IN_CLOSE_WRITE, "exn-a-n1", 16), []string{"exn-a-n1"}},
		{"two", append(event(unix.IN_CLOSE_NOWRITE, "x", 8), event(unix.IN_DELETE, "y", 8)...), []string{"x", "y"}},
		{"the directory itself", event(unix.IN_CLOSE_NOWRITE, "", 0), nil},
		{"overflow", event(unix.IN_Q_OVERFLOW, "", 0), []string{"!"}},
		{"truncated name", event(unix.IN_CLOSE_WRITE, "exn", 16)[:20], nil},
		{"truncated header", event(unix.IN_CLOSE_WRITE, "exn", 16)[:10], nil},
		{"empty", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			CloseEventNames(tc.in, func(name []byte, lost bool) {
				if lost {
					got = append(got, "!")
					return
				}
				got = append(got, string(name))
			})
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestWatchCloses: closing a file in the watched directory is reported
// with its name.
func TestWatchCloses(t *testing.T) {
	dir := t.TempDir()
	w, err := WatchCloses(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	f, err := os.Create(filepath.Join(dir, "exn-x-n1"))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	buf := make([]byte, 8*CloseEventSize)
	var seen []string
	for !slices.Contains(seen, "exn-x-n1") {
		k, err := w.Read(buf) // blocks until events come: a hang is a failure of the watch
		if err != nil {
			t.Fatal(err)
		}
		CloseEventNames(buf[:k], func(name []byte, lost bool) { seen = append(seen, string(name)) })
	}
}

// FuzzCloseEventNames: any bytes decode without a panic, and every name
// handed out lies inside the input.
func FuzzCloseEventNames(f *testing.F) {
	f.Add(event(unix.IN_CLOSE_WRITE, "exn-a-n1", 16))
	f.Add(event(unix.IN_Q_OVERFLOW, "", 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		total := 0
		CloseEventNames(b, func(name []byte, lost bool) { total += len(name) })
		if total > len(b) {
			t.Fatalf("names of %d bytes from %d bytes of input", total, len(b))
		}
	})
}

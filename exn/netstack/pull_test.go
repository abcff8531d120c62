package netstack

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/exn-project/exn/internal/testenv"
)

// TestReadFrames: pull mode hands queued frames to the reader in order,
// counts them as transmitted, drops a frame too long for its buffer, and
// unblocks with net.ErrClosed on Close. Start and ReadFrames exclude each
// other.
func TestReadFrames(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	ep := newEndpoint(t, Config{MAC: macA, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	var pl stack.PacketBufferList
	for _, size := range []int{100, 3000, 200} {
		pl.PushBack(udpPacket(t, size))
	}
	want := make([]int, 0, 3)
	for _, p := range pl.AsSlice() {
		want = append(want, p.Size())
	}
	if n, err := ep.WritePackets(pl); n != 3 || err != nil {
		t.Fatalf("WritePackets = %d, %v", n, err)
	}
	pl.DecRef()

	// The second buffer is too small for the 3000-byte frame.
	bufs := [][]byte{make([]byte, 2048), make([]byte, 1000), make([]byte, 2048), make([]byte, 2048)}
	sizes := make([]int, len(bufs))
	n, err := ep.ReadFrames(bufs, sizes)
	if err != nil || n != 2 {
		t.Fatalf("ReadFrames = %d, %v; want 2 frames", n, err)
	}
	if sizes[0] != want[0] || sizes[1] != want[2] {
		t.Fatalf("sizes %v, want %d and %d", sizes[:2], want[0], want[2])
	}
	if st := ep.Stats(); st.TxFrames != 2 || st.TxOversize != 1 || st.TxBytes != uint64(want[0]+want[2]) {
		t.Fatalf("stats %+v", st)
	}
	if err := ep.Start(txFunc(nil)); err == nil || !strings.Contains(err.Error(), "ReadFrames") {
		t.Fatalf("Start after ReadFrames: %v", err)
	}
	if _, err := ep.ReadFrames(nil, nil); err == nil {
		t.Fatal("ReadFrames without buffers: no error")
	}

	done := make(chan error, 1)
	go func() {
		_, err := ep.ReadFrames(bufs, sizes)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("ReadFrames on an empty queue returned %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	ep.Close()
	if err := testenv.Within(t, "ReadFrames after Close", done, 2*time.Second); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("blocked ReadFrames after Close: %v", err)
	}
}

func TestReadFramesAfterStart(t *testing.T) {
	ep := newEndpoint(t, Config{MAC: macA})
	if err := ep.Start(txFunc(nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := ep.ReadFrames(make([][]byte, 1), make([]int, 1)); err == nil {
		t.Fatal("ReadFrames on a started endpoint: no error")
	}
}

package perf

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
)

// goFloorEnv names the FIFO directory of TestHelperGoFIFOEcho.
const goFloorEnv = "EXN_GOFLOOR_DIR"

// goFloor is fifoFloor (perf/testdata/fifo_pingpong.c) written in Go:
// this process and a helper process of the same test binary ping-pong one
// byte through two FIFOs, each side parked in Go's netpoller between
// messages, count times after gap of quiet. It returns the p50 round trip
// in µs: the floor of a park-and-wake in a Go program, as exnd parks,
// beside the C floor of any parking design.
func goFloor(b *testing.B, count int, gap time.Duration) (float64, error) {
	dir := b.TempDir()
	ping, pong := filepath.Join(dir, "ping"), filepath.Join(dir, "pong")
	for _, p := range []string{ping, pong} {
		if err := syscall.Mkfifo(p, 0o600); err != nil {
			return 0, fmt.Errorf("go floor: %w", err)
		}
	}
	testenv.StartHelper(b, "TestHelperGoFIFOEcho", goFloorEnv+"="+dir)
	// Opening a FIFO blocks until its other end opens: the child opens
	// ping for reading first, then pong for writing, as this side does
	// in the other order.
	w, err := os.OpenFile(ping, os.O_WRONLY, 0)
	if err != nil {
		return 0, fmt.Errorf("go floor: %w", err)
	}
	defer w.Close()
	r, err := os.OpenFile(pong, os.O_RDONLY, 0)
	if err != nil {
		return 0, fmt.Errorf("go floor: %w", err)
	}
	defer r.Close()
	buf := make([]byte, 1)
	rtts := make([]float64, 0, count)
	for range count {
		time.Sleep(gap)
		t0 := time.Now()
		if _, err := w.Write(buf); err != nil {
			return 0, fmt.Errorf("go floor: %w", err)
		}
		if _, err := r.Read(buf); err != nil {
			return 0, fmt.Errorf("go floor: %w", err)
		}
		rtts = append(rtts, float64(time.Since(t0).Nanoseconds())/1e3)
	}
	return pct(rtts, 50), nil
}

// TestHelperGoFIFOEcho is goFloor's other process: it echoes each byte
// from DIR/ping to DIR/pong until the parent closes ping.
func TestHelperGoFIFOEcho(t *testing.T) {
	testenv.RunHelper(t, goFloorEnv, "go fifo echo", func(dir string) error {
		r, err := os.OpenFile(filepath.Join(dir, "ping"), os.O_RDONLY, 0)
		if err != nil {
			return err
		}
		defer r.Close()
		w, err := os.OpenFile(filepath.Join(dir, "pong"), os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		defer w.Close()
		buf := make([]byte, 1)
		for {
			// A read or write fails once the parent closes its ends or
			// exits: the normal end of the echo.
			if _, err := r.Read(buf); err != nil {
				return nil
			}
			if _, err := w.Write(buf); err != nil {
				return nil
			}
		}
	})
}

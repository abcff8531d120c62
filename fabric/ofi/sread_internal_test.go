//go:build ofi && cgo

package ofi

import (
	"testing"
	"time"
)

// TestCQWaitBounded checks that the progress goroutine's idle wait returns
// within its bound on every provider, with or without a wait fd, and that
// fi_cq_signal cuts it short: Close and queued control packets depend on
// it.
func TestCQWaitBounded(t *testing.T) {
	const bound = 200 * time.Millisecond // generous: a loaded CI machine
	for _, p := range []string{"shm", "tcp"} {
		node, svc := "", ""
		if p == "tcp" {
			node, svc = "127.0.0.1", "0"
		}
		in, err := getinfo(p, node, svc, capMsg|capRMA|capSource, true, orderSAS)
		if err != nil {
			t.Fatal(err)
		}
		f, err := openFab(in, 1024, 16)
		if err != nil {
			t.Fatal(err)
		}
		b := newCQBatch(8)
		t0 := time.Now()
		f.cqWait(progressSleepMs)
		if n, err := f.cqRead(b); n != 0 || err != nil {
			t.Errorf("%s: idle cq read: n=%d err=%v", p, n, err)
		}
		if d := time.Since(t0); d > bound {
			t.Errorf("%s: idle wait of %d ms took %v", p, progressSleepMs, d)
		}
		if f.waitable() {
			go func() { time.Sleep(time.Millisecond); f.signal() }()
			t0 = time.Now()
			f.cqWait(10000)
			if d := time.Since(t0); d > bound {
				t.Errorf("%s: signalled wait took %v", p, d)
			}
		}
		t.Logf("%s: cq wait fd %v", p, f.waitable())
		b.free()
		f.close()
	}
}

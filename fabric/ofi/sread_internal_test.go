//go:build ofi && cgo

package ofi

import (
	"testing"
	"time"
)

// TestWaitFDParksInNetpoller checks the background goroutine's idle park
// on every provider with a CQ wait fd: the dup of the fd is watched by
// Go's netpoller (a RawConn.Read on it parks instead of blocking a
// thread), fi_trywait arms it on an idle CQ, and fi_cq_signal wakes the
// parked reader. Close and queued control packets depend on that wake.
func TestWaitFDParksInNetpoller(t *testing.T) {
	const bound = 2 * time.Second // generous: a loaded CI machine
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
		n := &NIC{f: f}
		n.openWaitFile()
		t.Logf("%s: cq wait fd in netpoller: %v", p, n.waitRC != nil)
		if p == "tcp" && n.waitRC == nil {
			t.Errorf("tcp: no CQ wait fd; the background goroutine would poll on a timer")
		}
		if n.waitRC != nil {
			if !f.trywait() {
				t.Errorf("%s: fi_trywait on an idle CQ did not arm", p)
			}
			woke := make(chan struct{})
			go func() {
				defer close(woke)
				calls := 0
				n.waitRC.Read(func(uintptr) bool {
					calls++
					return calls > 1 // the first call parks; the wake makes the second
				})
			}()
			time.Sleep(20 * time.Millisecond)
			select {
			case <-woke:
				t.Errorf("%s: reader returned before the signal", p)
			default:
			}
			t0 := time.Now()
			f.signal()
			select {
			case <-woke:
				t.Logf("%s: woken %v after fi_cq_signal", p, time.Since(t0))
			case <-time.After(bound):
				t.Fatalf("%s: fi_cq_signal did not wake the netpoller within %v", p, bound)
			}
			n.waitFile.Close()
		}
		f.close()
	}
}

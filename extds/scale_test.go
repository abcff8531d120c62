package extds

import (
	"io"
	"sync"
	"testing"
	"time"

	"github.com/exn-project/exn/extds/internal/wire"
	"github.com/exn-project/exn/internal/testenv"
)

// TestManyConnections opens N concurrent connections (1000; 100 when
// small), echoes over all of them at once, closes them, and checks that
// nothing leaks: goroutines, fds, table entries.
func TestManyConnections(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	testenv.VerifyNoFDLeaks(t)
	n := 1000
	if testenv.Small() {
		n = 100
	}
	p := newPair(t, WithRingSize(wire.MinRingSize), WithEagerWindow(2048))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // echo server
		defer wg.Done()
		for i := 0; i < n; i++ {
			c, err := p.ln.AcceptConn()
			if err != nil {
				t.Error(err)
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	conns := make([]*Conn, n)
	for i := range conns {
		c, err := p.dialer.DialConn(t.Context(), "tcp", p.ln.Addr().String())
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		if c.Mode() != ModeEXTDS {
			t.Fatalf("conn %d mode %v", i, c.Mode())
		}
		conns[i] = c
	}
	var cw sync.WaitGroup
	for i, c := range conns {
		cw.Add(1)
		go func() {
			defer cw.Done()
			msg := randBytes(100+i%3000, uint64(i))
			if _, err := c.Write(msg); err != nil {
				t.Error(err)
				return
			}
			got := make([]byte, len(msg))
			c.SetReadDeadline(time.Now().Add(20 * time.Second))
			if _, err := io.ReadFull(c, got); err != nil || string(got) != string(msg) {
				t.Errorf("conn %d: echo mismatch, %v", i, err)
			}
			c.CloseWrite()
			if _, err := c.Read(got[:1]); err != io.EOF {
				t.Errorf("conn %d: want EOF, got %v", i, err)
			}
			c.Close()
		}()
	}
	cw.Wait()
	wg.Wait()
	testenv.Eventually(t, "all released", 5*time.Second, func() bool {
		return p.devA.Stats().Active == 0 && p.devB.Stats().Active == 0
	})
	if st := p.devB.Stats(); st.ConnsEXTDS != uint64(n) || st.TotalDrops() != st.Drops["unknown_conn"] {
		t.Fatalf("server stats %+v", st)
	}
}

package taptest_test

import (
	"bytes"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
	"github.com/exn-project/exn/tap/taptest"
)

func TestContract(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	taptest.RunContract(t, func(t *testing.T) taptest.Harness {
		d := taptest.New("fake0", 1500)
		t.Cleanup(func() { d.Close() })
		return taptest.Harness{
			Dev: d,
			HostSend: func(p []byte) error {
				return d.Inject(append(make([]byte, 14), p...))
			},
			Frame: func(p []byte) []byte { return append(make([]byte, 14), p...) },
			HostRecv: func(timeout time.Duration) ([]byte, error) {
				select {
				case f := <-d.Written():
					return f[14:], nil
				case <-time.After(timeout):
					return nil, errors.New("timeout")
				}
			},
		}
	})
}

func TestInjectAfterClose(t *testing.T) {
	d := taptest.New("fake0", 0)
	if d.MTU() != 65521 || d.Name() != "fake0" {
		t.Fatalf("New: name %q mtu %d", d.Name(), d.MTU())
	}
	d.Close()
	if err := d.Inject([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Inject after Close = %v; want net.ErrClosed", err)
	}
}

func TestWrittenCopies(t *testing.T) {
	d := taptest.New("fake0", 1500)
	defer d.Close()
	f := bytes.Repeat([]byte{7}, 60)
	if _, err := d.Write([][]byte{f}); err != nil {
		t.Fatal(err)
	}
	f[0] = 9
	if got := <-d.Written(); got[0] != 7 {
		t.Fatal("Written aliases the caller's frame")
	}
	if st := d.Stats(); st.TxFrames != 1 || st.TxBytes != 60 {
		t.Fatalf("Stats = %+v", st)
	}
}

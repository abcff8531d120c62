package tap_test

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/exn-project/exn/tap"
)

// icmpEcho builds an IPv4 ICMP echo request from the peer to the TAP's
// address, with payload bytes of data.
func icmpEcho(seq uint16, payload int) []byte {
	f := udpFrame(peerMAC, localMAC, peerIP, localIP, 0, 0, make([]byte, payload))
	ip := f[14:34]
	ip[9] = 1 // ICMP
	ip[10], ip[11] = 0, 0
	binary.BigEndian.PutUint16(ip[10:12], ipChecksum(ip))
	icmp := f[34:]
	for i := range 8 {
		icmp[i] = 0
	}
	icmp[0] = 8 // echo request
	binary.BigEndian.PutUint16(icmp[4:6], 0x4558)
	binary.BigEndian.PutUint16(icmp[6:8], seq)
	binary.BigEndian.PutUint16(icmp[2:4], ipChecksum(icmp))
	return f
}

func isEchoReply(f []byte) bool {
	return len(f) >= 42 && f[12] == 0x08 && f[13] == 0x00 && f[14+9] == 1 && f[34] == 0
}

// echo writes the echo requests reqs into d and reads frames into bufs
// (their lengths into sizes) until as many echo replies came back,
// failing tb on an error. It allocates nothing.
func echo(tb testing.TB, d tap.Device, reqs, bufs [][]byte, sizes []int) {
	if n, err := d.Write(reqs); n != len(reqs) || err != nil {
		tb.Fatalf("Write = %d, %v", n, err)
	}
	for got := 0; got < len(reqs); {
		n, err := d.Read(bufs, sizes)
		if err != nil {
			tb.Fatalf("Read: %v", err)
		}
		for i := range n {
			if isEchoReply(bufs[i][:sizes[i]]) {
				got++
			}
		}
	}
}

// BenchmarkEcho measures the TAP round trip: a batch of ICMP echo
// requests written into the kernel, the kernel's replies read back. One op
// is one frame each way; frames/s is one-way frames per second.
func BenchmarkEcho(b *testing.B) {
	for _, size := range []int{64, 1400, 8972, 65000} {
		for _, batch := range []int{1, 64} {
			b.Run(fmt.Sprintf("payload=%d/batch=%d", size, batch), func(b *testing.B) {
				cfg := defaultCfg
				cfg.MTU = tap.MaxMTU
				d, _ := openTAP(b, cfg)
				reqs := make([][]byte, batch)
				for i := range reqs {
					reqs[i] = icmpEcho(uint16(i), size)
				}
				bufs := make([][]byte, batch)
				for i := range bufs {
					bufs[i] = make([]byte, tap.FrameSize(d.MTU()))
				}
				sizes := make([]int, batch)
				b.SetBytes(int64(len(reqs[0])))
				b.ReportAllocs()
				b.ResetTimer()
				done := 0
				for done < b.N {
					k := min(batch, b.N-done)
					echo(b, d, reqs[:k], bufs, sizes)
					done += k
				}
				b.StopTimer()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "frames/s")
				if st := d.Stats(); st.ShortBuffer != 0 || st.RxErrors != 0 || st.TxErrors != 0 {
					b.Fatalf("Stats = %+v", st)
				}
			})
		}
	}
}

// TestEchoNoAlloc checks the data path allocates nothing per batch.
func TestEchoNoAlloc(t *testing.T) {
	d, _ := openTAP(t, defaultCfg)
	reqs := [][]byte{icmpEcho(1, 100), icmpEcho(2, 100)}
	bufs := [][]byte{make([]byte, 1514), make([]byte, 1514)}
	sizes := make([]int, 2)
	allocs := testing.AllocsPerRun(50, func() { echo(t, d, reqs, bufs, sizes) })
	if allocs != 0 {
		t.Fatalf("Write+Read allocate %v times per batch", allocs)
	}
}

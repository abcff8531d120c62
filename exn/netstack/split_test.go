package netstack

import (
	"bytes"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// tcpFrame builds an Ethernet+IPv4+TCP frame with the given TCP option
// bytes and payload size.
func tcpFrame(opts, payload int) []byte {
	const eth, ip = header.EthernetMinimumSize, header.IPv4MinimumSize
	tcpLen := header.TCPMinimumSize + opts
	f := make([]byte, eth+ip+tcpLen+payload)
	header.Ethernet(f).Encode(&header.EthernetFields{SrcAddr: tcpip.LinkAddress(macA), DstAddr: tcpip.LinkAddress(macB), Type: header.IPv4ProtocolNumber})
	header.IPv4(f[eth:]).Encode(&header.IPv4Fields{TotalLength: uint16(ip + tcpLen + payload), Protocol: uint8(header.TCPProtocolNumber), TTL: 64, SrcAddr: ipA, DstAddr: ipB})
	header.TCP(f[eth+ip:]).Encode(&header.TCPFields{SrcPort: 1, DstPort: 2, DataOffset: uint8(tcpLen), Flags: header.TCPFlagAck})
	for i := eth + ip + tcpLen; i < len(f); i++ {
		f[i] = byte(i)
	}
	return f
}

// TestFrameBufferSplit: a large TCP frame is delivered as a header view
// ending exactly where the payload starts and a payload view; small or
// unparsable frames in one view (or split at maxHeaders); the bytes are
// always the frame's.
func TestFrameBufferSplit(t *testing.T) {
	odd := tcpFrame(0, 4000)
	header.Ethernet(odd).Encode(&header.EthernetFields{Type: 0x88b5}) // not IP
	short := tcpFrame(12, 4000)
	short = short[:header.EthernetMinimumSize+header.IPv4MinimumSize+10] // cut inside TCP
	short = append(short, make([]byte, 2000)...)
	for _, tc := range []struct {
		name  string
		f     []byte
		views []int // sizes
	}{
		{"ack", tcpFrame(12, 0), []int{66}},
		{"small segment", tcpFrame(12, 500), []int{566}},
		{"large segment", tcpFrame(12, 65000), []int{66, 65000}},
		{"no options", tcpFrame(0, 2000), []int{54, 2000}},
		{"not ip", odd, []int{maxHeaders, len(odd) - maxHeaders}},
		{"truncated tcp", short, []int{maxHeaders, len(short) - maxHeaders}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := frameBuffer(tc.f)
			defer b.Release()
			var sizes []int
			vl := b.AsViewList()
			for v := vl.Front(); v != nil; v = v.Next() {
				sizes = append(sizes, v.Size())
			}
			if len(sizes) != len(tc.views) || (len(sizes) > 0 && sizes[0] != tc.views[0]) {
				t.Fatalf("views %v, want %v", sizes, tc.views)
			}
			if got := b.Flatten(); !bytes.Equal(got, tc.f) {
				t.Fatal("buffer bytes differ from the frame")
			}
		})
	}
}

package node

import (
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// TestRACKSetting: RACK-TLP is off unless asked for (see TCPConfig.RACK),
// and the setting reaches the stack.
func TestRACKSetting(t *testing.T) {
	for _, on := range []bool{false, true} {
		tc, err := TCPConfig{RACK: on}.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		s, err := newStack(tc)
		if err != nil {
			t.Fatal(err)
		}
		var r tcpip.TCPRecovery
		if err := s.TransportProtocolOption(tcp.ProtocolNumber, &r); err != nil {
			t.Fatal(err)
		}
		s.Destroy()
		want := tcpip.TCPRecovery(0)
		if on {
			want = tcpip.TCPRACKLossDetection
		}
		if r != want {
			t.Errorf("RACK=%v: stack recovery %v, want %v", on, r, want)
		}
	}
}

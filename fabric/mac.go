package fabric

import (
	"fmt"
	"net"
)

// DefaultMACPrefix is the Extoll MAC prefix of Figure 5.13: 2E:87:04:07.
// 0x2E has the locally-administered bit set and the multicast bit clear.
var DefaultMACPrefix = MACPrefix{0x2E, 0x87, 0x04, 0x07}

// MACPrefix is the configurable first four octets of a node's MAC.
type MACPrefix [4]byte

// Validate rejects a prefix that is not locally administered and unicast.
func (p MACPrefix) Validate() error {
	if p[0]&0x02 == 0 {
		return fmt.Errorf("mac prefix %02x:%02x:%02x:%02x: not locally administered: %w", p[0], p[1], p[2], p[3], ErrInvalid)
	}
	if p[0]&0x01 != 0 {
		return fmt.Errorf("mac prefix %02x:%02x:%02x:%02x: multicast bit set: %w", p[0], p[1], p[2], p[3], ErrInvalid)
	}
	return nil
}

// ParseMACPrefix parses "2e:87:04:07".
func ParseMACPrefix(s string) (MACPrefix, error) {
	hw, err := net.ParseMAC(s + ":00:00")
	if err != nil || len(hw) != 6 {
		return MACPrefix{}, fmt.Errorf("mac prefix %q: want 4 octets: %w", s, ErrInvalid)
	}
	var p MACPrefix
	copy(p[:], hw)
	return p, p.Validate()
}

// MAC returns node n's MAC address: prefix, then n's high and low octets.
func (p MACPrefix) MAC(n NodeID) net.HardwareAddr {
	return net.HardwareAddr{p[0], p[1], p[2], p[3], byte(n >> 8), byte(n)}
}

// Node returns the node a MAC names, without allocating. ok is false for a
// MAC with another prefix (including every multicast MAC).
func (p MACPrefix) Node(mac []byte) (n NodeID, ok bool) {
	if len(mac) < 6 || mac[0] != p[0] || mac[1] != p[1] || mac[2] != p[2] || mac[3] != p[3] {
		return 0, false
	}
	return NodeID(mac[4])<<8 | NodeID(mac[5]), true
}

package gateway

// The SOCKS5 protocol of userspace access's --socks front door: the
// handshake, the replies and the mapping of fabric dial errors to reply
// codes. nsServices.socks (access.go) serves a client with them and then
// splices the connection like a --forward's.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
)

// SOCKS5 (RFC 1928), the subset a local proxy needs: no authentication,
// CONNECT, IPv4 and IPv6 addresses, and domain names that are IP literals
// (the fabric has no DNS).
const (
	socksVersion    = 5
	socksNoAuth     = 0
	socksNoMethod   = 0xff
	socksConnect    = 1
	socksAtypIPv4   = 1
	socksAtypDomain = 3
	socksAtypIPv6   = 4

	socksOK               = 0
	socksGeneralFailure   = 1
	socksNetUnreachable   = 3
	socksHostUnreachable  = 4
	socksConnRefused      = 5
	socksCmdNotSupported  = 7
	socksAtypNotSupported = 8
	socksMaxDomain        = 255
	socksMaxRequest       = 4 + 1 + socksMaxDomain + 2 // also holds the 255 greeting methods
)

// errSocks is a handshake the server refused (already answered).
var errSocks = errors.New("socks5: refused")

// socksHandshake reads the greeting and the request from c, answers the
// greeting, and returns the CONNECT destination. On a request it refuses
// it writes the failure reply and returns an error.
func socksHandshake(c io.ReadWriter) (netip.AddrPort, error) {
	var buf [socksMaxRequest]byte
	if _, err := io.ReadFull(c, buf[:2]); err != nil {
		return netip.AddrPort{}, fmt.Errorf("greeting: %w", err)
	}
	if buf[0] != socksVersion {
		return netip.AddrPort{}, fmt.Errorf("greeting: version %d, want 5", buf[0])
	}
	nm := int(buf[1])
	if nm == 0 {
		c.Write([]byte{socksVersion, socksNoMethod})
		return netip.AddrPort{}, errors.New("greeting: no methods")
	}
	if _, err := io.ReadFull(c, buf[:nm]); err != nil {
		return netip.AddrPort{}, fmt.Errorf("greeting: %w", err)
	}
	noAuth := false
	for _, m := range buf[:nm] {
		noAuth = noAuth || m == socksNoAuth
	}
	if !noAuth {
		c.Write([]byte{socksVersion, socksNoMethod})
		return netip.AddrPort{}, errors.New("greeting: client does not offer no-auth")
	}
	if _, err := c.Write([]byte{socksVersion, socksNoAuth}); err != nil {
		return netip.AddrPort{}, err
	}
	if _, err := io.ReadFull(c, buf[:4]); err != nil {
		return netip.AddrPort{}, fmt.Errorf("request: %w", err)
	}
	if buf[0] != socksVersion {
		return netip.AddrPort{}, fmt.Errorf("request: version %d, want 5", buf[0])
	}
	cmd, atyp := buf[1], buf[3]
	var addr netip.Addr
	switch atyp {
	case socksAtypIPv4:
		if _, err := io.ReadFull(c, buf[:4+2]); err != nil {
			return netip.AddrPort{}, fmt.Errorf("request: %w", err)
		}
		addr = netip.AddrFrom4([4]byte(buf[:4]))
		copy(buf[:2], buf[4:6])
	case socksAtypIPv6:
		if _, err := io.ReadFull(c, buf[:16+2]); err != nil {
			return netip.AddrPort{}, fmt.Errorf("request: %w", err)
		}
		addr = netip.AddrFrom16([16]byte(buf[:16])).Unmap()
		copy(buf[:2], buf[16:18])
	case socksAtypDomain:
		if _, err := io.ReadFull(c, buf[:1]); err != nil {
			return netip.AddrPort{}, fmt.Errorf("request: %w", err)
		}
		l := int(buf[0])
		if _, err := io.ReadFull(c, buf[:l+2]); err != nil {
			return netip.AddrPort{}, fmt.Errorf("request: %w", err)
		}
		name := string(buf[:l])
		a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(name, "["), "]"))
		if err != nil || a.Zone() != "" {
			c.Write(socksReply(socksHostUnreachable, netip.AddrPort{}))
			return netip.AddrPort{}, fmt.Errorf("request: %w: name %q is not an IP address (the fabric has no DNS)", errSocks, name)
		}
		addr = a.Unmap()
		copy(buf[:2], buf[l:l+2])
	default:
		c.Write(socksReply(socksAtypNotSupported, netip.AddrPort{}))
		return netip.AddrPort{}, fmt.Errorf("request: %w: address type %d", errSocks, atyp)
	}
	port := uint16(buf[0])<<8 | uint16(buf[1])
	if cmd != socksConnect {
		c.Write(socksReply(socksCmdNotSupported, netip.AddrPort{}))
		return netip.AddrPort{}, fmt.Errorf("request: %w: command %d (only CONNECT)", errSocks, cmd)
	}
	if port == 0 || addr.IsUnspecified() || addr.IsMulticast() {
		c.Write(socksReply(socksHostUnreachable, netip.AddrPort{}))
		return netip.AddrPort{}, fmt.Errorf("request: %w: destination %s:%d", errSocks, addr, port)
	}
	return netip.AddrPortFrom(addr, port), nil
}

// socksReply is a reply with code rep and bound address bnd (0.0.0.0:0
// when invalid).
func socksReply(rep byte, bnd netip.AddrPort) []byte {
	a := bnd.Addr().Unmap()
	if !a.IsValid() {
		a = netip.IPv4Unspecified()
	}
	b := make([]byte, 0, 4+16+2)
	if a.Is4() {
		b = append(b, socksVersion, rep, 0, socksAtypIPv4)
	} else {
		b = append(b, socksVersion, rep, 0, socksAtypIPv6)
	}
	b = append(b, a.AsSlice()...)
	return append(b, byte(bnd.Port()>>8), byte(bnd.Port()))
}

// socksDialCode maps a failed fabric dial to a SOCKS5 reply code.
func socksDialCode(err error) byte {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "refused"):
		return socksConnRefused
	case strings.Contains(msg, "no route") || strings.Contains(msg, "network is unreachable"):
		return socksNetUnreachable
	case errors.Is(err, context.DeadlineExceeded) || strings.Contains(msg, "timed out") ||
		strings.Contains(msg, "host is unreachable") || strings.Contains(msg, "no remote link address"):
		return socksHostUnreachable
	}
	return socksGeneralFailure
}

package peers

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/exn-project/exn/fabric"
)

// MaxLineLen is the longest line Parse accepts.
const MaxLineLen = 4096

// Peer is one line of a peers file.
type Peer struct {
	// Node is the peer's fabric node ID.
	Node fabric.NodeID
	// Addr is the address field as written: host, or host:port.
	Addr string
	// IP is the peer's exn0 address; the zero Addr when the line has none.
	IP netip.Addr
}

// ErrSyntax is the sentinel every *ParseError wraps, so callers can test
// errors.Is(err, peers.ErrSyntax).
var ErrSyntax = errors.New("invalid peers file")

// ParseError describes one bad line.
type ParseError struct {
	Path  string // the file, when known (Load)
	Line  int    // 1-based line number
	Field string // "node", "address", "ip", "line"
	Value string // the offending text, possibly truncated
	Err   error  // the reason; wraps ErrSyntax
}

func (e *ParseError) Error() string {
	var b strings.Builder
	b.WriteString("peers")
	if e.Path != "" {
		b.WriteString(" ")
		b.WriteString(e.Path)
	}
	fmt.Fprintf(&b, ": line %d: %s", e.Line, e.Field)
	if e.Value != "" {
		fmt.Fprintf(&b, " %q", e.Value)
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *ParseError) Unwrap() error { return e.Err }

func lineErr(line int, field, value, format string, args ...any) *ParseError {
	if len(value) > 64 {
		value = value[:64] + "..."
	}
	return &ParseError{
		Line: line, Field: field, Value: value,
		Err: fmt.Errorf(format+": %w", append(args, ErrSyntax)...),
	}
}

// Load reads and parses the peers file at path.
func Load(path string) ([]Peer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("peers: %w", err)
	}
	defer f.Close()
	ps, err := Parse(f)
	if pe, ok := errors.AsType[*ParseError](err); ok {
		pe.Path = path
	} else if err != nil {
		err = fmt.Errorf("peers %s: %w", path, err)
	}
	return ps, err
}

// Parse parses a peers file. It returns the peers in file order, or the
// first error: a *ParseError for a bad line, or the reader's error.
func Parse(r io.Reader) ([]Peer, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 256), MaxLineLen)
	var (
		out    []Peer
		nodeAt = make(map[fabric.NodeID]int)
		ipAt   = make(map[netip.Addr]int)
		line   int
	)
	for sc.Scan() {
		line++
		text := sc.Text()
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		p, err := parseLine(line, fields)
		if err != nil {
			return nil, err
		}
		if prev, dup := nodeAt[p.Node]; dup {
			return nil, lineErr(line, "node", fields[0], "duplicate node id (first on line %d)", prev)
		}
		nodeAt[p.Node] = line
		if p.IP.IsValid() {
			if prev, dup := ipAt[p.IP]; dup {
				return nil, lineErr(line, "ip", fields[2], "duplicate ip (first on line %d)", prev)
			}
			ipAt[p.IP] = line
		}
		out = append(out, p)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, lineErr(line+1, "line", "", "longer than %d bytes", MaxLineLen)
		}
		return nil, fmt.Errorf("peers: read after line %d: %w", line, err)
	}
	return out, nil
}

func parseLine(line int, f []string) (Peer, error) {
	if len(f) < 2 {
		return Peer{}, lineErr(line, "address", "", "missing (want NODE_ID ADDRESS[:PORT] [IP])")
	}
	if len(f) > 3 {
		return Peer{}, lineErr(line, "line", f[3], "extra field (want NODE_ID ADDRESS[:PORT] [IP])")
	}
	var p Peer
	n, err := strconv.ParseUint(f[0], 10, 16)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return Peer{}, lineErr(line, "node", f[0], "out of range 0..65535")
		}
		return Peer{}, lineErr(line, "node", f[0], "not a decimal number")
	}
	p.Node = fabric.NodeID(n)
	if err := checkAddr(f[1]); err != nil {
		return Peer{}, lineErr(line, "address", f[1], "%s", err.Error())
	}
	p.Addr = f[1]
	if len(f) == 3 {
		ip, err := netip.ParseAddr(f[2])
		switch {
		case err != nil:
			return Peer{}, lineErr(line, "ip", f[2], "not an IP address")
		case ip.Zone() != "":
			return Peer{}, lineErr(line, "ip", f[2], "zone not allowed")
		case ip.Is4In6():
			return Peer{}, lineErr(line, "ip", f[2], "ipv4-mapped ipv6 not allowed; write the ipv4 address")
		case ip.IsUnspecified(), ip.IsMulticast(), ip.IsLoopback(), ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
			return Peer{}, lineErr(line, "ip", f[2], "not a unicast address")
		}
		p.IP = ip
	}
	return p, nil
}

// checkAddr validates ADDRESS[:PORT]: a host name or IP, optionally with a
// port 1..65535; an IPv6 address with a port must be bracketed.
func checkAddr(s string) error {
	if _, err := netip.ParseAddr(s); err == nil {
		return nil // bare IPv4 or IPv6 (zones allowed: link-local peers)
	}
	host, port := s, ""
	if strings.HasPrefix(s, "[") || strings.Count(s, ":") == 1 {
		h, p, err := net.SplitHostPort(s)
		if err != nil {
			return errors.New("malformed host:port")
		}
		host, port = h, p
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil || n == 0 {
			return fmt.Errorf("port %q not in 1..65535", port)
		}
		if strings.HasPrefix(s, "[") {
			if _, err := netip.ParseAddr(host); err != nil || !strings.Contains(host, ":") {
				return errors.New("brackets hold an ipv6 address")
			}
			return nil
		}
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return nil
	}
	return checkHostname(host)
}

// checkHostname accepts RFC 1123 names (letters, digits, '-', '.'; labels
// of 1..63 bytes, 253 in all) and '_' for service-style names.
func checkHostname(h string) error {
	if h == "" || len(h) > 253 {
		return errors.New("bad host name length")
	}
	label := 0
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c == '.':
			if label == 0 {
				return errors.New("empty host name label")
			}
			label = 0
			continue
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
		default:
			return fmt.Errorf("bad character %q in host name", c)
		}
		label++
		if label > 63 {
			return errors.New("host name label longer than 63 bytes")
		}
	}
	if strings.HasPrefix(h, "-") || strings.Contains(h, ".-") {
		return errors.New("host name label starts with '-'")
	}
	return nil
}

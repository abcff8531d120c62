package control

// Who may use the control socket, and how the server tells callers
// apart: the kernel's word (SO_PEERCRED on the accepted connection),
// never a PID or user a message names. The socket file's mode is the
// first guard (the kernel checks it at connect), the policy check on
// every accepted connection the second.

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/exn-project/exn/internal/sys"
)

// Access says who may connect to the control socket.
type Access int

const (
	// AccessAll: every local user (socket mode 0666); each user acts only
	// on what it made (handlers check the caller's uid).
	AccessAll Access = iota
	// AccessGroup: root, exnd's own user and members of Policy.GID
	// (socket mode 0660, group GID).
	AccessGroup
	// AccessRoot: root and exnd's own user only (socket mode 0600).
	AccessRoot
)

// Policy is the control socket's access policy.
type Policy struct {
	Access Access
	GID    int // AccessGroup's group
}

// String is the policy as ParsePolicy reads it.
func (p Policy) String() string {
	switch p.Access {
	case AccessGroup:
		return "group:" + strconv.Itoa(p.GID)
	case AccessRoot:
		return "root"
	}
	return "all"
}

// mode is the socket file's permission bits for p.
func (p Policy) mode() os.FileMode {
	switch p.Access {
	case AccessGroup:
		return 0o660
	case AccessRoot:
		return 0o600
	}
	return 0o666
}

// ParsePolicy reads "all", "root" or "group:GROUP" (a group name or
// numeric gid). lookup resolves a group name (nil: numeric only).
func ParsePolicy(s string, lookup func(name string) (int, error)) (Policy, error) {
	switch {
	case s == "all" || s == "":
		return Policy{Access: AccessAll}, nil
	case s == "root":
		return Policy{Access: AccessRoot}, nil
	case strings.HasPrefix(s, "group:"):
		g := s[len("group:"):]
		if id, err := strconv.ParseUint(g, 10, 31); err == nil {
			return Policy{Access: AccessGroup, GID: int(id)}, nil
		}
		if lookup == nil || g == "" {
			return Policy{}, fmt.Errorf("%q: want group:GID", s)
		}
		id, err := lookup(g)
		if err != nil {
			return Policy{}, fmt.Errorf("%q: %w", s, err)
		}
		return Policy{Access: AccessGroup, GID: id}, nil
	}
	return Policy{}, fmt.Errorf("%q: want all, group:GROUP or root", s)
}

// allows reports whether a caller with cred may use the socket.
func (p Policy) allows(c sys.Cred) bool {
	if c.UID == 0 || c.UID == uint32(os.Geteuid()) {
		return true
	}
	switch p.Access {
	case AccessAll:
		return true
	case AccessGroup:
		if c.GID == uint32(p.GID) {
			return true
		}
		ok, _ := sys.InGroup(c.PID, uint32(p.GID))
		return ok
	}
	return false
}

// Peer is a caller as the kernel identified it.
type Peer = sys.Cred

type peerKey struct{}

// PeerFrom returns the caller of the request whose context ctx is: the
// credentials the kernel recorded for its connection (SO_PEERCRED).
// ok is false outside a control request (or for a connection that is
// not a unix socket, in tests over net.Pipe).
func PeerFrom(ctx context.Context) (Peer, bool) {
	p, ok := ctx.Value(peerKey{}).(Peer)
	return p, ok
}

// WithPeer returns ctx carrying p as the caller (for tests and for
// servers that serve a connection they accepted themselves).
func WithPeer(ctx context.Context, p Peer) context.Context {
	return context.WithValue(ctx, peerKey{}, p)
}

// Refusal reasons the server counts (Stats.Refused).
const (
	ReasonUnauthorized = "unauthorized"   // the policy does not allow the caller
	ReasonNoCred       = "no_peer_cred"   // SO_PEERCRED failed
	ReasonTooMany      = "too_many_conns" // MaxConns connections open
	ReasonOversized    = "oversized"      // a line longer than MaxLine
	ReasonTooManyFDs   = "too_many_fds"   // more than MaxFDs descriptors, or truncated ancillary data
	ReasonTruncated    = "truncated"      // EOF in the middle of a line
	ReasonIdle         = "idle"           // no complete line within LineTimeout
	ReasonBadRequest   = "bad_request"    // empty line, unknown operation
	ReasonFailed       = "failed"         // a handler returned an error
)

var reasons = [...]string{ReasonUnauthorized, ReasonNoCred, ReasonTooMany, ReasonOversized, ReasonTooManyFDs,
	ReasonTruncated, ReasonIdle, ReasonBadRequest, ReasonFailed}

// ServerStats are the control server's counters.
type ServerStats struct {
	Accepted uint64            `json:"accepted"` // connections accepted
	Active   int64             `json:"active"`   // connections open now
	Requests uint64            `json:"requests"` // request lines answered
	Refused  map[string]uint64 `json:"refused"`  // by reason (the Reason* constants)
}

type counters struct {
	accepted, requests atomic.Uint64
	active             atomic.Int64
	refused            [len(reasons)]atomic.Uint64
}

func (c *counters) refuse(reason string) {
	for i, r := range reasons {
		if r == reason {
			c.refused[i].Add(1)
			return
		}
	}
}

func (c *counters) snapshot() ServerStats {
	st := ServerStats{Accepted: c.accepted.Load(), Active: c.active.Load(), Requests: c.requests.Load(),
		Refused: make(map[string]uint64, len(reasons))}
	for i, r := range reasons {
		st.Refused[r] = c.refused[i].Load()
	}
	return st
}

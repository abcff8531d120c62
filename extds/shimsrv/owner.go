package shimsrv

// Users are isolated (issue #18): a registration, a switched connection
// and what exnd says about them belong to the uid that made them (the
// kernel's word, SO_PEERCRED). These are the checks that a request of
// another uid meets; each refusal is counted (Stats.Refused, reason
// not_owner).

import (
	"net/netip"
	"os"

	"github.com/exn-project/exn/control"
)

// privileged reports whether p sees and may act on everything: root and
// exnd's own user.
func privileged(p control.Peer) bool { return p.UID == 0 || p.UID == uint32(os.Geteuid()) }

// covers reports whether a listener bound to bound can have accepted a
// connection whose local address (getsockname, family as the kernel
// says) is local. An invalid bound (a registration restored from an
// older state file) covers every address.
func covers(bound, local netip.Addr) bool {
	switch {
	case !bound.IsValid():
		return true
	case bound.Is4():
		return local.Is4() && (bound.IsUnspecified() || bound == local)
	case bound.IsUnspecified(): // [::] takes IPv6 and, unless V6ONLY, v4-mapped
		return local.Is6()
	}
	return bound == local.WithZone(bound.Zone())
}

// mayAccept reports whether who may have exnd claim a connection
// accepted with local address la. Without any registration for the port
// it may (the Device declines every CLAIM for it). Otherwise a
// registration must cover la and belong to who's uid — or to root (a
// root master whose workers dropped privileges), or who is privileged.
// A connection accepted from another socket that only shares the port
// number (another address or family, bound by another user) does not
// ride on that user's registration.
func (s *Server) mayAccept(who control.Peer, la netip.AddrPort) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	found := false
	for k, l := range s.listens {
		if k.port != la.Port() {
			continue
		}
		found = true
		if covers(l.addr, la.Addr()) && (l.uid == who.UID || l.uid == 0 || privileged(who)) {
			return true
		}
	}
	return !found
}

// ConnsFor lists the switched connections who may see: all for a
// privileged caller, else the caller's own. A listing that withheld
// another user's connections counts one not_owner refusal.
func (s *Server) ConnsFor(who control.Peer) []ConnInfo {
	all := s.Conns()
	if privileged(who) {
		return all
	}
	out := all[:0]
	for _, c := range all {
		if c.UID == who.UID {
			out = append(out, c)
		}
	}
	if len(out) < len(all) {
		_ = s.refuse(ReasonNotOwner, "conns: %d connections of other users withheld", len(all)-len(out))
	}
	return out
}

package localq

import (
	"fmt"
	"net"
	"sync/atomic"

	"github.com/exn-project/exn/fabric"
)

// Groups is a NIC's multicast membership bitmap; its Join and Leave are
// the NIC's (fabric.NIC). The zero value is unusable; call Init.
type Groups struct {
	bits   atomic.Uint64
	prefix string // error prefix: the backend's name
	ctr    *fabric.Counters
	closed *atomic.Bool
}

// Init joins Broadcast; prefix starts every error ("mem", "fabnet", ...),
// invalid requests are counted in ctr, and closed is the NIC's state.
func (g *Groups) Init(prefix string, ctr *fabric.Counters, closed *atomic.Bool) {
	g.prefix, g.ctr, g.closed = prefix, ctr, closed
	g.bits.Store(1 << fabric.Broadcast)
}

func (g *Groups) check(grp fabric.Group) error {
	if grp >= fabric.MaxGroups {
		return fmt.Errorf("%s: group %d >= %d: %w", g.prefix, grp, fabric.MaxGroups, fabric.ErrInvalid)
	}
	return nil
}

// Join adds grp (fabric.NIC.Join).
func (g *Groups) Join(grp fabric.Group) error {
	if err := g.check(grp); err != nil {
		return g.ctr.CountErr(err)
	}
	if g.closed.Load() {
		return fmt.Errorf("%s: join: %w", g.prefix, net.ErrClosed)
	}
	g.bits.Or(1 << grp)
	return nil
}

// Leave removes grp (fabric.NIC.Leave); Broadcast cannot be left.
func (g *Groups) Leave(grp fabric.Group) error {
	if err := g.check(grp); err != nil {
		return g.ctr.CountErr(err)
	}
	if grp == fabric.Broadcast {
		return g.ctr.CountErr(fmt.Errorf("%s: leave broadcast group: %w", g.prefix, fabric.ErrInvalid))
	}
	if g.closed.Load() {
		return fmt.Errorf("%s: leave: %w", g.prefix, net.ErrClosed)
	}
	g.bits.And(^(uint64(1) << grp))
	return nil
}

// Member reports whether grp is joined.
func (g *Groups) Member(grp fabric.Group) bool { return g.bits.Load()&(1<<grp) != 0 }

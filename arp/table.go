package arp

import (
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/peers"
	"github.com/exn-project/exn/internal/ratelog"
)

// DefaultMaxEntries bounds the table: learning stops (and is counted as
// Full) once this many entries exist, so a flood of forged announcements
// cannot grow memory without limit. Static entries are always added.
const DefaultMaxEntries = 1 << 16

// Source says where an entry came from.
type Source uint8

const (
	// Learned entries come from observed ARP/NDP.
	Learned Source = iota + 1
	// Static entries come from Seed (the peers file).
	Static
)

func (s Source) String() string {
	switch s {
	case Learned:
		return "learned"
	case Static:
		return "static"
	}
	return "unknown"
}

// Entry is one neighbour.
type Entry struct {
	IP   netip.Addr
	MAC  net.HardwareAddr // a fresh copy; the caller may keep or modify it
	Node fabric.NodeID
	// Source is Learned or Static.
	Source Source
	// Updated is when the entry was created, changed, or last confirmed by
	// an observation (the Table's clock).
	Updated time.Time
}

// Stats is a snapshot of the Table's counters.
type Stats struct {
	Observed  uint64 // ARP or ICMPv6 frames examined
	Learned   uint64 // new entries from observations
	Updated   uint64 // learned entries whose MAC changed
	Refreshed uint64 // observations confirming an existing entry
	Conflicts uint64 // an IP seen with a MAC other than its entry's
	Foreign   uint64 // learnable announcements with a non-fabric MAC
	Malformed uint64 // ARP/NDP frames that did not parse
	Full      uint64 // new entries refused: table at MaxEntries
	Entries   int    // current number of entries
}

type counters struct {
	observed, learned, updated, refreshed atomic.Uint64
	conflicts, foreign, malformed, full   atomic.Uint64
}

// entry is the stored form: fixed-size, no pointers to share.
type entry struct {
	mac     [6]byte
	node    fabric.NodeID
	source  Source
	updated time.Time
}

// Table is the neighbour table. The zero value is not usable; call New.
type Table struct {
	prefix fabric.MACPrefix
	log    *slog.Logger
	now    func() time.Time
	max    int
	limit  ratelog.Limiter

	mu sync.RWMutex
	m  map[netip.Addr]entry

	c counters
}

// Option configures a Table.
type Option func(*Table)

// WithClock sets the clock used for Entry.Updated (default time.Now).
func WithClock(now func() time.Time) Option { return func(t *Table) { t.now = now } }

// WithMaxEntries sets the table bound (default DefaultMaxEntries).
func WithMaxEntries(n int) Option { return func(t *Table) { t.max = n } }

// New returns an empty table that learns MACs with the given prefix. A nil
// logger discards.
func New(prefix fabric.MACPrefix, logger *slog.Logger, opts ...Option) *Table {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	t := &Table{
		prefix: prefix,
		log:    logger,
		now:    time.Now,
		max:    DefaultMaxEntries,
		m:      make(map[netip.Addr]entry),
	}
	for _, o := range opts {
		o(t)
	}
	t.limit.Init(t.now, time.Second, 10)
	return t
}

// Lookup returns the entry for ip. An IPv4-mapped IPv6 address is looked
// up as IPv4.
func (t *Table) Lookup(ip netip.Addr) (Entry, bool) {
	ip = ip.Unmap()
	t.mu.RLock()
	e, ok := t.m[ip]
	t.mu.RUnlock()
	if !ok {
		return Entry{}, false
	}
	return e.export(ip), true
}

// Neighbors returns a snapshot of every entry, sorted by IP (IPv4 first).
func (t *Table) Neighbors() []Entry {
	t.mu.RLock()
	out := make([]Entry, 0, len(t.m))
	for ip, e := range t.m {
		out = append(out, e.export(ip))
	}
	t.mu.RUnlock()
	slices.SortFunc(out, func(a, b Entry) int { return a.IP.Compare(b.IP) })
	return out
}

func (e *entry) export(ip netip.Addr) Entry {
	return Entry{IP: ip, MAC: slices.Clone(e.mac[:]), Node: e.node, Source: e.source, Updated: e.updated}
}

// Seed adds a static entry for every peer with an IP: the IP maps to the
// peer's node and the MAC the prefix gives it. It replaces any entry for
// that IP. Peers without an IP are skipped.
func (t *Table) Seed(ps []peers.Peer) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range ps {
		if !p.IP.IsValid() {
			continue
		}
		var e entry
		copy(e.mac[:], t.prefix.MAC(p.Node))
		e.node, e.source, e.updated = p.Node, Static, now
		t.m[p.IP.Unmap()] = e
	}
}

// InvalidateNode removes the learned entries of node n (a peer that died)
// and returns how many it removed. Static entries stay: they are
// configuration, and the fabric, not the table, says whether a node is up.
func (t *Table) InvalidateNode(n fabric.NodeID) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	removed := 0
	for ip, e := range t.m {
		if e.node == n && e.source == Learned {
			delete(t.m, ip)
			removed++
		}
	}
	return removed
}

// Stats returns a snapshot of the counters.
func (t *Table) Stats() Stats {
	t.mu.RLock()
	n := len(t.m)
	t.mu.RUnlock()
	return Stats{
		Observed: t.c.observed.Load(), Learned: t.c.learned.Load(),
		Updated: t.c.updated.Load(), Refreshed: t.c.refreshed.Load(),
		Conflicts: t.c.conflicts.Load(), Foreign: t.c.foreign.Load(),
		Malformed: t.c.malformed.Load(), Full: t.c.full.Load(),
		Entries: n,
	}
}

// learn records ip → mac. mac is a view into the frame; it is copied.
func (t *Table) learn(ip netip.Addr, mac []byte) {
	node, ok := t.prefix.Node(mac)
	if !ok {
		t.c.foreign.Add(1)
		return
	}
	var m [6]byte
	copy(m[:], mac)
	now := t.now()

	t.mu.Lock()
	old, exists := t.m[ip]
	switch {
	case !exists:
		if len(t.m) >= t.max {
			t.mu.Unlock()
			t.c.full.Add(1)
			t.warn("neighbour table full", slog.Int("max", t.max), slog.String("ip", ip.String()))
			return
		}
		t.m[ip] = entry{mac: m, node: node, source: Learned, updated: now}
		t.mu.Unlock()
		t.c.learned.Add(1)
		return
	case old.mac == m:
		old.updated = now
		t.m[ip] = old
		t.mu.Unlock()
		t.c.refreshed.Add(1)
		return
	case old.source == Static:
		t.mu.Unlock()
		t.c.conflicts.Add(1)
		t.warn("neighbour conflicts with static entry; kept static",
			slog.String("ip", ip.String()), slog.String("static", net.HardwareAddr(old.mac[:]).String()),
			slog.String("seen", net.HardwareAddr(m[:]).String()))
		return
	default:
		t.m[ip] = entry{mac: m, node: node, source: Learned, updated: now}
		t.mu.Unlock()
		t.c.conflicts.Add(1)
		t.c.updated.Add(1)
		t.warn("neighbour moved to another mac",
			slog.String("ip", ip.String()), slog.String("old", net.HardwareAddr(old.mac[:]).String()),
			slog.String("new", net.HardwareAddr(m[:]).String()))
	}
}

func (t *Table) malformed(what string) {
	t.c.malformed.Add(1)
	t.warn("malformed neighbour frame", slog.String("reason", what))
}

// warn logs a per-frame event, at most a few per second.
func (t *Table) warn(msg string, attrs ...slog.Attr) { t.limit.Warn(t.log, msg, attrs...) }

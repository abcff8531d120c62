package gateway

// Kernel bypass: application processes attached to this node's EXT-DS
// (extds.AttachDevice). On the shm fabric exnd lends each such process a
// block of 16 VPIDs (bases attachFirstBase, +16, ... up to 255: outside
// EXT-Eth's VPID 0, fping's 1 and exnd's own EXT-DS block 16..31) as a
// lease in the node's shm header (fabric/shm attach.go); the process
// opens them itself and moves its data with no hop through exnd.
//
// Operations:
//
//	extds-attach PID            lease a block to PID → {fabric, node, vpid_base, vpids, token}
//	extds-detach PID BASE       give it back (the holder loses it at once)
//	extds-listen PID BASE PORT  exnd's Device answers peers' probes for PORT (see extds/attach.go)
//	extds-unlisten PID BASE PORT
//	extds-leases                the lease table and counters
//
// exnd learns the caller from the kernel (SO_PEERCRED on the control
// connection, control.PeerFrom), never from the message: PID must be the
// caller's own PID (it is kept in the requests for compatibility and
// checked), the lease belongs to that PID and uid, and
// detach/listen/unlisten are honoured only from the lease's own process
// (or root); anything else is refused and counted. The shm grant is made
// for that PID and shm.Attach refuses it to any other process. A lease is
// reclaimed when its holder
// detaches or dies (the shm layer sees the holder's attach lock go, within
// its 10 ms liveness period), or — never attached — when PID dies or
// attachGrace passes. A lying caller can at worst hold a block until the
// grace ends.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/backend"
	"github.com/exn-project/exn/fabric/shm"
	"github.com/exn-project/exn/internal/sys"
)

const (
	// attachFirstBase is the first leased VPID block, right after exnd's
	// own EXT-DS block.
	attachFirstBase = extds.DefaultBaseVPID + extds.NumVDevs
	// attachBlocks is how many 16-VPID blocks fit above it (32..255).
	attachBlocks = (256 - int(attachFirstBase)) / extds.NumVDevs
	// attachGrace: a lease not attached this long after it was granted
	// is revoked (the caller died or lied about its PID).
	attachGrace = 10 * time.Second
	// attachSweep is how often leases are checked against their holders:
	// the fabric's liveness period (fabric/shm's monitor reclaims a dead
	// holder's lease at that period, so sweeping faster finds nothing
	// new), and the only timer of an idle attach service.
	attachSweep = time.Second
	// maxPortsPerLease bounds the listening ports one lease may announce.
	maxPortsPerLease = 1024
)

// appLease is one lease exnd made.
type appLease struct {
	pid     int    // the caller that made it (SO_PEERCRED)
	uid     uint32 // its owner
	grant   shm.Grant
	granted time.Time
	seen    bool                // the holder was seen attached
	ports   map[uint16][]func() // extds-listen registrations on exnd's Device
}

// AttachStats counts the attach service's work.
type AttachStats struct {
	Attached  uint64 `json:"attached"`  // leases granted
	Detached  uint64 `json:"detached"`  // extds-detach calls honoured
	Reclaimed uint64 `json:"reclaimed"` // leases ended because the holder let go or died
	Expired   uint64 `json:"expired"`   // leases never attached (PID died, grace ran out)
	Refused   uint64 `json:"refused"`   // bad requests: bad PID, wrong owner, no block left, ...
	Listens   uint64 `json:"listens"`   // extds-listen registrations
}

type attachSvc struct {
	d    *Daemon
	dev  *extds.Device
	lend shm.Lender // nil: the fabric is not shm
	log  *slog.Logger

	mu     sync.Mutex
	leases map[fabric.VPID]*appLease // by VPID base
	closed bool

	stop chan struct{}
	wg   sync.WaitGroup

	attached, detached, reclaimed, expired, refused, listens atomic.Uint64
}

// startAttach makes the lease service and, on shm, starts its lease
// sweeper. The EXT-DS part returns its handlers and closes it.
func startAttach(d *Daemon, dev *extds.Device, log *slog.Logger) *attachSvc {
	s := &attachSvc{d: d, dev: dev, log: log, leases: make(map[fabric.VPID]*appLease), stop: make(chan struct{})}
	if d.cfg.Fabric.Kind == backend.SHM {
		s.lend, _ = d.nic.(shm.Lender)
	}
	if s.lend != nil {
		s.wg.Add(1)
		go s.sweeper()
	}
	return s
}

// handlers are the lease service's control operations.
func (s *attachSvc) handlers() map[string]control.HandlerFunc {
	return map[string]control.HandlerFunc{
		"extds-attach":   s.handleAttach,
		"extds-detach":   s.handleDetach,
		"extds-listen":   s.handleListen,
		"extds-unlisten": s.handleUnlisten,
		"extds-leases":   s.handleLeases,
	}
}

func (s *attachSvc) refuse(format string, args ...any) error {
	s.refused.Add(1)
	return fmt.Errorf(format, args...)
}

// parsePID checks a caller-supplied PID against the kernel's word: it
// must be the caller's own process, and not exnd.
func (s *attachSvc) parsePID(ctx context.Context, arg string) (int, error) {
	who, ok := control.PeerFrom(ctx)
	pid, err := strconv.Atoi(arg)
	switch {
	case !ok:
		return 0, s.refuse("the caller's credentials are unknown")
	case err != nil || pid <= 0:
		return 0, s.refuse("pid %q: want a positive process ID", arg)
	case pid != who.PID:
		return 0, s.refuse("pid %d is not the caller (pid %d)", pid, who.PID)
	case pid == os.Getpid():
		return 0, s.refuse("pid %d is exnd itself", pid)
	case !sys.ProcessAlive(pid):
		return 0, s.refuse("pid %d: no such process", pid)
	}
	return pid, nil
}

func (s *attachSvc) handleAttach(ctx context.Context, args []string) (any, error) {
	if len(args) != 1 {
		return nil, s.refuse("usage: extds-attach PID")
	}
	if s.lend == nil {
		return nil, s.refuse("kernel bypass needs the shm fabric (this exnd runs %s)", s.d.cfg.Fabric)
	}
	pid, err := s.parsePID(ctx, args[0])
	if err != nil {
		return nil, err
	}
	who, _ := control.PeerFrom(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, s.refuse("exnd is shutting down")
	}
	var lastErr error
	for i := 0; i < attachBlocks; i++ {
		base := attachFirstBase + fabric.VPID(i*extds.NumVDevs)
		if s.leases[base] != nil {
			continue
		}
		g, err := s.lend.Grant(base, extds.NumVDevs, pid)
		if err != nil {
			lastErr = err // e.g. the block's previous holder is still letting go
			continue
		}
		s.leases[base] = &appLease{pid: pid, uid: who.UID, grant: g, granted: time.Now(), ports: map[uint16][]func(){}}
		s.attached.Add(1)
		s.log.Info("EXT-DS lease granted", "pid", pid, "vpids", fmt.Sprintf("%d-%d", base, int(base)+extds.NumVDevs-1))
		return extds.AttachReply{Fabric: s.d.cfg.Fabric.String(), Node: g.Node, VPIDBase: g.VPIDBase, VPIDs: g.VPIDs, Token: g.Token}, nil
	}
	if lastErr != nil {
		return nil, s.refuse("no VPID block free (%d leased): %v", len(s.leases), lastErr)
	}
	return nil, s.refuse("no VPID block free: all %d are leased", attachBlocks)
}

// lease finds the lease at BASE made for PID, which must be the caller
// (or the caller root); s.mu is held.
func (s *attachSvc) lease(ctx context.Context, pidArg, baseArg string) (*appLease, error) {
	who, ok := control.PeerFrom(ctx)
	pid, err := strconv.Atoi(pidArg)
	switch {
	case !ok:
		return nil, s.refuse("the caller's credentials are unknown")
	case err != nil || pid <= 0:
		return nil, s.refuse("pid %q: want a positive process ID", pidArg)
	case pid != who.PID && who.UID != 0:
		return nil, s.refuse("pid %d is not the caller (pid %d)", pid, who.PID)
	}
	b, err := strconv.Atoi(baseArg)
	if err != nil || b < 0 || b > 255 {
		return nil, s.refuse("base %q: want a VPID", baseArg)
	}
	l := s.leases[fabric.VPID(b)]
	switch {
	case l == nil:
		return nil, s.refuse("no lease at vpid %d", b)
	case l.pid != pid:
		return nil, s.refuse("the lease at vpid %d belongs to pid %d, not %d", b, l.pid, pid)
	case l.uid != who.UID && who.UID != 0:
		return nil, s.refuse("the lease at vpid %d belongs to another user", b)
	}
	return l, nil
}

// drop forgets a lease and withdraws its ports; s.mu is held.
func (s *attachSvc) drop(l *appLease) {
	delete(s.leases, l.grant.VPIDBase)
	for _, us := range l.ports {
		for _, u := range us {
			u()
		}
	}
}

func (s *attachSvc) handleDetach(ctx context.Context, args []string) (any, error) {
	if len(args) != 2 {
		return nil, s.refuse("usage: extds-detach PID BASE")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l, err := s.lease(ctx, args[0], args[1])
	if err != nil {
		return nil, err
	}
	if err := s.lend.Revoke(l.grant); err != nil && !errors.Is(err, fabric.ErrInvalid) {
		return nil, err // ErrInvalid: the shm layer already reclaimed it
	}
	s.drop(l)
	s.detached.Add(1)
	s.log.Info("EXT-DS lease returned", "pid", l.pid, "base", l.grant.VPIDBase)
	return struct{}{}, nil
}

func (s *attachSvc) parsePort(arg string) (uint16, error) {
	p, err := strconv.Atoi(arg)
	if err != nil || p < 1 || p > 65535 {
		return 0, s.refuse("port %q: want 1..65535", arg)
	}
	return uint16(p), nil
}

// onLeasePort parses "PID BASE PORT" (the arguments of extds-listen and
// extds-unlisten, op) into the lease and the port, and runs f on them
// with s.mu held.
func (s *attachSvc) onLeasePort(ctx context.Context, op string, args []string, f func(l *appLease, port uint16) error) (any, error) {
	if len(args) != 3 {
		return nil, s.refuse("usage: %s PID BASE PORT", op)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l, err := s.lease(ctx, args[0], args[1])
	if err != nil {
		return nil, err
	}
	port, err := s.parsePort(args[2])
	if err != nil {
		return nil, err
	}
	if err := f(l, port); err != nil {
		return nil, err
	}
	return struct{}{}, nil
}

func (s *attachSvc) handleListen(ctx context.Context, args []string) (any, error) {
	return s.onLeasePort(ctx, "extds-listen", args, func(l *appLease, port uint16) error {
		n := 0
		for _, us := range l.ports {
			n += len(us)
		}
		if n >= maxPortsPerLease {
			return s.refuse("lease at vpid %d has %d ports registered", l.grant.VPIDBase, n)
		}
		u, err := s.dev.RegisterPort(port)
		if err != nil {
			return err
		}
		l.ports[port] = append(l.ports[port], u)
		s.listens.Add(1)
		return nil
	})
}

func (s *attachSvc) handleUnlisten(ctx context.Context, args []string) (any, error) {
	return s.onLeasePort(ctx, "extds-unlisten", args, func(l *appLease, port uint16) error {
		us := l.ports[port]
		if len(us) == 0 {
			return s.refuse("port %d is not registered by the lease at vpid %d", port, l.grant.VPIDBase)
		}
		us[len(us)-1]()
		if us = us[:len(us)-1]; len(us) == 0 {
			delete(l.ports, port)
		} else {
			l.ports[port] = us
		}
		return nil
	})
}

// LeaseRow is one row of "extds-leases".
type LeaseRow struct {
	PID      int         `json:"pid"`
	VPIDBase fabric.VPID `json:"vpid_base"`
	VPIDs    int         `json:"vpids"`
	Attached bool        `json:"attached"`
	Holder   int         `json:"holder,omitempty"`
	Ports    []uint16    `json:"ports"`
	AgeSec   float64     `json:"age_seconds"`
}

// LeasesReply is the reply to "extds-leases".
type LeasesReply struct {
	Leases []LeaseRow     `json:"leases"`
	Stats  AttachStats    `json:"stats"`
	Fabric shm.LeaseStats `json:"fabric"` // the shm layer's lending counters
	Free   int            `json:"free_blocks"`
	Blocks int            `json:"blocks"`
}

func (s *attachSvc) handleLeases(ctx context.Context, args []string) (any, error) {
	if len(args) != 0 {
		return nil, fmt.Errorf("takes no arguments, have %d", len(args))
	}
	held := map[string]shm.Lease{}
	var fs shm.LeaseStats
	if s.lend != nil {
		for _, l := range s.lend.Leases() {
			held[l.Token] = l
		}
		fs = s.lend.LeaseStats()
	}
	// Root and exnd's user see every lease; anyone else only their own
	// (another user's PIDs and VPIDs are not theirs to know). A listing
	// that withheld some counts as one refusal.
	who, ok := control.PeerFrom(ctx)
	all := !ok || who.UID == 0 || who.UID == uint32(os.Geteuid())
	hidden := 0
	s.mu.Lock()
	rows := make([]LeaseRow, 0, len(s.leases))
	for _, l := range s.leases {
		if !all && l.uid != who.UID {
			hidden++
			continue
		}
		h := held[l.grant.Token]
		r := LeaseRow{PID: l.pid, VPIDBase: l.grant.VPIDBase, VPIDs: l.grant.VPIDs, Attached: h.Attached, Holder: h.Holder,
			Ports: []uint16{}, AgeSec: time.Since(l.granted).Round(time.Millisecond).Seconds()}
		for p := range l.ports {
			r.Ports = append(r.Ports, p)
		}
		sort.Slice(r.Ports, func(i, j int) bool { return r.Ports[i] < r.Ports[j] })
		rows = append(rows, r)
	}
	free := attachBlocks - len(s.leases)
	s.mu.Unlock()
	if hidden > 0 {
		s.refused.Add(1)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].VPIDBase < rows[j].VPIDBase })
	return LeasesReply{Leases: rows, Stats: s.Stats(), Fabric: fs, Free: free, Blocks: attachBlocks}, nil
}

// Stats returns the counters.
func (s *attachSvc) Stats() AttachStats {
	return AttachStats{Attached: s.attached.Load(), Detached: s.detached.Load(), Reclaimed: s.reclaimed.Load(),
		Expired: s.expired.Load(), Refused: s.refused.Load(), Listens: s.listens.Load()}
}

// sweeper ends leases whose holder let go (the shm layer reclaimed them)
// and grants never attached.
func (s *attachSvc) sweeper() {
	defer s.wg.Done()
	every(s.stop, attachSweep, s.sweep)
}

func (s *attachSvc) sweep() {
	held := map[string]shm.Lease{}
	for _, l := range s.lend.Leases() {
		held[l.Token] = l
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.leases {
		h, ok := held[l.grant.Token]
		switch {
		case !ok || h.Revoked:
			// The holder detached or died and the shm layer reclaimed
			// (or is reclaiming) the block.
			s.drop(l)
			s.reclaimed.Add(1)
			s.log.Info("EXT-DS lease reclaimed", "pid", l.pid, "base", l.grant.VPIDBase, "seen_attached", l.seen || h.Attached)
		case h.Attached:
			l.seen = true
		case h.Holder == 0 && (!sys.ProcessAlive(l.pid) || time.Since(l.granted) > attachGrace):
			s.lend.Revoke(l.grant) //nolint:errcheck // ErrInvalid: already gone
			s.drop(l)
			s.expired.Add(1)
			s.log.Info("EXT-DS lease never attached, revoked", "pid", l.pid, "base", l.grant.VPIDBase)
		}
	}
}

// Close revokes every lease (holders lose their attachments) and stops
// the sweeper.
func (s *attachSvc) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	for _, l := range s.leases {
		if s.lend != nil {
			s.lend.Revoke(l.grant) //nolint:errcheck
		}
		s.drop(l)
	}
	s.mu.Unlock()
	close(s.stop)
	s.wg.Wait()
}

package shimsrv

// The listen registry: shim-listen registers a listening socket (its port
// and inode, who made it by SO_PEERCRED) with the Device, so peers' probes
// and claims for the port are answered; shim-unlisten withdraws it; the
// sweeper drops registrations whose socket is gone. A registration is
// owned by a uid and bounded per uid (MaxListensPerUser).
//
// Locks: s.mu guards listens (and is held while the state file is written,
// saveLocked); the Device's port registration and its unregister run
// with s.mu released or are leaf calls. The sweeper runs only while
// registrations exist: with none it stops its ticker and waits for
// kickSweeper, so an idle exnd has no shimsrv timer.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"time"

	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/internal/sys"
)

// listenKey is one listening socket: its port and inode (the kernel's
// identity of the socket, shared by every process that inherited it).
type listenKey struct {
	port uint16
	ino  uint64
}

// listenReg is a registration: who made it (SO_PEERCRED) and how to
// withdraw it from the Device.
type listenReg struct {
	uid   uint32
	pid   int
	addr  netip.Addr // the socket's bound address (getsockname); invalid: unknown (an old state file)
	unreg func()
}

// listen registers the listening socket the caller hands over (its
// port, from the kernel). The registration belongs to the caller's uid
// and lives while that socket does (see sweepDead); exnd does not keep
// the descriptor, so a listener the application closes really closes.
func (s *Server) listen(ctx context.Context, r *control.Request) (any, []*os.File, error) {
	const op = "shim-listen"
	who, err := s.callerWithFile(ctx, op, "listening socket", r)
	if err != nil {
		return nil, nil, err
	}
	var port uint16
	var ino uint64
	var bound netip.AddrPort
	var ierr error
	if err := rawFD(r.Files[0], func(fd int) {
		if port, ierr = sys.ListeningTCPPort(fd); ierr == nil {
			if ino, ierr = sys.SocketInode(fd); ierr == nil {
				bound, ierr = sys.SockName(fd)
			}
		}
	}); err != nil || ierr != nil {
		return nil, nil, s.refuse(ReasonNotListening, "%s: %v", op, errors.Join(err, ierr))
	}
	k := listenKey{port: port, ino: ino}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, errors.New("shim-listen: exnd is shutting down")
	}
	if l, ok := s.listens[k]; ok {
		if l.uid != who.UID && who.UID != 0 {
			return nil, nil, s.refuseLocked(ReasonNotOwner, "%s: port %d is registered by another user", op, port)
		}
		return ListenResult{Port: port}, nil, nil // idempotent
	}
	n := 0
	for _, l := range s.listens {
		if l.uid == who.UID {
			n++
		}
	}
	if n >= MaxListensPerUser {
		return nil, nil, s.refuseLocked(ReasonLimit, "%s: uid %d has %d listeners registered", op, who.UID, n)
	}
	unreg, err := s.dev.RegisterClaimPort(port)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", op, err)
	}
	s.listens[k] = &listenReg{uid: who.UID, pid: who.PID, addr: bound.Addr(), unreg: unreg}
	s.saveLocked()
	s.kickSweeper()
	return ListenResult{Port: port}, nil, nil
}

// ListenResult is shim-listen's data.
type ListenResult struct {
	Port uint16 `json:"port"`
}

// unlisten says the caller closed its listener on PORT: registrations of
// the caller's uid for PORT whose socket is gone are dropped now (the
// sweep would drop them within a second). A socket another process still
// holds (a forked worker) stays registered.
func (s *Server) unlisten(ctx context.Context, args []string) (any, error) {
	const op = "shim-unlisten"
	who, err := s.caller(ctx, op)
	if err != nil {
		return nil, err
	}
	if len(args) != 1 {
		return nil, s.refuse(ReasonBadRequest, "%s: want PORT, got %d arguments", op, len(args))
	}
	port, err := parsePort(args[0])
	if err != nil {
		return nil, s.refuse(ReasonBadRequest, "%s: %v", op, err)
	}
	live, lerr := sys.ListeningTCP()
	var drop []func()
	s.mu.Lock()
	mine, others := 0, 0
	for k, l := range s.listens {
		if k.port != port {
			continue
		}
		if l.uid != who.UID && who.UID != 0 {
			others++
			continue
		}
		mine++
		if _, ok := live[k.ino]; lerr == nil && !ok {
			delete(s.listens, k)
			drop = append(drop, l.unreg)
		}
	}
	if len(drop) > 0 {
		s.saveLocked()
	}
	s.mu.Unlock()
	for _, f := range drop {
		f()
	}
	if mine == 0 && others > 0 {
		return nil, s.refuse(ReasonNotOwner, "%s: port %d is registered by another user", op, port)
	}
	return empty, nil
}

// sweeper drops listener registrations whose socket is gone (closed by
// every process that had it, or its processes killed). With no
// registration it stops its ticker and sleeps until one is added, so an
// idle exnd has no timer from here (docs/wakeup.md).
func (s *Server) sweeper() {
	defer s.wg.Done()
	t := time.NewTicker(s.sweep)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			if s.sweepDead() == 0 {
				t.Stop()
				select {
				case <-s.ctx.Done():
					return
				case <-s.listenAdded:
				}
				t.Reset(s.sweep)
			}
		}
	}
}

// kickSweeper wakes a sweeper idle for lack of registrations.
func (s *Server) kickSweeper() {
	select {
	case s.listenAdded <- struct{}{}:
	default: // a kick is pending
	}
}

// sweepDead drops the dead registrations and returns how many remain.
func (s *Server) sweepDead() int {
	live, err := sys.ListeningTCP()
	if err != nil {
		s.logConn(slog.LevelWarn, "extds shim: cannot list listening sockets", "err", err)
		return 1 // keep sweeping
	}
	var dead []func()
	s.mu.Lock()
	for k, l := range s.listens {
		if p, ok := live[k.ino]; !ok || p != k.port {
			delete(s.listens, k)
			dead = append(dead, l.unreg)
			s.logConn(slog.LevelInfo, "extds shim: listener gone", "port", k.port, "pid", l.pid, "uid", l.uid)
		}
	}
	if len(dead) > 0 {
		s.saveLocked()
	}
	left := len(s.listens)
	s.mu.Unlock()
	for _, f := range dead {
		f()
	}
	return left
}

// MaxListensPerUser bounds one uid's listener registrations (each costs
// a Device port registration and a sweep check).
const MaxListensPerUser = 1024

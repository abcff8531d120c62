package shimsrv

// Listener registrations that outlive exnd: with WithStateFile the
// server writes its registrations (port, socket inode, uid, pid) to a
// file after every change, and New restores those whose socket is still
// a listening TCP socket on the same port (the kernel's word,
// sys.ListeningTCP: an inode is unique while the socket exists). So a
// server program that was already running when exnd restarted (SIGTERM,
// SIGKILL, upgrade) gets EXT-DS for its next connection, without
// re-registering itself.

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/exn-project/exn/internal/sys"
)

// WithStateFile keeps registrations in path (see state.go).
func WithStateFile(path string) Option { return func(s *Server) { s.statePath = path } }

type stateEntry struct {
	Port uint16 `json:"port"`
	Ino  uint64 `json:"ino"`
	UID  uint32 `json:"uid"`
	PID  int    `json:"pid"`
	// Addr is the bound address ("" in files of older exnds: unknown).
	Addr string `json:"addr,omitempty"`
}

// saveLocked writes the registrations to the state file (s.mu held):
// a temporary file renamed over it, mode 0600.
func (s *Server) saveLocked() {
	if s.statePath == "" {
		return
	}
	es := make([]stateEntry, 0, len(s.listens))
	for k, l := range s.listens {
		e := stateEntry{Port: k.port, Ino: k.ino, UID: l.uid, PID: l.pid}
		if l.addr.IsValid() {
			e.Addr = l.addr.String()
		}
		es = append(es, e)
	}
	b, _ := json.Marshal(es)
	tmp := s.statePath + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		s.logConn(slog.LevelWarn, "extds shim: cannot save listeners", "err", err)
		return
	}
	if err := os.Rename(tmp, s.statePath); err != nil {
		s.logConn(slog.LevelWarn, "extds shim: cannot save listeners", "err", err)
	}
}

// restore registers again the listeners of the state file whose socket
// still listens on the same port. It returns how many it restored.
func (s *Server) restore() (int, error) {
	if s.statePath == "" {
		return 0, nil
	}
	if err := os.MkdirAll(filepath.Dir(s.statePath), 0o755); err != nil {
		return 0, fmt.Errorf("state file: %w", err)
	}
	b, err := os.ReadFile(s.statePath)
	if os.IsNotExist(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("state file: %w", err)
	}
	var es []stateEntry
	if err := json.Unmarshal(b, &es); err != nil {
		s.log.Warn("extds shim: state file unreadable, ignored", "path", s.statePath, "err", err)
		return 0, nil
	}
	live, err := sys.ListeningTCP()
	if err != nil {
		return 0, fmt.Errorf("state file: %w", err)
	}
	n := 0
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range es {
		k := listenKey{port: e.Port, ino: e.Ino}
		if p, ok := live[e.Ino]; !ok || p != e.Port || s.listens[k] != nil {
			continue
		}
		unreg, err := s.dev.RegisterClaimPort(e.Port)
		if err != nil {
			continue
		}
		addr, _ := netip.ParseAddr(e.Addr) // "": invalid, covers every address
		s.listens[k] = &listenReg{uid: e.UID, pid: e.PID, addr: addr, unreg: unreg}
		n++
	}
	s.saveLocked()
	if n > 0 {
		s.kickSweeper()
	}
	return n, nil
}

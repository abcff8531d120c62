package shimsrv

// Direct connections (docs/direct.md): when both programs run under the
// shim on one shm fabric, exnd hands each of them the connection's
// shared buffer and its side's bell and steps out of the data path.
//
// What exnd keeps per connection: E, its end of the socketpair whose
// other end V is the program's descriptor, and one bell: on one host its
// own dup of the program's bell B_S (it rings the peer with it after its
// terminal stores, and parks on it for the relay after exec); across
// hosts the engine's B_{1−S} (remote.go), and no bell of the program's
// side until shim-relay hands B_S over. The buffer's descriptor is closed
// once mapped (dring.Attach). Until the relay the program's waiters park
// on B_S, so exnd's endpoint never drains it (dring's SetPollOnly: a
// write of bytes from E into a full ring polls the ring instead).
//
// The pair of bells on one host (docs/direct.md, "Who holds which
// bell"): the accepting exnd's pooled buffer comes with a listener at
// NAME.b (dpool.go); the connecting exnd's open connects to it
// (directOpen, before its COMMIT); on COMMIT the accepting exnd accepts
// (acceptBell or Files.Accept in switch.go) and removes both names.
//
// exnd's part after the hand-over, per connection (one goroutine, owned
// by the Server, s.wg): watch reads E. The shim never writes V while
// the connection is direct, so watch normally sleeps in the netpoller
// until the last copy of V closes (close, exit, SIGKILL: TCP's last
// close), then stores rd_closed and fin for this side, rings the peer,
// and ends the connection. Bytes that do arrive on E (a program writing
// V behind the shim's back, or one relayed after exec) go into the
// outbound ring, so nothing is lost either way. After shim-relay (exec),
// a second goroutine, relayOut, copies the inbound ring to E, and an EOF
// on E is the program's real shutdown(SHUT_WR): watch stores fin only
// and ends the connection when V hangs up (waitHangup).
//
// exnd cannot ring its own program (it holds the same end of the bell):
// where it resets the connection for a reason of its own (the peer node
// is down, exnd stops, a corrupt buffer), it also shuts E down for
// writing (resetOwn), which makes V readable in the program's parks.
//
// Locks: s.mu guards s.dconns and s.dnext; a dconn's fields are fixed
// once it is entered, except relaying (atomic). The Endpoint does its own
// locking (extds/dring).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/extds/dring"
	"github.com/exn-project/exn/extds/rdirect"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/sys"
)

// DirectConfig enables direct connections: the fabric's name (in the
// buffers' file names) and the directory of the buffers, this node, and
// the ring size per direction. With Engine nil the fabric is shm and both
// programs map one buffer (one host); with an Engine each node has its
// own copy, joined over the fabric by the engine (across hosts,
// remote.go), which the Server uses but does not own or close.
type DirectConfig struct {
	Fabric string
	Dir    string
	Node   fabric.NodeID
	Ring   int
	Engine *rdirect.Engine
	// ReclaimIdle: how long a direction moves no byte before its ring's
	// pages go back (reclaim.go; exnd's default is DefaultReclaimIdle);
	// 0 or less: never.
	ReclaimIdle time.Duration
	// ReclaimRemote: reclaim across hosts too (Engine set). Only for a
	// fabric whose RMA reads the buffer by address (net): a NIC that
	// pins a registered buffer (ofi) would keep reading the old pages.
	ReclaimRemote bool
}

// WithDirect lets the server make and take direct connections.
func WithDirect(c DirectConfig) Option { return func(s *Server) { s.directCfg = &c } }

// dconn is one direct connection, from this side.
type dconn struct {
	id       uint64
	pid      int
	uid      uint32
	side     string
	ep       *dring.Endpoint
	uc       *net.UnixConn // E
	vIno     uint64        // V's inode: shim-relay finds the connection by it
	bellIno  uint64        // B_S's inode: shim-relay's bell must be it
	local    string
	remote   string
	peer     string
	node     fabric.NodeID // the peer's node
	lport    uint16        // the local TCP port (accept: the listener's)
	since    time.Time
	upgraded bool         // made by shim-connect/accept upgrade (upgrade.go): not timed for holds
	rcl      reclaimState // the reclaimer's alone (reclaim.go)
	relaying atomic.Bool
	rem      *remoteSide // across hosts: this side's engine connection (remote.go)
}

// directLivenessPeriod is how often the peer nodes of open direct
// connections are checked on a fabric that cannot announce a change of
// its peers (no fabric.PeerWatcher; direct connections are made on shm,
// which can, so this is the fallback): the shm fabric's own idle
// liveness period (fabric/shm, idleLivenessPeriod), and only while a
// direct connection is open. A peer node that died with its program
// (nobody left to store fin) must not leave this side's program waiting
// forever.
const directLivenessPeriod = time.Second

// directOpen is the connecting side's open hook: the accepting exnd made
// the buffer and its listener; open the buffer and connect side 0's bell
// (no wait for the accept: docs/direct.md), before COMMIT, and keep them
// for prepareDirect.
func (s *Server) directOpen(out **dring.Files) func(*extds.DirectInfo) error {
	return func(di *extds.DirectInfo) error {
		fs, err := dring.Open(s.directCfg.Dir, dring.Name(s.directCfg.Fabric, di.Node, di.ID))
		if err != nil {
			return err
		}
		*out = fs
		return nil
	}
}

// directCreate is the accepting side's create hook: a buffer from the
// pool (dpool.go), or a new one.
func (s *Server) directCreate(out **dring.Files, name *string) func() (extds.DirectInfo, error) {
	return func() (extds.DirectInfo, error) {
		b, err := s.takeBuf()
		if err != nil {
			return extds.DirectInfo{}, err
		}
		*out, *name = b.fs, b.name
		return extds.DirectInfo{Node: s.directCfg.Node, Token: uint32(b.id) | 1, ID: b.id, Ring: uint32(s.directCfg.Ring)}, nil
	}
}

// directPrep is a direct connection made ready for the program but not
// yet entered: the accepting side prepares it while the client's COMMIT
// is on its way (extds.Claim.AgreeDirect), and on one host takes the
// bell only on COMMIT (acceptBell).
type directPrep struct {
	dc  *dconn
	out []*os.File   // the program's descriptors: V, the buffer, B_S (acceptBell adds it)
	lis *dring.Files // one host, accepting before COMMIT: the listener of B_1
	si  int
}

// discard undoes prepareDirect: the program never gets the connection.
// reset stores rst in the buffer first, for a client that may be using
// it (closing the listener ends a bell it connected).
func (p *directPrep) discard(reset bool) {
	if reset {
		p.dc.ep.Reset()
	}
	p.dc.rem.close()
	p.dc.ep.Close()
	p.dc.uc.Close()
	if p.lis != nil {
		p.lis.Close()
	}
	for _, f := range p.out {
		f.Close()
	}
}

// acceptBell takes B_1 from the listener once the client committed (one
// host, where prepareDirect ran before COMMIT): the program's dup goes
// into out, exnd's own to its endpoint. Without a listener it does
// nothing. On error the caller discards p with a reset.
func (p *directPrep) acceptBell() error {
	if p.lis == nil {
		return nil
	}
	if err := p.lis.Accept(); err != nil {
		return err
	}
	b := p.lis.Bell[1]
	p.lis.Bell[1] = nil
	p.lis.Close()
	p.lis = nil
	d, err := dupFile(b)
	if err != nil {
		b.Close()
		return err
	}
	p.out = append(p.out, d)
	var st unix.Stat_t
	if err := rawStat(d, &st); err != nil {
		b.Close()
		return err
	}
	p.dc.bellIno = st.Ino
	return p.dc.ep.SetBell(b)
}

// settleNamed ends the names of a buffer that the accepting side made
// on one host (dname; "" for none: nothing to do), once the agreement
// ended with err and di. The client has opened the buffer and connected
// its bell (it committed) or never will: on its commit side 1's bell is
// taken from the listener, prep's (or fs's when nothing was prepared);
// nothing queued there is an error, which the caller answers with a
// reset. Either way the names go now. It returns err, or the bell's
// error.
func (s *Server) settleNamed(dname string, err error, di *extds.DirectInfo, prep *directPrep, fs *dring.Files) error {
	if dname == "" {
		return err
	}
	if err == nil && di != nil {
		if prep != nil {
			err = prep.acceptBell()
		} else if fs != nil {
			err = fs.Accept()
		}
	}
	if rerr := dring.Remove(s.directCfg.Dir, dname); rerr != nil {
		s.logConn(slog.LevelWarn, "extds shim: remove direct files", "err", rerr)
	}
	return err
}

// resetFiles stores rst in a buffer exnd will not use (a peer may have
// it mapped) and closes fs, which it takes over.
func resetFiles(fs *dring.Files, side int) {
	if ep, err := dring.Attach(fs, side); err == nil { // Attach closes fs on error
		ep.Reset()
		ep.Close()
	}
}

// prepareDirect attaches fs (which it takes over) as this side and makes
// the program's descriptors: V, the buffer and, if fs has it, the side's
// bell B_S (docs/direct.md); enterDirect hands them over. exnd's
// endpoint keeps its own dup of B_S on one host; across hosts (rem, the
// engine's side, whose Kick the endpoint rings with) the program gets
// B_S itself and exnd keeps none. A one-host acceptor's fs still has
// the listener instead of B_1: the Prep keeps it for acceptBell. When it
// fails after attaching, it resets the buffer (the peer may be direct
// already); rem stays the caller's on error.
func (s *Server) prepareDirect(fs *dring.Files, di *extds.DirectInfo, local, remote net.Addr, who control.Peer, side string, rem *remoteSide) (*directPrep, error) {
	si := 0
	if side == sideAccept {
		si = 1
	}
	var out []*os.File
	fail := func(err error) (*directPrep, error) {
		for _, f := range out {
			f.Close()
		}
		resetFiles(fs, si)
		return nil, err
	}
	app, mine, err := sys.Socketpair("extds-direct")
	if err != nil {
		return fail(err)
	}
	out = append(out, app)
	var st unix.Stat_t
	if err := rawStat(app, &st); err != nil {
		mine.Close()
		return fail(err)
	}
	vIno := st.Ino
	buf, err := dupFile(fs.Buf)
	if err != nil {
		mine.Close()
		return fail(err)
	}
	out = append(out, buf)
	var bellIno uint64
	if b := fs.Bell[si]; b != nil {
		if rem == nil {
			if b, err = dupFile(b); err != nil { // the program's; exnd keeps fs'
				mine.Close()
				return fail(err)
			}
		} else {
			fs.Bell[si] = nil // the program's alone
		}
		out = append(out, b)
		if err := rawStat(b, &st); err != nil {
			mine.Close()
			return fail(err)
		}
		bellIno = st.Ino
	}
	mc, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		return fail(err)
	}
	uc, ok := mc.(*net.UnixConn)
	if !ok {
		mc.Close()
		return fail(fmt.Errorf("socketpair end is a %T", mc))
	}
	// exnd's endpoint takes the buffer and its bell, if any; fs keeps
	// the listener, if any.
	epfs := &dring.Files{Buf: fs.Buf}
	epfs.Bell[si] = fs.Bell[si]
	fs.Buf, fs.Bell[si] = nil, nil
	ep, err := dring.Attach(epfs, si)
	if err != nil {
		uc.Close()
		fs.Close()
		for _, f := range out {
			f.Close()
		}
		return nil, err
	}
	if rem != nil {
		ep.SetRinger(rem.rc.Kick) // no bell: the engine is the peer, in this process
	}
	// The program's waiters park on B_S: exnd must not drain it until it
	// relays the side (SetRelay).
	ep.SetPollOnly(true)
	dc := &dconn{
		pid: who.PID, uid: who.UID, side: side, ep: ep, uc: uc, vIno: vIno, bellIno: bellIno,
		local: local.String(), remote: remote.String(),
		peer: fmt.Sprint(di.Node), node: di.Node, since: time.Now(), rem: rem,
	}
	if la, ok := tcpAddrPort(local); ok {
		dc.lport = la.Port()
	}
	p := &directPrep{dc: dc, out: out, si: si}
	if fs.Listening() {
		p.lis = fs
	} else {
		fs.Close()
	}
	return p, nil
}

// enterDirect enters a prepared connection and starts watching it; the
// result is shim-connect's / shim-accept's answer.
func (s *Server) enterDirect(p *directPrep) (any, []*os.File, error) {
	dc := p.dc
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		p.discard(true)
		return nil, nil, errors.New("exnd is shutting down")
	}
	s.nextID++
	dc.id = s.nextID
	s.dconns[dc.id] = dc
	s.dpeak = max(s.dpeak, len(s.dconns))
	s.wg.Add(1)
	// Across hosts the engine watches the peer nodes itself
	// (rdirect.Config.Liveness) and resets their connections: a second
	// watcher here would only poll the same fabric again.
	local := dc.rem == nil
	if local && !s.livenessOn {
		s.livenessOn = true
		s.wg.Add(1)
		// The watch channel is taken here, before checkPeer below: a
		// change announced after the check closes it, however late the
		// goroutine starts.
		go s.directLiveness(s.dev.PeersChanged())
	}
	s.startReclaimLocked()
	s.mu.Unlock()
	go s.watch(dc)
	if local {
		s.checkPeer(dc) // after it is in s.dconns: see directLiveness
	}
	s.directConns.Add(1)
	s.switched.Add(1)
	s.logConn(slog.LevelDebug, "extds shim: direct", "id", dc.id, "side", dc.side, "pid", dc.pid,
		"uid", dc.uid, "local", dc.local, "remote", dc.remote, "peer", dc.peer, "ring", dc.ep.Ring())
	si := p.si
	return SwitchResult{Mode: "direct", ID: dc.id, Side: &si, Ring: dc.ep.Ring()}, p.out, nil
}

// dupFile duplicates f's descriptor (close-on-exec) without touching its
// mode (f.Fd() would make a non-blocking descriptor blocking).
func dupFile(f *os.File) (*os.File, error) {
	nfd, derr := -1, error(nil)
	if err := rawFD(f, func(fd int) { nfd, derr = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, fmt.Errorf("dup: %w", derr)
	}
	return os.NewFile(uintptr(nfd), f.Name()), nil
}

// rawStat is fstat of f's descriptor (rawFD: no change of mode).
func rawStat(f *os.File, st *unix.Stat_t) error {
	var serr error
	if err := rawFD(f, func(fd int) { serr = unix.Fstat(fd, st) }); err != nil {
		return err
	}
	return serr
}

// watch is exnd's goroutine for a direct connection: E → outbound ring
// until the program's last descriptor closes, then fin, rd_closed, end.
func (s *Server) watch(dc *dconn) {
	defer s.wg.Done()
	rerr, werr := pump(dc.ep, dc.uc)
	switch {
	case werr != nil:
		// The peer is gone or reset, or the buffer is corrupt (the
		// endpoint stored rst itself: exnd's own reset): the program's
		// socket must see it too.
		if errors.Is(werr, dring.ErrCorrupt) {
			s.resetOwn(dc, false)
		}
		dc.uc.CloseRead()
		s.resets.Add(1)
	case errors.Is(rerr, io.EOF) && dc.relaying.Load():
		// Relayed (after exec), EOF is the program's real
		// shutdown(SHUT_WR) on V, not yet its last close: fin, and the
		// other direction goes on until V hangs up.
		dc.ep.CloseWrite()
		waitHangup(dc.uc)
	case !errors.Is(rerr, io.EOF) && !errors.Is(rerr, net.ErrClosed):
		s.logConn(slog.LevelDebug, "extds shim: direct socket", "id", dc.id, "err", rerr)
	}
	// rd_closed before fin: a peer that has read the EOF then finds
	// its writes refused, never accepted into a ring nobody reads. Each
	// rings the peer if it waits (one host: through exnd's dup of B_S;
	// across hosts the endpoint kicks the engine).
	dc.ep.CloseRead()
	dc.ep.CloseWrite()
	s.endDirect(dc)
}

// resetOwn is exnd's own reset of dc (the peer node is down, exnd
// stops, a corrupt buffer): rst in the buffer (the peer is rung; unless
// stored already) and shutdown(E, SHUT_WR), which makes V readable (EOF)
// in every park of the program's side, since exnd cannot ring its own
// side's bell (docs/direct.md, "exnd waking its own program"). The
// shim, finding V readable without relay[S], reads rst.
func (s *Server) resetOwn(dc *dconn, store bool) {
	if store {
		dc.ep.Reset()
	}
	_ = dc.uc.CloseWrite()
}

// waitHangup returns when every descriptor of V is closed (E shows
// POLLHUP: a shutdown(SHUT_WR) alone does not give it) or E is closed.
func waitHangup(uc *net.UnixConn) {
	rc, err := uc.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Read(func(fd uintptr) bool {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		_, err := unix.Poll(p, 0)
		return err != nil || p[0].Revents&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0
	})
}

// relayOut copies the inbound ring to E for a side handed over by
// shim-relay.
func (s *Server) relayOut(dc *dconn) {
	defer s.wg.Done()
	rerr, werr := pump(dc.uc, dc.ep)
	switch {
	case werr != nil:
		dc.ep.CloseRead()
	case errors.Is(rerr, io.EOF):
		dc.uc.CloseWrite()
	default:
		dc.uc.Close() // a reset: the program's reads fail
	}
}

// pump copies src to dst through a pooled buffer until a read from src
// fails (rerr, io.EOF at its end) or a write to dst does (werr; rerr is
// then nil).
func pump(dst io.Writer, src io.Reader) (rerr, werr error) {
	buf := bufPool.Get().(*[]byte)
	defer bufPool.Put(buf)
	for {
		n, err := src.Read(*buf)
		if n > 0 {
			if _, werr := dst.Write((*buf)[:n]); werr != nil {
				return nil, werr
			}
		}
		if err != nil {
			return err, nil
		}
	}
}

// endDirect drops dc: its byte counts go into the totals.
func (s *Server) endDirect(dc *dconn) {
	s.mu.Lock()
	_, ok := s.dconns[dc.id]
	delete(s.dconns, dc.id)
	s.mu.Unlock()
	if !ok {
		return
	}
	if !dc.upgraded {
		s.connEnded(dc.side, dc.lport, dc.since)
	}
	sent, recvd := dc.ep.Counters()
	s.directOut.Add(sent)
	s.directIn.Add(recvd)
	dc.uc.Close()
	dc.ep.Close()
	s.endRemote(dc.rem) // across hosts: after the engine finished
}

// relay is shim-relay: the program is about to exec with a direct
// descriptor open; from now on exnd moves this side's bytes over V. The
// request carries V and the side's bell B_S (docs/direct.md, "exec"):
// exnd parks on that bell for the side from then on. Across hosts it is
// the only B_S exnd gets (the endpoint takes it over; the control
// server's file of it is in Go's netpoller, which only costs wake-ups
// while the relay parks anyway); on one host exnd has its own dup
// already and closes it. A request with V alone (an
// older shim) is relayed too; across hosts the relay then polls its
// ring (dring.Endpoint without a bell).
func (s *Server) relay(ctx context.Context, r *control.Request) (any, []*os.File, error) {
	const op = "shim-relay"
	who, err := s.caller(ctx, op)
	if err != nil {
		return nil, nil, err
	}
	if len(r.Args) != 0 || len(r.Files) < 1 || len(r.Files) > 2 {
		return nil, nil, s.refuse(ReasonBadRequest, "%s: want no arguments and V and its bell, got %d and %d descriptors", op, len(r.Args), len(r.Files))
	}
	var st unix.Stat_t
	if err := rawStat(r.Files[0], &st); err != nil {
		return nil, nil, s.refuse(ReasonBadRequest, "%s: %v", op, err)
	}
	vIno, bellIno := st.Ino, uint64(0)
	if len(r.Files) == 2 {
		if err := rawStat(r.Files[1], &st); err != nil {
			return nil, nil, s.refuse(ReasonBadRequest, "%s: %v", op, err)
		}
		bellIno = st.Ino
	}
	s.mu.Lock()
	var dc *dconn
	for _, c := range s.dconns {
		if c.vIno == vIno {
			dc = c
			break
		}
	}
	if dc == nil {
		s.mu.Unlock()
		return nil, nil, s.refuse(ReasonBadRequest, "%s: not a direct connection of this exnd", op)
	}
	if dc.uid != who.UID && !privileged(who) {
		s.mu.Unlock()
		return nil, nil, s.refuse(ReasonNotOwner, "%s: connection %d belongs to another user", op, dc.id)
	}
	if bellIno != 0 && bellIno != dc.bellIno {
		s.mu.Unlock()
		return nil, nil, s.refuse(ReasonBadRequest, "%s: the second descriptor is not connection %d's bell", op, dc.id)
	}
	start := !dc.relaying.Swap(true)
	if start {
		s.wg.Add(1)
	}
	s.mu.Unlock()
	if start {
		if bellIno != 0 {
			bell := r.Files[1]
			r.Files[1] = nil // ours now (the control server closes the rest)
			if err := dc.ep.SetBell(bell); err != nil {
				s.logConn(slog.LevelDebug, "extds shim: relay's bell", "id", dc.id, "err", err)
			}
		}
		dc.ep.SetRelay()
		go s.relayOut(dc)
		s.relays.Add(1)
	}
	return struct{}{}, nil, nil
}

// directLiveness resets the direct connections whose peer node the
// fabric declares down. It runs while direct connections exist. Where
// the fabric announces changes of its peers (fabric/shm's PeerWatcher,
// fed by the fabric's own liveness protocol) it has no timer: it checks
// at each change, and ends (livenessOn false) at the first change that
// finds no direct connection. Otherwise it polls every
// directLivenessPeriod and ends at the first tick with none. A
// connection entered after a check is checked once by enterDirect
// (checkPeer), so a node that died before the connection was entered
// is not missed either. changed is the fabric's watch channel as it was
// before that first check (nil: poll), so a change announced between
// the check and this goroutine's start is not missed.
func (s *Server) directLiveness(changed <-chan struct{}) {
	defer s.wg.Done()
	if s.livenessStarted != nil {
		s.livenessStarted()
	}
	var tick <-chan time.Time
	if changed == nil {
		t := time.NewTicker(s.livenessPeriod)
		defer t.Stop()
		tick = t.C
	}
	var dcs []*dconn
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-tick:
		case <-changed:
			changed = s.dev.PeersChanged() // before PeerAlive: no change is missed
		}
		var ok bool
		if dcs, ok = s.dconnsOrStop(dcs, func() { s.livenessOn = false }); !ok {
			return
		}
		for _, dc := range dcs {
			s.checkPeer(dc)
		}
		clear(dcs)
	}
}

// dconnsOrStop copies the direct connections into dcs[:0] for a
// goroutine that runs while there are some (directLiveness, reclaimer).
// With none, it calls stop under s.mu, so that a connection entered
// next starts the goroutine again, and reports false.
func (s *Server) dconnsOrStop(dcs []*dconn, stop func()) ([]*dconn, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.dconns) == 0 {
		stop()
		return dcs, false
	}
	dcs = dcs[:0]
	for _, dc := range s.dconns {
		dcs = append(dcs, dc)
	}
	return dcs, true
}

// checkPeer resets dc if the fabric declares its peer node down.
func (s *Server) checkPeer(dc *dconn) {
	if err := s.dev.PeerAlive(dc.node); err != nil {
		s.logConn(slog.LevelInfo, "extds shim: direct connection's peer node is down, reset", "id", dc.id, "peer", dc.peer, "err", err)
		s.resets.Add(1)
		s.resetOwn(dc, true)
		dc.uc.Close() // watch ends the connection
	}
}

// closeDirect ends every direct connection (Close): reset, so both
// programs see ECONNRESET rather than a stream that stops.
func (s *Server) closeDirect() {
	s.mu.Lock()
	dcs := make([]*dconn, 0, len(s.dconns))
	for _, dc := range s.dconns {
		dcs = append(dcs, dc)
	}
	s.mu.Unlock()
	for _, dc := range dcs {
		s.resetOwn(dc, true)
		dc.uc.Close() // watch ends, and with it the connection
	}
}

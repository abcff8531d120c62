package shimsrv

// Direct connections across hosts (issue #38, docs/direct.md "Across
// hosts"): on a fabric whose nodes cannot map each other's memory (net,
// ofi), each side's exnd makes its own connection buffer, hands it to its
// program exactly as on one host (the same three descriptors, the same
// layout), and plays the peer side of it itself through the engine
// (extds/rdirect), which joins the two copies by RMA PUT and cursor
// messages. The program cannot tell the difference.
//
// Stages, per connection:
//
//	accepting exnd                              connecting exnd
//	remoteCreate: a pooled buffer, mapped,
//	  Engine.Prepare → CLAIM_RDIRECT ─────────→ remoteOpen: its own buffer,
//	                                              Prepare, Start(acceptor)
//	                  ←────────────────────────── COMMIT_R (its id and NLA)
//	startRemote: Start(client)
//	both: prepareDirect and enterDirect as on one host (dc.rc, dc.rmem)
//	  (the mid-stream upgrade, upgrade.go, goes through the same hooks,
//	  agreed by OfferDirect and AgreeUpgrade instead)
//	last close (watch): fin and rd_closed in the buffer; endRemote kicks
//	  the engine, waits for it to finish (or remoteLinger), then closes
//	  the Conn and the engine's bell and unmaps.
//
// The bells: prepareRemote makes the pair with a socketpair; B_S goes to
// the program (prepareDirect hands it over and keeps no dup) and the
// engine keeps B_{1−S}, one epoll registration. exnd so holds E and
// B_{1−S} per connection; its endpoint has no bell and kicks the engine
// instead (dring.Endpoint.SetRinger, Conn.Kick), until shim-relay hands
// it B_S for the relay after exec.
//
// Ownership: a remoteSide owns its mapping (rmem) and the engine's bell
// (bell), from remoteCreate/remoteOpen until close; dconn takes it over
// in prepareDirect. The buffers have no names (dpool.go's makeBuf
// removes them at once): nobody else opens them, and an exnd that dies
// leaves nothing in the directory.
//
// Locks: none of its own; a remoteSide is used by one goroutine at a time
// (the switch, then watch).

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/extds/dring"
	"github.com/exn-project/exn/extds/rdirect"
	"github.com/exn-project/exn/internal/sys"
)

// remoteLinger bounds how long exnd keeps a closed cross-host direct
// connection after its program's last close, for the engine to PUT the
// bytes still in the ring and for the peer's fin: TCP's FIN_WAIT_2 bound
// (Linux tcp_fin_timeout, 60 s). A peer program that never closes its
// end costs this connection's buffer for that long, then a reset.
const remoteLinger = 60 * time.Second

// remoteSide is this node's half of a cross-host direct connection.
type remoteSide struct {
	rc   *rdirect.Conn
	rmem []byte   // exnd's own mapping of the buffer
	bell *os.File // B_{1−S}, the engine's
}

// close resets what has not finished, then releases the engine's
// connection, the mapping and the bell (in that order: the engine
// touches neither once Close returned).
func (r *remoteSide) close() {
	if r == nil {
		return
	}
	if r.rc != nil {
		_ = r.rc.Close()
	}
	_ = sys.Unmap(r.rmem)
	if r.bell != nil {
		r.bell.Close()
	}
}

// prepareRemote maps fs's buffer for exnd's engine, marks it a
// cross-host copy in its upgrade word (dring.UpgXHost), makes the bells
// and the engine's connection, where the program is side si: on success
// fs.Bell[si] is the program's bell B_si (fs stays the caller's) and
// the engine has B_{1−si}.
func (s *Server) prepareRemote(fs *dring.Files, si int) (*remoteSide, error) {
	st, err := fs.Buf.Stat()
	if err != nil {
		return nil, err
	}
	r := &remoteSide{}
	var prog *os.File
	fail := func(err error) (*remoteSide, error) {
		r.close()
		if prog != nil {
			prog.Close()
		}
		return nil, fmt.Errorf("cross-host direct connection: %w", err)
	}
	b0, b1, err := dring.NewBells()
	if err != nil {
		return fail(err)
	}
	prog, r.bell = b0, b1
	if si == 1 {
		prog, r.bell = b1, b0
	}
	if r.rmem, err = sys.MapShared(fs.Buf, int(st.Size())); err != nil {
		return fail(err)
	}
	// Before the program can see the buffer: its shim asks to move
	// instead of moving on an upgrade (extds/dring's UpgXHost).
	w, err := dring.UpgradeWord(r.rmem)
	if err != nil {
		return fail(err)
	}
	w.Or(dring.UpgXHost)
	if r.rc, err = s.directCfg.Engine.Prepare(r.rmem, si, r.bell); err != nil {
		return fail(err)
	}
	fs.Bell[si] = prog
	return r, nil
}

// remoteCreate is the accepting side's create hook across hosts: a
// buffer from the pool, prepared for the engine; CLAIM_RDIRECT names its
// engine connection and NLA.
func (s *Server) remoteCreate(out **dring.Files, rem **remoteSide) func() (extds.DirectInfo, error) {
	return func() (extds.DirectInfo, error) {
		b, err := s.takeBuf() // unnamed already (makeBuf)
		if err != nil {
			return extds.DirectInfo{}, err
		}
		r, err := s.prepareRemote(b.fs, 1)
		if err != nil {
			b.fs.Close()
			return extds.DirectInfo{}, err
		}
		*out, *rem = b.fs, r
		return extds.DirectInfo{Node: s.directCfg.Node, Token: uint32(b.id) | 1, ID: r.rc.LocalID(),
			Ring: uint32(r.rc.Ring()), Remote: true, NLA: r.rc.LocalNLA()}, nil
	}
}

// remoteOpen is the connecting side's open hook across hosts: its own
// buffer, prepared and started towards the acceptor's; di gets this
// side's engine connection and NLA for COMMIT_R.
func (s *Server) remoteOpen(out **dring.Files, rem **remoteSide) func(*extds.DirectInfo) error {
	return func(di *extds.DirectInfo) error {
		if !di.Remote {
			return errors.New("the acceptor offers a one-host direct connection; this exnd makes them across hosts only")
		}
		if int(di.Ring) != s.directCfg.Ring {
			return fmt.Errorf("ring size %d, this node's is %d", di.Ring, s.directCfg.Ring)
		}
		b, err := s.takeBuf()
		if err != nil {
			return err
		}
		r, err := s.prepareRemote(b.fs, 0)
		if err != nil {
			b.fs.Close()
			return err
		}
		if err := r.rc.Start(di.Node, di.ID, di.NLA); err != nil {
			r.close()
			b.fs.Close()
			return err
		}
		di.ClientID, di.ClientNLA = r.rc.LocalID(), r.rc.LocalNLA()
		*out, *rem = b.fs, r
		return nil
	}
}

// startRemote starts the accepting side's engine connection across
// hosts (p.dc.rem) towards the client's, which came with its COMMIT_R
// (di), from the node the fabric names. Without a remote side or an
// agreed cross-host connection (p or di nil) it does nothing. On error
// the caller discards p with a reset (switch.go, upgrade.go).
func (p *directPrep) startRemote(di *extds.DirectInfo) error {
	if p == nil || di == nil || !di.Remote || p.dc.rem == nil {
		return nil
	}
	p.dc.node, p.dc.peer = di.ClientNode, fmt.Sprint(di.ClientNode)
	return p.dc.rem.rc.Start(di.ClientNode, di.ClientID, di.ClientNLA)
}

// endRemote ends this side's engine connection once the program has let
// go: the engine PUTs what is left in the ring, announces fin, and waits
// for the peer's, within remoteLinger (exnd's shutdown cuts it short,
// with a reset).
func (s *Server) endRemote(r *remoteSide) {
	if r == nil {
		return
	}
	// exnd's stores (fin and rd_closed at the last close, or rst) rang
	// no bell: the program's is not exnd's to ring.
	r.rc.Kick()
	t := time.NewTimer(remoteLinger)
	defer t.Stop()
	select {
	case <-r.rc.Done():
	case <-t.C:
		s.resets.Add(1)
	case <-s.ctx.Done():
	}
	r.close()
}

package shimsrv

// shim-connect upgrade / shim-accept upgrade: the mid-stream upgrade of
// docs/shim.md ("Upgrade", issue #33). The program's TCP connection is
// established and in use, and stays the program's: exnd reads its
// addresses and nothing else (no net.FileConn, which would flip
// O_NONBLOCK on the open file the program shares; no peek, no hello),
// agrees a direct connection with the peer's exnd out of band (the CLAIM
// exchange of extds/internal/agree/claimdirect.go, keyed by the
// 4-tuple), and answers as for "direct": V, the buffer and the side's
// bell. The shim does not wait for the answer: it reads it at its next
// call on the descriptor, and the two programs then move their streams
// onto the buffer at a byte boundary of their own (shim/upgrade.c).
// Whatever fails, the answer is "tcp" with a counted reason, and the
// connection simply stays TCP: nothing was written into it.
//
// Across hosts (DirectConfig.Engine) each exnd makes its own copy of the
// buffer as for a connect-time direct connection (remote.go, the same
// hooks as switch.go's): the client's is started in its open hook, the
// acceptor's on the client's COMMIT_R. The copy comes marked UpgXHost
// (prepareRemote): the shim then asks to move (UpgReq) instead of moving,
// and the engines carry the upgrade word between the copies and grant
// the moves (extds/rdirect/upgrade.go).
//
// Locks: s.mu for the set of 4-tuples being upgraded (one request per
// connection, whichever process of a forked family asks first); none
// across the agreement.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/extds/dring"
)

// ArgUpgrade is shim-connect's and shim-accept's argument for an
// established connection to upgrade in the background.
const ArgUpgrade = "upgrade"

// Fallback reasons of an upgrade (Stats.Fallbacks) besides extds's.
const (
	// ReasonUpgradeBusy: another request for the same connection is
	// being agreed (two processes of a forked family asked).
	ReasonUpgradeBusy = "upgrade_busy"
	// ReasonNoDirect: this exnd makes no direct connections.
	ReasonNoDirect = "no_direct"
)

// upgradeClaimWait bounds how long an acceptor's upgrade waits for the
// client's CLAIM. The two programs ask independently, each at its first
// call after the connection's age passed the shim's UPG_AGE_NS; a busy
// connection asks on both sides within a round trip, an idle one when it
// is next used (the shim retries a connection that was not agreed,
// shim/upgrade.c). The client waits as long (agree.UpgradeClaimTimeout),
// and its CLAIM is kept twice that on this side.
const upgradeClaimWait = extds.UpgradeClaimTimeout

// upgradeFD answers shim-connect upgrade / shim-accept upgrade for the
// program's socket f (owned by the control server).
func (s *Server) upgradeFD(ctx context.Context, f *os.File, who control.Peer, side string) (any, []*os.File, error) {
	_, ts, err := readTCPSocket(f, true)
	if err != nil {
		return nil, nil, err
	}
	// exnd's copy of the program's socket goes at once: the program's
	// close must end the connection when it happens, not after the
	// agreement (the control server's own Close then does nothing).
	f.Close()
	tcp := func(reason string) (any, []*os.File, error) {
		s.fallback(reason)
		return SwitchResult{Mode: "tcp", Reason: reason}, nil, nil
	}
	switch {
	case s.directCfg == nil:
		return tcp(ReasonNoDirect)
	case side == sideAccept && !s.mayAccept(who, ts.local):
		_ = s.refuse(ReasonNotOwner, "shim-accept upgrade: port %d is registered by another user", ts.local.Port())
		return tcp(ReasonNotOwner)
	case !s.dev.OnFabric(ts.remote.Addr()):
		return tcp(extds.FallbackNoRoute.String())
	}
	key := extds.TupleKey{Local: ts.local, Remote: ts.remote}
	if !s.upgradeBegin(key) {
		return tcp(ReasonUpgradeBusy)
	}
	defer s.upgradeEnd(key)
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	local, remote := net.TCPAddrFromAddrPort(ts.local), net.TCPAddrFromAddrPort(ts.remote)

	var (
		fs   *dring.Files
		rem  *remoteSide // across hosts (remote.go): until a dconn takes it over
		di   *extds.DirectInfo
		prep *directPrep
		why  extds.FallbackReason
	)
	if side == sideConnect {
		open := s.directOpen(&fs)
		if s.directCfg.Engine != nil {
			open = s.remoteOpen(&fs, &rem)
		}
		di, why, err = s.dev.OfferDirect(ctx, ts.local, ts.remote, open)
		if err == nil && di != nil {
			prep, err = s.prepareDirect(fs, di, local, remote, who, side, rem)
			fs = nil
			if prep != nil {
				rem = nil // prep.dc's
			}
		}
	} else {
		prep, why, err = s.upgradeAccept(ctx, key, local, remote, who)
	}
	if fs != nil {
		fs.Close()
	}
	rem.close() // made, and never entered: reset (the peer may have started)
	if err != nil {
		s.errs.Add(1)
		s.logConn(slog.LevelWarn, "extds shim: upgrade failed", "side", side, "pid", who.PID, "err", err)
		return nil, nil, fmt.Errorf("shim-%s upgrade: %w", side, err)
	}
	if prep == nil {
		return tcp(why.String())
	}
	prep.dc.upgraded = true
	return s.enterDirect(prep)
}

// upgradeAccept is the acceptor's side: claim the connection key, wait
// for the client's direct CLAIM (upgradeClaimWait), and make the buffer
// (across hosts this node's copy, started on the client's COMMIT_R).
// prep is nil with the fallback reason when no direct connection came
// of it.
func (s *Server) upgradeAccept(ctx context.Context, key extds.TupleKey, local, remote net.Addr, who control.Peer) (*directPrep, extds.FallbackReason, error) {
	wake := make(chan struct{}, 1)
	cl := s.dev.ClaimDirect(key, func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	defer cl.Close()
	if cl.Held() {
		return nil, extds.FallbackShortLived, nil
	}
	if !cl.DirectPending() {
		t := time.NewTimer(upgradeClaimWait)
		select {
		case <-wake:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	if !cl.DirectPending() {
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
		return nil, extds.FallbackNoClaim, nil
	}
	var (
		fs    *dring.Files
		dname string
		rem   *remoteSide // across hosts: until a dconn takes it over
		prep  *directPrep
		perr  error
	)
	create := s.directCreate(&fs, &dname)
	if s.directCfg.Engine != nil {
		create = s.remoteCreate(&fs, &rem)
	}
	prepare := func(di extds.DirectInfo) {
		prep, perr = s.prepareDirect(fs, &di, local, remote, who, sideAccept, rem)
		fs = nil // taken over
		if prep != nil {
			rem = nil // prep.dc's
		}
	}
	di, aborted, err := cl.AgreeUpgrade(ctx, create, prepare)
	err = s.settleNamed(dname, err, di, prep, fs)
	if err == nil && perr != nil {
		err = perr // prepareDirect reset the buffer
	}
	if err == nil {
		err = prep.startRemote(di)
	}
	if prep != nil && (err != nil || di == nil) {
		prep.discard(err != nil) // the client may be direct: reset
		prep = nil
	}
	if fs != nil {
		if err != nil {
			resetFiles(fs, 1)
		} else {
			fs.Close()
		}
	}
	rem.close() // made, and never entered: reset (the client may have started)
	switch {
	case err != nil:
		return nil, 0, err
	case aborted:
		return nil, extds.FallbackDirectAbort, nil
	case di == nil:
		return nil, extds.FallbackDeclined, nil
	case prep == nil:
		return nil, 0, errors.New("direct connection agreed but not prepared")
	}
	return prep, 0, nil
}

// upgradeBegin enters key in the set of connections being upgraded;
// false if it is there already.
func (s *Server) upgradeBegin(key extds.TupleKey) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.upgrading == nil {
		s.upgrading = make(map[extds.TupleKey]struct{})
	}
	if _, busy := s.upgrading[key]; busy {
		return false
	}
	s.upgrading[key] = struct{}{}
	return true
}

func (s *Server) upgradeEnd(key extds.TupleKey) {
	s.mu.Lock()
	delete(s.upgrading, key)
	s.mu.Unlock()
}

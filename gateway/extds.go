package gateway

// EXT-DS in exnd: the extds.Device on this node's NIC (VPIDs
// extds.DefaultBaseVPID .. +15), resolving peer IPs through the neighbour
// table, and the shim server (extds/shimsrv) that libextds.so talks to
// over the control socket. It fills the daemon's "conns" (switched shim
// connections), "stats"/metrics (the Device's counters, under "extds"),
// adds "shim-stats", and the shim's operations: shim-hello, shim-listen,
// shim-unlisten, shim-connect, shim-accept.

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"

	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/extds/dring"
	"github.com/exn-project/exn/extds/rdirect"
	"github.com/exn-project/exn/extds/shimsrv"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/backend"
	"github.com/exn-project/exn/metrics"
)

// shimRingSize is each EXT-DS connection's receive ring in exnd (the
// sender mirrors it: 2x per connection). The shim's bulk streams arrive
// faster than a loaded application drains them; with the library's 256
// KiB default the ring is full most of the time and the sender spills
// into 116-byte VELO fragments (about 14% of an iperf3 stream's bytes,
// see docs/shim.md "Numbers"). 4 MiB keeps bulk on RMA PUTs and returns
// credits in 1 MiB steps.
const shimRingSize = 4 << 20

// remoteRing is the ring per direction of a direct connection across
// hosts (each node's copy of the buffer has two). A stream's PUTs are a
// quarter of the ring (extds/rdirect), and each waits for the peer's
// completion on net: with 1 MiB (one host's dring.DefaultRing) one
// iperf3 stream through the shim on net moved 11.9 Gbit/s, with 4 MiB
// 15.4, 8 MiB 14.1-15.0, 16 MiB 11.2-11.9 (TestShimNet's iperf3, two
// runs each, 2026-11-28 20:35 UTC, 2 vCPUs). Its pages are touched only
// as the stream fills them.
const remoteRing = 4 << 20

// startEXTDS is the part "extds" (parts.go).
func startEXTDS(d *Daemon) (started, error) {
	log := d.log.With("part", "extds")
	res := extds.ResolverFunc(func(ip netip.Addr) (fabric.NodeID, bool) {
		e, ok := d.arp.Lookup(ip)
		if !ok || e.Node == d.cfg.Node {
			return 0, false // unknown, or this node: plain (loopback) TCP
		}
		return e.Node, true
	})
	dev, err := extds.NewDevice(d.nic, extds.WithResolver(res), extds.WithLogger(log), extds.WithRingSize(shimRingSize))
	if err != nil {
		return started{}, err
	}
	// The shim hands over sockets the application connected itself, so
	// the Dialer never dials a shadow connection here (Upgrade only).
	// Listener registrations outlive exnd in a file beside the control
	// socket, so running servers stay on EXT-DS across a restart.
	var sopts []shimsrv.Option
	if d.cfg.Control != "" {
		sopts = append(sopts, shimsrv.WithStateFile(d.cfg.Control+".listeners"))
	}
	var eng *rdirect.Engine
	switch {
	case !d.cfg.EXTDSDirect:
	case d.cfg.Fabric.Kind == backend.SHM:
		// The fabric's files are in /dev/shm (fabric/shm): so are a direct
		// connection's, and every node of the fabric can open them.
		sopts = append(sopts, shimsrv.WithDirect(shimsrv.DirectConfig{
			Fabric: d.cfg.Fabric.Arg, Dir: "/dev/shm", Node: d.cfg.Node, Ring: dring.DefaultRing,
			ReclaimIdle: d.cfg.EXTDSReclaimIdle,
		}))
	default:
		// Across hosts (issue #38): each node keeps its own copy of a
		// connection's buffer in /dev/shm, and the engine on VPID
		// rdirect.VPID joins the copies by RMA (docs/direct.md, "Across
		// hosts"). A fabric that cannot register the buffers (no
		// fabric.BufferRegistrar) keeps the relay, said once here.
		if eng, err = startEngine(d, log); err != nil {
			log.Warn("EXT-DS direct connections across hosts are off: the shim relays", "err", err)
			break
		}
		sopts = append(sopts, shimsrv.WithDirect(shimsrv.DirectConfig{
			Fabric: fmt.Sprintf("%s%d", d.cfg.Fabric.Kind, os.Getpid()), Dir: "/dev/shm", Node: d.cfg.Node,
			Ring: remoteRing, Engine: eng, ReclaimIdle: d.cfg.EXTDSReclaimIdle,
			// net's RMA reads and writes the buffer by address; a NIC
			// behind ofi may pin what it registered.
			ReclaimRemote: d.cfg.Fabric.Kind == backend.Net,
		}))
		d.remoteStats = eng.Stats
	}
	sopts = append(sopts, shimsrv.WithShortHold(d.cfg.EXTDSShortHold))
	srv := shimsrv.New(dev, &extds.Dialer{Device: dev}, log.With("sub", "shim"), sopts...)
	d.conns = func(ctx context.Context) any {
		// Outside a control request (tests) the caller is exnd itself.
		who, ok := control.PeerFrom(ctx)
		if !ok {
			who = control.Peer{UID: uint32(os.Geteuid())}
		}
		return srv.ConnsFor(who)
	}
	d.extdsStats = dev.Stats
	d.shimStats = srv.Stats
	ops := srv.Handlers()
	ops["shim-stats"] = func(_ context.Context, args []string) (any, error) {
		if len(args) != 0 {
			return nil, fmt.Errorf("takes no arguments, have %d", len(args))
		}
		return srv.Stats(), nil
	}
	att := startAttach(d, dev, log.With("sub", "attach")) // extds_attach.go
	maps.Copy(ops, att.handlers())
	d.attachStats = func() metrics.AttachStats {
		st := att.Stats()
		att.mu.Lock()
		n := len(att.leases)
		att.mu.Unlock()
		return metrics.AttachStats{Attached: st.Attached, Detached: st.Detached, Reclaimed: st.Reclaimed,
			Expired: st.Expired, Refused: st.Refused, Listens: st.Listens, Leases: n}
	}
	log.Info("EXT-DS ready", "vpids", fmt.Sprintf("%d-%d", dev.VPID(0), dev.VPID(15)))
	closeFn := func() error {
		// The control socket is closed before the parts: no new shim
		// request arrives. Switched connections are reset, attached
		// processes lose their leases, then the Device releases the VPIDs.
		srv.Close()
		att.Close()
		if eng != nil {
			_ = eng.Close() // after the shim server: it resets what is left
		}
		if err := dev.Close(); err != nil {
			return fmt.Errorf("close extds: %w", err)
		}
		return nil
	}
	return started{close: closeFn, ops: ops, fdOps: srv.FDHandlers()}, nil
}

// startEngine opens the cross-host direct engine's VPID on this node's
// NIC and starts it (extds/rdirect); the caller closes it.
func startEngine(d *Daemon, log *slog.Logger) (*rdirect.Engine, error) {
	ep, err := d.nic.Open(rdirect.VPID)
	if err != nil {
		return nil, fmt.Errorf("open vpid %d: %w", rdirect.VPID, err)
	}
	// New closes ep on error.
	return rdirect.New(ep, rdirect.Config{Logger: log.With("sub", "rdirect"), Liveness: d.nic})
}

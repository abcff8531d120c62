package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exn-project/exn/arp"
	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/exn"
	"github.com/exn-project/exn/exn/taplink"
	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/extds/rdirect"
	"github.com/exn-project/exn/extds/shimsrv"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/backend"
	"github.com/exn-project/exn/fabric/fping"
	"github.com/exn-project/exn/metrics"
	"github.com/exn-project/exn/tap"
	"github.com/prometheus/client_golang/prometheus"
)

// Daemon is one running exnd node.
//
// Start brings the parts up in order (fabric NIC, VPID 0, TAP and its
// link (exn/taplink), engine, the link's reader, fabric ping on VPID 1,
// the optional parts such as EXT-DS, then the control socket and the
// metrics endpoint) and Close takes them down in reverse, so that no
// request reaches a part that is gone.
type Daemon struct {
	cfg     Config
	log     *slog.Logger
	opts    options
	started time.Time

	nic    fabric.NIC
	ep     fabric.Endpoint
	dev    tap.Device    // read-only here (Name, MTU, Stats): link owns it
	link   *taplink.Link // the TAP pump and the engine's link to the TAP
	engine *exn.Engine
	arp    *arp.Table
	ping   *fping.Service

	// Filled by optional parts (parts.go) before the control socket and
	// metrics start; nil means the part is absent.
	//
	// conns lists EXT-DS connections for the "conns" operation, as the
	// caller (control.PeerFrom(ctx)) may see them.
	conns func(ctx context.Context) any
	// extdsStats is the EXT-DS device's counters, for "stats" and metrics.
	extdsStats func() extds.Stats
	// shimStats is the shim server's counters (switches, fallbacks and
	// refusals by reason), for "stats" and metrics.
	shimStats func() shimsrv.Stats
	// remoteStats is the cross-host direct engine's counters (nil when
	// it does not run: gateway/extds.go).
	remoteStats func() rdirect.Stats
	// attachStats is the kernel-bypass lease service's counters, for
	// metrics.
	attachStats func() metrics.AttachStats
	// extraHandlers are the control operations the parts return,
	// registered by startParts (parts.go).
	extraHandlers map[string]control.HandlerFunc
	// extraFDHandlers are the descriptor-passing operations the parts
	// return, registered by startParts.
	extraFDHandlers map[string]control.FDHandlerFunc
	// partClosers close the parts, in reverse order of start.
	partClosers []func() error

	ctl       *control.Server
	ctlStats  atomic.Pointer[control.Server] // ctl for controlStats, which the control and metrics goroutines call
	reg       *prometheus.Registry
	pingRTT   prometheus.Histogram
	http      *http.Server
	metricsLn net.Listener

	wg       sync.WaitGroup // the metrics server
	errc     chan error     // the first fatal error (TAP reader, metrics server)
	once     sync.Once
	closeErr error
}

// Option changes how Start builds a node; the defaults are a real TAP and
// a fabric from Config.Fabric.
type Option func(*options)

type options struct {
	dev   tap.Device
	mem   backend.Cluster
	parts []part // nil: stdParts (parts.go); tests replace them
}

// WithDevice makes the node use dev instead of opening a TAP (tests use a
// taptest.Device, which needs no root). The node closes it. Config's
// Ifname, MTU and Addrs are then not applied to it.
func WithDevice(dev tap.Device) Option { return func(o *options) { o.dev = dev } }

// WithMemCluster is the in-process cluster a "mem" fabric joins.
func WithMemCluster(c backend.Cluster) Option { return func(o *options) { o.mem = c } }

// Start opens the fabric NIC, VPID 0, the TAP and the engine, starts the
// TAP reader, the fabric ping service, the optional parts, the control
// socket and the metrics endpoint. On error everything opened so far is
// closed again.
func Start(cfg Config, log *slog.Logger, opts ...Option) (_ *Daemon, err error) {
	d := &Daemon{cfg: cfg, log: log, errc: make(chan error, 1), started: time.Now(),
		extraHandlers: map[string]control.HandlerFunc{}, extraFDHandlers: map[string]control.FDHandlerFunc{}}
	for _, o := range opts {
		o(&d.opts)
	}
	defer func() {
		if err != nil {
			d.teardown()
		}
	}()

	prefix := fabric.DefaultMACPrefix
	d.arp = arp.New(prefix, log.With("part", "arp"))
	ps, err := Check(cfg)
	if err != nil {
		return nil, err
	}
	d.arp.Seed(ps)

	if d.nic, err = backend.OpenSpec(cfg.Fabric, cfg.Node, backend.Options{Mem: d.opts.mem, Peers: ps, Logger: log.With("part", "fabric"), Liveness: cfg.Liveness, Sessions: cfg.Sessions}); err != nil {
		return nil, fmt.Errorf("open fabric: %w", err)
	}
	if d.ep, err = d.nic.Open(fabric.EthVPID); err != nil {
		return nil, fmt.Errorf("open vpid %d: %w", fabric.EthVPID, err)
	}
	mac := prefix.MAC(cfg.Node)
	if cfg.Netstack && d.opts.dev == nil { // userspace mode: the stack is the device
		if d.opts.dev, err = openNetstack(cfg, d.nic, log.With("part", "netstack")); err != nil {
			return nil, fmt.Errorf("start netstack: %w", err)
		}
	}
	if d.opts.dev != nil {
		d.dev = d.opts.dev
	} else if d.dev, err = tap.Open(tap.Config{
		Name:    cfg.Ifname,
		MAC:     mac,
		MTU:     cfg.MTU,
		Addrs:   cfg.Addrs,
		Up:      true,
		Offload: cfg.Offload,
		Logger:  log.With("part", "tap"),
	}); err != nil {
		d.dev = nil // not a typed nil
		return nil, fmt.Errorf("open tap %s: %w", cfg.Ifname, err)
	}
	d.link = taplink.New(d.dev, taplink.Config{Logger: log, Fatal: d.fail})
	caps := d.link.Offload()
	if d.engine, err = exn.New(d.nic, d.ep, d.link, exn.Config{
		MACPrefix:      prefix,
		MTU:            cfg.MTU,
		EagerThreshold: cfg.EagerThreshold,
		Offload:        caps,
		Push:           cfg.Push,
		Observer:       d.arp,
		Logger:         log.With("part", "exn"),
	}); err != nil {
		return nil, fmt.Errorf("start engine: %w", err)
	}

	if err := d.link.Start(d.engine); err != nil {
		return nil, fmt.Errorf("start tap reader: %w", err)
	}

	pingEP, err := d.nic.Open(fping.VPID)
	if err != nil {
		return nil, fmt.Errorf("open vpid %d (ping): %w", fping.VPID, err)
	}
	d.ping = fping.New(pingEP, log.With("part", "fping"))

	parts := d.opts.parts
	if parts == nil {
		parts = stdParts()
	}
	if err := d.startParts(parts); err != nil {
		return nil, err
	}
	if err := d.startMetrics(); err != nil {
		return nil, err
	}
	if err := d.startControl(); err != nil {
		return nil, err
	}

	addrs := make([]string, len(cfg.Addrs))
	for i, a := range cfg.Addrs {
		addrs[i] = a.String()
	}
	log.Info("exnd up", "node", cfg.Node, "mac", net.HardwareAddr(mac).String(), "mtu", cfg.MTU,
		"eager_threshold", cfg.EagerThreshold, "offload", caps, "push", d.engine.Pushes(), "fabric", cfg.Fabric.String(), "ifname", d.dev.Name(),
		"addrs", strings.Join(addrs, ","), "control", cfg.Control, "metrics", d.MetricsAddr())
	return d, nil
}

func (d *Daemon) fail(err error) {
	select {
	case d.errc <- err:
	default:
	}
}

// Done yields the error that stopped the daemon on its own (a TAP that
// went away); it does not fire on Close.
func (d *Daemon) Done() <-chan error { return d.errc }

// MAC returns the node's MAC address.
func (d *Daemon) MAC() net.HardwareAddr { return fabric.DefaultMACPrefix.MAC(d.cfg.Node) }

// Close stops the metrics endpoint and the control socket (removing its
// file), the parts, the ping service and the TAP link (its reader, then
// the TAP, removing the interface), then closes the engine and the NIC
// (releasing its fabric resources). It is idempotent.
func (d *Daemon) Close() error {
	d.once.Do(func() { d.closeErr = d.teardown() })
	return d.closeErr
}

func (d *Daemon) teardown() error {
	var errs []error
	// Front doors first, so no request reaches a part that is closing.
	if d.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := d.http.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop metrics: %w", err))
			d.http.Close()
		}
		cancel()
	} else if d.metricsLn != nil {
		d.metricsLn.Close()
	}
	if d.ctl != nil {
		if err := d.ctl.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("close control socket: %w", err))
		}
	}
	for i := len(d.partClosers) - 1; i >= 0; i-- {
		if err := d.partClosers[i](); err != nil {
			errs = append(errs, err)
		}
	}
	if d.ping != nil {
		if err := d.ping.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("close ping: %w", err))
		}
	}
	if d.link != nil {
		// The link stops the reader and closes the TAP, which ends a read
		// in progress; the reader gives back the buffers the engine lent
		// it, which Engine.Close waits for. So the link closes first.
		if err := d.link.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close tap: %w", err))
		}
	}
	if d.engine != nil {
		if err := d.engine.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close engine: %w", err))
		}
	}
	d.wg.Wait()
	// The engine owns VPID 0 once it exists, and closed it above.
	if d.engine == nil && d.ep != nil {
		if err := d.ep.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("close vpid 0: %w", err))
		}
	}
	if d.nic != nil {
		if err := d.nic.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close fabric: %w", err))
		}
	}
	return errors.Join(errs...)
}

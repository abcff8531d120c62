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
	"time"
	"unsafe"

	"github.com/exn-project/exn/arp"
	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/exn"
	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/extds/shimsrv"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/backend"
	"github.com/exn-project/exn/fabric/fping"
	"github.com/exn-project/exn/metrics"
	"github.com/exn-project/exn/tap"
	"github.com/prometheus/client_golang/prometheus"
)

// ReadBatch is how many frames the TAP reader takes per wake-up and hands
// to the engine as one batch.
const ReadBatch = 64

// Daemon is one running exnd node.
//
// Start brings the parts up in order (fabric NIC, VPID 0, TAP, engine,
// fabric ping on VPID 1, the optional parts such as EXT-DS, then the
// control socket and the metrics endpoint) and Close takes them down in
// reverse, so that no request reaches a part that is gone.
type Daemon struct {
	cfg     Config
	log     *slog.Logger
	opts    options
	started time.Time

	nic    fabric.NIC
	ep     fabric.Endpoint
	dev    tap.Device
	vnet   tap.OffloadDevice // dev, when it carries virtio-net headers
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
	reg       *prometheus.Registry
	pingRTT   prometheus.Histogram
	http      *http.Server
	metricsLn net.Listener

	cancel   context.CancelFunc
	wg       sync.WaitGroup
	errc     chan error // the reader's fatal error, at most one
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

// tapLink is the engine's Link: it writes received frames to the TAP. A
// frame the kernel refuses is skipped (the TAP counts and logs it) so the
// rest of the batch still goes out. On a TAP with a virtio-net header it
// is an exn.OffloadLink: the frames' offload metadata becomes their
// headers, so the kernel takes a partial checksum or a super-frame as the
// sending kernel made it.
type tapLink struct{ t tap.Device }

// offloadLink is tapLink on a tap.OffloadDevice.
type offloadLink struct {
	tapLink
	od tap.OffloadDevice
}

// exn.Offload and tap.VnetHdr are the same struct (this conversion only
// compiles while their fields are), so a slice of one is a slice of the
// other.
var _ = tap.VnetHdr(exn.Offload{})

func vnetHdrs(offs []exn.Offload) []tap.VnetHdr {
	if len(offs) == 0 {
		return []tap.VnetHdr{}
	}
	return unsafe.Slice((*tap.VnetHdr)(unsafe.Pointer(&offs[0])), len(offs))
}

func (l offloadLink) DeliverFramesOffload(frames [][]byte, offs []exn.Offload) error {
	hdrs := vnetHdrs(offs)
	return writeAll(frames, func(frames [][]byte) (int, error) {
		n, err := l.od.WriteVnet(frames, hdrs)
		hdrs = hdrs[min(n+1, len(hdrs)):]
		return n, err
	})
}

func (l tapLink) DeliverFrames(frames [][]byte) error { return writeAll(frames, l.t.Write) }

// writeAll writes frames with write, skipping a refused frame.
func writeAll(frames [][]byte, write func([][]byte) (int, error)) error {
	var first error
	for len(frames) > 0 {
		n, err := write(frames)
		frames = frames[n:]
		if err == nil {
			continue
		}
		if errors.Is(err, net.ErrClosed) {
			return err
		}
		if first == nil {
			first = err
		}
		if len(frames) > 0 {
			frames = frames[1:] // the refused frame
		}
	}
	return first
}

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

	if d.nic, err = backend.OpenSpec(cfg.Fabric, cfg.Node, backend.Options{Mem: d.opts.mem, Peers: ps, Logger: log.With("part", "fabric")}); err != nil {
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
		d.dev = nil // a typed nil would look open to teardown
		return nil, fmt.Errorf("open tap %s: %w", cfg.Ifname, err)
	}
	var link exn.Link = tapLink{d.dev}
	var caps uint8
	if od, ok := d.dev.(tap.OffloadDevice); ok && od.Offloads() != 0 {
		d.vnet = od
		link = offloadLink{tapLink{d.dev}, od}
		// The kernel takes partial checksums and TCP and UDP super-frames
		// written to any TAP with a virtio-net header.
		caps = exn.CapCsum | exn.CapTSO | exn.CapUSO
	}
	if d.engine, err = exn.New(d.nic, d.ep, link, exn.Config{
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

	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	d.wg.Add(1)
	go d.readLoop(ctx)

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

// maxReadErrors is how many TAP read errors in a row stop the daemon: a
// single refused frame is the TAP's to count, a TAP that only fails is
// dead.
const maxReadErrors = 100

// readLoop moves frames from the TAP to the engine, ReadBatch at a time,
// reading straight into transmit slots the engine lends (exn.Engine.Lend),
// so a rendezvous frame is never copied again before the receiver pulls
// it. It keeps the buffers it did not fill for the next read and tops up
// the rest without waiting; only with none left does it wait for a slot
// (the transmit back-pressure). On exit it gives every lent buffer back,
// which Engine.Close waits for: teardown closes the TAP first, which ends
// a read in progress.
func (d *Daemon) readLoop(ctx context.Context) {
	defer d.wg.Done()
	bufs := make([][]byte, ReadBatch)
	sizes := make([]int, ReadBatch)
	frames := make([][]byte, ReadBatch)
	offs := make([]exn.Offload, ReadBatch)
	hdrs := vnetHdrs(offs) // the same memory: headers read are offs
	have := 0              // bufs[:have] are lent and empty
	defer func() { d.engine.Return(bufs[:have]) }()
	errRun := 0
	for {
		k, err := d.engine.Lend(ctx, bufs[have:], have == 0)
		if err != nil {
			return // closing: ctx done or engine closed
		}
		have += k
		var n int
		if d.vnet != nil {
			n, err = d.vnet.ReadVnet(bufs[:have], sizes, hdrs)
		} else {
			n, err = d.dev.Read(bufs[:have], sizes)
		}
		for i := 0; i < n; i++ {
			frames[i] = bufs[i][:sizes[i]]
		}
		// bufs[:n] now belong to frames; keep the empty ones in front.
		have = copy(bufs, bufs[n:have])
		o := offs[:n]
		if d.vnet == nil {
			o = nil
		}
		if !d.transmit(ctx, frames[:n], o) {
			return
		}
		switch {
		case err == nil:
			errRun = 0
		case errors.Is(err, net.ErrClosed) || ctx.Err() != nil:
			return
		default:
			if errRun++; errRun >= maxReadErrors {
				d.fail(fmt.Errorf("tap read: %d errors in a row, last: %w", errRun, err))
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// transmit hands frames read into lent buffers to the engine. Frames to
// dead or unknown nodes are the engine's to drop and count; an error it
// returns for one frame skips (and gives back) that frame, never the rest
// of the batch. It reports false once the engine or the daemon is
// closing, after giving back the frames not sent.
func (d *Daemon) transmit(ctx context.Context, frames [][]byte, offs []exn.Offload) bool {
	for len(frames) > 0 {
		n, err := d.engine.TransmitLentOffload(ctx, frames, offs)
		frames = frames[n:]
		if offs != nil {
			offs = offs[n:]
		}
		if err == nil {
			continue
		}
		if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
			d.engine.Return(frames)
			return false
		}
		d.log.Debug("transmit", "err", err)
		if len(frames) > 0 {
			d.engine.Return(frames[:1])
			frames = frames[1:]
			if offs != nil {
				offs = offs[1:]
			}
		}
	}
	return true
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
// file), the parts, the ping service and the reader, then closes the
// engine, the TAP (removing the interface) and the NIC (releasing its
// fabric resources). It is idempotent.
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
	if d.cancel != nil {
		d.cancel() // unblocks a Lend or Transmit waiting on back-pressure
	}
	if d.dev != nil {
		// Closing the TAP unblocks the reader's Read, which may be filling
		// buffers lent by the engine: the reader then gives them back,
		// which Engine.Close waits for. So the TAP closes first.
		if err := d.dev.Close(); err != nil {
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

package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/exn-project/exn/arp"
	"github.com/exn-project/exn/exn"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/backend"
	"github.com/exn-project/exn/fabric/peers"
	"github.com/exn-project/exn/tap"
)

// ReadBatch is how many frames the TAP reader takes per wake-up and hands
// to the engine as one batch.
const ReadBatch = 64

// Daemon is one running exnd node.
type Daemon struct {
	cfg    Config
	log    *slog.Logger
	nic    fabric.NIC
	ep     fabric.Endpoint
	tap    *tap.TAP
	engine *exn.Engine
	arp    *arp.Table

	cancel   context.CancelFunc
	wg       sync.WaitGroup
	errc     chan error // the reader's fatal error, at most one
	once     sync.Once
	closeErr error
}

// tapLink is the engine's Link: it writes received frames to the TAP. A
// frame the kernel refuses is skipped (the TAP counts and logs it) so the
// rest of the batch still goes out.
type tapLink struct{ t *tap.TAP }

func (l tapLink) DeliverFrames(frames [][]byte) error {
	var first error
	for len(frames) > 0 {
		n, err := l.t.Write(frames)
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

// Start opens the fabric NIC, VPID 0, the TAP and the engine, and starts
// the TAP reader. On error everything opened so far is closed again.
func Start(cfg Config, log *slog.Logger) (_ *Daemon, err error) {
	d := &Daemon{cfg: cfg, log: log, errc: make(chan error, 1)}
	defer func() {
		if err != nil {
			d.teardown()
		}
	}()

	prefix := fabric.DefaultMACPrefix
	d.arp = arp.New(prefix, log.With("part", "arp"))
	if cfg.Peers != "" {
		ps, err := peers.Load(cfg.Peers)
		if err != nil {
			return nil, fmt.Errorf("--peers: %w", err)
		}
		d.arp.Seed(ps)
	}

	if d.nic, err = backend.OpenSpec(cfg.Fabric, cfg.Node, backend.Options{Logger: log.With("part", "fabric")}); err != nil {
		return nil, fmt.Errorf("open fabric: %w", err)
	}
	if d.ep, err = d.nic.Open(fabric.EthVPID); err != nil {
		return nil, fmt.Errorf("open vpid %d: %w", fabric.EthVPID, err)
	}
	mac := prefix.MAC(cfg.Node)
	if d.tap, err = tap.Open(tap.Config{
		Name:   cfg.Ifname,
		MAC:    mac,
		MTU:    cfg.MTU,
		Addrs:  cfg.Addrs,
		Up:     true,
		Logger: log.With("part", "tap"),
	}); err != nil {
		return nil, fmt.Errorf("open tap %s: %w", cfg.Ifname, err)
	}
	if d.engine, err = exn.New(d.nic, d.ep, tapLink{d.tap}, exn.Config{
		MACPrefix:      prefix,
		MTU:            cfg.MTU,
		EagerThreshold: cfg.EagerThreshold,
		Observer:       d.arp,
		Logger:         log.With("part", "exn"),
	}); err != nil {
		return nil, fmt.Errorf("start engine: %w", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	d.wg.Add(1)
	go d.readLoop(ctx)

	addrs := make([]string, len(cfg.Addrs))
	for i, a := range cfg.Addrs {
		addrs[i] = a.String()
	}
	log.Info("exnd up", "node", cfg.Node, "mac", net.HardwareAddr(mac).String(), "mtu", cfg.MTU,
		"eager_threshold", cfg.EagerThreshold, "fabric", cfg.Fabric.String(), "ifname", cfg.Ifname,
		"addrs", strings.Join(addrs, ","))
	return d, nil
}

// maxReadErrors is how many TAP read errors in a row stop the daemon: a
// single refused frame is the TAP's to count, a TAP that only fails is
// dead.
const maxReadErrors = 100

// readLoop moves frames from the TAP to the engine, ReadBatch at a time,
// reusing its buffers (the engine copies on Transmit).
func (d *Daemon) readLoop(ctx context.Context) {
	defer d.wg.Done()
	size := d.cfg.MTU + tap.HeaderLen
	bufs := make([][]byte, ReadBatch)
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	sizes := make([]int, ReadBatch)
	frames := make([][]byte, ReadBatch)
	errRun := 0
	for {
		n, err := d.tap.Read(bufs, sizes)
		for i := 0; i < n; i++ {
			frames[i] = bufs[i][:sizes[i]]
		}
		if !d.transmit(ctx, frames[:n]) {
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

// transmit hands frames to the engine. Frames to dead or unknown nodes
// are the engine's to drop and count; an error it returns for one frame
// skips that frame, never the rest of the batch. It reports false once
// the engine or the daemon is closing.
func (d *Daemon) transmit(ctx context.Context, frames [][]byte) bool {
	for len(frames) > 0 {
		n, err := d.engine.Transmit(ctx, frames)
		frames = frames[n:]
		if err == nil {
			continue
		}
		if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
			return false
		}
		d.log.Debug("transmit", "err", err)
		if len(frames) > 0 {
			frames = frames[1:]
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

// Close stops the reader, then closes the engine, the TAP (removing the
// interface) and the NIC (releasing its fabric resources). It is
// idempotent.
func (d *Daemon) Close() error {
	d.once.Do(func() { d.closeErr = d.teardown() })
	return d.closeErr
}

func (d *Daemon) teardown() error {
	var errs []error
	if d.cancel != nil {
		d.cancel() // unblocks a Transmit waiting on back-pressure
	}
	if d.engine != nil {
		if err := d.engine.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close engine: %w", err))
		}
	}
	if d.tap != nil {
		// Closing the TAP unblocks the reader's Read.
		if err := d.tap.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close tap: %w", err))
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

package tap

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/exn-project/exn/internal/ratelog"
	"github.com/exn-project/exn/internal/sys"
	"github.com/exn-project/exn/internal/vnet"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Device is the host side of exn0: Ethernet frames (destination MAC,
// source MAC, EtherType, payload; no FCS), with no packet-information or
// virtio-net header. *TAP and *taptest.Device implement it.
type Device interface {
	// Read reads up to min(len(bufs), len(sizes)) frames, frame i into
	// bufs[i] and its length into sizes[i], and returns how many it read.
	// It blocks until at least one frame is available, then returns what
	// is ready without blocking further. Buffers should hold
	// FrameSize(MTU()) bytes: a frame longer than its buffer is dropped
	// and counted (Stats.ShortBuffer) and Read goes on to the next. A
	// zero-length buffer makes Read fail with io.ErrShortBuffer. The
	// buffers belong to the caller; Read keeps no reference. After Close,
	// and in a Read blocked when Close is called, it returns an error
	// satisfying errors.Is(err, net.ErrClosed). One goroutine at a time
	// may call Read; Read may run concurrently with Write and Close.
	Read(bufs [][]byte, sizes []int) (n int, err error)

	// Write writes frames in order and returns how many it wrote. If
	// n < len(frames), err says why frames[n] was refused (too short for
	// an Ethernet header, longer than FrameSize(MTU()), or the kernel's
	// error); the caller may drop it and write frames[n+1:]. Write keeps
	// no reference to frames. After Close it returns net.ErrClosed. It is
	// safe to call concurrently with Read; concurrent Writes do not
	// interleave within a frame but their order is unspecified.
	Write(frames [][]byte) (n int, err error)

	// Name is the interface name, e.g. "exn0".
	Name() string

	// MTU is the interface MTU: the largest payload after the 14-byte
	// Ethernet header.
	MTU() int

	// Close releases the device and makes blocked and later Read and
	// Write calls return net.ErrClosed. It is idempotent; calls after the
	// first return nil.
	Close() error
}

const (
	// DefaultName is the interface name Open uses when Config.Name is "".
	DefaultName = "exn0"
	// HeaderLen is the Ethernet header length: two MACs and an EtherType.
	HeaderLen = 14
	// MaxMTU is the largest MTU Linux gives a TAP: its max_mtu is 65535
	// less the Ethernet header. 65522 and above are refused (EINVAL);
	// TestMTULimit checks this against the running kernel.
	MaxMTU = 65535 - HeaderLen
	// DefaultMTU is MaxMTU (docs/design.md "EXT-Eth").
	DefaultMTU = MaxMTU
	// MinMTU is the IPv4 minimum (RFC 791).
	MinMTU = 68
	// DefaultQueueLen is the TAP's tx queue length Open sets: the number
	// of frames the kernel queues for Read before it drops. The kernel's
	// own default is 500, too few for a burst of 64 KiB TSO frames.
	DefaultQueueLen = 1024
)

// ErrFrameSize is wrapped in the error Write returns for a frame shorter
// than HeaderLen or longer than FrameSize(MTU()).
var ErrFrameSize = errors.New("frame size out of range")

// FrameSize is the largest frame a device with the given MTU carries.
func FrameSize(mtu int) int { return mtu + HeaderLen }

// Config configures Open.
type Config struct {
	// Name is the interface name (at most 15 bytes); "" means DefaultName.
	Name string
	// MAC is the interface's unicast MAC; nil keeps the kernel's random one.
	MAC net.HardwareAddr
	// MTU is in MinMTU..MaxMTU; 0 means DefaultMTU.
	MTU int
	// QueueLen is the kernel queue length (frames); 0 means
	// DefaultQueueLen.
	QueueLen int
	// Addrs are added to the interface. IPv6 addresses are added with
	// IFA_F_NODAD: exn's MACs are unique by construction (they encode the
	// node ID), and without duplicate address detection an address is
	// usable at once instead of after about a second of tentative state.
	Addrs []netip.Prefix
	// Up brings the link up after configuring it.
	Up bool
	// Offload opens the TAP with IFF_VNET_HDR and asks the kernel for
	// checksum offload and TSO4/TSO6 (and USO where it has it): the TAP
	// then implements OffloadDevice (vnet.go), Read returns frames
	// complete (checksums filled in, super-frames dropped and counted)
	// and Write sends complete frames.
	Offload bool
	// Logger receives rate-limited per-frame warnings; nil discards.
	Logger *slog.Logger
}

// Stats are a TAP's counters since Open.
type Stats struct {
	RxFrames, RxBytes uint64 // frames (and bytes) Read returned
	TxFrames, TxBytes uint64 // frames (and bytes) Write wrote
	RxErrors          uint64 // read errors other than Close
	TxErrors          uint64 // frames Write refused
	ShortBuffer       uint64 // frames dropped: longer than their Read buffer
	BadVnet           uint64 // frames dropped: virtio-net header short or not understood
	GSODropped        uint64 // super-frames dropped by a plain Read (use ReadVnet)
}

// Counters is the atomic counter block behind Stats, shared with taptest.
type Counters struct {
	RxFrames, RxBytes, TxFrames, TxBytes atomic.Uint64
	RxErrors, TxErrors, ShortBuffer      atomic.Uint64
	BadVnet, GSODropped                  atomic.Uint64
}

// Snapshot copies the counters.
func (c *Counters) Snapshot() Stats {
	return Stats{
		RxFrames: c.RxFrames.Load(), RxBytes: c.RxBytes.Load(),
		TxFrames: c.TxFrames.Load(), TxBytes: c.TxBytes.Load(),
		RxErrors: c.RxErrors.Load(), TxErrors: c.TxErrors.Load(),
		ShortBuffer: c.ShortBuffer.Load(),
		BadVnet:     c.BadVnet.Load(), GSODropped: c.GSODropped.Load(),
	}
}

// Addr is a device's net.Addr in *net.OpError: network "tap", the name.
type Addr string

func (a Addr) Network() string { return "tap" }
func (a Addr) String() string  { return string(a) }

// TAP is a Linux TAP interface. Its methods implement Device.
type TAP struct {
	f    *os.File
	rc   syscall.RawConn
	name string
	mtu  int
	vnet int // TUN_F_* offloads the kernel took; 0: no virtio-net header
	log  *slog.Logger
	lim  ratelog.Limiter

	readMu  sync.Mutex
	rd      readOp
	writeMu sync.Mutex
	wr      writeOp

	closed    atomic.Bool
	closeOnce sync.Once

	c Counters
}

var _ Device = (*TAP)(nil)

// Open creates the TAP interface cfg.Name in the calling thread's network
// namespace, sets its MAC, MTU, queue length and addresses, and brings it
// up if cfg.Up. The interface is not persistent: Close removes it. On error
// nothing is left behind.
func Open(cfg Config) (*TAP, error) {
	cfg.Name = cmp.Or(cfg.Name, DefaultName)
	cfg.MTU = cmp.Or(cfg.MTU, DefaultMTU)
	cfg.QueueLen = cmp.Or(cfg.QueueLen, DefaultQueueLen)
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("tap %s: %w", cfg.Name, err)
	}
	var (
		fd, offloads int
		name         string
		err          error
	)
	if cfg.Offload {
		fd, name, offloads, err = sys.OpenTAPVnet(cfg.Name)
	} else {
		fd, name, err = sys.OpenTAP(cfg.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("tap %s: %w", cfg.Name, err)
	}
	// The fd is non-blocking, so os.NewFile registers it with the runtime
	// poller: Read parks in the poller, and Close wakes it.
	f := os.NewFile(uintptr(fd), "/dev/net/tun")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("tap %s: %w", name, err)
	}
	t := &TAP{f: f, rc: rc, name: name, mtu: cfg.MTU, vnet: offloads, log: cfg.Logger.With("tap", name)}
	t.lim.Init(nil, time.Second, 10)
	t.rd.fn, t.rd.vnet = t.rd.run, offloads != 0
	t.wr.fn, t.wr.maxLen, t.wr.vnet = t.wr.run, FrameSize(cfg.MTU), offloads != 0
	if err := configure(name, &cfg); err != nil {
		f.Close()
		return nil, fmt.Errorf("tap %s: %w", name, err)
	}
	return t, nil
}

func (c *Config) validate() error {
	if len(c.Name) > 15 {
		return fmt.Errorf("name longer than 15 bytes: %w", unix.EINVAL)
	}
	if c.MTU < MinMTU || c.MTU > MaxMTU {
		return fmt.Errorf("mtu %d not in %d..%d: %w", c.MTU, MinMTU, MaxMTU, unix.EINVAL)
	}
	if c.MAC != nil && (len(c.MAC) != 6 || c.MAC[0]&1 != 0 || [6]byte(c.MAC) == [6]byte{}) {
		return fmt.Errorf("mac %v: not a unicast ethernet address: %w", c.MAC, unix.EINVAL)
	}
	if c.QueueLen < 0 {
		return fmt.Errorf("queue length %d: %w", c.QueueLen, unix.EINVAL)
	}
	for _, p := range c.Addrs {
		if !p.IsValid() || p.Addr().Zone() != "" || p.Addr().Is4In6() {
			return fmt.Errorf("address %v: %w", p, unix.EINVAL)
		}
	}
	return nil
}

// configure applies cfg to the interface over rtnetlink.
func configure(name string, cfg *Config) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find link: %w", err)
	}
	if cfg.MAC != nil {
		if err := netlink.LinkSetHardwareAddr(link, cfg.MAC); err != nil {
			return fmt.Errorf("set mac %v: %w", cfg.MAC, err)
		}
	}
	if err := netlink.LinkSetMTU(link, cfg.MTU); err != nil {
		return fmt.Errorf("set mtu %d: %w", cfg.MTU, err)
	}
	if err := netlink.LinkSetTxQLen(link, cfg.QueueLen); err != nil {
		return fmt.Errorf("set queue length %d: %w", cfg.QueueLen, err)
	}
	for _, p := range cfg.Addrs {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := netlink.AddrAdd(link, a); err != nil {
			return fmt.Errorf("add address %v: %w", p, err)
		}
	}
	if cfg.Up {
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("set up: %w", err)
		}
	}
	return nil
}

// Name returns the interface name.
func (t *TAP) Name() string { return t.name }

// MTU returns the MTU set at Open.
func (t *TAP) MTU() int { return t.mtu }

// Stats returns a snapshot of the counters.
func (t *TAP) Stats() Stats { return t.c.Snapshot() }

func (t *TAP) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: "tap", Addr: Addr(t.name), Err: err}
}

// readOp is the state of one Read, kept in the TAP with its callback
// bound once, so a Read does not allocate a closure.
type readOp struct {
	fd    int
	bufs  [][]byte
	sizes []int
	hdrs  []VnetHdr // ReadVnet: the frames' headers; nil: complete frames
	want  int
	n     int
	bytes uint64
	short uint64
	bad   uint64 // BadVnet
	gso   uint64 // GSODropped
	err   error
	vnet  bool
	hdr   [sys.VnetHdrLen]byte
	fn    func(fd uintptr) bool
}

func (r *readOp) run(fd uintptr) bool {
	for r.n < r.want {
		var m int
		var err error
		if r.vnet {
			m, err = sys.TAPReadVnet(int(fd), &r.hdr, r.bufs[r.n])
		} else {
			m, err = sys.TAPRead(int(fd), r.bufs[r.n])
		}
		switch {
		case err == sys.EAGAIN:
			return r.n > 0 // park in the poller only if nothing was read
		case err == sys.EINTR:
			continue
		case err != nil:
			r.err = err
			return true
		case m > len(r.bufs[r.n]):
			r.short++ // longer than its buffer, truncated and consumed: drop
			continue
		case r.vnet && !r.header(r.bufs[r.n], m):
			continue
		}
		r.sizes[r.n] = m
		r.bytes += uint64(m)
		r.n++
	}
	return true
}

// writeOp is the state of one Write; see readOp.
type writeOp struct {
	frames [][]byte
	hdrs   []VnetHdr // WriteVnet: the frames' headers; nil: complete frames
	maxLen int
	n      int
	bytes  uint64
	err    error
	vnet   bool
	hdr    [sys.VnetHdrLen]byte
	fn     func(fd uintptr) bool
}

func (w *writeOp) run(fd uintptr) bool {
	for w.n < len(w.frames) {
		f := w.frames[w.n]
		limit := w.maxLen
		if w.hdrs != nil && w.hdrs[w.n].GSOType != vnet.GSONone {
			limit = vnet.MaxGSOFrame
		}
		if len(f) < HeaderLen || len(f) > limit {
			w.err = fmt.Errorf("frame of %d bytes not in %d..%d: %w", len(f), HeaderLen, limit, ErrFrameSize)
			return true
		}
		var err error
		if w.vnet {
			w.hdr = [sys.VnetHdrLen]byte{}
			if w.hdrs != nil {
				w.hdrs[w.n].encode(&w.hdr)
			}
			_, err = sys.TAPWriteVnet(int(fd), &w.hdr, f)
		} else if w.hdrs != nil && w.hdrs[w.n] != (VnetHdr{}) {
			w.err = fmt.Errorf("virtio-net header on a TAP opened without Offload: %w", unix.EINVAL)
			return true
		} else {
			_, err = sys.TAPWrite(int(fd), f)
		}
		switch {
		case err == sys.EAGAIN:
			return false // wait until writable
		case err == sys.EINTR:
			continue
		case err != nil:
			w.err = err
			return true
		}
		w.bytes += uint64(len(f))
		w.n++
	}
	return true
}

// Read implements Device.Read. One wake-up drains up to len(bufs) frames
// with non-blocking reads inside a single poller callback. It does not
// allocate.
func (t *TAP) Read(bufs [][]byte, sizes []int) (int, error) { return t.read(bufs, sizes, nil) }

func (t *TAP) read(bufs [][]byte, sizes []int, hdrs []VnetHdr) (int, error) {
	want := min(len(bufs), len(sizes))
	if hdrs != nil {
		want = min(want, len(hdrs))
	}
	if want == 0 {
		return 0, nil
	}
	for _, b := range bufs[:want] {
		if len(b) == 0 {
			return 0, t.opErr("read", io.ErrShortBuffer)
		}
	}
	if t.closed.Load() {
		return 0, t.opErr("read", net.ErrClosed)
	}
	t.readMu.Lock()
	defer t.readMu.Unlock()
	r := &t.rd
	r.bufs, r.sizes, r.want, r.n, r.bytes, r.short, r.err = bufs, sizes, want, 0, 0, 0, nil
	r.hdrs, r.bad, r.gso = hdrs, 0, 0
	err := t.rc.Read(r.fn)
	n, rerr, short := r.n, r.err, r.short
	r.bufs, r.sizes, r.hdrs = nil, nil, nil // keep no reference to the caller's buffers
	if r.bad > 0 {
		t.c.BadVnet.Add(r.bad)
		t.warn("frame with a malformed virtio-net header dropped", slog.Uint64("frames", r.bad))
	}
	if r.gso > 0 {
		t.c.GSODropped.Add(r.gso)
		t.warn("super-frame dropped by a plain Read", slog.Uint64("frames", r.gso))
	}
	if n > 0 {
		t.c.RxFrames.Add(uint64(n))
		t.c.RxBytes.Add(r.bytes)
	}
	if short > 0 {
		t.c.ShortBuffer.Add(short)
		t.warn("frame longer than read buffer dropped", slog.Uint64("frames", short))
	}
	switch {
	case err != nil:
		return n, t.pollerErr("read", err, &t.c.RxErrors)
	case rerr != nil:
		t.c.RxErrors.Add(1)
		t.warn("read error", slog.Any("err", rerr))
		return n, t.opErr("read", rerr)
	}
	return n, nil
}

// Write implements Device.Write. The frames go out in one poller callback;
// concurrent Writes are serialized. It does not allocate unless a frame is
// refused.
func (t *TAP) Write(frames [][]byte) (int, error) { return t.write(frames, nil) }

func (t *TAP) write(frames [][]byte, hdrs []VnetHdr) (int, error) {
	if t.closed.Load() {
		return 0, t.opErr("write", net.ErrClosed)
	}
	if hdrs != nil && len(hdrs) < len(frames) {
		frames = frames[:len(hdrs)]
	}
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	w := &t.wr
	w.frames, w.hdrs, w.n, w.bytes, w.err = frames, hdrs, 0, 0, nil
	err := t.rc.Write(w.fn)
	n, werr := w.n, w.err
	w.frames, w.hdrs = nil, nil
	if n > 0 {
		t.c.TxFrames.Add(uint64(n))
		t.c.TxBytes.Add(w.bytes)
	}
	switch {
	case err != nil:
		return n, t.pollerErr("write", err, &t.c.TxErrors)
	case werr != nil:
		t.c.TxErrors.Add(1)
		t.warn("write refused", slog.Int("len", len(frames[n])), slog.Any("err", werr))
		return n, t.opErr("write", werr)
	}
	return n, nil
}

// pollerErr is the error of a Read or Write (op) whose poller call failed
// with err: net.ErrClosed once the TAP is closed, else err, counted in
// errs.
func (t *TAP) pollerErr(op string, err error, errs *atomic.Uint64) error {
	if errors.Is(err, os.ErrClosed) || t.closed.Load() {
		return t.opErr(op, net.ErrClosed)
	}
	errs.Add(1)
	return t.opErr(op, err)
}

// Close closes the fd, which removes the interface, and wakes blocked
// calls with net.ErrClosed. It returns once the fd is closed.
func (t *TAP) Close() error {
	var err error
	t.closeOnce.Do(func() {
		t.closed.Store(true)
		if cerr := t.f.Close(); cerr != nil {
			err = t.opErr("close", cerr)
		}
	})
	return err
}

func (t *TAP) warn(msg string, attrs ...slog.Attr) { t.lim.Warn(t.log, msg, attrs...) }

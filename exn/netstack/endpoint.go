package netstack

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// Defaults and limits.
const (
	// DefaultMTU is the IP MTU: the largest a TAP takes (docs/design.md
	// "EXT-Eth"), so a netstack node and a TAP node agree.
	DefaultMTU = 65521
	// MaxMTU is the largest IP MTU: an IPv4 datagram's total length is 16
	// bits, and gVisor's largest pooled buffer chunk is 64 KiB.
	MaxMTU = 65535 - header.EthernetMinimumSize
	// MinMTU is the smallest IP MTU IPv6 allows (RFC 8200 §5).
	MinMTU = header.IPv6MinimumMTU
	// DefaultTxQueueLen is the number of frames WritePackets may queue
	// ahead of the transmit goroutine.
	DefaultTxQueueLen = 1024
	// DefaultTxQueueBytes bounds the bytes held by queued frames.
	DefaultTxQueueBytes = 16 << 20
	// DefaultTxBatch is the most frames handed to one Transmit call.
	DefaultTxBatch = 64

	smallFrame = 2048 // size class for ACKs, ARP, small datagrams
)

// Transmitter is the fabric side of an Endpoint; *exn.Engine implements it.
//
// Transmit sends frames (whole Ethernet frames) in order and returns how
// many it accepted; on error, frames[n] is the one that failed. It copies
// the frames, may block on back-pressure, and must return once ctx is done.
type Transmitter interface {
	Transmit(ctx context.Context, frames [][]byte) (int, error)
}

// Config configures an Endpoint.
type Config struct {
	// MAC is the endpoint's link address: a unicast Ethernet address,
	// normally the node's fabric MAC (fabric.MACPrefix.MAC). Required.
	MAC net.HardwareAddr
	// MTU is the IP MTU, MinMTU..MaxMTU; 0 means DefaultMTU. The inner
	// endpoint reports MTU+14, which the Ethernet wrapper takes back off.
	MTU uint32
	// TxQueueLen and TxQueueBytes bound the transmit queue, in frames and
	// bytes; 0 means the defaults.
	TxQueueLen   int
	TxQueueBytes int
	// TxBatch is the most frames per Transmit call; 0 means DefaultTxBatch.
	TxBatch int
	// ChecksumOffload advertises TX and RX checksum offload, so the stack
	// neither computes nor verifies IP/TCP/UDP checksums. It is correct only
	// when every peer is a netstack node with the same setting (a kernel
	// behind a TAP verifies checksums and would drop the frames) and the
	// fabric is trusted to deliver bytes intact. Off by default.
	ChecksumOffload bool
	// Logger receives rate-limited reports of dropped frames. Nil means
	// slog.Default().
	Logger *slog.Logger
}

// Stats are the endpoint's counters.
type Stats struct {
	TxFrames, TxBytes uint64 // accepted by Transmit
	TxQueueFull       uint64 // dropped by WritePackets: queue full
	TxErrors          uint64 // rejected by Transmit (unknown or dead node, ...)
	TxOversize        uint64 // larger than MTU+14: dropped
	TxClosed          uint64 // written or queued when the endpoint closed
	RxFrames, RxBytes uint64 // delivered to the stack
	RxDropped         uint64 // not attached, closed, runt or oversized
}

// Endpoint is a stack.LinkEndpoint whose packets are whole Ethernet frames
// carried by a Transmitter (outbound) and fed by DeliverFrames (inbound).
// It has no link header of its own: wrap it in ethernet.New.
//
// All methods are safe for concurrent use.
type Endpoint struct {
	log      *slog.Logger
	offload  bool
	batchMax int
	qBytes   int64

	mu         sync.RWMutex
	dispatcher stack.NetworkDispatcher
	linkAddr   tcpip.LinkAddress
	mtu        uint32
	onClose    func()

	maxFrame atomic.Uint32 // mtu + 14, read on the hot paths
	closed   atomic.Bool

	txq      chan *frameBuf
	queued   atomic.Int64 // bytes in txq
	pending  atomic.Int64 // frames written but not yet through Transmit
	started  atomic.Bool  // Start (push mode) was called
	pulling  atomic.Bool  // ReadFrames (pull mode) was called
	readMu   sync.Mutex   // one ReadFrames at a time
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	closeOne sync.Once

	small, large sync.Pool // *frameBuf

	txFrames, txBytes, txFull, txErrors, txOversize, txClosed atomic.Uint64
	rxFrames, rxBytes, rxDropped                              atomic.Uint64

	lastLog atomic.Int64 // unix nanos of the last drop report
}

type frameBuf struct {
	b     []byte
	large bool
}

var (
	_ stack.LinkEndpoint = (*Endpoint)(nil)
	_ interface {
		DeliverFrames([][]byte) error
	} = (*Endpoint)(nil)
)

// New returns an Endpoint that is not yet transmitting; call Start with the
// engine once it exists. Frames written before Start are queued.
func New(cfg Config) (*Endpoint, error) {
	if len(cfg.MAC) != header.EthernetAddressSize {
		return nil, fmt.Errorf("netstack: mac %q: want 6 octets", cfg.MAC)
	}
	if cfg.MAC[0]&1 != 0 {
		return nil, fmt.Errorf("netstack: mac %s: multicast, want unicast", cfg.MAC)
	}
	cfg.MTU = cmp.Or(cfg.MTU, DefaultMTU)
	if cfg.MTU < MinMTU || cfg.MTU > MaxMTU {
		return nil, fmt.Errorf("netstack: mtu %d not in %d..%d", cfg.MTU, MinMTU, MaxMTU)
	}
	if cfg.TxQueueLen < 0 || cfg.TxQueueBytes < 0 || cfg.TxBatch < 0 {
		return nil, errors.New("netstack: negative queue setting")
	}
	cfg.TxQueueLen = cmp.Or(cfg.TxQueueLen, DefaultTxQueueLen)
	cfg.TxQueueBytes = cmp.Or(cfg.TxQueueBytes, DefaultTxQueueBytes)
	cfg.TxBatch = cmp.Or(cfg.TxBatch, DefaultTxBatch)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	e := &Endpoint{
		log:      cfg.Logger,
		offload:  cfg.ChecksumOffload,
		batchMax: cfg.TxBatch,
		qBytes:   int64(cfg.TxQueueBytes),
		linkAddr: tcpip.LinkAddress(cfg.MAC),
		mtu:      cfg.MTU,
		txq:      make(chan *frameBuf, cfg.TxQueueLen),
	}
	e.maxFrame.Store(cfg.MTU + header.EthernetMinimumSize)
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.small.New = func() any { return &frameBuf{b: make([]byte, 0, smallFrame)} }
	e.large.New = func() any {
		return &frameBuf{b: make([]byte, 0, MaxMTU+header.EthernetMinimumSize), large: true}
	}
	return e, nil
}

// Start starts the transmit goroutine, which hands queued frames to tx
// until Close. It fails if the endpoint is closed or already started.
func (e *Endpoint) Start(tx Transmitter) error {
	if tx == nil {
		return errors.New("netstack: start: nil transmitter")
	}
	if e.closed.Load() {
		return net.ErrClosed
	}
	if e.pulling.Load() {
		return errors.New("netstack: start: frames are being pulled with ReadFrames")
	}
	if !e.started.CompareAndSwap(false, true) {
		return errors.New("netstack: already started")
	}
	e.wg.Add(1)
	go e.txLoop(tx)
	return nil
}

// ReadFrames is the pull alternative to Start, for a caller that owns the
// transmit path itself (exnd in userspace mode hands the frames to its own
// engine): it copies queued outbound frames, frame i into bufs[i] and its
// length into sizes[i], and returns how many. It blocks until at least one
// frame is queued, then takes what is ready without blocking, at most
// min(len(bufs), len(sizes)) frames. A frame longer than its buffer is
// dropped and counted as TxOversize. After Close (or detach), and in a
// ReadFrames blocked when the endpoint closes, it returns net.ErrClosed.
// Frames it returns count as transmitted. An endpoint is either started or
// read, never both; one goroutine at a time may call ReadFrames.
func (e *Endpoint) ReadFrames(bufs [][]byte, sizes []int) (int, error) {
	if e.started.Load() {
		return 0, errors.New("netstack: read frames: endpoint started with a transmitter")
	}
	e.pulling.Store(true)
	max := min(len(bufs), len(sizes))
	if max == 0 {
		return 0, errors.New("netstack: read frames: no buffers")
	}
	e.readMu.Lock()
	defer e.readMu.Unlock()
	if e.closed.Load() {
		return 0, net.ErrClosed
	}
	n := 0
	take := func(f *frameBuf) {
		e.queued.Add(-int64(len(f.b)))
		if len(f.b) > len(bufs[n]) {
			e.txOversize.Add(1)
			e.report("tx frame longer than the read buffer dropped", "len", len(f.b), "buf", len(bufs[n]))
		} else {
			sizes[n] = copy(bufs[n], f.b)
			e.txFrames.Add(1)
			e.txBytes.Add(uint64(sizes[n]))
			n++
		}
		e.putBuf(f)
		e.pending.Add(-1)
	}
	for n == 0 {
		select {
		case f := <-e.txq:
			take(f)
		case <-e.ctx.Done():
			return 0, net.ErrClosed
		}
	fill:
		for n < max {
			select {
			case f := <-e.txq:
				take(f)
			default:
				break fill
			}
		}
	}
	return n, nil
}

// Stats returns a snapshot of the counters.
func (e *Endpoint) Stats() Stats {
	return Stats{
		TxFrames: e.txFrames.Load(), TxBytes: e.txBytes.Load(),
		TxQueueFull: e.txFull.Load(), TxErrors: e.txErrors.Load(),
		TxOversize: e.txOversize.Load(), TxClosed: e.txClosed.Load(),
		RxFrames: e.rxFrames.Load(), RxBytes: e.rxBytes.Load(), RxDropped: e.rxDropped.Load(),
	}
}

// DeliverFrames implements exn.Link: it injects inbound Ethernet frames
// into the stack, in order, on the caller's goroutine. It copies each frame
// (into a gVisor buffer) and keeps no reference to frames. Frames that
// arrive before Attach or after Close, runts and oversized frames are
// dropped and counted; after Close it returns net.ErrClosed.
func (e *Endpoint) DeliverFrames(frames [][]byte) error {
	if e.closed.Load() {
		e.rxDropped.Add(uint64(len(frames)))
		return net.ErrClosed
	}
	e.mu.RLock()
	d := e.dispatcher
	e.mu.RUnlock()
	if d == nil {
		e.rxDropped.Add(uint64(len(frames)))
		return nil
	}
	max := int(e.maxFrame.Load())
	var nb uint64
	for _, f := range frames {
		if len(f) < header.EthernetMinimumSize || len(f) > max {
			e.rxDropped.Add(1)
			e.report("rx frame dropped", "len", len(f), "max", max)
			continue
		}
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: frameBuffer(f)})
		// The Ethernet wrapper parses the header and ignores this protocol.
		d.DeliverNetworkPacket(0, pkt)
		pkt.DecRef()
		nb += uint64(len(f))
	}
	e.rxFrames.Add(uint64(len(frames)))
	e.rxBytes.Add(nb)
	return nil
}

// splitMin is the smallest frame whose headers DeliverFrames puts in a
// chunk of their own; maxHeaders bounds that chunk (Ethernet, IPv6 with
// extension headers or IPv4 with options, TCP with options).
const (
	splitMin   = 1024
	maxHeaders = 256
)

// frameBuffer copies frame f into a new gVisor buffer. A large frame gets
// two views: its headers (up to the TCP or UDP payload, or maxHeaders
// bytes) and the rest. The stack's IP layer holds a reference to the
// network header's view while it reads the headers again, and a read of a
// shared chunk copies the whole chunk: with the frame in one 64 KiB chunk
// that was a 64 KiB clear and copy per received segment, with the headers
// apart it is a few hundred bytes.
func frameBuffer(f []byte) buffer.Buffer {
	if len(f) < splitMin {
		return buffer.MakeWithData(f)
	}
	n := headerLen(f)
	// Prepend, not Append: Append would fill the header chunk's spare
	// room with payload.
	b := buffer.MakeWithView(buffer.NewViewWithData(f[n:]))
	if err := b.Prepend(buffer.NewViewWithData(f[:n])); err != nil {
		b.Release()
		return buffer.MakeWithData(f)
	}
	return b
}

// headerLen returns where the payload of frame f starts: after the TCP or
// UDP header of an IPv4 or IPv6 packet, else (or if the headers look
// wrong) maxHeaders. It never exceeds maxHeaders or len(f)-1.
func headerLen(f []byte) int {
	n := maxHeaders
	const eth = header.EthernetMinimumSize
	var proto uint8
	var l3 int
	switch header.Ethernet(f).Type() {
	case header.IPv4ProtocolNumber:
		ip := header.IPv4(f[eth:])
		if len(ip) < header.IPv4MinimumSize {
			break
		}
		l3 = int(ip.HeaderLength())
		proto = ip.Protocol()
	case header.IPv6ProtocolNumber:
		ip := header.IPv6(f[eth:])
		if len(ip) < header.IPv6MinimumSize {
			break
		}
		l3 = header.IPv6MinimumSize
		proto = ip.NextHeader() // an extension header: maxHeaders
	}
	if l3 >= header.IPv4MinimumSize {
		l4 := eth + l3
		switch proto {
		case uint8(header.TCPProtocolNumber):
			if len(f) >= l4+header.TCPMinimumSize {
				if off := int(header.TCP(f[l4:]).DataOffset()); off >= header.TCPMinimumSize {
					n = l4 + off
				}
			}
		case uint8(header.UDPProtocolNumber):
			n = l4 + header.UDPMinimumSize
		}
	}
	return max(eth, min(n, maxHeaders, len(f)-1))
}

// WritePackets implements stack.LinkEndpoint. Each packet carries its
// Ethernet header (pushed by the wrapper). WritePackets copies the packets
// into the transmit queue and never blocks; it does not take ownership of
// pkts. It returns how many were queued: when the queue is full the rest are
// dropped and counted (ErrNoBufferSpace if none fit); after Close it returns
// ErrClosedForSend.
func (e *Endpoint) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	if e.closed.Load() {
		e.txClosed.Add(uint64(pkts.Len()))
		return 0, &tcpip.ErrClosedForSend{}
	}
	max := int(e.maxFrame.Load())
	n := 0
	for _, pkt := range pkts.AsSlice() {
		size := pkt.Size()
		if size > max {
			e.txOversize.Add(1)
			e.report("tx packet over mtu dropped", "len", size, "max", max)
			n++ // consumed: retrying cannot help
			continue
		}
		if e.queued.Load()+int64(size) > e.qBytes {
			e.txFull.Add(uint64(pkts.Len() - n))
			break
		}
		f := e.getBuf(size)
		f.b = appendPacket(f.b[:0], pkt)
		e.queued.Add(int64(size))
		e.pending.Add(1)
		select {
		case e.txq <- f:
			n++
			continue
		default:
		}
		e.queued.Add(-int64(size))
		e.pending.Add(-1)
		e.putBuf(f)
		e.txFull.Add(uint64(pkts.Len() - n))
		break
	}
	if n == 0 && pkts.Len() > 0 {
		return 0, &tcpip.ErrNoBufferSpace{}
	}
	return n, nil
}

// appendPacket appends pkt's bytes, link header first, to b without
// allocating: it walks the packet's views from its header offset.
func appendPacket(b []byte, pkt *stack.PacketBuffer) []byte {
	vl, off := pkt.AsViewList()
	for v := vl.Front(); v != nil; v = v.Next() {
		s := v.AsSlice()
		if off >= len(s) {
			off -= len(s)
			continue
		}
		b = append(b, s[off:]...)
		off = 0
	}
	return b
}

func (e *Endpoint) getBuf(size int) *frameBuf {
	if size <= smallFrame {
		return e.small.Get().(*frameBuf)
	}
	return e.large.Get().(*frameBuf)
}

func (e *Endpoint) putBuf(f *frameBuf) {
	f.b = f.b[:0]
	if f.large {
		e.large.Put(f)
	} else {
		e.small.Put(f)
	}
}

// txLoop owns the transmit side: it waits for a frame, drains up to a batch
// without blocking, and hands the batch to tx. It returns on Close.
func (e *Endpoint) txLoop(tx Transmitter) {
	defer e.wg.Done()
	batch := make([]*frameBuf, 0, e.batchMax)
	frames := make([][]byte, 0, e.batchMax)
	for {
		select {
		case f := <-e.txq:
			batch = append(batch, f)
		case <-e.ctx.Done():
			return
		}
	fill:
		for len(batch) < e.batchMax {
			select {
			case f := <-e.txq:
				batch = append(batch, f)
			default:
				break fill
			}
		}
		frames = frames[:0]
		var nb int64
		for _, f := range batch {
			frames = append(frames, f.b)
			nb += int64(len(f.b))
		}
		e.queued.Add(-nb)
		e.transmit(tx, frames)
		for i, f := range batch {
			e.putBuf(f)
			batch[i] = nil
		}
		e.pending.Add(-int64(len(batch)))
		batch = batch[:0]
		clear(frames)
	}
}

// transmit sends frames, skipping (and counting) any frame Transmit
// rejects so that one frame to a dead node does not drop its batch-mates.
func (e *Endpoint) transmit(tx Transmitter, frames [][]byte) {
	for len(frames) > 0 {
		n, err := tx.Transmit(e.ctx, frames)
		for _, f := range frames[:n] {
			e.txBytes.Add(uint64(len(f)))
		}
		e.txFrames.Add(uint64(n))
		if err == nil {
			return
		}
		if e.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
			e.txClosed.Add(uint64(len(frames) - n))
			return
		}
		e.txErrors.Add(1)
		e.report("tx frame rejected", "err", err)
		frames = frames[n+1:]
	}
}

// report logs a drop at most once a second.
func (e *Endpoint) report(msg string, args ...any) {
	now := time.Now().UnixNano()
	last := e.lastLog.Load()
	if now-last < int64(time.Second) || !e.lastLog.CompareAndSwap(last, now) {
		return
	}
	e.log.Warn("netstack: "+msg, args...)
}

// Flush waits until every frame written so far has been through Transmit,
// ctx is done, or the endpoint is closed. It lets a caller push out final
// frames (such as the RSTs of aborted connections) before closing the
// engine.
func (e *Endpoint) Flush(ctx context.Context) error {
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for e.pending.Load() > 0 {
		if (!e.started.Load() && !e.pulling.Load()) || e.closed.Load() {
			return net.ErrClosed
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-e.ctx.Done():
			return net.ErrClosed
		case <-t.C:
		}
	}
	return nil
}

// Close implements stack.LinkEndpoint. It runs the on-close action and
// shuts the endpoint down: it stops the transmit goroutine (a Transmit
// blocked on back-pressure is cancelled) and waits for it; queued frames
// are dropped. Later writes return ErrClosedForSend and DeliverFrames
// returns net.ErrClosed. Close is idempotent.
func (e *Endpoint) Close() {
	e.mu.RLock()
	action := e.onClose
	e.mu.RUnlock()
	if action != nil && !e.closed.Load() {
		action()
	}
	e.shutdown()
}

// shutdown is Close without the on-close action. It is idempotent.
func (e *Endpoint) shutdown() {
	e.closeOne.Do(func() {
		e.closed.Store(true)
		e.cancel()
		e.wg.Wait()
		for {
			select {
			case f := <-e.txq:
				e.txClosed.Add(1)
				e.pending.Add(-1)
				e.putBuf(f)
				continue
			default:
			}
			break
		}
	})
}

// Wait implements stack.LinkEndpoint: it waits for the transmit goroutine,
// which stops on Close or on detach (Attach(nil)). The stack removes a NIC
// by detaching, then Wait, then Close, so Wait never waits on itself.
func (e *Endpoint) Wait() { e.wg.Wait() }

// Attach implements stack.LinkEndpoint. Detaching (a nil dispatcher, as
// the stack does when it removes the NIC) shuts the endpoint down as Close
// does: an Endpoint serves one NIC for its lifetime.
func (e *Endpoint) Attach(d stack.NetworkDispatcher) {
	e.mu.Lock()
	was := e.dispatcher
	e.dispatcher = d
	e.mu.Unlock()
	if d == nil && was != nil {
		e.shutdown()
	}
}

// IsAttached implements stack.LinkEndpoint.
func (e *Endpoint) IsAttached() bool {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.dispatcher != nil
}

// MTU implements stack.LinkEndpoint: the largest frame, IP MTU plus the
// 14-byte Ethernet header (the Ethernet wrapper subtracts it again).
func (e *Endpoint) MTU() uint32 { return e.maxFrame.Load() }

// SetMTU implements stack.LinkEndpoint. mtu is a frame size, as MTU
// returns; values outside the configurable range are ignored.
func (e *Endpoint) SetMTU(mtu uint32) {
	if mtu < MinMTU+header.EthernetMinimumSize || mtu > MaxMTU+header.EthernetMinimumSize {
		return
	}
	e.mu.Lock()
	e.mtu = mtu - header.EthernetMinimumSize
	e.maxFrame.Store(mtu)
	e.mu.Unlock()
}

// MaxHeaderLength implements stack.LinkEndpoint. The endpoint adds no
// header; the Ethernet wrapper reserves its own.
func (*Endpoint) MaxHeaderLength() uint16 { return 0 }

// LinkAddress implements stack.LinkEndpoint.
func (e *Endpoint) LinkAddress() tcpip.LinkAddress {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.linkAddr
}

// SetLinkAddress implements stack.LinkEndpoint.
func (e *Endpoint) SetLinkAddress(addr tcpip.LinkAddress) {
	e.mu.Lock()
	e.linkAddr = addr
	e.mu.Unlock()
}

// Capabilities implements stack.LinkEndpoint: checksum offload only if
// configured (see Config.ChecksumOffload). The Ethernet wrapper adds
// CapabilityResolutionRequired, so ARP and NDP run.
func (e *Endpoint) Capabilities() stack.LinkEndpointCapabilities {
	if e.offload {
		return stack.CapabilityTXChecksumOffload | stack.CapabilityRXChecksumOffload
	}
	return stack.CapabilityNone
}

// ARPHardwareType implements stack.LinkEndpoint; the Ethernet wrapper
// reports ARPHardwareEther.
func (*Endpoint) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareNone }

// AddHeader implements stack.LinkEndpoint; the Ethernet wrapper adds the
// header.
func (*Endpoint) AddHeader(*stack.PacketBuffer) {}

// ParseHeader implements stack.LinkEndpoint; the Ethernet wrapper parses
// the header.
func (*Endpoint) ParseHeader(*stack.PacketBuffer) bool { return true }

// SetOnCloseAction implements stack.LinkEndpoint: action runs at the start
// of Close.
func (e *Endpoint) SetOnCloseAction(action func()) {
	e.mu.Lock()
	e.onClose = action
	e.mu.Unlock()
}

package extds

// Node-level messages of the Device, not addressed to a connection: the
// listener probe (PROBE / PROBE_REPLY) a client sends before its hello,
// the port registrations that answer it, NOCONN for a connection ID this
// node does not know, and the client's negative cache of addresses that
// do not speak EXT-DS. The out-of-band CLAIM is claim.go; both ask a peer
// the same way (ask).
//
// Locks: the handlers run on the rx loop and take Device.mu only to read
// ports, probes and byPeer; answers go through the control sender
// (ctrlLoop), never a Send on the rx loop. A prober holds no lock while it
// sends and waits. negMu guards the negative cache and is a leaf lock.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/exn-project/exn/fabric"
)

// noConn answers data for the unknown connection ID id with NOCONN,
// rate-limited.
func (d *Device) noConn(v *vdev, peer fabric.Addr, id uint32) {
	if !d.noConnRL.allow(noConnLimit) {
		d.ctr.noConnLimit.Add(1)
		return
	}
	d.sendCtl(v, peer, id, TagNoConn)
}

// onNoConn fails the connection whose peer (the source) no longer knows
// the ID it was sent to. The ID is the peer's: look it up by (source,
// peer ID), which only the real peer can match since the fabric fills in
// the source.
func (d *Device) onNoConn(v *vdev, from fabric.Addr, m *msg) {
	d.mu.RLock()
	c := d.byPeer[peerKey{from, m.conn}]
	d.mu.RUnlock()
	if c == nil || c.vd != v {
		// Both sides already released, or a forgery: counted, not logged.
		d.ctr.drops[DropUnknownConn].Add(1)
		return
	}
	d.ctr.resetsRecv.Add(1)
	c.fail(fmt.Errorf("peer has no such connection: %w", errReset), false)
}

// onProbe answers a peer's listener probe for a port served by vdev v.
func (d *Device) onProbe(v *vdev, from fabric.Addr, m *msg) {
	port := uint16(m.a)
	if int(port&0xF) != v.idx {
		d.drop(DropProbe, "from", from, "port", port, "vdev", v.idx, "why", "probe on the wrong vdev")
		return
	}
	d.mu.RLock()
	n := d.ports[port]
	d.mu.RUnlock()
	var st uint8
	if n > 0 {
		st = 1
	}
	d.ctr.probesServed.Add(1)
	d.queueCtl(ctrlReq{vd: v, peer: from, conn: m.conn, tag: TagProbeRep, port: port, status: st})
}

// onProbeReply hands an answer to the probe waiting for it.
func (d *Device) onProbeReply(v *vdev, from fabric.Addr, m *msg) {
	d.mu.RLock()
	pw := d.probes[m.conn]
	d.mu.RUnlock()
	if pw == nil || pw.vd != v || pw.peer != from || pw.port != uint16(m.a) {
		d.drop(DropProbe, "from", from, "token", m.conn, "port", m.a, "why", "reply matches no probe")
		return
	}
	select {
	case pw.ch <- m.b == 1:
	default:
		d.drop(DropProbe, "from", from, "token", m.conn, "why", "duplicate reply")
	}
}

// RegisterPort says an EXT-DS listener for TCP port is served on this
// node, so a peer's probe for it is answered "yes" (Listen and NewListener
// do this themselves; exnd's shim server calls it for shimmed apps). It
// opens the port's vdev, which must be open to receive probes and
// connections. Registrations are counted: the port is unlisted when every
// registration's unregister has run. unregister is idempotent.
func (d *Device) RegisterPort(port uint16) (unregister func(), err error) {
	if _, err := d.vdev(int(port & 0xF)); err != nil {
		return func() {}, err
	}
	hookUnreg := func() {}
	if d.cfg.portHook != nil {
		u, err := d.cfg.portHook(port)
		if err != nil {
			return func() {}, err
		}
		hookUnreg = u
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		hookUnreg()
		return func() {}, net.ErrClosed
	}
	d.ports[port]++
	d.mu.Unlock()
	return uncount(&d.mu, d.ports, port, hookUnreg), nil
}

// uncount returns the unregister of one counted registration of port in
// ports (guarded by mu): it takes the registration back, the port's entry
// with the last one, then runs after. It is idempotent.
func uncount(mu sync.Locker, ports map[uint16]int, port uint16, after func()) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			mu.Lock()
			if ports[port]--; ports[port] <= 0 {
				delete(ports, port)
			}
			mu.Unlock()
			after()
		})
	}
}

// Listening reports whether port is registered (RegisterPort).
func (d *Device) Listening(port uint16) bool {
	d.mu.RLock()
	auto := d.ports[port] > 0
	d.mu.RUnlock()
	return auto || d.claimListening(port)
}

// Probe asks node's Device whether an EXT-DS listener is registered for
// TCP port. It sends one PROBE from the vdev of localPort (the prober's
// side of the shadow connection) to VPID base + (port & 0xF) on node —
// the prober's own base, or, in a process attached through exnd
// (AttachDevice), exnd's block, which answers for the node's attached
// listeners too — and waits at most the probe timeout;
// a node whose vdev for port is not open, or no answer in time, is
// "no". The error is non-nil only when ctx ends or the Device is closed.
func (d *Device) Probe(ctx context.Context, node fabric.NodeID, localPort, port uint16) (bool, error) {
	v, peer, err := d.askTarget(node, localPort, port)
	if err != nil {
		return false, err
	}
	pw := &probeWait{vd: v, peer: peer, port: port, ch: make(chan bool, 1)}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return false, net.ErrClosed
	}
	tok := freeID(&d.nextTok, d.probes)
	d.probes[tok] = pw
	d.mu.Unlock()
	defer dropWait(&d.mu, d.probes, tok)
	var fm [1]fabric.Message
	encProbe(&fm[0], peer, TagProbe, tok, port, 0)
	yes, res, err := ask(ctx, d, v, d.cfg.probeTO, &fm, pw.ch)
	return res == askAnswered && yes, err
}

// askTarget returns the vdev a question about port is sent from (that of
// localPort, the asker's side of the shadow connection) and the address
// it goes to: VPID base + (port & 0xF) on node, where base is the probe
// base (exnd's block, for a process attached through exnd) or our own.
func (d *Device) askTarget(node fabric.NodeID, localPort, port uint16) (*vdev, fabric.Addr, error) {
	v, err := d.vdev(int(localPort & 0xF))
	if err != nil {
		return nil, fabric.Addr{}, err
	}
	pbase := d.cfg.probeBase
	if pbase == 0 {
		pbase = d.cfg.base
	}
	return v, fabric.Addr{Node: node, VPID: pbase + fabric.VPID(port&0xF)}, nil
}

// askResult says how a question to a peer's Device ended.
type askResult uint8

const (
	askAnswered askResult = iota // the answer came
	askUnsent                    // the Send failed: unknown node or vdev, peer down, mailbox stuck
	askTimeout                   // no answer in time (counted)
)

// ask sends the question fm (a PROBE or a CLAIM) from v and waits at most
// timeout for the answer the rx loop puts on ch. err is non-nil only when
// ctx ended or the Device closed; otherwise res says whether ans is an
// answer. No lock is held.
func ask[T any](ctx context.Context, d *Device, v *vdev, timeout time.Duration, fm *[1]fabric.Message, ch <-chan T) (ans T, res askResult, err error) {
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d.ctr.probes.Add(1)
	if _, err := v.ep.Send(actx, fm[:]); err != nil {
		if ctx.Err() != nil {
			return ans, 0, ctx.Err()
		}
		if errors.Is(err, net.ErrClosed) {
			return ans, 0, err
		}
		return ans, askUnsent, nil
	}
	select {
	case ans = <-ch:
		return ans, askAnswered, nil
	case <-actx.Done():
		if ctx.Err() != nil {
			return ans, 0, ctx.Err()
		}
		d.ctr.probeTimeouts.Add(1)
		return ans, askTimeout, nil
	case <-d.ctx.Done():
		return ans, 0, net.ErrClosed
	}
}

// freeID returns the next ID after *next that is neither 0 nor in use in
// m, and leaves it in *next. IDs count up and skip live ones, so a stale
// ID (of a connection, probe or claim) comes back only after 2^32 others.
func freeID[V any](next *uint32, m map[uint32]V) uint32 {
	for {
		*next++
		if _, used := m[*next]; *next != 0 && !used {
			return *next
		}
	}
}

// dropWait removes the waiter filed under tok (by freeID) from m, which
// mu guards: what an asker defers once its question is filed.
func dropWait[V any](mu sync.Locker, m map[uint32]V, tok uint32) {
	mu.Lock()
	delete(m, tok)
	mu.Unlock()
}

func (d *Device) negative(addr string) bool {
	d.negMu.Lock()
	defer d.negMu.Unlock()
	return timeLeft(d.neg, addr, time.Now()) > 0
}

func (d *Device) setNegative(addr string) {
	d.negMu.Lock()
	if len(d.neg) > 4096 { // bound the cache; forget everything rather than grow
		clear(d.neg)
	}
	d.neg[addr] = time.Now().Add(d.cfg.negativeTTL)
	d.negMu.Unlock()
}

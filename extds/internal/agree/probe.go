package agree

// The listener probe (PROBE / PROBE_REPLY) a client sends before its
// hello, the port registrations that answer it, and the client's
// negative cache of addresses that do not speak EXT-DS. The out-of-band
// CLAIM is claim.go; both ask a peer the same way (ask, agent.go).
//
// Locks: the handlers run on the rx loop and take pmu only to read ports
// and probes; answers go through the Host's control sender, never a
// Send on the rx loop. A prober holds no lock while it sends and waits.
// negMu guards the negative cache and is a leaf lock.

import (
	"context"
	"net"
	"time"

	"github.com/exn-project/exn/extds/internal/wire"
	"github.com/exn-project/exn/fabric"
)

// probeWait is one listener probe waiting for its answer.
type probeWait struct {
	vd   int
	peer fabric.Addr
	port uint16
	ch   chan bool // cap 1
}

// onProbe answers a peer's listener probe for a port served by vdev v.
func (a *Agent) onProbe(v int, from fabric.Addr, m *wire.Msg) {
	port := uint16(m.A)
	if int(port&0xF) != v {
		a.drop("from", from, "port", port, "vdev", v, "why", "probe on the wrong vdev")
		return
	}
	a.pmu.RLock()
	n := a.ports[port]
	a.pmu.RUnlock()
	var st uint8
	if n > 0 {
		st = 1
	}
	a.ctr.probesServed.Add(1)
	a.host.Queue(v, wire.Ctl{Peer: from, Conn: m.Conn, Tag: wire.TagProbeRep, Port: port, Status: st})
}

// onProbeReply hands an answer to the probe waiting for it.
func (a *Agent) onProbeReply(v int, from fabric.Addr, m *wire.Msg) {
	a.pmu.RLock()
	pw := a.probes[m.Conn]
	a.pmu.RUnlock()
	if pw == nil || pw.vd != v || pw.peer != from || pw.port != uint16(m.A) {
		a.drop("from", from, "token", m.Conn, "port", m.A, "why", "reply matches no probe")
		return
	}
	select {
	case pw.ch <- m.B == 1:
	default:
		a.drop("from", from, "token", m.Conn, "why", "duplicate reply")
	}
}

// RegisterPort implements Device.RegisterPort: it opens the port's vdev,
// runs the PortHook, and counts the registration.
func (a *Agent) RegisterPort(port uint16) (unregister func(), err error) {
	if err := a.host.Open(int(port & 0xF)); err != nil {
		return func() {}, err
	}
	hookUnreg := func() {}
	if a.cfg.PortHook != nil {
		u, err := a.cfg.PortHook(port)
		if err != nil {
			return func() {}, err
		}
		hookUnreg = u
	}
	if a.host.Closed() {
		hookUnreg()
		return func() {}, net.ErrClosed
	}
	a.pmu.Lock()
	a.ports[port]++
	a.pmu.Unlock()
	return uncount(&a.pmu, a.ports, port, hookUnreg), nil
}

// Listening reports whether port is registered, by RegisterPort or
// RegisterClaimPort.
func (a *Agent) Listening(port uint16) bool {
	a.pmu.RLock()
	auto := a.ports[port] > 0
	a.pmu.RUnlock()
	return auto || a.claimListening(port)
}

// Probe implements Device.Probe.
func (a *Agent) Probe(ctx context.Context, node fabric.NodeID, localPort, port uint16) (bool, error) {
	v, peer, err := a.askTarget(node, localPort, port)
	if err != nil {
		return false, err
	}
	if a.host.Closed() {
		return false, net.ErrClosed
	}
	pw := &probeWait{vd: v, peer: peer, port: port, ch: make(chan bool, 1)}
	a.pmu.Lock()
	tok := FreeID(&a.nextTok, a.probes)
	a.probes[tok] = pw
	a.pmu.Unlock()
	defer dropWait(&a.pmu, a.probes, tok)
	var fm [1]fabric.Message
	wire.EncProbe(&fm[0], peer, wire.TagProbe, tok, port, 0)
	yes, res, err := ask(ctx, a, v, a.cfg.ProbeTimeout, &fm, pw.ch)
	return res == askAnswered && yes, err
}

// Negative reports whether addr is in the negative cache: the client
// takes it as plain TCP without asking.
func (a *Agent) Negative(addr string) bool {
	a.negMu.Lock()
	defer a.negMu.Unlock()
	return timeLeft(a.neg, addr, time.Now()) > 0
}

// SetNegative puts addr in the negative cache for NegativeTTL.
func (a *Agent) SetNegative(addr string) {
	a.negMu.Lock()
	if len(a.neg) > 4096 { // bound the cache; forget everything rather than grow
		clear(a.neg)
	}
	a.neg[addr] = time.Now().Add(a.cfg.NegativeTTL)
	a.negMu.Unlock()
}

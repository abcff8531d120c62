package exn

// Per-peer offload capability, negotiated with hellos (wire.go, tag 0x03).
//
//	first transmit to a peer whose capability is unknown
//	   └─ hello{version, our caps, reply-please} queued (ctlq, sent by the
//	      control goroutine); until a hello comes back the peer is
//	      treated as an engine without offload (software fallbacks)
//	hello from a peer (rxLoop)
//	   ├─ its caps recorded (masked to the bits we know)
//	   └─ reply-please: our hello queued back, without reply-please
//	plain advert (tag 0x01) from a peer recorded as capable, an advert
//	sequence gap, or the peer found dead by housekeeping
//	   └─ forgotten: the next transmit says hello again
//
// An engine without this code counts a hello as bad-tag and never
// answers, so it stays "no offload" and gets complete frames. A capable
// engine sends every rendezvous frame to a capable peer as an offload
// advert (tag 0x04), so a plain advert from a peer recorded as capable
// means it restarted as another version.
//
// State: one atomic word per node ID, written by rxLoop (hellos,
// forgetting) and by transmitters (the hello-sent bit, CAS), read
// lock-free on the transmit path.

import "github.com/exn-project/exn/fabric"

const (
	// helloVersion is the hello layout this engine writes; it reads any
	// version ≥ 1 whose first three bytes keep this meaning.
	helloVersion = 1
	helloLen     = 3
	helloReply   = 1 << 0 // flags: the sender does not know our caps yet
	helloPush    = 1 << 1 // flags: the sender pushes into grants (push.go)

	peerKnown     = 1 << 8  // caps (low byte) came in a hello
	peerHelloSent = 1 << 9  // our hello with reply-please is on its way
	peerPushes    = 1 << 10 // its hello said it pushes into grants
)

// peerCaps is the capability the engine may use towards node: zero until
// the node said hello.
func (e *Engine) peerCaps(node fabric.NodeID) uint8 {
	w := e.peers[node].Load()
	if w&peerKnown == 0 {
		return 0
	}
	return uint8(w)
}

// hello makes sure node gets our hello once: the first transmit to a
// node of unknown capability queues it. Cheap when done (one load).
func (e *Engine) hello(node fabric.NodeID) {
	p := &e.peers[node]
	w := p.Load()
	if w&(peerKnown|peerHelloSent) != 0 || !p.CompareAndSwap(w, w|peerHelloSent) {
		return
	}
	if !e.queueCtl(ctlMsg{node: node, kind: tagHello, flags: helloReply}) {
		p.CompareAndSwap(w|peerHelloSent, w) // try again on the next transmit
	}
}

// gotHello records a peer's hello and answers one that asks (rxLoop).
func (e *Engine) gotHello(node fabric.NodeID, p []byte) {
	if len(p) < helloLen || p[0] < helloVersion {
		e.drop(DropHelloMalformed, node)
		return
	}
	caps := p[1] & capAll
	w := uint32(caps) | peerKnown | peerHelloSent
	if p[2]&helloPush != 0 {
		w |= peerPushes
	}
	e.peers[node].Store(w)
	if src := e.rx.sources[node]; src != nil && w&peerPushes != 0 {
		e.maybeGrant(src) // its adverts came before its hello
	}
	e.ctr.hellos.Add(1)
	if p[2]&helloReply != 0 {
		e.queueCtl(ctlMsg{node: node, kind: tagHello})
	}
}

// forgetPeer drops what we know of node's capability (rxLoop).
func (e *Engine) forgetPeer(node fabric.NodeID) { e.peers[node].Store(0) }

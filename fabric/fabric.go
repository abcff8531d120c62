package fabric

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Hardware limits of the emulated NIC. They are the Extoll Tourmalet values
// from the dissertation's §3.2 and are the same for every backend.
const (
	// MaxVELOPayload is the largest VELO payload: a 128-byte mailbox slot
	// less its 8-byte status word.
	MaxVELOPayload = 120
	// SlotSize is the size of one VELO mailbox slot.
	SlotSize = 128
	// RMAMTU is the payload of one RMA network packet (512 B less a
	// 16-byte network descriptor). Notifications name the last such packet.
	RMAMTU = 496
	// MaxRMALen is the most one RMA descriptor moves.
	MaxRMALen = 8 << 20
	// MaxGroups is the number of multicast groups.
	MaxGroups = 64
	// Broadcast is the multicast group every node belongs to.
	Broadcast Group = MaxGroups - 1
	// DefaultNotifyDepth is the least number of notifications a VPID's
	// queue holds.
	DefaultNotifyDepth = 4096
	// EthVPID is the VPID reserved for EXT-Eth.
	EthVPID VPID = 0
)

// NodeID names a node on the fabric (16 bits, Figure 5.13).
type NodeID uint16

// VPID is a virtual process ID on one node (0–255). Mailboxes, registered
// memory and notification queues belong to exactly one VPID.
type VPID uint8

// Group is a multicast group ID, 0..MaxGroups-1.
type Group uint8

// Tag is VELO's 8-bit message type tag; its meaning belongs to the protocol
// above (EXT-Eth, EXT-DS).
type Tag uint8

// Addr is a (node, VPID) pair: the address of an Endpoint.
type Addr struct {
	Node NodeID
	VPID VPID
}

func (a Addr) String() string { return fmt.Sprintf("%d:%d", a.Node, a.VPID) }

// Sentinel errors. Backends wrap them with short context, so callers test
// with errors.Is. A closed NIC or Endpoint returns net.ErrClosed.
var (
	// ErrPeerDown: the addressed node is gone (its process died or its NIC
	// was closed). A call blocked on that node returns it.
	ErrPeerDown = errors.New("fabric: peer down")
	// ErrUnknownNode: no such node, or the VPID is not open on it.
	ErrUnknownNode = errors.New("fabric: unknown node or vpid")
	// ErrInUse: a VPID (or node ID) is already owned by someone else.
	ErrInUse = errors.New("fabric: already in use")
	// ErrInvalid: a malformed request — a payload over 120 bytes, an RMA
	// length of 0 or over 8 MiB, a local NLA outside this endpoint's regions,
	// a bad group, an undecodable descriptor.
	ErrInvalid = errors.New("fabric: invalid request")
)

// Message is one VELO message. It is a value type with its payload inline,
// so a []Message batch moves through the hot path without allocation.
type Message struct {
	// Peer is the target on Send and the source on Recv. On Recv the NIC
	// fills it in; a sender cannot forge it.
	Peer Addr
	// MC marks a multicast message. On Send, Peer.Node holds the Group and
	// Peer.VPID the VPID addressed on every member.
	MC bool
	// Tag is the 8-bit message type tag.
	Tag Tag
	// Len is the payload length, 0..MaxVELOPayload.
	Len uint8
	// Data holds the payload in Data[:Len].
	Data [MaxVELOPayload]byte
}

// Payload returns the message payload. It aliases m.Data.
func (m *Message) Payload() []byte { return m.Data[:m.Len] }

// SetPayload copies p into the message. It fails with ErrInvalid if p is
// longer than MaxVELOPayload.
func (m *Message) SetPayload(p []byte) error {
	if len(p) > MaxVELOPayload {
		return fmt.Errorf("velo payload %d bytes > %d: %w", len(p), MaxVELOPayload, ErrInvalid)
	}
	m.Len = uint8(copy(m.Data[:], p))
	return nil
}

// Op is an RMA command.
type Op uint8

const (
	OpPut Op = 1 // write local memory into the peer's region
	OpGet Op = 2 // read the peer's region into local memory
)

var opNames = [...]string{OpPut: "put", OpGet: "get"}

func (o Op) String() string { return enumString(opNames[:], uint8(o), "op") }

// enumString is the String of a small enumeration: names[v], or what(v)
// for a value without a name.
func enumString(names []string, v uint8, what string) string {
	if int(v) < len(names) && names[v] != "" {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", what, v)
}

// Notify selects which RMA units write a notification (Table 3.1).
type Notify uint8

const (
	// NotifyRequester: the requesting endpoint, once the request is done on
	// its side. Local address: the requester's own buffer (read for PUT,
	// write for GET).
	NotifyRequester Notify = 1 << iota
	// NotifyCompleter: the unit that wrote the data — the peer for PUT, the
	// requester for GET. Local address: the write address.
	NotifyCompleter
	// NotifyResponder: GET only; the peer whose memory was read. Local
	// address: the read address.
	NotifyResponder
)

// RMA is one RMA work request (one software descriptor).
type RMA struct {
	Op Op
	// Peer is the remote endpoint whose registered region Remote lies in.
	// Peer.Node may be this node (loopback RMA).
	Peer Addr
	// Local is an NLA in a region registered to the posting endpoint.
	Local NLA
	// Remote is an NLA in a region registered to Peer.VPID on Peer.Node.
	Remote NLA
	// Len is the byte count, 1..MaxRMALen.
	Len uint32
	// Notify selects the notifications, per Table 3.1.
	Notify Notify
}

// Region is registered memory. Buf is owned by the fabric: it stays valid
// until the owner's Deregister or Close of its endpoint — a fault under it
// (a dead peer, a lost shm attachment) makes calls fail but never unmaps
// it — and may be read and written by the owner at any time (RMA does not
// synchronise with local access).
type Region struct {
	NLA NLA
	Buf []byte
}

// Endpoint is one opened VPID. It is the NIC's per-process interface: a
// VELO mailbox, a notification queue, registered memory and the RMA
// request queue.
//
// Concurrency: Send and Post may be called from many goroutines; Recv,
// PollNotifications and Wait are meant for a single consumer (the NAPI
// loop) but are safe to call concurrently. Close may be called at any time
// and makes blocked Send and Wait calls return net.ErrClosed.
type Endpoint interface {
	// Addr returns this endpoint's (node, VPID).
	Addr() Addr

	// Send delivers msgs in order. Each target mailbox keeps the order of
	// messages from this endpoint. If a target mailbox is full, Send blocks
	// (back-pressure) until there is room, ctx is done, the target dies
	// (ErrPeerDown) or the endpoint is closed (net.ErrClosed). It returns
	// how many messages were delivered; on error, msgs[n] is the one that
	// failed. Send reads msgs and does not retain them.
	Send(ctx context.Context, msgs []Message) (n int, err error)

	// Recv copies up to len(msgs) messages out of the mailbox, oldest
	// first, and frees their slots. It never blocks: it returns 0, nil when
	// the mailbox is empty.
	Recv(msgs []Message) (n int, err error)

	// Register allocates size bytes of memory that RMA can reach, owned by
	// this VPID. The NLA identifies it fabric-wide together with this
	// endpoint's Addr.
	Register(size int) (Region, error)

	// Deregister releases a region by its base NLA. RMA to it afterwards
	// gets an error notification.
	Deregister(base NLA) error

	// Post starts RMA requests in order. Errors found locally (bad length,
	// Local outside this endpoint's regions, bad flags) are returned at
	// once, and reqs[n] is the failing one. Remote faults (out of bounds,
	// wrong VPID, peer down) become an error notification to this endpoint
	// of kind NotifyRequester, whatever the flags asked, and no memory is
	// touched. Completion is reported only through notifications; a backend
	// may complete a request before Post returns.
	Post(reqs []RMA) (n int, err error)

	// PollNotifications copies up to len(ns) notifications, oldest first,
	// and removes them from the queue. It never blocks.
	//
	// A notification queue holds at least DefaultNotifyDepth entries. The
	// RMA unit never blocks on it (that could deadlock a consumer that also
	// posts): a notification that finds its queue full is dropped and
	// counted in Stats.NotifyOverflow. Protocols bound their outstanding
	// RMA requests below the depth.
	PollNotifications(ns []Notification) (n int, err error)

	// Wait blocks until Recv or PollNotifications may return something
	// (wake-ups may be spurious), ctx is done, or the endpoint is closed
	// (net.ErrClosed). It spins briefly before it sleeps.
	Wait(ctx context.Context) error

	// Close releases the VPID, its mailbox, regions and queues. Blocked
	// calls return net.ErrClosed. Close is idempotent.
	Close() error
}

// NIC is one node's emulated Extoll NIC.
//
// All methods are safe for concurrent use. Close closes every endpoint;
// peers then see this node as down.
type NIC interface {
	// Node returns this node's ID.
	Node() NodeID

	// Open claims a VPID. A VPID has exactly one owner: a second Open, in
	// this process or another, fails with ErrInUse until the first owner
	// closes it or dies.
	Open(v VPID) (Endpoint, error)

	// Join adds this node to a multicast group; Leave removes it. Every
	// node is always a member of Broadcast. A multicast message reaches the
	// addressed VPID on every member except the sending node.
	Join(g Group) error
	Leave(g Group) error

	// Peers lists the other nodes currently up on this fabric.
	Peers() []NodeID

	// Alive reports nil if node n is up, ErrPeerDown if it was up and is
	// gone, or ErrUnknownNode.
	Alive(n NodeID) error

	// Stats returns a snapshot of this NIC's counters.
	Stats() Stats

	// Close shuts the NIC down. It is idempotent.
	Close() error
}

// PeerWatcher is implemented by a NIC that can announce changes of its
// peer set, so that a consumer of Peers need not poll it (fabric/shm's
// NIC does; docs/wakeup.md).
type PeerWatcher interface {
	// PeersChanged returns a channel that is closed at the next change
	// of the peer set (a peer found, or marked down). A caller fetches a
	// fresh channel after each close, before it reads Peers, so no change
	// goes unnoticed. Safe for concurrent use; it never blocks.
	PeersChanged() <-chan struct{}
}

// BufferRegistrar is implemented by an Endpoint that can register memory
// its caller owns — typically an mmap of a file another process maps too
// (an LD_PRELOAD program's connection buffer in /dev/shm) — as ibv_reg_mr
// or fi_mr_reg do, so RMA moves bytes straight from or into it with no
// extra copy. fabric/mem, fabric/fabnet and fabric/ofi implement it;
// fabric/shm does not (its RMA is stores into the target's own /dev/shm
// region files, which a caller's mapping is not). Callers test for it
// with a type assertion.
type BufferRegistrar interface {
	// RegisterBuffer registers buf for RMA, owned by this VPID, and
	// returns its Region: Region.Buf is buf itself (same memory, capacity
	// trimmed to len(buf)), and the region is len(buf) bytes. len(buf)
	// must be 1..MaxRegionSize, as Register's size; otherwise, and when
	// region indices are exhausted, the error wraps ErrInvalid, and on a
	// closed endpoint it is net.ErrClosed.
	//
	// Ownership: buf stays the caller's. The caller keeps it mapped and
	// valid until Deregister of the region's base NLA, or Close of the
	// endpoint, has returned (both wait for RMA in flight on it); the
	// fabric never frees, unmaps or resizes it, and after that return
	// never touches it again. buf should be an mmap, not Go memory:
	// fabric/ofi hands its address to libfabric (it pins Go memory while
	// registered, but providers register page-aligned mappings best).
	//
	// Concurrency: safe to call from many goroutines, like Register. RMA
	// reads and writes buf concurrently with the caller's own access,
	// and with other processes' access through a shared mapping; nothing
	// synchronises them (the protocol above does: e.g. it announces a PUT
	// once the completer notification came, or under PutOrderer; a PUT's
	// requester notification says only that the source was read).
	RegisterBuffer(buf []byte) (Region, error)
}

// RemoteViewer is implemented by an Endpoint that can lend its caller a
// peer's registered memory to read in place, where a GET would first copy
// it into a local region: fabric/shm, whose peers' regions are files this
// process maps anyway and whose GET is a copy out of that mapping. A
// protocol that GETs bytes only to hand them on (EXT-Eth's receiver
// writing a frame to its TAP, exn/rx.go) saves that copy. Backends whose
// peers are on other hosts do not implement it. Callers test for it with
// a type assertion.
type RemoteViewer interface {
	// ViewRemote checks r as Post checks a GET's remote side (r.Op must
	// be OpGet and r.Len 1..MaxRMALen; r.Local is not used) and fills v
	// with the r.Len bytes at r.Remote, in place. A remote fault (the
	// range outside a region registered to r.Peer.VPID, the peer gone) is
	// returned as the NotifyErr a GET would have reported, with v left
	// empty; err is for the local ones: ErrInvalid for a bad request,
	// net.ErrClosed on a closed endpoint. Nothing is notified yet.
	//
	// Ownership: v.Buf is the peer's memory. The caller only reads it,
	// and must not trust two reads of it to agree: the peer may write it
	// at any time, as it may during a GET. It stays mapped, whatever the
	// peer does, until the caller passes v to EndView, which every view
	// must reach exactly once, also after the endpoint closed.
	//
	// Concurrency: safe for concurrent use, like Post. It does not
	// allocate once the peer's region is mapped.
	ViewRemote(r *RMA, v *RemoteView) (NotifyErr, error)

	// EndView returns a view. With notify true it finishes the view as
	// its GET would have finished: the peer gets the responder
	// notification r.Notify asked for (NotifyResponder; the requester's
	// own notifications are not written, the caller knows); with false
	// (the caller dropped the bytes) nothing is notified. A peer gone in
	// the meantime gets nothing. It never blocks and does not allocate.
	EndView(v *RemoteView, notify bool)
}

// RemoteView is a peer's memory lent by RemoteViewer.ViewRemote. It is a
// value the caller keeps (in a queue, without allocation) and passes back
// to EndView unchanged; only Buf is the caller's to read.
type RemoteView struct {
	Buf []byte
	// Req is the request the view stands for.
	Req RMA
	// Token is the backend's reference to what it holds for the view.
	Token any
}

// PutOrderer is implemented by an Endpoint that can say whether its RMA
// PUTs are placed before its later VELO messages are delivered: once
// Post has returned without error for a PUT, a message that the same
// endpoint then Sends to the same peer node is delivered only after the
// PUT's data is in the peer's memory, unless the PUT failed (then its
// requester gets an error notification, and the message may still
// arrive). A protocol can then announce data it PUT with a message
// instead of a completer notification (exn's receiver-granted PUT,
// exn/push.go). Backends that cannot promise it do not implement the
// interface or return false; the answer does not change over the
// endpoint's life.
type PutOrderer interface {
	PutsBeforeSends() bool
}

// BestEffortMulticaster is implemented by an Endpoint whose multicast
// may reach some members as a datagram (fabric/fabnet under lazy
// sessions: the members its node holds no session with, so a broadcast
// does not make a session to every node): such a copy is not ordered
// against the endpoint's unicast messages, and a member whose mailbox is
// full drops it and counts it instead of back-pressuring the sender.
// Copies to the other members keep the contract. Backends that keep it
// for every member do not implement the interface or return false; the
// answer does not change over the endpoint's life.
type BestEffortMulticaster interface {
	MulticastBestEffort() bool
}

// WaitSpinner is implemented by an Endpoint whose Wait spins for a budget
// before it parks (fabric/shm) and lets its consumer shorten that spin.
// A spin pays off when the item usually comes within it, as between two
// consumers that answer each other at once; a consumer that knows its
// items come later than that (EXT-Eth's receive loop, whose frames come
// from other nodes' TAPs, tens of µs apart even in a ping-pong: exn/rx.go)
// spends the spin for nothing, on CPUs its producers need. Callers test
// for it with a type assertion.
type WaitSpinner interface {
	// SetWaitSpin sets how long this endpoint's Wait polls before it
	// parks: d from 0 (park at once) up to the backend's own budget; a
	// longer d leaves that budget. Safe to call at any time, concurrently
	// with Wait; the next Wait uses it.
	SetWaitSpin(d time.Duration)
}

// Colocated is implemented by an Endpoint whose peers all run in this
// process (fabric/mem): a waiter that spins without yielding can then
// keep the very goroutine it waits for from running, so a spin must
// learn to stop (extds/spin.go). Backends across processes do not
// implement it or return false; the answer does not change over the
// endpoint's life.
type Colocated interface {
	PeersInProcess() bool
}

func isErr(err, target error) bool { return errors.Is(err, target) }

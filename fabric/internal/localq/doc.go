// Package localq is the endpoint core the in-process-queue backends
// (fabric/mem, fabric/fabnet, fabric/ofi) share: Core (embedded in each
// backend's endpoint: the Send and Post loops with their accounting,
// notification queue and its overflow accounting, PollNotifications,
// the spin-then-sleep Wait, closed flag and done channel, registration
// checks, the completion notifications of Table 3.1, the errors'
// wording), Regions (Register, RegisterBuffer and Deregister, embedded
// in mem's and fabnet's endpoints), the bounded Mailbox mem and fabnet
// receive into (with Core.Recv and the blocking Core.Deliver, whose wait,
// Core.ParkSender, fabnet's and ofi's senders waiting for credit share),
// Open's VPID table, the region table and the multicast group bitmap,
// and the NIC-level pieces of nic.go (Shut, SelfAlive, AsNIC,
// FaultLogInterval; fabric/shm uses its ClosedChan too). It knows
// nothing of transports; each backend keeps only what is its own: its
// send path and back-pressure (credits in fabnet and ofi), ofi's growing
// mailbox, RMA, and the body of Close.
//
// Locking discipline:
//
//	Core: no lock of its own; its parts below have theirs. Closed and
//	    Done change once, in Shut.
//	Mailbox: Mu guards the ring, the closed flag and the space channel
//	    (*Locked methods need it held); the length is mirrored in an
//	    atomic for Core.Ready. A backend may guard its own accounting
//	    (fabnet's credits) with the same Mu.
//	NotifyQueue: its own mutex guards the ring and the closed flag; the
//	    length is mirrored in an atomic for lock-free readiness checks.
//	    Push never blocks: a full queue drops and counts NotifyOverflow.
//	    Counters are updated after the mutex is released.
//	Waiter: no lock. A consumer spins on the backend's readiness func,
//	    then publishes sleeping and re-checks before it parks on wake;
//	    producers call Signal after making their item visible, and only
//	    a sleeping consumer costs them a channel operation.
//	Table: one RWMutex guards the index counter and the map (index →
//	    region, owner, size). Lookups take it for reading; Register,
//	    Deregister and Close take it for writing. Callers may hold it
//	    (Lock/Unlock, *Locked methods) to make a check, such as "the
//	    endpoint is not closed", atomic with an insert, or to guard
//	    backend fields of their regions. Region bodies (buffers, dead
//	    flags, users) are the backend's and are never touched under it.
//	Groups: one atomic bitmap, no lock.
//
// No lock of this package is held while a caller blocks, and none calls
// back into the backend while held.
//
// # Imports
//
// It may import fabric, internal/ratelog and the standard library; only
// fabric/... backends may import it (Go's internal rule enforces that).
package localq

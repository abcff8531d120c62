/*
 * dring.h: the connection buffer of a direct EXT-DS connection
 * (docs/direct.md), as the shim (and shim/test/dring_test.c) use it.
 *
 * One struct dring describes one process's view of one connection: the
 * mapping, its side S, the two descriptors it parks on and rings (its
 * bell B_S, V) and process-local state (local EIO, SHUT_RD). The caller
 * owns the struct and its storage (the shim's table); dring.c has no
 * global state, allocates nothing, starts no thread, and makes its system
 * calls with syscall(2) so that an LD_PRELOAD shim that links it never
 * sees them (V is the application's descriptor number).
 *
 * Concurrency: any number of threads of one process may call every
 * function at once on one struct; writers of a direction serialise on its
 * prod_lock, readers on its cons_lock (process-shared futexes in the
 * buffer), so each write is contiguous in the stream. Waiters of one side
 * share the bell: the caller's hooks (struct dring_hooks) make the other
 * waiters of its process look again after a drain took bytes off the
 * bell, and keep waiters of a second process off it (docs/direct.md,
 * "One bell per side"). Without hooks, one waiter per side at a time.
 *
 * Errors are returned as negative errno values; nothing sets errno.
 */
#ifndef EXN_DRING_H
#define EXN_DRING_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#define DRING_API __attribute__((visibility("hidden")))

#define EXDD_MAGIC 0x44445845u /* "EXDD" */
#define EXDD_VERSION 4u
/* prod_lock's value while exnd gives an idle, empty ring's pages back
 * (layout version 4; docs/direct.md, "Rings that shrink when idle"): a
 * short hold that never parks, so even a non-blocking writer waits it
 * out on the futex instead of failing with EAGAIN (bounded: a writer
 * that still finds it after 50 ms looks at V, in case exnd died). */
#define EXDD_LOCK_RECLAIM 3u
#define EXDD_HDR 4096u
#define EXDD_RING_MIN 4096u
#define EXDD_RING_MAX (64u << 20)

/*
 * Spin budget before parking on the bell: 20 µs, the same measurement as
 * extds.connSpinBudget (docs/wakeup.md): a peer that answers within a
 * ping-pong round trip is caught without a syscall on either side, and an
 * idle connection costs at most one budget of CPU before it sleeps.
 */
#define EXDD_SPIN_NS 20000L

/* Returned (negated) by the data calls once relay[S] is set: use V as a
 * plain kernel socket from now on. Not an errno value. */
#define DRING_RELAYED 10000

/* Flags of the data calls. */
enum {
	DRING_NONBLOCK = 1 << 0, /* MSG_DONTWAIT / O_NONBLOCK */
	DRING_PEEK = 1 << 1,     /* MSG_PEEK: copy, do not consume */
	DRING_WAITALL = 1 << 2,  /* MSG_WAITALL */
	DRING_TRUNC = 1 << 3,    /* MSG_TRUNC: consume without copying */
	DRING_TIMEO = 1 << 4,    /* honour SO_RCVTIMEO / SO_SNDTIMEO, read from V when parking */
};

/* Control block of one direction (docs/direct.md, "version 1"). */
struct dring_ctl {
	uint64_t tail;
	uint32_t fin;
	uint32_t prod_wait;
	uint32_t prod_lock;
	uint32_t rst;
	uint32_t data_rung; /* the producer rang the consumer's side for data; that side clears it after draining its bell */
	uint8_t pad0[128 - 28];
	uint64_t head;
	uint32_t cons_wait;
	uint32_t cons_lock;
	uint32_t rd_closed;
	uint32_t space_rung; /* the consumer rang the producer's side for space; that side clears it after draining its bell */
	uint8_t pad1[1024 - 128 - 24];
};

/* A waiter of this process parked (or about to park) on a connection's
 * bell: kick is written to make it look again, wait is what it polls
 * beside the bell and V (-1: nothing). */
struct dwaiter {
	int kick, wait;
	struct dwaiter *next;
};

struct dring;

/* What the owner of a struct dring does around the waits (the shim:
 * dparty.c). Any hook may be NULL. */
struct dring_hooks {
	/* w is about to park on d's bell: fill in w->kick and w->wait. 0, or
	 * a negative errno. */
	int (*enter)(struct dring *d, struct dwaiter *w);
	/* w parks no more. */
	void (*leave)(struct dring *d, struct dwaiter *w);
	/* A drain took bytes off d's bell, or d's state changed for every
	 * waiter (fin, SHUT_RD, rst): make the other waiters of d (not self,
	 * which may be NULL) look again. */
	void (*fanout)(struct dring *d, struct dwaiter *self);
	/* w->wait was readable: consume what made it so (NULL: read it
	 * empty). */
	void (*kicked)(struct dwaiter *w);
};

struct dring {
	uint8_t *base;            /* the mapping, 4096 + 2R bytes */
	size_t len;
	uint32_t ring;            /* R */
	int side;                 /* S */
	struct dring_ctl *out;    /* direction S: I produce */
	struct dring_ctl *in;     /* direction 1-S: I consume */
	uint8_t *outdata, *indata;
	uint32_t *pwait;          /* pwait[S] in the header: parked parties of side S, all processes */
	int bell;                 /* B_S: parked on, written to ring the peer */
	int v;                    /* V: one of the application's descriptors of the connection */
	int failed;               /* this process saw a forged cursor: EIO */
	int rd_shut;              /* shutdown(SHUT_RD) in this process */
	const struct dring_hooks *hooks;
};

/*
 * Validate the buffer file bufd (magic, version, ring == R, a power of two
 * in [EXDD_RING_MIN, EXDD_RING_MAX], the header's size and fstat's both
 * 4096 + 2R), map it shared and fill d. bufd is closed in every case; bell
 * and v are recorded, not duplicated (the caller keeps them open as long
 * as d is used; the bell gets O_NONBLOCK). hooks may be NULL. 0 or
 * -EINVAL/-ENOMEM/...
 */
DRING_API int dring_attach(struct dring *d, int bufd, int side, uint32_t ring, int bell, int v, const struct dring_hooks *hooks);

/* Unmap. The descriptors are the caller's to close. */
DRING_API void dring_detach(struct dring *d);

/*
 * Write iov into the outbound ring. Blocking (no DRING_NONBLOCK): returns
 * when everything is written, or with the count so far when a signal, the
 * send timeout or an error stops it (an error with nothing written is
 * returned instead). Nonblocking: what fits, -EAGAIN if nothing does.
 * -EPIPE (rd_closed or SHUT_WR: the caller raises SIGPIPE), -ECONNRESET,
 * -EIO (forged cursor), -EINTR, -EAGAIN (timeout, as SO_SNDTIMEO),
 * -DRING_RELAYED.
 */
DRING_API ssize_t dring_writev(struct dring *d, const struct iovec *iov, int iovcnt, int flags);

/*
 * Read into iov from the inbound ring: waits (unless DRING_NONBLOCK) for
 * at least one byte (all with DRING_WAITALL), 0 at end of stream (fin
 * with the ring empty, or SHUT_RD). Errors as dring_writev, -EAGAIN
 * nonblocking or on SO_RCVTIMEO.
 */
DRING_API ssize_t dring_readv(struct dring *d, const struct iovec *iov, int iovcnt, int flags);

DRING_API ssize_t dring_write(struct dring *d, const void *buf, size_t n, int flags);
DRING_API ssize_t dring_read(struct dring *d, void *buf, size_t n, int flags);

/* shutdown(SHUT_WR): store fin, wake a parked peer. */
DRING_API void dring_fin(struct dring *d);
/* shutdown(SHUT_RD) in this process: reads return 0. */
DRING_API void dring_shut_rd(struct dring *d);
/* Reset: store rst on both directions, wake the peer. */
DRING_API void dring_rst(struct dring *d);
/* The consumer side is gone (last close): store rd_closed, wake the peer. */
DRING_API void dring_rd_closed(struct dring *d);

/* Bytes readable now (FIOREAD), or a negative errno for a forged cursor. */
DRING_API long dring_nread(struct dring *d);
/* Free bytes in the outbound ring now, or a negative errno for a forged cursor. */
DRING_API long dring_space(struct dring *d);

/* The upgrade word at header +80 (docs/direct.md): state of a connection
 * that moves onto this buffer in the middle of its stream (shim/upgrade.c
 * owns its meaning; dring.c only waits on it, dring_wait_upg). */
#define EXDD_HDR_UPG 80u
DRING_API uint32_t *dring_upg(struct dring *d);

/* Ring the peer side (one byte on my bell) with nothing new in the rings:
 * across hosts the peer side is exnd's engine, which then looks at the
 * upgrade word (docs/direct.md, "The upgrade word across hosts"). */
DRING_API void dring_kick(struct dring *d);

/*
 * Wait until the upgrade word has a bit of mask: spin, then park on the
 * bell and V like a data wait (the engine rings the bell when it changes
 * the word). 0 when it has; -ECONNRESET when the connection was reset or
 * exnd is gone (V hung up); -DRING_RELAYED; never -EINTR (a signal's
 * handler runs and the wait goes on: the caller is inside a data call
 * that must not fail for the upgrade's sake).
 */
DRING_API int dring_wait_upg(struct dring *d, uint32_t mask);

/*
 * Wait until the outbound ring has room (without writing): the free
 * bytes (> 0), or -EAGAIN (DRING_NONBLOCK), -EPIPE (fin or rd_closed),
 * -ECONNRESET, -EIO, -DRING_RELAYED, or the wait's -EINTR / -EAGAIN
 * (SO_SNDTIMEO, with DRING_TIMEO). For a writer that must take its bytes
 * from somewhere it cannot put them back (splice from a pipe: shim
 * direct.c) only once they fit. Another writer of the side may take the
 * room first.
 */
DRING_API long dring_wait_space(struct dring *d, int flags);

/* Whether relay[S] is set (exnd relays V from now on). */
DRING_API int dring_relayed(const struct dring *d);

/*
 * Readiness now, as poll(2) bits for a TCP socket: POLLIN|POLLRDNORM,
 * POLLOUT|POLLWRNORM, POLLRDHUP, POLLHUP, POLLERR.
 */
DRING_API unsigned dring_ready(struct dring *d);

/*
 * Arm the waits for events (POLLIN: cons_wait += 1, POLLOUT: prod_wait
 * += 1) so that the peer rings my bell, and return the readiness
 * re-checked after arming: if it intersects events, do not park. Every
 * dring_arm is followed by one dring_disarm with the same events, whether
 * the caller parked or not. The caller drains the bell (dring_bell_drain)
 * when its wait saw it readable.
 */
DRING_API unsigned dring_arm(struct dring *d, unsigned events);

/* Uncount what dring_arm counted. */
DRING_API void dring_disarm(struct dring *d, unsigned events);

/*
 * Empty my bell (non-blocking reads until EAGAIN), then clear the rung
 * flags that target this side, so that the caller looks at the rings
 * again after it and a later ring writes a byte again. Returns the bytes
 * taken (> 0: the caller fans out to its other waiters unless self is
 * given to the hook here: then dring_bell_drain calls the fanout hook
 * itself with self). At EOF (the peer side closed every copy of its
 * bell) a connection that has not ended (fin both ways) is reset; the
 * return value has DRING_BELL_EOF set.
 */
#define DRING_BELL_EOF 0x40000000
DRING_API int dring_bell_drain(struct dring *d, struct dwaiter *self);

/*
 * V was in a wait and reported revents: exnd's death (POLLHUP, POLLERR)
 * resets the connection; V readable while relay[S] is 0 is exnd's reset
 * (rst set) or a protocol violation (EIO). Returns 1 if d's state ended
 * the wait (relayed, reset), else 0.
 */
DRING_API int dring_v_event(struct dring *d, short revents);

/* Empty a descriptor (non-blocking reads until EAGAIN): 1 if it was at
 * EOF, else 0. */
DRING_API int dring_drain(int fd);

/* Pending socket error for SO_ERROR: ECONNRESET, EIO, or 0. */
DRING_API int dring_error(struct dring *d);

#endif

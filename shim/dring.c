/*
 * dring.c: the shared connection buffer of a direct EXT-DS connection
 * (docs/direct.md), two single-producer single-consumer byte rings with
 * their cursors in shared memory. See dring.h for the contract.
 *
 * Data path: a producer copies into its outbound ring, publishes tail
 * (seq_cst, after the data) and, only if consumers are parked
 * (cons_wait > 0, a count) and no ring is pending (data_rung), writes one
 * byte to its bell B_S, which makes the peer's bell B_{1-S} readable; a
 * consumer does the same with head, prod_wait and space_rung. A waiter
 * spins for EXDD_SPIN_NS, then counts itself in (seq_cst add), re-checks,
 * and parks in poll({B_S, V, its kick}): the Dekker pair "add to the
 * count, load the cursor" / "store the cursor, load the count" guarantees
 * that one of the two sees the other. V is in every park so that exnd's
 * death (V hangs up), exnd's own reset (V readable with rst set) and the
 * relay after exec (relay[S], V readable) end the wait.
 *
 * One bell per side (docs/direct.md, "One bell per side"): readers and
 * writers of a side park on the same B_S, and whoever drains it clears
 * both rung flags that target the side and, if it took bytes, asks the
 * owner's fanout hook to make the other waiters of its process look
 * again (their kick descriptors): a drain may take a byte another waiter
 * needed, and one cannot ring one's own bell.
 *
 * Nothing in the mapping is trusted: every cursor load checks
 * tail - head <= R (unsigned), every index is reduced mod R, and a
 * violation fails the connection (EIO here, rst for both sides).
 *
 * System calls go through syscall(2): the shim interposes poll, read,
 * write, getsockopt, close... on V's number, and must not see its own.
 * errno may be clobbered; results are returned as negative errno values.
 */
#define _GNU_SOURCE
#include "dring.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

_Static_assert(sizeof(struct dring_ctl) == 1024, "control block is 1024 bytes");
_Static_assert(offsetof(struct dring_ctl, head) == 128, "head at +128");
_Static_assert(offsetof(struct dring_ctl, rd_closed) == 144, "rd_closed at +144");
_Static_assert(offsetof(struct dring_ctl, data_rung) == 24 && offsetof(struct dring_ctl, space_rung) == 148,
	       "data_rung at +24, space_rung at +148");
_Static_assert(offsetof(struct dring_ctl, prod_wait) == 12 && offsetof(struct dring_ctl, cons_wait) == 136,
	       "wait counts");

#define LD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define ST(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define LD_SC(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define ADD(p, v) __atomic_add_fetch((p), (v), __ATOMIC_SEQ_CST)

#define HDR_MAGIC 0
#define HDR_VERSION 4
#define HDR_RING 8
#define HDR_SIZE 16
#define HDR_RELAY 64
#define HDR_PWAIT 72

static void sys_close(int fd) { syscall(SYS_close, fd); }

/* Ring the peer: one byte into my bell (EAGAIN: bytes are pending,
 * enough; EPIPE: the peer's bell is gone, nobody to wake). */
static void ring_peer(struct dring *d)
{
	char b = 1;
	if (d->bell >= 0)
		(void)syscall(SYS_sendto, d->bell, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL, NULL, 0);
}

/*
 * Ring the peer for what I produced (ring_data) or consumed (ring_space)
 * if it waits, once per drain: the direction's data_rung / space_rung
 * says a ring is pending, and the side that empties its bell clears it
 * (dring_bell_drain). A waiter that stays armed (an epoll record) would
 * otherwise cost a write per message (docs/direct.md, "Wake-up
 * protocol").
 */
static void ring_data(struct dring *d)
{
	if (LD_SC(&d->out->cons_wait) && !LD_SC(&d->out->data_rung) &&
	    !__atomic_exchange_n(&d->out->data_rung, 1, __ATOMIC_SEQ_CST))
		ring_peer(d);
}

static void ring_space(struct dring *d)
{
	if (LD_SC(&d->in->prod_wait) && !LD_SC(&d->in->space_rung) &&
	    !__atomic_exchange_n(&d->in->space_rung, 1, __ATOMIC_SEQ_CST))
		ring_peer(d);
}

/* The other waiters of this process look again (the owner's hook). */
static void fanout(struct dring *d, struct dwaiter *self)
{
	if (d->hooks && d->hooks->fanout)
		d->hooks->fanout(d, self);
}

static int64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ volatile("yield");
#endif
}

int dring_attach(struct dring *d, int bufd, int side, uint32_t ring, int bell, int v, const struct dring_hooks *hooks)
{
	memset(d, 0, sizeof *d);
	d->bell = d->v = -1;
	struct stat st;
	size_t len = EXDD_HDR + 2 * (size_t)ring;
	if ((side != 0 && side != 1) || ring < EXDD_RING_MIN || ring > EXDD_RING_MAX || (ring & (ring - 1)) ||
	    fstat(bufd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != len) {
		sys_close(bufd);
		return -EINVAL;
	}
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, bufd, 0);
	int e = errno;
	sys_close(bufd);
	if (p == MAP_FAILED)
		return -e;
	uint8_t *b = p;
	if (LD((uint32_t *)(b + HDR_MAGIC)) != EXDD_MAGIC || LD((uint32_t *)(b + HDR_VERSION)) != EXDD_VERSION ||
	    LD((uint32_t *)(b + HDR_RING)) != ring || LD((uint64_t *)(b + HDR_SIZE)) != len) {
		munmap(p, len);
		return -EINVAL;
	}
	d->base = b;
	d->len = len;
	d->ring = ring;
	d->side = side;
	d->out = (struct dring_ctl *)(b + 1024 + 1024 * side);
	d->in = (struct dring_ctl *)(b + 1024 + 1024 * (1 - side));
	d->outdata = b + EXDD_HDR + (size_t)side * ring;
	d->indata = b + EXDD_HDR + (size_t)(1 - side) * ring;
	d->pwait = (uint32_t *)(b + HDR_PWAIT + 4 * side);
	d->bell = bell;
	long fl = bell >= 0 ? syscall(SYS_fcntl, bell, F_GETFL) : -1;
	if (fl >= 0 && !(fl & O_NONBLOCK))
		syscall(SYS_fcntl, bell, F_SETFL, fl | O_NONBLOCK);
	d->v = v;
	d->hooks = hooks;
	return 0;
}

void dring_detach(struct dring *d)
{
	if (d->base)
		munmap(d->base, d->len);
	d->base = NULL;
}

uint32_t *dring_upg(struct dring *d) { return (uint32_t *)(d->base + EXDD_HDR_UPG); }

void dring_kick(struct dring *d) { ring_peer(d); }

int dring_relayed(const struct dring *d) { return LD((uint32_t *)(d->base + HDR_RELAY + 4 * d->side)) != 0; }

void dring_rst(struct dring *d)
{
	ST(&d->in->rst, 1);
	ST(&d->out->rst, 1);
	ring_peer(d);
	fanout(d, NULL); /* other waiters of this side */
}

static int fail(struct dring *d)
{
	d->failed = 1;
	dring_rst(d);
	return -EIO;
}

static int is_reset(struct dring *d) { return d->failed || LD(&d->in->rst) || LD(&d->out->rst); }

int dring_error(struct dring *d)
{
	if (d->failed)
		return EIO;
	return is_reset(d) ? ECONNRESET : 0;
}

void dring_fin(struct dring *d)
{
	ST(&d->out->fin, 1);
	ring_data(d);
	fanout(d, NULL); /* a writer of this process parked for space: EPIPE now */
}

void dring_shut_rd(struct dring *d)
{
	d->rd_shut = 1;
	fanout(d, NULL); /* a parked reader of this process: 0 now */
}

void dring_rd_closed(struct dring *d)
{
	ST(&d->in->rd_closed, 1);
	ring_space(d);
}

int dring_drain(int fd)
{
	char b[64];
	for (;;) {
		long r = syscall(SYS_read, fd, b, sizeof b);
		if (r > 0 || (r < 0 && errno == EINTR))
			continue;
		return r == 0;
	}
}

/* Bytes in the inbound ring, or -1 (forged cursor: failed). */
static int64_t in_avail(struct dring *d)
{
	uint64_t t = LD(&d->in->tail), h = LD(&d->in->head);
	if (t - h > d->ring) {
		fail(d);
		return -1;
	}
	return (int64_t)(t - h);
}

/* Free bytes in the outbound ring, or -1. */
static int64_t out_space(struct dring *d)
{
	uint64_t t = LD(&d->out->tail), h = LD(&d->out->head);
	if (t - h > d->ring) {
		fail(d);
		return -1;
	}
	return (int64_t)(d->ring - (t - h));
}

long dring_nread(struct dring *d)
{
	int64_t a = in_avail(d);
	return a < 0 ? -EIO : (long)a;
}

long dring_space(struct dring *d)
{
	int64_t s = out_space(d);
	return s < 0 ? -EIO : (long)s;
}

unsigned dring_ready(struct dring *d)
{
	const unsigned all = POLLIN | POLLRDNORM | POLLOUT | POLLWRNORM | POLLERR | POLLHUP;
	if (is_reset(d))
		return all;
	unsigned m = 0;
	uint32_t fin = LD(&d->in->fin);
	int64_t a = in_avail(d), s = out_space(d);
	if (a < 0 || s < 0)
		return all;
	if (a > 0 || fin || d->rd_shut)
		m |= POLLIN | POLLRDNORM;
	if (fin || d->rd_shut)
		m |= POLLRDHUP;
	uint32_t myfin = LD(&d->out->fin);
	if (s > 0 || myfin || LD(&d->out->rd_closed))
		m |= POLLOUT | POLLWRNORM;
	if (fin && myfin)
		m |= POLLHUP;
	return m;
}

#define EV_IN (POLLIN | POLLRDNORM | POLLRDHUP)
#define EV_OUT (POLLOUT | POLLWRNORM)

unsigned dring_arm(struct dring *d, unsigned events)
{
	if (events & EV_IN)
		ADD(&d->in->cons_wait, 1);
	if (events & EV_OUT)
		ADD(&d->out->prod_wait, 1);
	return dring_ready(d);
}

void dring_disarm(struct dring *d, unsigned events)
{
	if (events & EV_IN)
		ADD(&d->in->cons_wait, -1u);
	if (events & EV_OUT)
		ADD(&d->out->prod_wait, -1u);
}

int dring_bell_drain(struct dring *d, struct dwaiter *self)
{
	char b[64];
	int n = 0, eof = 0;
	for (;;) {
		long r = syscall(SYS_read, d->bell, b, sizeof b);
		if (r > 0) {
			n += (int)r;
			continue;
		}
		if (r < 0 && errno == EINTR)
			continue;
		eof = r == 0;
		break;
	}
	/* After the drain: a ring from now on writes again, and the caller
	 * looks at the rings after this. */
	ST(&d->in->data_rung, 0);
	ST(&d->out->space_rung, 0);
	if (eof && !is_reset(d) && !(LD(&d->in->fin) && (LD(&d->out->rd_closed) || LD(&d->out->fin)))) {
		/* every copy of the peer's bell is closed, and it never said
		 * it was done (fin, and rd_closed or the end of my own
		 * stream): the peer side is gone */
		ST(&d->in->rst, 1);
		ST(&d->out->rst, 1);
		n = n ? n : 1; /* everyone looks again */
	}
	if (n > 0)
		fanout(d, self);
	if (n > DRING_BELL_EOF - 1)
		n = DRING_BELL_EOF - 1;
	return n | (eof ? DRING_BELL_EOF : 0);
}

int dring_v_event(struct dring *d, short revents)
{
	if (revents & (POLLHUP | POLLERR | POLLNVAL)) {
		dring_rst(d); /* exnd is gone */
		return 1;
	}
	if (!(revents & POLLIN))
		return 0;
	/* exnd writes E only after storing relay[S], and shuts it only
	 * after storing rst */
	if (!dring_relayed(d) && !is_reset(d))
		fail(d);
	return 1;
}

/* v_gone looks at V once, without waiting: 1 if it says exnd is gone
 * or reset the connection (dring_v_event), which the caller then fails. */
static int v_gone(struct dring *d)
{
	struct pollfd p = {d->v, POLLIN, 0};
	return poll(&p, 1, 0) == 1 && dring_v_event(d, p.revents) && !dring_relayed(d);
}

/* ---- waiting ---- */

enum { W_READ, W_WRITE, W_UPG };

struct waitst {
	int64_t deadline; /* ns, CLOCK_MONOTONIC; 0: none yet */
	int timeo_read;   /* SO_*TIMEO looked up */
	uint32_t upg;     /* W_UPG: the bits of the upgrade word waited for */
};

/* Whether a waiter of kind w can go on. */
static int wait_over(struct dring *d, int w, const struct waitst *ws)
{
	if (is_reset(d) || dring_relayed(d))
		return 1;
	if (w == W_UPG)
		return (LD(dring_upg(d)) & ws->upg) != 0;
	if (w == W_READ) {
		if (LD(&d->in->fin))
			return 1;
		return in_avail(d) != 0; /* -1: failed */
	}
	if (LD(&d->out->rd_closed) || LD(&d->out->fin))
		return 1;
	return out_space(d) != 0;
}

/*
 * Wait until a waiter of kind w may go on: spin, then arm and park. 0
 * (look again), -EAGAIN (timeout), -EINTR, -ECONNRESET (V hung up: exnd
 * is gone; or reset), -EIO, -DRING_RELAYED (the owner's enter hook handed
 * the connection to exnd's relay).
 */
static int park(struct dring *d, int w, struct waitst *ws, struct dwaiter *me);

static int wait_for(struct dring *d, int w, int flags, struct waitst *ws)
{
	int64_t t0 = now_ns();
	for (unsigned i = 0;; i++) {
		if (wait_over(d, w, ws))
			return 0;
		relax();
		if ((i & 63) == 63 && now_ns() - t0 >= EXDD_SPIN_NS)
			break;
	}
	/* d->v is loaded only after enter: the owner may replace V while no
	 * waiter is in (shim/upgrade.c, upg_convert) */
	struct dwaiter me = {-1, -1, NULL};
	if (d->hooks && d->hooks->enter) {
		int e = d->hooks->enter(d, &me);
		if (e < 0)
			return e;
	}
	if ((flags & DRING_TIMEO) && !ws->timeo_read) {
		struct timeval tv = {0, 0};
		socklen_t l = sizeof tv;
		ws->timeo_read = 1;
		if (syscall(SYS_getsockopt, d->v, SOL_SOCKET, w == W_READ ? SO_RCVTIMEO : SO_SNDTIMEO, &tv, &l) == 0 &&
		    (tv.tv_sec || tv.tv_usec))
			ws->deadline = t0 + (int64_t)tv.tv_sec * 1000000000 + (int64_t)tv.tv_usec * 1000;
	}
	/* W_UPG counts in nowhere: the engine rings at every change of the
	 * word (extds/rdirect/conn.go) */
	uint32_t *nwait = w == W_READ ? &d->in->cons_wait : w == W_WRITE ? &d->out->prod_wait : NULL;
	if (nwait)
		ADD(nwait, 1);
	int r = park(d, w, ws, &me);
	if (nwait)
		ADD(nwait, -1u);
	if (d->hooks && d->hooks->leave)
		d->hooks->leave(d, &me);
	return r;
}

/* The park of wait_for, counted in: 0 (look again) or -errno. */
static int park(struct dring *d, int w, struct waitst *ws, struct dwaiter *me)
{
	for (;;) {
		if (wait_over(d, w, ws))
			return 0;
		struct timespec ts, *tp = NULL;
		if (ws->deadline) {
			int64_t left = ws->deadline - now_ns();
			if (left <= 0)
				return -EAGAIN;
			ts.tv_sec = left / 1000000000;
			ts.tv_nsec = left % 1000000000;
			tp = &ts;
		}
		struct pollfd p[3] = {{d->bell, POLLIN, 0}, {d->v, POLLIN, 0}, {me->wait, POLLIN, 0}};
		long r = syscall(SYS_ppoll, p, 3, tp, NULL, (size_t)8);
		if (r < 0) {
			if (errno == EINTR)
				return -EINTR;
			return -errno;
		}
		if (p[2].revents & POLLIN) {
			if (d->hooks && d->hooks->kicked)
				d->hooks->kicked(me);
			else
				dring_drain(me->wait);
		}
		/* once relayed, the bell's bytes are exnd's relay's */
		if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) && !dring_relayed(d))
			dring_bell_drain(d, me);
		if (p[1].revents && dring_v_event(d, p[1].revents) && !dring_relayed(d))
			return d->failed ? -EIO : -ECONNRESET;
	}
}

/* ---- copying ---- */

/* A position in an iovec array. */
struct iovcur {
	const struct iovec *iov;
	int n, i;
	size_t off;
};

static size_t iov_total(const struct iovec *iov, int n, int *bad)
{
	size_t t = 0;
	*bad = n < 0;
	for (int i = 0; i < n; i++) {
		if (iov[i].iov_len > (size_t)SSIZE_MAX - t) {
			*bad = 1;
			return 0;
		}
		t += iov[i].iov_len;
	}
	return t;
}

/* Copy n bytes between ring data (at stream position pos) and the iovec
 * cursor; to_ring: from the iovecs into the ring. */
static void ring_copy(uint8_t *data, uint32_t ring, uint64_t pos, struct iovcur *c, size_t n, int to_ring)
{
	while (n > 0) {
		while (c->iov[c->i].iov_len == c->off) {
			c->i++;
			c->off = 0;
		}
		size_t r = (size_t)(pos & (ring - 1));
		size_t k = ring - r;
		size_t seg = c->iov[c->i].iov_len - c->off;
		if (k > seg)
			k = seg;
		if (k > n)
			k = n;
		uint8_t *u = (uint8_t *)c->iov[c->i].iov_base + c->off;
		if (to_ring)
			memcpy(data + r, u, k);
		else if (u)
			memcpy(u, data + r, k);
		c->off += k;
		pos += k;
		n -= k;
	}
}

/* ---- locks: futex, process-shared (no FUTEX_PRIVATE_FLAG) ---- */

/* 0 free, 1 held, 2 held with waiters, EXDD_LOCK_RECLAIM held by exnd's
 * reclaim (a producer lock only). A reclaim holds the lock for one
 * madvise and wakes every waiter when it lets go, so a non-blocking
 * caller that meets it waits (it would otherwise see EAGAIN on an empty
 * ring, and an edge-triggered epoll would never report the space that
 * was there all along). */
/* RECLAIM_CHECK_NS bounds each wait on a reclaim's hold: the hold is
 * one madvise, so the wake comes long before; only an exnd killed while
 * it held the lock leaves the word at EXDD_LOCK_RECLAIM, and then V has
 * hung up: the waiter looks at V after each bound and fails with
 * ECONNRESET instead of waiting for ever. */
#define RECLAIM_CHECK_NS 50000000L

static int v_gone(struct dring *d);

static int lk_acquire(struct dring *d, uint32_t *l, int nonblock)
{
	uint32_t c = 0;
	while (!__atomic_compare_exchange_n(l, &c, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
		if (c != EXDD_LOCK_RECLAIM)
			break;
		struct timespec ts = {0, RECLAIM_CHECK_NS};
		if (syscall(SYS_futex, l, FUTEX_WAIT, EXDD_LOCK_RECLAIM, &ts, NULL, 0) < 0 && errno == ETIMEDOUT && v_gone(d))
			return d->failed ? -EIO : -ECONNRESET;
		c = 0;
	}
	if (c == 0)
		return 0;
	if (nonblock)
		return -EAGAIN;
	if (c != 2)
		c = __atomic_exchange_n(l, 2, __ATOMIC_ACQUIRE);
	while (c != 0) {
		if (syscall(SYS_futex, l, FUTEX_WAIT, 2, NULL, NULL, 0) < 0 && errno == EINTR)
			return -EINTR;
		c = __atomic_exchange_n(l, 2, __ATOMIC_ACQUIRE);
	}
	return 0;
}

static void lk_release(uint32_t *l)
{
	if (__atomic_exchange_n(l, 0, __ATOMIC_RELEASE) == 2)
		syscall(SYS_futex, l, FUTEX_WAKE, 1, NULL, NULL, 0);
}

/* ---- data calls ---- */

/* The state of one dring_writev or dring_readv call. */
struct dcall {
	struct iovcur c; /* where the caller's bytes are */
	struct waitst ws;
	size_t want, done; /* bytes asked for, moved */
};

/* data_begin is the prologue of dring_writev and dring_readv: k set for
 * iov, then lock (the side's producer or consumer lock) taken. 0, or a
 * negative errno with the lock not held. */
static int data_begin(struct dring *d, const struct iovec *iov, int iovcnt, int flags, uint32_t *lock, struct dcall *k)
{
	int bad;
	*k = (struct dcall){{iov, iovcnt, 0, 0}, {0, 0, 0}, iov_total(iov, iovcnt, &bad), 0};
	if (bad)
		return -EINVAL;
	if (dring_relayed(d))
		return -DRING_RELAYED;
	return lk_acquire(d, lock, flags & DRING_NONBLOCK);
}

/* data_gone says why a data call cannot go on: the connection was handed to
 * exnd's relay, or reset (TCP drops what was not read when the reset comes);
 * 0 while it lives. */
static ssize_t data_gone(struct dring *d)
{
	if (dring_relayed(d))
		return -DRING_RELAYED;
	if (is_reset(d))
		return d->failed ? -EIO : -ECONNRESET;
	return 0;
}

int dring_wait_upg(struct dring *d, uint32_t mask)
{
	struct waitst ws = {0, 1, mask};
	for (;;) {
		if (LD(dring_upg(d)) & mask)
			return 0;
		ssize_t gone = data_gone(d);
		if (gone)
			return gone == -DRING_RELAYED ? (int)gone : -ECONNRESET;
		int r = wait_for(d, W_UPG, 0, &ws);
		if (r < 0 && r != -EINTR && r != -EAGAIN)
			return r == -DRING_RELAYED ? r : -ECONNRESET;
	}
}

long dring_wait_space(struct dring *d, int flags)
{
	struct waitst ws = {0, 0, 0};
	for (;;) {
		ssize_t gone = data_gone(d);
		if (gone)
			return gone;
		if (LD(&d->out->rd_closed) || LD(&d->out->fin))
			return -EPIPE;
		int64_t space = out_space(d);
		if (space < 0)
			return -EIO;
		if (space > 0)
			return (long)space;
		if (flags & DRING_NONBLOCK)
			return -EAGAIN;
		int r = wait_for(d, W_WRITE, flags, &ws);
		if (r < 0)
			return r;
	}
}

/* data_wait waits for ring space (w W_WRITE) or bytes (W_READ): 0 (look
 * again), or -EAGAIN at once for DRING_NONBLOCK, or wait_for's error. */
static ssize_t data_wait(struct dring *d, int w, int flags, struct dcall *k)
{
	if (flags & DRING_NONBLOCK)
		return -EAGAIN;
	return wait_for(d, w, flags, &k->ws);
}

ssize_t dring_writev(struct dring *d, const struct iovec *iov, int iovcnt, int flags)
{
	struct dcall k;
	ssize_t err = data_begin(d, iov, iovcnt, flags, &d->out->prod_lock, &k);
	if (err < 0)
		return err;
	while ((err = data_gone(d)) == 0) {
		if (LD(&d->out->rd_closed) || LD(&d->out->fin)) {
			err = -EPIPE;
			break;
		}
		if (k.done == k.want)
			break;
		int64_t space = out_space(d);
		if (space < 0) {
			err = -EIO;
			break;
		}
		if (space == 0) {
			if ((err = data_wait(d, W_WRITE, flags, &k)) < 0)
				break;
			continue;
		}
		size_t n = k.want - k.done < (size_t)space ? k.want - k.done : (size_t)space;
		uint64_t t = LD(&d->out->tail);
		ring_copy(d->outdata, d->ring, t, &k.c, n, 1);
		ST(&d->out->tail, t + n);
		ring_data(d);
		k.done += n;
	}
	lk_release(&d->out->prod_lock);
	if (k.done > 0) /* what is in the ring is delivered, also by a relay */
		return (ssize_t)k.done;
	return err;
}

ssize_t dring_readv(struct dring *d, const struct iovec *iov, int iovcnt, int flags)
{
	struct dcall k;
	ssize_t err = data_begin(d, iov, iovcnt, flags, &d->in->cons_lock, &k);
	if (err < 0)
		return err;
	while ((err = data_gone(d)) == 0) {
		if (d->rd_shut || k.done == k.want)
			break;
		uint32_t fin = LD(&d->in->fin);
		int64_t a = in_avail(d);
		if (a < 0) {
			err = -EIO;
			break;
		}
		if (a == 0) {
			if (fin || (k.done > 0 && !(flags & DRING_WAITALL)))
				break;
			if ((err = data_wait(d, W_READ, flags, &k)) < 0)
				break;
			continue;
		}
		size_t n = k.want - k.done < (size_t)a ? k.want - k.done : (size_t)a;
		uint64_t h = LD(&d->in->head);
		if (!(flags & DRING_TRUNC))
			ring_copy(d->indata, d->ring, h, &k.c, n, 0);
		k.done += n;
		if (flags & DRING_PEEK)
			break;
		ST(&d->in->head, h + n);
		ring_space(d);
		if (!(flags & DRING_WAITALL))
			break;
	}
	lk_release(&d->in->cons_lock);
	if (k.done > 0)
		return (ssize_t)k.done;
	return err;
}

ssize_t dring_write(struct dring *d, const void *buf, size_t n, int flags)
{
	struct iovec v = {(void *)buf, n};
	return dring_writev(d, &v, 1, flags);
}

ssize_t dring_read(struct dring *d, void *buf, size_t n, int flags)
{
	struct iovec v = {buf, n};
	return dring_readv(d, &v, 1, flags);
}

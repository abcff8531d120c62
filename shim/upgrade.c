/*
 * upgrade.c: the mid-stream upgrade (EXTDS_SETUP=upgrade; docs/shim.md,
 * "Upgrade", issue #33). Owns fdent's upgrade fields (ust, uat, ucl,
 * uside, utries, uwsh) and the meaning of the buffer's upgrade word
 * (upgrade.h).
 *
 * A connection starts as the program's own TCP connection: connect and
 * accept ask nobody. Its stages, each at a data call of the program on
 * it (read, write and their family, through direct.c's d_io; stages 1
 * and 2 are in upgrade_ask.c, the readiness filters in upgrade_ready.c):
 *
 *   1. U_YOUNG → U_ASKED: the first call after UPG_AGE_NS sends
 *      "shim-connect upgrade" / "shim-accept upgrade" with the socket and
 *      does not wait: the control connection is kept, hidden, in ucl.
 *      The two exnds agree a direct connection out of band
 *      (extds/shimsrv/upgrade.go); nothing touches the stream.
 *   2. U_ASKED → U_ATT: a later call finds the answer. "direct": the
 *      buffer is attached (V and the bell hidden) and UPG_ATT(S) set.
 *      "tcp": the connection stays TCP (no_claim: asked again later).
 *   3. Moving a direction: a write of side S, once both sides attached,
 *      sets UPG_MOV(S) and shuts the TCP write side: every byte it wrote
 *      before precedes the FIN, every byte after goes into the buffer.
 *   4. Conversion: a read of side S that finds TCP at EOF with
 *      UPG_MOV(1-S) set moves S's own direction too (if it has not), and
 *      installs V under the descriptor's number (direct.c,
 *      direct_install): from then on it is a direct descriptor like any
 *      other, and the read goes on in the buffer. A TCP EOF without the
 *      peer's UPG_MOV is the peer's real end.
 *
 * The peer can move only after this side attached, and this side
 * attaches only by its own call: so an EOF read while the answer is
 * still with exnd is always a real one, and a side that never attaches
 * (exec'd, closed, refused) keeps the connection TCP for both.
 *
 * Locks: the table lock for the entry's fields, never across a system
 * call that blocks; U_BUSY marks a thread that changes the state outside
 * it. The upgrade word changes by CAS only.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "direct.h"
#include "shim.h"
#include "upgrade.h"

/*
 * Three counts per descriptor entry (struct ucount in shim.h), each
 * entered and left around a step and drained by the step that must not
 * overlap it:
 *   utw  writes on TCP: a move shuts TCP's write side only once every
 *        write started before it returned (no write meets the shutdown:
 *        EPIPE, SIGPIPE; every byte written to TCP precedes the FIN);
 *   utr  reads on TCP: the conversion closes the TCP socket (dup3) only
 *        once no read is between its look at the state and its recvmsg
 *        (at the boundary TCP is at EOF: such a read returns at once);
 *   umv  moves and program shutdowns between their CAS and their TCP
 *        shutdown: the conversion replaces the TCP socket only after
 *        them, or a late shutdown would shut V (exnd then ends the side
 *        and the connection resets: TestShimUpgrade, a writer thread's
 *        move and a reader thread's conversion at the same moment).
 * A drain sets waiting and sleeps on the futex n until it is 0.
 */
static void cnt_enter(struct ucount *c) { __atomic_add_fetch(&c->n, 1, __ATOMIC_SEQ_CST); }

static void cnt_leave(struct ucount *c)
{
	if (__atomic_sub_fetch(&c->n, 1, __ATOMIC_SEQ_CST) == 0 && __atomic_load_n(&c->waiting, __ATOMIC_SEQ_CST))
		syscall(SYS_futex, &c->n, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static void cnt_drain(struct ucount *c)
{
	__atomic_store_n(&c->waiting, 1, __ATOMIC_SEQ_CST);
	uint32_t v;
	while ((v = __atomic_load_n(&c->n, __ATOMIC_SEQ_CST)) != 0)
		syscall(SYS_futex, &c->n, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
}

/* Whether count k of fd's entry or of another entry of this process on
 * the same connection is not zero now. */
static int cnt_busy_conn(int fd, size_t k)
{
	struct fdent *e = ent(fd);
	int dc = e->dc;
	if (__atomic_load_n(&((struct ucount *)(void *)((char *)e + k))->n, __ATOMIC_SEQ_CST))
		return 1;
	for (int o = 0; o < g_ntab && dc > 0; o++)
		if (o != fd && (g_tab[o].flags & F_UPG) && g_tab[o].dc == dc &&
		    __atomic_load_n(&((struct ucount *)(void *)((char *)&g_tab[o] + k))->n, __ATOMIC_SEQ_CST))
			return 1;
	return 0;
}

/* Drain count k (utw, utr or umv) of fd's entry and of every other
 * entry of this process on the same connection (its dups, which count
 * their calls in their own entries: a write in flight on a dup must not
 * meet the move's shutdown either). */
static void cnt_drain_conn(int fd, size_t k)
{
	struct fdent *e = ent(fd);
	int dc = e->dc;
	cnt_drain((struct ucount *)(void *)((char *)e + k));
	for (int o = 0; o < g_ntab && dc > 0; o++)
		if (o != fd && (g_tab[o].flags & F_UPG) && g_tab[o].dc == dc)
			cnt_drain((struct ucount *)(void *)((char *)&g_tab[o] + k));
}

/* Across hosts, side S asked to move (UPG_REQ): wait until the peer's
 * engine granted it (UPG_MOV(S) came back), refused it (the peer left:
 * UPG_DET) or the connection is gone. At most one round trip of the
 * fabric; the wait parks on the bell and V like a data wait. */
static void upg_await_grant(struct dconn *c)
{
	int S = c->d.side;
	(void)dring_wait_upg(&c->d, UPG_MOV(S) | UPG_DET(1 - S) | UPG_GONE);
}

/* Stage 3 for side S: move S's writes onto the buffer if both sides
 * may. 1 if S writes into the buffer now, 0 if it stays on TCP. The
 * caller has no write of its own in flight on TCP. On one host the move
 * is S's own CAS of UPG_MOV(S); across hosts S's CAS is UPG_REQ(S) and
 * the grant is the peer engine's (upgrade.h): the thread that asked
 * shuts TCP's write side once it came, and other threads that meet the
 * request wait for it with it. */
static int upg_move(int fd, struct dconn *c)
{
	int S = c->d.side;
	struct fdent *e = ent(fd);
	uint32_t *w = dring_upg(&c->d);
	cnt_enter(&e->umv);
	uint32_t o = __atomic_load_n(w, __ATOMIC_SEQ_CST);
	int xhost = (o & UPG_XHOST) != 0, asked = 0;
	uint32_t mine = xhost ? UPG_REQ(S) : UPG_MOV(S);
	for (;;) {
		if (o & UPG_MOV(S)) {
			cnt_leave(&e->umv);
			return 1;
		}
		if ((o & (UPG_ATT(0) | UPG_ATT(1))) != (UPG_ATT(0) | UPG_ATT(1)) ||
		    (o & (UPG_DET(0) | UPG_DET(1) | UPG_WSH(S) | UPG_GONE))) {
			cnt_leave(&e->umv);
			return 0;
		}
		if (o & mine)
			break; /* across hosts: another thread asked */
		if (__atomic_compare_exchange_n(w, &o, o | mine, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
			asked = 1;
			break;
		}
	}
	if (xhost) {
		if (asked)
			dring_kick(&c->d); /* the engine carries UPG_REQ(S) to the peer */
		upg_await_grant(c);
		int moved = (__atomic_load_n(w, __ATOMIC_SEQ_CST) & UPG_MOV(S)) != 0;
		if (!moved || !asked) {
			cnt_leave(&e->umv);
			return moved;
		}
	}
	/* The boundary: everything written to TCP before precedes the FIN. */
	cnt_drain_conn(fd, offsetof(struct fdent, utw));
	real.shutdown(fd, SHUT_WR);
	cnt_leave(&e->umv);
	dbg("fd %d: writes moved to the buffer", fd);
	return 1;
}

/* A conversion that does not happen (now): U_BUSY back to U_ATT, its
 * reads go on in the buffer through upg_io. */
static void upg_untake(struct fdent *e)
{
	lock();
	if ((e->flags & F_UPG) && e->ust == U_BUSY)
		e->ust = U_ATT;
	unlock();
}

/* Stage 4: TCP is at EOF and the peer moved: S's own direction moves
 * too, and a dup of V takes the descriptor's number (the connection
 * keeps V itself, hidden, as the dring's V: a waiter parked on it never
 * sees it change). While it runs the entry is U_BUSY with its slot, so
 * the calls of other threads find the buffer (upg_conn); do_switch makes
 * it direct in one step. 0, or -1 (errno; the entry stays U_ATT and its
 * reads go on in the buffer through upg_io). */
int upg_convert(int fd)
{
	if (!upg_take(fd, U_ATT))
		return (fdflags(fd) & F_DIRECT) ? 0 : -1; /* another thread is at it */
	struct fdent *e = ent(fd);
	cnt_drain_conn(fd, offsetof(struct fdent, utr));
	int slot = e->dc - 1;
	struct dconn *c = &g_dc[slot];
	int S = c->d.side;
	uint32_t *w = dring_upg(&c->d);
	if (!(__atomic_load_n(w, __ATOMIC_SEQ_CST) & (UPG_MOV(S) | UPG_WSH(S))) &&
	    cnt_busy_conn(fd, offsetof(struct fdent, utw))) {
		/* A write of this side is on TCP, and moving this side waits
		 * for it; it may wait for the peer to read, and the peer may
		 * read only once it has written what this side is reading now
		 * (TestShimUpgradeNoRead): so this read does not convert, it
		 * goes on in the buffer (the boundary is behind it), and a
		 * later call converts. A writer counted in after the upg_take
		 * above finds U_BUSY and never goes to TCP, so a count seen
		 * here is one on TCP or about to leave. */
		upg_untake(e);
		errno = EAGAIN;
		return -1;
	}
	if (!upg_move(fd, c) && (__atomic_load_n(w, __ATOMIC_ACQUIRE) & UPG_WSH(S)))
		dring_fin(&c->d); /* the program ended this direction on TCP */
	/* Before the dup3, no call may be left on the TCP socket: writes
	 * (the move drained them if it shut TCP's write side; not if it
	 * did not move), and another thread's move or shutdown, which
	 * must shut the TCP socket, not V. Calls counted in later find
	 * U_BUSY and go to the buffer (upg_wbegin, upg_shutdown). */
	cnt_drain_conn(fd, offsetof(struct fdent, utw));
	cnt_drain_conn(fd, offsetof(struct fdent, umv));
	int v = real.fcntl(c->d.v, F_DUPFD_CLOEXEC, 0);
	if (v < 0 || direct_install(fd, slot, c->id, v, -1, -1) < 0) {
		int err = errno;
		dbg("fd %d: conversion failed: %s", fd, strerror(err));
		upg_untake(e);
		errno = err;
		return -1;
	}
	/* The descriptor's number is a V of its own now: the hidden one goes
	 * (2 descriptors, as a connection direct from its connect). A waiter
	 * of this process loads the dring's V only between its enter and
	 * leave (dparty.c, under the lock): with none in, the hidden V closes
	 * now; else the last one's leave closes it, so that no wait ever
	 * polls a number that was closed and given to another file. */
	lock();
	int hv = c->d.v;
	c->d.v = fd;
	c->vhidden = 0;
	if (c->waiters)
		c->vclose = hv + 1;
	else
		real.close(hv);
	unlock();
	__atomic_sub_fetch(&g_upg_att, 1, __ATOMIC_RELAXED);
	/* Other descriptors of the process on the same connection (dups). */
	for (int o = 0; o < g_ntab; o++) {
		if (o == fd || !(fdflags(o) & F_UPG))
			continue;
		lock();
		int same = (g_tab[o].flags & F_UPG) && g_tab[o].dc == slot + 1;
		if (same)
			g_tab[o].ust = U_BUSY; /* upg_drop_locked leaves the reference */
		unlock();
		if (!same)
			continue;
		int ocl = real.fcntl(o, F_GETFD);
		if (real.dup3(fd, o, (ocl >= 0 && (ocl & FD_CLOEXEC)) ? O_CLOEXEC : 0) < 0)
			continue;
		lock();
		g_tab[o] = g_tab[fd];
		g_tab[o].nreg = 0;
		g_tab[o].utw = g_tab[o].utr = g_tab[o].umv = (struct ucount){0, 0}; /* fd's calls */
		unlock();
	}
	dbg("fd %d: direct (upgraded)", fd);
	return 0;
}

/* Whether a TCP EOF on c's side is where its inbound stream goes on in
 * the buffer: the peer moved; or this side moved and the peer ended its
 * direction on TCP (then the buffer holds fin, and converting gives the
 * descriptor the buffer's readiness for the writes that moved). */
static int upg_boundary(struct dconn *c)
{
	int S = c->d.side;
	uint32_t w = __atomic_load_n(dring_upg(&c->d), __ATOMIC_ACQUIRE);
	return (w & UPG_MOV(1 - S)) || ((w & UPG_MOV(S)) && (w & UPG_WSH(1 - S)));
}

/* Whether the TCP socket fd is at EOF now (a peek that does not wait). */
int tcp_at_eof(int fd)
{
	char b;
	return real.recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* The attached connection of an F_UPG entry (U_ATT, or U_BUSY while it
 * converts), or NULL. */
struct dconn *upg_conn(int fd)
{
	struct fdent *e = ent(fd);
	if (!e || !(fdflags(fd) & F_UPG))
		return NULL;
	int st = __atomic_load_n(&e->ust, __ATOMIC_ACQUIRE), dc = e->dc;
	return (st == U_ATT || st == U_BUSY) && dc > 0 ? &g_dc[dc - 1] : NULL;
}

/* O_NONBLOCK of fd as MSG_DONTWAIT (an entry that is not direct caches nothing). */
static int nb_flag(int fd)
{
	int fl = real.fcntl(fd, F_GETFL);
	return fl >= 0 && (fl & O_NONBLOCK) ? MSG_DONTWAIT : 0;
}

/* fd's state under the lock: VIEW_DIRECT (converted), VIEW_RING with
 * *c (attached, or converting: U_BUSY), VIEW_TCP (not attached). */
enum { VIEW_TCP, VIEW_RING, VIEW_BUSY, VIEW_DIRECT };
static int upg_view(int fd, struct dconn **c)
{
	int v = VIEW_TCP;
	*c = NULL;
	lock();
	struct fdent *e = ent(fd);
	if (e->flags & F_DIRECT) {
		v = VIEW_DIRECT;
	} else if ((e->flags & F_UPG) && e->dc > 0 && (e->ust == U_ATT || e->ust == U_BUSY)) {
		*c = &g_dc[e->dc - 1];
		v = e->ust == U_BUSY ? VIEW_BUSY : VIEW_RING;
	}
	unlock();
	return v;
}

int upg_wbegin(int fd, struct dconn **c)
{
	struct fdent *e = ent(fd);
	for (int asked = 0;; asked = 1) {
		cnt_enter(&e->utw);
		int v = upg_view(fd, c);
		if (v == VIEW_DIRECT) {
			cnt_leave(&e->utw);
			return UPG_W_DIRECT;
		}
		if (v == VIEW_TCP)
			return UPG_W_TCP; /* not attached: a conversion drains this count */
		int moved = (__atomic_load_n(dring_upg(&(*c)->d), __ATOMIC_SEQ_CST) & UPG_MOV((*c)->d.side)) != 0;
		/* Converting (U_BUSY), the TCP socket may be V already: the
		 * buffer, moved (the usual case: the peer moved) or not (this
		 * side shut its writes, or a reset: the buffer says which). */
		if (moved || (v == VIEW_BUSY && asked)) {
			cnt_leave(&e->utw);
			return UPG_W_RING;
		}
		if (asked)
			return UPG_W_TCP; /* attached, and the move was refused: TCP, counted */
		cnt_leave(&e->utw);
		upg_move(fd, *c); /* then look again */
	}
}

void upg_wend(int fd)
{
	int saved = errno;
	cnt_leave(&ent(fd)->utw);
	errno = saved;
}

int upg_rbegin(int fd, struct dconn **c)
{
	struct fdent *e = ent(fd);
	cnt_enter(&e->utr);
	int v = upg_view(fd, c);
	if (v == VIEW_DIRECT || v == VIEW_BUSY) {
		/* converted; or converting: TCP is at EOF, the stream goes on
		 * in the buffer */
		cnt_leave(&e->utr);
		return v == VIEW_DIRECT ? UPG_W_DIRECT : UPG_W_RING;
	}
	return UPG_W_TCP;
}

void upg_rend(int fd)
{
	int saved = errno;
	cnt_leave(&ent(fd)->utr);
	errno = saved;
}

/* A send on F_UPG fd: on TCP only while UPG_MOV(S) is unset after this
 * writer counted itself in (utw), else into the buffer. */
static ssize_t upg_send(int fd, struct msghdr *mh, int mflags)
{
	struct dconn *c;
	switch (upg_wbegin(fd, &c)) {
	case UPG_W_DIRECT:
		return d_io(fd, mh->msg_iov, (int)mh->msg_iovlen, mflags, 1);
	case UPG_W_RING:
		return d_ring_io(c, fd, mh->msg_iov, (int)mh->msg_iovlen, mflags | nb_flag(fd), 1);
	}
	/* On TCP, as the program's write (SIGPIPE as write's). */
	ssize_t r = real.sendmsg(fd, mh, mflags);
	upg_wend(fd);
	return r;
}

ssize_t upg_io(int fd, const struct iovec *iov, int cnt, int mflags, int send)
{
	int saved = errno;
	if (cnt < 0 || cnt > IOV_MAX) {
		errno = EINVAL;
		return -1;
	}
	struct msghdr mh = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)cnt};
	upg_tick(fd);
	if (send)
		return upg_send(fd, &mh, mflags);
	struct dconn *c;
	switch (upg_rbegin(fd, &c)) {
	case UPG_W_DIRECT:
		errno = saved;
		return d_io(fd, iov, cnt, mflags, 0);
	case UPG_W_RING:
		errno = saved;
		return d_ring_io(c, fd, iov, cnt, mflags | nb_flag(fd), 0);
	}
	ssize_t r = real.recvmsg(fd, &mh, mflags);
	upg_rend(fd);
	if (r < 0)
		return r;
	size_t want = 0;
	for (int i = 0; i < cnt; i++)
		want += iov[i].iov_len;
	if ((size_t)r >= want)
		return r;
	int v = upg_view(fd, &c);
	if (v == VIEW_DIRECT) {
		/* Converted by another thread while this read was on TCP. */
		if (r > 0)
			return r;
		errno = saved;
		return d_io(fd, iov, cnt, mflags, 0);
	}
	if (!c || !upg_boundary(c))
		return r; /* data, or the peer's real EOF */
	if (r > 0 && (!(mflags & MSG_WAITALL) || !tcp_at_eof(fd)))
		return r; /* a short read that is not at the boundary */
	/* The boundary: the peer's TCP stream ended where its buffer stream
	 * begins. The rest comes from the buffer, converted or not (another
	 * thread may be converting). */
	upg_convert(fd);
	if (!(fdflags(fd) & F_DIRECT))
		mflags |= nb_flag(fd);
	errno = saved;
	if (r == 0)
		return d_ring_io(c, fd, iov, cnt, mflags, 0);
	/* MSG_WAITALL across the boundary: the rest from the buffer. */
	struct iovec rest[IOV_MAX];
	int n = 0;
	size_t skip = (size_t)r;
	for (int i = 0; i < cnt; i++) {
		if (skip >= iov[i].iov_len) {
			skip -= iov[i].iov_len;
			continue;
		}
		rest[n].iov_base = (char *)iov[i].iov_base + skip;
		rest[n++].iov_len = iov[i].iov_len - skip;
		skip = 0;
	}
	ssize_t r2 = d_ring_io(c, fd, rest, n, mflags, 0);
	errno = saved;
	return r2 > 0 ? r + r2 : r;
}

struct dconn *upg_eof(int fd)
{
	if (fdflags(fd) & F_DIRECT)
		return dcof(fd); /* another thread converted it since the call */
	struct dconn *c = upg_conn(fd);
	if (!c || !upg_boundary(c) || !tcp_at_eof(fd))
		return NULL;
	upg_convert(fd); /* or not now: the buffer either way */
	return (fdflags(fd) & F_DIRECT) ? dcof(fd) : c;
}

int upg_shutdown(int fd, int how, int *ret)
{
	struct fdent *e = ent(fd);
	if (!(fdflags(fd) & F_UPG) || (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR))
		return 0;
	/* Counted in before the look (umv), so that the look holds for the
	 * whole call: a conversion that starts later waits for this one
	 * before its dup3; one that started already is U_BUSY here. */
	cnt_enter(&e->umv);
	lock();
	int f = e->flags, st = e->ust;
	int att = (f & F_UPG) && e->dc > 0 && (st == U_ATT || st == U_BUSY);
	if ((f & F_UPG) && !att && how != SHUT_RD)
		e->uwsh = 1; /* the direction ends on TCP, and so it stays once attached */
	struct dconn *c = att ? &g_dc[e->dc - 1] : NULL;
	unlock();
	if (f & F_DIRECT) {
		cnt_leave(&e->umv);
		return 0; /* converted meanwhile: the direct shutdown */
	}
	if (!c) {
		*ret = real.shutdown(fd, how); /* TCP, and it stays TCP */
		int err = errno;
		cnt_leave(&e->umv);
		errno = err;
		return 1;
	}
	int S = c->d.side;
	uint32_t *w = dring_upg(&c->d);
	*ret = 0;
	int err = errno;
	if (st == U_BUSY) {
		/* Converting: the TCP socket may be V already, so no real call.
		 * The peer moved (that is why this side converts): this side
		 * moves too (the move shuts TCP's write side), and the
		 * shutdown is the buffer's. */
		if (how != SHUT_RD)
			upg_move(fd, c);
	} else {
		uint32_t o = __atomic_load_n(w, __ATOMIC_SEQ_CST);
		if (how != SHUT_RD) {
			if ((o & UPG_XHOST) && (o & UPG_REQ(S)) && !(o & UPG_MOV(S))) {
				/* A thread of this side asked to move: its answer first. */
				upg_await_grant(c);
				o = __atomic_load_n(w, __ATOMIC_SEQ_CST);
			}
			while (!(o & UPG_MOV(S)) &&
			       !__atomic_compare_exchange_n(w, &o, o | UPG_WSH(S), 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
				;
			if ((o & UPG_XHOST) && !(o & UPG_MOV(S)))
				dring_kick(&c->d); /* UPG_WSH(S) to the peer's copy */
		}
		/* Attached and not converting: the descriptor is the TCP
		 * socket for this whole call (counted). Either way the
		 * direction ends in the buffer too: a peer that moved converts
		 * at this side's TCP EOF and reads fin there. */
		if (how == SHUT_RD || !(o & UPG_MOV(S))) {
			*ret = real.shutdown(fd, how); /* ends on TCP */
			err = errno;
		} else if (how == SHUT_RDWR) {
			real.shutdown(fd, SHUT_RD);
		}
	}
	if (how != SHUT_WR)
		dring_shut_rd(&c->d);
	if (how != SHUT_RD)
		dring_fin(&c->d);
	cnt_leave(&e->umv);
	errno = err;
	return 1;
}

void upg_drop_locked(int fd, struct fdent *e)
{
	(void)fd;
	if (e->ust == U_BUSY && e->dc > 0)
		return; /* converting (upg_convert): the reference goes to the direct entry */
	if (e->ust == U_ASKED && e->ucl >= 0) {
		real.close(e->ucl);
		__atomic_sub_fetch(&g_upg_asked, 1, __ATOMIC_RELAXED);
	}
	if (e->ust == U_ATT && e->dc > 0) {
		struct dconn *c = &g_dc[e->dc - 1];
		if (--c->refs <= 0) {
			__atomic_sub_fetch(&g_upg_att, 1, __ATOMIC_RELAXED);
			dring_detach(&c->d);
			real.close(c->d.bell);
			if (c->vhidden)
				real.close(c->d.v); /* E hangs up: exnd ends the buffer */
			memset(c, 0, sizeof *c);
			g_ndc--;
		}
	}
	e->ust = 0;
	e->ucl = -1;
}

void upg_dup_locked(struct fdent *o, struct fdent *n)
{
	/* The copy's in-flight counts are o's calls, not n's: a dup made
	 * while a thread read or wrote o would keep them for ever, and the
	 * conversion, which drains the dups' counts too, would wait on
	 * them for ever (a dup made halfway hung every stress run). */
	n->utw = n->utr = n->umv = (struct ucount){0, 0};
	if ((o->ust == U_ATT || o->ust == U_BUSY) && o->dc > 0) {
		/* Attached, or converting (U_BUSY with its slot: upg_convert's
		 * loop over the dups runs after this, under the lock, and
		 * installs V under n too): converted together. */
		g_dc[o->dc - 1].refs++;
		return;
	}
	/* Not attached yet (or a thread is attaching it: U_BUSY without a
	 * slot, upg_pickup): a connection with two
	 * descriptors stays TCP; a pending answer is dropped unread, so this
	 * side never attaches and the peer never moves. */
	if (o->ust == U_ASKED && o->ucl >= 0) {
		real.close(o->ucl);
		__atomic_sub_fetch(&g_upg_asked, 1, __ATOMIC_RELAXED);
	}
	o->flags &= ~F_UPG;
	n->flags &= ~F_UPG;
	o->ust = n->ust = 0;
	o->ucl = n->ucl = -1;
}

void upg_exec(void)
{
	for (int fd = 0; fd < g_ntab; fd++) {
		struct dconn *c = upg_conn(fd);
		if (!c)
			continue;
		int cl = real.fcntl(fd, F_GETFD);
		if (cl >= 0 && (cl & FD_CLOEXEC))
			continue;
		uint32_t *w = dring_upg(&c->d);
		int S = c->d.side;
		uint32_t o = __atomic_load_n(w, __ATOMIC_ACQUIRE);
		if ((o & UPG_XHOST) && (o & UPG_REQ(S)) && !(o & UPG_MOV(S))) {
			/* A move was asked: the peer may have granted it. */
			upg_await_grant(c);
			o = __atomic_load_n(w, __ATOMIC_ACQUIRE);
		}
		while (!(o & (UPG_MOV(0) | UPG_MOV(1))) &&
		       !__atomic_compare_exchange_n(w, &o, o | UPG_DET(S), 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			;
		if ((o & UPG_XHOST) && !(o & (UPG_MOV(0) | UPG_MOV(1))))
			dring_kick(&c->d); /* UPG_DET(S) to the peer's copy */
		if (o & (UPG_MOV(0) | UPG_MOV(1)))
			dbg("exec: fd %d is moving onto its buffer: the new program cannot follow it (docs/shim.md, \"Upgrade\")", fd);
	}
}

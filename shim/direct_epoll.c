/*
 * direct_epoll.c: readiness of direct descriptors for epoll (docs/direct.md,
 * "Wake-up protocol" and "Readiness"): owns d_epoll_ctl (shared via
 * direct.h with direct.c and calls.c's epoll_ctl), the g_dep records of
 * direct.c, and epoll_wait, epoll_pwait, epoll_pwait2, spinning on the
 * rings before they arm the bells. Split from direct_poll.c, which keeps
 * poll and select.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "direct.h"
#include "shim.h"
#include "upgrade.h"

/* ---- epoll in O(ready) ---- */

/*
 * A direct descriptor in an epoll set is two kernel registrations: V with
 * the application's data (it only ever shows the relay, exnd's reset or
 * its death), and the connection's bell tagged DEP_TAG | record (a
 * hidden dup of it only when the set holds the bell already for another
 * descriptor of the connection); each set with direct records also holds
 * the process's epoll kick (dparty.c), EPOLLET, tagged DEP_TAG | DEP_KICK.
 * The record is armed for its events (dring_arm: counted in cons_wait /
 * prod_wait) from EPOLL_CTL_ADD until EPOLL_CTL_DEL or the close, so the
 * peer rings the bell whenever data or space comes, and the kernel's
 * epoll says which record. A record is on its set's hot list while it
 * may be ready: just added or modified, its bell fired, another party of
 * its process drained the bell (the fan-out), or a level-triggered
 * report that may still hold. epoll_wait evaluates the hot list and the
 * records the kernel names, never the others: its cost follows the ready
 * records, not the registered ones (issue #32; before, it armed, checked
 * and disarmed every record of the set on every wait: 1,000 idle records
 * made a busy one's ping-pong 12x slower, docs/direct.md "Descriptors").
 *
 * The price: while a record is armed, each write of the peer into an
 * empty ring (each read that frees space, for EPOLLOUT) rings a bell, a
 * system call the peer skips when nobody waits (docs/direct.md,
 * "Wake-up protocol").
 *
 * All of it runs under the table lock; the kernel waits do not.
 */

void hot_push_locked(struct depset *s, int i)
{
	if (g_dep[i].hot)
		return;
	g_dep[i].hot = 1;
	g_dep[i].hot_next = s->hot;
	s->hot = i;
}

/* With the lock held: register c's bell in s for record slot (a dup if
 * the set holds the bell already, for another record of c), and the
 * process's epoll kick once per set. 0 or -1 with errno. */
static int dep_bell_add_locked(struct depset *s, struct dconn *c, int slot, uint32_t excl)
{
	struct depreg *r = &g_dep[slot];
	struct epoll_event bev = {EPOLLIN | excl, {.u64 = DEP_TAG | (uint64_t)slot}};
	r->hbell = c->d.bell;
	r->hdup = 0;
	if (real.epoll_ctl(s->epfd, EPOLL_CTL_ADD, r->hbell, &bev) < 0) {
		if (errno != EEXIST || (r->hbell = hide_fd(c->d.bell, 1)) < 0)
			return -1;
		r->hdup = 1;
		if (real.epoll_ctl(s->epfd, EPOLL_CTL_ADD, r->hbell, &bev) < 0) {
			int e = errno;
			real.close(r->hbell);
			errno = e;
			return -1;
		}
	}
	if (s->n == 0) {
		int k = direct_fkick();
		struct epoll_event kev = {EPOLLIN | EPOLLET, {.u64 = DEP_TAG | DEP_KICK}};
		if (k >= 0 && real.epoll_ctl(s->epfd, EPOLL_CTL_ADD, k, &kev) < 0 && errno != EEXIST)
			dbg("epoll %d: kick: %s", s->epfd, strerror(errno));
	}
	return 0;
}

/* epoll_ctl on a direct descriptor. 1 handled (ret in *ret), 0 not direct. */
int d_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev, int *ret)
{
	struct dconn *c = dcof(fd);
	if (!c)
		return 0;
	*ret = -1;
	if (op != EPOLL_CTL_DEL && !ev) {
		errno = EFAULT;
		return 1;
	}
	const uint32_t pass = EPOLLET | EPOLLONESHOT | EPOLLEXCLUSIVE;
	struct epoll_event vev = {0, {0}};
	if (ev)
		vev = (struct epoll_event){EPOLLIN | EPOLLRDHUP | (ev->events & pass), ev->data};
	unsigned arm = ev ? ((ev->events & (EPOLLIN | EPOLLRDHUP) ? POLLIN : 0) | (ev->events & EPOLLOUT ? POLLOUT : 0)) : 0;
	lock();
	int slot = -1;
	for (int i = 0, seen = 0; i < DEP_MAX && seen < g_ndep; i++) {
		if (g_dep[i].fd < 0)
			continue;
		seen++;
		if (g_dep[i].fd == fd && g_dep[i].epfd == epfd) {
			slot = i;
			break;
		}
	}
	if (op == EPOLL_CTL_ADD) {
		if (slot >= 0) {
			unlock();
			errno = EEXIST;
			return 1;
		}
		for (int i = 0; i < DEP_MAX && slot < 0; i++)
			if (g_dep[i].fd < 0)
				slot = i;
		struct depset *s = slot >= 0 ? dset_of_locked(epfd, 1) : NULL;
		if (!s) {
			unlock();
			errno = ENOSPC;
			return 1;
		}
		if (real.epoll_ctl(epfd, op, fd, &vev) < 0) {
			if (s->n == 0)
				s->epfd = -1;
			unlock();
			return 1;
		}
		if (dep_bell_add_locked(s, c, slot, ev->events & EPOLLEXCLUSIVE) < 0) {
			int e = errno;
			real.epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL);
			if (s->n == 0)
				s->epfd = -1;
			unlock();
			errno = e;
			return 1;
		}
		int hb = g_dep[slot].hbell, hd = g_dep[slot].hdup;
		g_dep[slot] = (struct depreg){.epfd = epfd, .fd = fd, .hbell = hb, .hdup = hd, .dc = (int)(c - g_dc),
					      .armed = arm, .owner = dparty_pid(), .hot_next = -1, .rang_next = -1, .ev = *ev,
					      .last_in = ~0ull, .last_out = ~0ull};
		/* A record parks on the bell for as long as it lives: a party
		 * of the side (dparty.c). */
		party_join_locked(c);
		c->nrec++;
		dring_arm(&c->d, arm);
		s->n++;
		hot_push_locked(s, slot); /* it may be ready already */
		g_ndep++;
		*ret = 0;
	} else if (slot < 0) {
		unlock();
		errno = ENOENT;
		return 1;
	} else if (op == EPOLL_CTL_MOD) {
		struct depreg *r = &g_dep[slot];
		if ((*ret = real.epoll_ctl(epfd, op, fd, &vev)) == 0) {
			if (arm != r->armed && r->owner == dparty_pid()) {
				dring_arm(&c->d, arm);
				dring_disarm(&c->d, r->armed);
				r->armed = arm;
			}
			r->ev = *ev;
			r->disabled = 0;
			r->last_in = r->last_out = ~0ull;
			struct depset *s = dset_of_locked(epfd, 0);
			if (s)
				hot_push_locked(s, slot);
		}
	} else if (op == EPOLL_CTL_DEL) {
		real.epoll_ctl(epfd, op, fd, NULL);
		dep_free_locked(slot);
		*ret = 0;
	} else {
		errno = EINVAL;
	}
	unlock();
	return 1;
}

/* The events record r reports now (0: none); commit: update its edge
 * and EPOLLONESHOT state (a report), else only look. */
static uint32_t dep_eval(struct depreg *r, int commit)
{
	struct dconn *c = dcof(r->fd);
	if (!c || r->disabled)
		return 0;
	uint32_t want = r->ev.events | EPOLLERR | EPOLLHUP;
	uint32_t m = dring_ready(&c->d) & want;
	if (!m)
		return 0;
	if (r->ev.events & EPOLLET) {
		uint64_t in = __atomic_load_n(&c->d.in->tail, __ATOMIC_ACQUIRE) ^
			      ((uint64_t)__atomic_load_n(&c->d.in->fin, __ATOMIC_ACQUIRE) << 63);
		uint64_t out = __atomic_load_n(&c->d.out->head, __ATOMIC_ACQUIRE);
		uint32_t e = 0;
		if ((m & (EPOLLIN | EPOLLRDHUP)) && in != r->last_in)
			e |= m & (EPOLLIN | EPOLLRDNORM | EPOLLRDHUP);
		if ((m & EPOLLOUT) && out != r->last_out)
			e |= m & (EPOLLOUT | EPOLLWRNORM);
		if (!e && !(m & (EPOLLERR | EPOLLHUP)))
			return 0;
		m = e | (m & (EPOLLERR | EPOLLHUP));
		if (commit) {
			r->last_in = in;
			r->last_out = out;
		}
	}
	if (commit && (r->ev.events & EPOLLONESHOT))
		r->disabled = 1;
	return m;
}

/* Report s's hot records that are ready into out (room max): a
 * level-triggered one stays hot, the others leave the list. Records past
 * max stay for the next call. With the lock held. */
static int hot_collect_locked(struct depset *s, struct epoll_event *out, int max)
{
	int n = 0;
	for (int *p = &s->hot; *p >= 0 && n < max;) {
		int i = *p;
		struct depreg *r = &g_dep[i];
		uint32_t m = r->fd >= 0 && r->epfd == s->epfd ? dep_eval(r, 1) : 0;
		if (m) {
			out[n++] = (struct epoll_event){m, r->ev.data};
			int seen = 0;
			for (int q = 0; q < DSET_RECENT; q++)
				seen |= s->recent[q] == i;
			if (!seen)
				s->recent[s->nrecent++ % DSET_RECENT] = i;
		}
		if (m && !(r->ev.events & (EPOLLET | EPOLLONESHOT))) {
			p = &r->hot_next;
			continue;
		}
		*p = r->hot_next; /* not ready, or reported once */
		r->hot = 0;
	}
	return n;
}

/* Take the kernel's events evs[from:to): a bell event makes its record
 * hot and puts the bell on the set's rang list, undrained; the others are
 * kept, in order. Returns the new end. With the lock held.
 *
 * A bell is drained (and its rung flag cleared) only just before
 * epoll_wait blocks (dep_settle_locked): until then its byte keeps the
 * peer from ringing again (the flag stays set), so a stream into a
 * server that keeps up costs the producer no bell write at all, as when
 * only a parked waiter was armed. */
static int dep_take_locked(struct depset *s, struct epoll_event *evs, int from, int to)
{
	int k = from;
	for (int i = from; i < to; i++) {
		uint64_t u = evs[i].data.u64;
		uint32_t idx = (uint32_t)u;
		if ((u & ~0xffffffffull) != DEP_TAG || (idx >= DEP_MAX && idx != DEP_KICK)) {
			evs[k++] = evs[i];
			continue;
		}
		if (idx == DEP_KICK) {
			/* a fan-out: this process's put its records on the
			 * hot list; another process's cannot, so look at
			 * every record of the set */
			for (int q = 0, seen = 0; q < DEP_MAX && seen < s->n; q++)
				if (g_dep[q].fd >= 0 && g_dep[q].epfd == s->epfd) {
					seen++;
					hot_push_locked(s, q);
				}
			continue;
		}
		struct depreg *r = &g_dep[idx];
		if (r->fd < 0 || r->epfd != s->epfd)
			continue; /* a record gone since: its bell is deregistered */
		if (!r->rang) {
			r->rang_next = s->rang;
			s->rang = (int)idx;
		}
		r->rang = 1;
		hot_push_locked(s, (int)idx);
	}
	return k;
}

/* Before blocking: empty every bell on the rang list (clearing the rung
 * flags, dring_bell_drain, which fans out to this process's other
 * parties of the connection) and make its record hot, so the caller looks
 * at the rings once more after the drain and only then blocks: a peer
 * that rings after the drain writes a byte the kernel wait sees. A bell
 * at EOF (the peer side is gone) leaves the set: it would be readable
 * for ever. A forked child's copy of a record leaves the bell to the
 * process that armed it (docs/direct.md, "Implementation notes"). With
 * the lock held. */
static void dep_settle_locked(struct depset *s)
{
	while (s->rang >= 0) {
		int i = s->rang;
		struct depreg *r = &g_dep[i];
		s->rang = r->rang_next;
		struct dconn *c = &g_dc[r->dc];
		if (c->refs > 0 && r->owner == dparty_pid() && !r->bell_gone &&
		    (dring_bell_drain(&c->d, &g_dep_self) & DRING_BELL_EOF)) {
			real.epoll_ctl(r->epfd, EPOLL_CTL_DEL, r->hbell, NULL);
			r->bell_gone = 1;
		}
		r->rang = 0;
		r->rang_next = -1;
		hot_push_locked(s, i);
	}
}

/* One look without blocking: the hot records and the recent ones, then,
 * if kernel, the kernel (zero timeout) and what it made hot. */
static int dep_poll_once(int epfd, struct depset *s, struct epoll_event *evs, int max, const sigset_t *mask, int kernel)
{
	struct timespec zero = {0, 0};
	lock();
	if (s->epfd != epfd) { /* the set went (epfd closed by another thread) */
		unlock();
		return kernel ? real.epoll_pwait2(epfd, evs, max, &zero, mask) : 0;
	}
	for (int q = 0; q < DSET_RECENT; q++) {
		int i = s->recent[q];
		if (i >= 0 && g_dep[i].fd >= 0 && g_dep[i].epfd == s->epfd && !g_dep[i].hot && dep_eval(&g_dep[i], 0))
			hot_push_locked(s, i);
	}
	int n = hot_collect_locked(s, evs, max);
	unlock();
	if (n == max || (n == 0 && !kernel))
		return n;
	int r = real.epoll_pwait2(epfd, evs + n, max - n, &zero, mask);
	if (r <= 0)
		return n;
	lock();
	int k = dep_take_locked(s, evs, n, n + r);
	/* Only bells: what they made hot, unless this batch has the hot
	 * list's reports already (a level-triggered record stays hot, and
	 * a second collect would report it twice: a blocking server read
	 * the second time with nothing there and hung, TestShimManyConns).
	 * What the bells made hot is reported by the next call. */
	if (k == n && n == 0)
		k += hot_collect_locked(s, evs + k, max - k);
	unlock();
	return k;
}

static int d_epoll_wait0(int epfd, struct epoll_event *evs, int max, const struct timespec *tmo, const sigset_t *mask);

/* epoll_wait, and the upgrade's boundary (upgrade.h): an event of a
 * descriptor that converted in the filter and is not ready is dropped;
 * when none is left, the wait goes on for what remains of the timeout. */
static int d_epoll_wait(int epfd, struct epoll_event *evs, int max, const struct timespec *tmo, const sigset_t *mask)
{
	struct timespec t0, left;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	const struct timespec *t = tmo;
	for (;;) {
		int n = d_epoll_wait0(epfd, evs, max, t, mask);
		if (n <= 0 || !__atomic_load_n(&g_upg_att, __ATOMIC_RELAXED))
			return n;
		if ((n = upg_epoll_filter(epfd, evs, n)) > 0)
			return n;
		if (!time_left(tmo, &t0, &left))
			return 0;
		t = tmo ? &left : NULL;
	}
}

static int d_epoll_wait0(int epfd, struct epoll_event *evs, int max, const struct timespec *tmo, const sigset_t *mask)
{
	struct depset *s = NULL;
	if (__atomic_load_n(&g_ndep, __ATOMIC_RELAXED) > 0 && max > 0) {
		lock();
		s = dset_of_locked(epfd, 0);
		unlock();
	}
	if (!s)
		return real.epoll_pwait2(epfd, evs, max, tmo, mask);
	int may_block = !tmo || tmo->tv_sec || tmo->tv_nsec;
	/* The spin (docs/direct.md, "Wake-up protocol"), for EXDD_SPIN_NS
	 * before parking: the rings of the records reported last (a busy
	 * connection's next request shows there without a system call), and
	 * every SPIN_KERNEL_EVERY rounds the kernel, where every other
	 * record's bell rings. */
	int64_t t0 = mono_ns();
	for (unsigned it = 0;; it++) {
		int n = dep_poll_once(epfd, s, evs, max, mask, it % SPIN_KERNEL_EVERY == 0);
		if (n > 0 || !may_block)
			return n;
		if (mono_ns() - t0 >= EXDD_SPIN_NS)
			break;
		cpu_relax();
	}
	struct timespec ts0;
	now_ts(&ts0);
	for (;;) {
		struct timespec left = {0, 0}, *lp = NULL;
		if (tmo) {
			long long ns = (long long)tmo->tv_sec * 1000000000 + tmo->tv_nsec - (long long)ms_since(&ts0) * 1000000;
			if (ns < 0)
				ns = 0;
			left = (struct timespec){ns / 1000000000, ns % 1000000000};
			lp = &left;
		}
		/* Drain the bells that fired, then look once more: only then
		 * block (dep_settle_locked). */
		lock();
		if (s->epfd == epfd) {
			dep_settle_locked(s);
			int n = hot_collect_locked(s, evs, max);
			if (n > 0) {
				unlock();
				return n;
			}
		}
		unlock();
		int r = real.epoll_pwait2(epfd, evs, max, lp, mask);
		if (r <= 0)
			return r;
		lock();
		if (s->epfd != epfd) {
			unlock();
			return r;
		}
		int k = dep_take_locked(s, evs, 0, r);
		k += hot_collect_locked(s, evs + k, max - k);
		unlock();
		if (k > 0)
			return k;
		/* Only bells, and nothing ready behind them (a byte for data
		 * another reader took): wait on. */
		if (tmo && ms_since(&ts0) >= tmo->tv_sec * 1000 + tmo->tv_nsec / 1000000)
			return 0;
	}
}

EXPORT int epoll_wait(int epfd, struct epoll_event *evs, int max, int timeout)
{
	INIT();
	struct timespec t = {timeout / 1000, (timeout % 1000) * 1000000L};
	return d_epoll_wait(epfd, evs, max, timeout < 0 ? NULL : &t, NULL);
}

EXPORT int epoll_pwait(int epfd, struct epoll_event *evs, int max, int timeout, const sigset_t *mask)
{
	INIT();
	struct timespec t = {timeout / 1000, (timeout % 1000) * 1000000L};
	return d_epoll_wait(epfd, evs, max, timeout < 0 ? NULL : &t, mask);
}

EXPORT int epoll_pwait2(int epfd, struct epoll_event *evs, int max, const struct timespec *tmo, const sigset_t *mask)
{
	INIT();
	return d_epoll_wait(epfd, evs, max, tmo, mask);
}

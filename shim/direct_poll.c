/*
 * direct_poll.c: readiness of direct descriptors (docs/direct.md,
 * "Wake-up protocol"): owns poll, __poll_chk, ppoll, select and pselect
 * through d_poll, and epoll (d_epoll_ctl, shared via direct.h with
 * direct.c and calls.c's epoll_ctl; the g_dep records of direct.c;
 * epoll_wait, epoll_pwait, epoll_pwait2), each spinning on the rings
 * before it arms the bells. No state of its own.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <time.h>

#include "direct.h"
#include "shim.h"

/* ---- poll, select ---- */

#define POLL_STACK 256

/*
 * poll with direct descriptors: their readiness from the rings; when none
 * is ready and the call may block, arm their waits and poll the kernel
 * with each replaced by its bell (and V appended, for exnd's death).
 */
static int64_t d_now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* How often a readiness spin also asks the kernel about the other
 * descriptors (a zero-timeout poll or epoll_wait, about 0.5 µs): every
 * 16 checks of the rings keeps a plain socket's event within a fraction
 * of the budget while the rings are checked without system calls. */
#define SPIN_KERNEL_EVERY 16

/*
 * poll's spin (docs/direct.md, "Wake-up protocol"): for EXDD_SPIN_NS,
 * look at the direct descriptors' rings and, every SPIN_KERNEL_EVERY
 * rounds, at the others with a zero-timeout poll into k. Returns when
 * something is ready or the budget is spent; the caller then does its
 * ordinary pass (which finds it, or arms and parks).
 */
static void d_poll_spin(struct pollfd *fds, nfds_t n, int nd, struct pollfd *k, const sigset_t *mask)
{
	int64_t t0 = d_now_ns();
	for (unsigned it = 1;; it++) {
		for (nfds_t i = 0; i < n; i++) {
			struct dconn *c = dcof(fds[i].fd);
			if (c && (dring_ready(&c->d) & ((unsigned)fds[i].events | POLLERR | POLLHUP)))
				return;
		}
		if (it % SPIN_KERNEL_EVERY == 0) {
			if ((nfds_t)nd < n) {
				for (nfds_t i = 0; i < n; i++) {
					k[i] = fds[i];
					k[i].revents = 0;
					if (dcof(fds[i].fd))
						k[i].fd = -1;
				}
				struct timespec zero = {0, 0};
				if (real.ppoll(k, n, &zero, mask) != 0)
					return;
			}
			if (d_now_ns() - t0 >= EXDD_SPIN_NS)
				return;
		}
		cpu_relax();
	}
}

static int d_poll(struct pollfd *fds, nfds_t n, const struct timespec *tmo, const sigset_t *mask)
{
	int nd = 0;
	if (g_ndc > 0)
		for (nfds_t i = 0; i < n; i++)
			if (dcof(fds[i].fd))
				nd++;
	if (!nd)
		return real.ppoll(fds, n, tmo, mask);
	int saved = errno;
	size_t kn = n + 2 * (size_t)nd;
	struct pollfd stackbuf[POLL_STACK], *k = stackbuf;
	if (kn > POLL_STACK) {
		k = mmap(NULL, kn * sizeof *k, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (k == MAP_FAILED) {
			errno = ENOMEM;
			return -1;
		}
	}
	struct timespec t0;
	now_ts(&t0);
	int block = !tmo || tmo->tv_sec || tmo->tv_nsec;
	int ret;
	if (block)
		d_poll_spin(fds, n, nd, k, mask);
	for (;;) {
		/* 1. what is ready now, without blocking */
		int armed = 0, ready = 0;
		for (int pass = 0; pass < 2 && !ready; pass++) {
			for (nfds_t i = 0; i < n; i++) {
				struct dconn *c = dcof(fds[i].fd);
				if (!c)
					continue;
				unsigned ev = (unsigned)fds[i].events | POLLERR | POLLHUP;
				unsigned m = pass ? dring_arm(&c->d, ev) : dring_ready(&c->d);
				if (m & ev)
					ready = 1;
			}
			if (!block)
				break;
			armed = pass == 1;
			if (ready && armed) /* disarm below */
				break;
		}
		/* 2. the kernel: direct ones as their bells (or ignored when something is ready) */
		size_t j = n;
		for (nfds_t i = 0; i < n; i++) {
			k[i] = fds[i];
			k[i].revents = 0;
			struct dconn *c = dcof(fds[i].fd);
			if (!c)
				continue;
			int in = fds[i].events & (POLLIN | POLLRDNORM | POLLRDHUP), out = fds[i].events & (POLLOUT | POLLWRNORM);
			k[i].fd = ready || !block ? -1 : in || !out ? c->d.dbell : c->d.sbell;
			k[i].events = POLLIN;
			if (!ready && block) {
				if (in && out)
					k[j++] = (struct pollfd){c->d.sbell, POLLIN, 0};
				k[j++] = (struct pollfd){c->d.v, POLLIN, 0};
			}
		}
		struct timespec left, *lp = NULL;
		if (ready || !block) {
			left = (struct timespec){0, 0};
			lp = &left;
		} else if (tmo) {
			long ms = ms_since(&t0);
			long long ns = (long long)tmo->tv_sec * 1000000000 + tmo->tv_nsec - (long long)ms * 1000000;
			if (ns < 0)
				ns = 0;
			left = (struct timespec){ns / 1000000000, ns % 1000000000};
			lp = &left;
		}
		int r = real.ppoll(k, (nfds_t)j, lp, mask);
		int e = errno;
		if (armed)
			for (nfds_t i = 0; i < n; i++) {
				struct dconn *c = dcof(fds[i].fd);
				if (c)
					dring_disarm(&c->d, (unsigned)fds[i].events | POLLERR | POLLHUP);
			}
		if (r < 0) {
			errno = e;
			ret = -1;
			break;
		}
		for (size_t i = n; i < j; i++)
			if (k[i].revents & (POLLHUP | POLLERR))
				for (nfds_t q = 0; q < n; q++) {
					struct dconn *c = dcof(fds[q].fd);
					if (c && c->d.v == k[i].fd)
						dring_rst(&c->d);
				}
		/* 3. merge */
		ret = 0;
		for (nfds_t i = 0; i < n; i++) {
			struct dconn *c = dcof(fds[i].fd);
			if (c) {
				unsigned ev = (unsigned)fds[i].events | POLLERR | POLLHUP;
				fds[i].revents = (short)(dring_ready(&c->d) & ev);
			} else {
				fds[i].revents = k[i].revents;
			}
			if (fds[i].revents)
				ret++;
		}
		if (ret > 0 || r == 0 || ready || !block)
			break;
		if (tmo && ms_since(&t0) >= tmo->tv_sec * 1000 + tmo->tv_nsec / 1000000)
			break;
	}
	if (k != stackbuf)
		munmap(k, kn * sizeof *k);
	if (ret >= 0)
		errno = saved;
	return ret;
}

EXPORT int poll(struct pollfd *fds, nfds_t n, int timeout)
{
	INIT();
	if (!g_ndc)
		return real.poll(fds, n, timeout);
	struct timespec t = {timeout / 1000, (timeout % 1000) * 1000000L};
	return d_poll(fds, n, timeout < 0 ? NULL : &t, NULL);
}

EXPORT int __poll_chk(struct pollfd *fds, nfds_t n, int timeout, size_t fdslen)
{
	if (fdslen / sizeof *fds < n)
		abort();
	return poll(fds, n, timeout);
}

EXPORT int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *tmo, const sigset_t *mask)
{
	INIT();
	if (!g_ndc)
		return real.ppoll(fds, n, tmo, mask);
	return d_poll(fds, n, tmo, mask);
}

/* select through d_poll when a direct descriptor is in a set. */
static int d_select(int nfds, fd_set *r, fd_set *w, fd_set *x, const struct timespec *tmo, const sigset_t *mask, int *handled)
{
	*handled = 0;
	if (!g_ndc || nfds <= 0)
		return 0;
	if (nfds > FD_SETSIZE)
		nfds = FD_SETSIZE;
	int any = 0;
	for (int fd = 0; fd < nfds && !any; fd++)
		if (((r && FD_ISSET(fd, r)) || (w && FD_ISSET(fd, w)) || (x && FD_ISSET(fd, x))) && dcof(fd))
			any = 1;
	if (!any)
		return 0;
	*handled = 1;
	struct pollfd p[FD_SETSIZE];
	int n = 0;
	for (int fd = 0; fd < nfds; fd++) {
		short ev = (short)((r && FD_ISSET(fd, r) ? POLLIN : 0) | (w && FD_ISSET(fd, w) ? POLLOUT : 0) |
				   (x && FD_ISSET(fd, x) ? POLLPRI : 0));
		if (ev)
			p[n++] = (struct pollfd){fd, ev, 0};
	}
	int ret = d_poll(p, (nfds_t)n, tmo, mask);
	if (ret < 0)
		return -1;
	for (int i = 0; i < n; i++)
		if (p[i].revents & POLLNVAL) {
			errno = EBADF;
			return -1;
		}
	if (r)
		FD_ZERO(r);
	if (w)
		FD_ZERO(w);
	if (x)
		FD_ZERO(x);
	ret = 0;
	for (int i = 0; i < n; i++) {
		short v = p[i].revents;
		if (r && (p[i].events & POLLIN) && (v & (POLLIN | POLLHUP | POLLERR)))
			FD_SET(p[i].fd, r), ret++;
		if (w && (p[i].events & POLLOUT) && (v & (POLLOUT | POLLERR)))
			FD_SET(p[i].fd, w), ret++;
		if (x && (p[i].events & POLLPRI) && (v & POLLPRI))
			FD_SET(p[i].fd, x), ret++;
	}
	return ret;
}

EXPORT int select(int nfds, fd_set *r, fd_set *w, fd_set *x, struct timeval *tv)
{
	INIT();
	int handled;
	struct timespec t, *tp = NULL;
	if (tv) {
		t = (struct timespec){tv->tv_sec, tv->tv_usec * 1000};
		tp = &t;
	}
	int ret = d_select(nfds, r, w, x, tp, NULL, &handled);
	return handled ? ret : real.select(nfds, r, w, x, tv);
}

EXPORT int pselect(int nfds, fd_set *r, fd_set *w, fd_set *x, const struct timespec *tmo, const sigset_t *mask)
{
	INIT();
	int handled;
	int ret = d_select(nfds, r, w, x, tmo, mask, &handled);
	return handled ? ret : real.pselect(nfds, r, w, x, tmo, mask);
}

/* ---- epoll ---- */

/* epoll_ctl on a direct descriptor: V registered with the application's
 * data (it only ever shows the relay or exnd's death), and a hidden dup
 * of the bell with our record. 1 handled (ret in *ret), 0 not direct. */
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
	lock();
	int slot = -1;
	for (int i = 0; i < DEP_MAX; i++)
		if (g_dep[i].fd == fd && g_dep[i].epfd == epfd) {
			slot = i;
			break;
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
		if (slot < 0) {
			unlock();
			errno = ENOSPC;
			return 1;
		}
		if (real.epoll_ctl(epfd, op, fd, &vev) < 0) {
			unlock();
			return 1;
		}
		int hb[2] = {hide_fd(c->d.dbell, 1), hide_fd(c->d.sbell, 1)}, k;
		struct epoll_event bev = {EPOLLIN | (ev->events & EPOLLEXCLUSIVE), {.u64 = DEP_TAG | (uint64_t)slot}};
		for (k = 0; k < 2; k++)
			if (hb[k] < 0 || real.epoll_ctl(epfd, EPOLL_CTL_ADD, hb[k], &bev) < 0)
				break;
		if (k < 2) {
			int e = errno;
			for (int q = 0; q < 2; q++) {
				if (q < k)
					real.epoll_ctl(epfd, EPOLL_CTL_DEL, hb[q], NULL);
				if (hb[q] >= 0)
					real.close(hb[q]);
			}
			real.epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL);
			unlock();
			errno = e;
			return 1;
		}
		g_dep[slot] = (struct depreg){epfd, fd, {hb[0], hb[1]}, *ev, 0, ~0ull, ~0ull};
		g_ndep++;
		*ret = 0;
	} else if (slot < 0) {
		unlock();
		errno = ENOENT;
		return 1;
	} else if (op == EPOLL_CTL_MOD) {
		if ((*ret = real.epoll_ctl(epfd, op, fd, &vev)) == 0) {
			g_dep[slot].ev = *ev;
			g_dep[slot].disabled = 0;
			g_dep[slot].last_in = g_dep[slot].last_out = ~0ull;
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

static uint32_t dep_events(struct depreg *r) { return dep_eval(r, 1); }

/* Collect the direct records of epfd that are ready into out (room max). */
static int dep_collect(int epfd, struct epoll_event *out, int max)
{
	int n = 0;
	lock();
	for (int i = 0; i < DEP_MAX && n < max; i++) {
		if (g_dep[i].fd < 0 || g_dep[i].epfd != epfd)
			continue;
		uint32_t m = dep_events(&g_dep[i]);
		if (m)
			out[n++] = (struct epoll_event){m, g_dep[i].ev.data};
	}
	unlock();
	return n;
}

/* Arm (on) or disarm every direct record of epfd; arming: whether one is ready. */
static int dep_arm(int epfd, int on)
{
	int ready = 0;
	for (int i = 0; i < DEP_MAX; i++) {
		struct depreg *r = &g_dep[i];
		if (r->fd < 0 || r->epfd != epfd || r->disabled)
			continue;
		struct dconn *c = dcof(r->fd);
		if (!c)
			continue;
		unsigned ev = r->ev.events & (EPOLLIN | EPOLLOUT | EPOLLRDHUP);
		if (on) {
			/* ready: what dep_collect would report now; for EPOLLET
			 * not the level (bytes already reported are no event,
			 * and taking them for one spun without end) */
			dring_arm(&c->d, ev);
			if (dep_eval(r, 0))
				ready = 1;
		} else {
			dring_disarm(&c->d, ev);
		}
	}
	return ready;
}

/* Drop the bell events of epfd's direct records from evs[from:to]
 * (their readiness is computed); returns the new end. */
static int dep_filter(int epfd, struct epoll_event *evs, int from, int to)
{
	int k = from;
	for (int i = from; i < to; i++) {
		uint64_t u = evs[i].data.u64;
		if ((u & ~0xffffffffull) == DEP_TAG && (u & 0xffffffffull) < DEP_MAX && g_dep[u & 0xffffffffull].epfd == epfd &&
		    g_dep[u & 0xffffffffull].fd >= 0)
			continue;
		evs[k++] = evs[i];
	}
	return k;
}

/* epoll_wait's spin, as d_poll_spin: the direct records' readiness, and
 * every SPIN_KERNEL_EVERY rounds a zero-timeout epoll_wait. Returns the
 * events found (0: the budget is spent, nothing ready). */
static int dep_spin(int epfd, struct epoll_event *evs, int max, const sigset_t *mask)
{
	int64_t t0 = d_now_ns();
	struct timespec zero = {0, 0};
	for (unsigned it = 1;; it++) {
		int n = dep_collect(epfd, evs, max);
		if (n > 0) {
			int r = n < max ? real.epoll_pwait2(epfd, evs + n, max - n, &zero, mask) : 0;
			return r > 0 ? dep_filter(epfd, evs, n, n + r) : n;
		}
		if (it % SPIN_KERNEL_EVERY == 0) {
			int r = real.epoll_pwait2(epfd, evs, max, &zero, mask);
			if (r > 0 && (r = dep_filter(epfd, evs, 0, r)) > 0)
				return r + (r < max ? dep_collect(epfd, evs + r, max - r) : 0);
			if (d_now_ns() - t0 >= EXDD_SPIN_NS)
				return 0;
		}
		cpu_relax();
	}
}

static int d_epoll_wait(int epfd, struct epoll_event *evs, int max, const struct timespec *tmo, const sigset_t *mask)
{
	int has = 0;
	if (g_ndep > 0)
		for (int i = 0; i < DEP_MAX && !has; i++)
			has = g_dep[i].fd >= 0 && g_dep[i].epfd == epfd;
	if (!has || max <= 0)
		return real.epoll_pwait2(epfd, evs, max, tmo, mask);
	struct timespec t0;
	now_ts(&t0);
	if (!tmo || tmo->tv_sec || tmo->tv_nsec) {
		int n = dep_spin(epfd, evs, max, mask);
		if (n > 0)
			return n;
	}
	for (;;) {
		int n = dep_collect(epfd, evs, max);
		int block = n == 0 && (!tmo || tmo->tv_sec || tmo->tv_nsec);
		int armed = 0;
		if (block) {
			armed = 1;
			if (dep_arm(epfd, 1)) {
				dep_arm(epfd, 0);
				continue;
			}
		}
		struct timespec left = {0, 0}, *lp = &left;
		if (block && !tmo)
			lp = NULL;
		else if (block) {
			long long ns = (long long)tmo->tv_sec * 1000000000 + tmo->tv_nsec - (long long)ms_since(&t0) * 1000000;
			if (ns < 0)
				ns = 0;
			left = (struct timespec){ns / 1000000000, ns % 1000000000};
		}
		int r = real.epoll_pwait2(epfd, evs + n, max - n, lp, mask);
		int e = errno;
		if (armed)
			dep_arm(epfd, 0);
		if (r < 0) {
			if (n > 0)
				return n;
			errno = e;
			return -1;
		}
		/* drop bell events (readiness is computed), keep the rest */
		int k = dep_filter(epfd, evs, n, n + r);
		if (k < max && r > 0 && block)
			k += dep_collect(epfd, evs + k, max - k);
		if (k > 0 || !block || r == 0)
			return k;
		if (tmo && ms_since(&t0) >= tmo->tv_sec * 1000 + tmo->tv_nsec / 1000000)
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

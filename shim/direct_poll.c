/*
 * direct_poll.c: readiness of direct descriptors for poll and select
 * (docs/direct.md, "Wake-up protocol"): owns poll, __poll_chk, ppoll,
 * select and pselect through d_poll, spinning on the rings before it
 * arms the bells; epoll is direct_epoll.c's. No state of its own.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "direct.h"
#include "shim.h"
#include "upgrade.h"

/* ---- poll, select ---- */

#define POLL_STACK 256

/*
 * poll with direct descriptors: their readiness from the rings; when none
 * is ready and the call may block, arm their waits and poll the kernel
 * with each replaced by its bell (and V appended, for exnd's death).
 */

/*
 * poll's spin (docs/direct.md, "Wake-up protocol"): for EXDD_SPIN_NS,
 * look at the direct descriptors' rings and, every SPIN_KERNEL_EVERY
 * rounds, at the others with a zero-timeout poll into k. Returns when
 * something is ready or the budget is spent; the caller then does its
 * ordinary pass (which finds it, or arms and parks).
 */
static void d_poll_spin(struct pollfd *fds, nfds_t n, int nd, struct pollfd *k, const sigset_t *mask)
{
	int64_t t0 = mono_ns();
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
			if (mono_ns() - t0 >= EXDD_SPIN_NS)
				return;
		}
		cpu_relax();
	}
}

/* A direct entry of one d_poll call: its connection (index in g_dc, -1:
 * not direct), its waiter while the call parks (dparty.c), and whether
 * this round gave the kernel its bell and V. */
struct dpent {
	struct dwaiter w;
	int c, joined, inround;
};

/* Join the parties of the direct entries, once the spin is over (some
 * may be relayed then: they are plain sockets from now on). */
static void d_poll_join(struct pollfd *fds, nfds_t n, struct dpent *pe)
{
	for (nfds_t i = 0; i < n; i++) {
		struct dconn *c = dcof(fds[i].fd);
		pe[i].c = c ? (int)(c - g_dc) : -1;
		pe[i].joined = c && g_dhooks.enter(&c->d, &pe[i].w) == 0;
	}
}

static void d_poll_leave(nfds_t n, struct dpent *pe)
{
	for (nfds_t i = 0; i < n; i++)
		if (pe[i].joined)
			g_dhooks.leave(&g_dc[pe[i].c].d, &pe[i].w);
}

static int d_poll0(struct pollfd *fds, nfds_t n, const struct timespec *tmo, const sigset_t *mask)
{
	int nd = 0;
	if (g_ndc > 0)
		for (nfds_t i = 0; i < n; i++)
			if (dcof(fds[i].fd))
				nd++;
	if (!nd) {
		return real.ppoll(fds, n, tmo, mask);
	}
	int saved = errno;
	/* the kernel's entries (each direct one as its bell, its V appended,
	 * and the thread's kick), then a struct dpent per entry */
	size_t kn = n + (size_t)nd + 1;
	size_t need = kn * sizeof(struct pollfd) + n * sizeof(struct dpent);
	struct pollfd stackbuf[POLL_STACK], *k = stackbuf;
	struct dpent pstack[POLL_STACK / 2], *pe = pstack;
	void *big = NULL;
	if (kn > POLL_STACK || n > POLL_STACK / 2) {
		big = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (big == MAP_FAILED) {
			errno = ENOMEM;
			return -1;
		}
		k = big;
		pe = (struct dpent *)(void *)(k + kn);
	}
	memset(pe, 0, n * sizeof *pe);
	struct timespec t0;
	now_ts(&t0);
	int block = !tmo || tmo->tv_sec || tmo->tv_nsec;
	int ret;
	if (block) {
		d_poll_spin(fds, n, nd, k, mask);
		d_poll_join(fds, n, pe);
	}
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
		int kick = -1;
		for (nfds_t i = 0; i < n; i++) {
			k[i] = fds[i];
			k[i].revents = 0;
			pe[i].inround = 0;
			struct dconn *c = dcof(fds[i].fd);
			if (!c)
				continue;
			k[i].fd = ready || !block ? -1 : c->d.bell;
			k[i].events = POLLIN;
			if (!ready && block) {
				k[j++] = (struct pollfd){c->d.v, POLLIN, 0};
				pe[i].inround = 1;
				pe[i].c = (int)(c - g_dc);
				if (pe[i].joined)
					kick = pe[i].w.kick;
			}
		}
		if (kick >= 0)
			k[j++] = (struct pollfd){kick, POLLIN, 0};
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
		/* the bells that fired, V's events, the kick */
		if (r > 0) {
			size_t q = n;
			for (nfds_t i = 0; i < n; i++) {
				if (!pe[i].inround)
					continue;
				struct dring *d = &g_dc[pe[i].c].d;
				if (k[i].revents)
					dring_bell_drain(d, pe[i].joined ? &pe[i].w : NULL);
				if (k[q].revents)
					dring_v_event(d, k[q].revents);
				q++;
			}
			if (kick >= 0 && k[j - 1].revents)
				dring_drain(kick);
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
	d_poll_leave(n, pe);
	if (big)
		munmap(big, need);
	if (ret >= 0)
		errno = saved;
	return ret;
}

/* poll, and the upgrade's boundary (upgrade.h): a descriptor that
 * converted in the filter and is not ready leaves the result; when none
 * is left, the wait goes on for what remains of the timeout. */
static int d_poll(struct pollfd *fds, nfds_t n, const struct timespec *tmo, const sigset_t *mask)
{
	struct timespec t0, left;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	const struct timespec *t = tmo;
	for (;;) {
		int r = d_poll0(fds, n, t, mask);
		if (r <= 0 || !__atomic_load_n(&g_upg_att, __ATOMIC_RELAXED))
			return r;
		if ((r = upg_poll_filter(fds, n, r)) > 0)
			return r;
		if (!time_left(tmo, &t0, &left))
			return 0;
		t = tmo ? &left : NULL;
	}
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
		if (((r && FD_ISSET(fd, r)) || (w && FD_ISSET(fd, w)) || (x && FD_ISSET(fd, x))) &&
		    (dcof(fd) || (g_upg_att && upg_attached(fd))))
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

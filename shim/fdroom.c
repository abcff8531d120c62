/*
 * fdroom.c: where the shim's own descriptors live, and whether a switch
 * has room for them (docs/direct.md, "Descriptors"; issue #32). Owns
 * fdroom_begin/place/end, hide_fd and fdroom_may_switch, declared in
 * fdroom.h.
 *
 * A direct connection holds descriptors the program never opened: a
 * hidden dup of V, four bells, a dup of a bell per epoll registration,
 * and, for a moment, the buffer and exnd's control socket. Left in the
 * program's descriptor space they take numbers the program sized its
 * limit for: a server at the default soft limit of 1024 failed with
 * EMFILE after 127 direct connections.
 *
 * RLIMIT_NOFILE bounds the numbers new descriptors get, not the ones that
 * exist. So while the hard limit leaves room above the soft one (the
 * default: soft 1024, hard 524288 or more), the shim raises the soft
 * limit for the few calls that place one of its descriptors (the receive
 * of exnd's answer, the moves), puts the descriptor at or above the
 * program's soft limit, and puts the limit back, all under g_rlim_mu. The
 * program's own numbers stay what plain TCP gives it: V replaces its
 * socket one for one. The shim never hands the program a number above
 * its soft limit, and its own select translation polls (direct_poll.c),
 * so FD_SETSIZE never meets a hidden descriptor.
 *
 * With no room above (soft == hard, e.g. bash's `ulimit -n N`, or
 * systemd's LimitNOFILE=N) the shim's descriptors share the program's
 * space. A switch goes ahead only if all the shim keeps, with what the
 * switch takes, stays within 1/FDROOM_SHARE_DIV of the soft limit and the
 * table has free numbers for it; otherwise the connection stays plain
 * TCP with reason fd_limit. That bounds, but cannot remove, the numbers
 * the shim takes from such a program (fdroom.h).
 *
 * Limits: a program that changes RLIMIT_NOFILE while another of its
 * threads is inside the window (a few system calls) can have its change
 * undone; fork waits for the window to end (fdroom_atfork_*), so a child
 * never inherits the raised limit.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>

#include "fdroom.h"
#include "shim.h"

static pthread_mutex_t g_rlim_mu = PTHREAD_MUTEX_INITIALIZER;

void fdroom_atfork_prepare(void) { pthread_mutex_lock(&g_rlim_mu); }
void fdroom_atfork_release(void) { pthread_mutex_unlock(&g_rlim_mu); }

void fdroom_begin(struct fdroom *r)
{
	int e = errno;
	pthread_mutex_lock(&g_rlim_mu);
	r->raised = 0;
	r->soft = r->hard = 0;
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		r->soft = rl.rlim_cur;
		r->hard = rl.rlim_max;
		if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_max > rl.rlim_cur &&
		    rl.rlim_max - rl.rlim_cur >= FDROOM_ABOVE_MIN) {
			struct rlimit up = {rl.rlim_max, rl.rlim_max};
			r->raised = setrlimit(RLIMIT_NOFILE, &up) == 0;
		}
	}
	errno = e;
}

void fdroom_end(struct fdroom *r)
{
	int e = errno;
	if (r->raised) {
		struct rlimit rl = {r->soft, r->hard};
		setrlimit(RLIMIT_NOFILE, &rl);
		r->raised = 0;
	}
	pthread_mutex_unlock(&g_rlim_mu);
	errno = e;
}

/* The least number a hidden descriptor gets without room above the soft
 * limit: out of the way of the program's low numbers, which most programs
 * expect densely packed. */
static int low_hide_base(const struct fdroom *r)
{
	if (r->soft == RLIM_INFINITY || r->soft <= 1024)
		return 512;
	return (int)(r->soft / 2 > 65536 ? 65536 : r->soft / 2);
}

int fdroom_place(const struct fdroom *r, int fd, int keep)
{
	if (fd < 0)
		return fd;
	if (r->raised && (rlim_t)fd >= r->soft) {
		if (!keep)
			return fd; /* already above */
		int h = real.fcntl(fd, F_DUPFD_CLOEXEC, (int)r->soft);
		return h;
	}
	int h = -1;
	if (r->raised)
		h = real.fcntl(fd, F_DUPFD_CLOEXEC, (int)r->soft);
	if (h < 0)
		h = real.fcntl(fd, F_DUPFD_CLOEXEC, low_hide_base(r));
	if (h < 0)
		h = real.fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (h >= 0 && !keep) {
		int e = errno;
		real.close(fd);
		errno = e;
	}
	return h;
}

int hide_fd(int fd, int keep)
{
	struct fdroom r;
	fdroom_begin(&r);
	int h = fdroom_place(&r, fd, keep);
	fdroom_end(&r);
	return h;
}

int fdroom_may_switch(int fd, int need, int kept)
{
	struct fdroom r;
	int e = errno, ok = 0;
	fdroom_begin(&r);
	/* The lowest free number where the shim's descriptors would go. */
	int h = real.fcntl(fd, F_DUPFD_CLOEXEC, r.raised ? (int)r.soft : 0);
	if (h >= 0) {
		real.close(h);
		if (r.raised)
			ok = (rlim_t)h + (rlim_t)need < r.hard;
		else
			ok = r.soft == RLIM_INFINITY ||
			     ((rlim_t)h + (rlim_t)need < r.soft && (rlim_t)(kept + need) <= r.soft / FDROOM_SHARE_DIV);
	}
	fdroom_end(&r);
	errno = e;
	return ok;
}

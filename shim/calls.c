/*
 * calls.c: owns the intercepted calls that create, switch, close and copy
 * descriptors (socket, connect, listen, accept, accept4, close, dup,
 * dup2, dup3, fcntl, fcntl64, epoll_ctl) and their helpers (the connect
 * wait, do_accept, dup_copy, ...). No state of its own: it works on
 * libextds.c's table (shim.h), asks exnd through the control client
 * (ctl.h), and hands off to hold.c (hold.h) and direct.c (direct.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "ctl.h"
#include "direct.h"
#include "hold.h"
#include "shim.h"
#include "upgrade.h"

/* ---- intercepted calls ---- */

EXPORT int socket(int domain, int type, int protocol)
{
	INIT();
	int fd = real.socket(domain, type, protocol);
	if (fd < 0 || !g_tab)
		return fd;
	int track = (domain == AF_INET || domain == AF_INET6) && (type & 0xf) == SOCK_STREAM &&
		    (protocol == 0 || protocol == IPPROTO_TCP);
	struct fdent *e = ent(fd);
	if (!e)
		return fd;
	lock();
	clear_locked(fd);
	if (track) {
		e->flags = F_TRACKED;
		e->family = domain;
	}
	unlock();
	return fd;
}

/* Wait for a non-blocking connect to finish. 0, or -1 with errno. */
static int finish_connect(int fd)
{
	struct timeval tv = {0, 0};
	socklen_t l = sizeof tv;
	long limit = 30000;
	if (real.getsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, &l) == 0 && (tv.tv_sec || tv.tv_usec))
		limit = tv.tv_sec * 1000 + tv.tv_usec / 1000;
	struct timespec t0;
	now_ts(&t0);
	for (;;) {
		long left = limit - ms_since(&t0);
		if (left < 0)
			left = 0;
		struct pollfd p = {fd, POLLOUT, 0};
		int r = poll(&p, 1, (int)left);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0) {
			errno = ETIMEDOUT;
			return -1;
		}
		int err = 0;
		l = sizeof err;
		if (real.getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l) < 0)
			return -1;
		if (err) {
			errno = err;
			return -1;
		}
		return 0;
	}
}

/* Make a connected TCP socket unusable (force mode refusal). */
static void disconnect(int fd)
{
	struct sockaddr sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_family = AF_UNSPEC;
	real.connect(fd, &sa, sizeof sa);
}

/* What to ask exnd for fd: a direct connection if there is room for its
 * descriptors (fdroom.c), else to count fd_limit and keep plain TCP; the
 * relay under EXTDS_DIRECT=0. */
static unsigned switch_how(int fd)
{
	if (!g_direct)
		return CTL_SW_RELAY;
	if (!direct_room(fd, 0)) {
		dbg("fd %d: no room for a direct connection's descriptors, plain TCP (fd_limit)", fd);
		return CTL_SW_FDLIMIT;
	}
	return CTL_SW_DIRECT;
}


EXPORT int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	INIT();
	if (g_mode == MODE_OFF || !addr || len < sizeof(sa_family_t) ||
	    (addr->sa_family != AF_INET && addr->sa_family != AF_INET6) || !ent(fd))
		return real.connect(fd, addr, len);
	if (fdflags(fd) & F_SWITCHED) {
		if (switched(fd, NULL)) {
			errno = EISCONN;
			return -1;
		}
	}
	int family;
	if (is_loopback(addr) || !is_tcp(fd, &family)) {
		if (is_loopback(addr))
			dbg("connect fd %d: loopback, plain TCP", fd);
		return real.connect(fd, addr, len);
	}
	if (g_upgrade && g_mode != MODE_FORCE) {
		/* The program's own TCP connection; it may move later
		 * (upgrade.c). A non-blocking connect in progress is marked
		 * too: its first data call comes after it completed. */
		int r = real.connect(fd, addr, len), e = errno;
		if (r == 0 || e == EINPROGRESS)
			upg_mark(fd, 0);
		else
			settle(fd);
		errno = e;
		return r;
	}
	if (g_mode != MODE_FORCE &&
	    len >= (addr->sa_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6)) &&
	    held_peer(addr)) {
		/* The server's port is on hold (hold.c): TCP, exnd not asked. */
		int r = real.connect(fd, addr, len), e = errno;
		settle(fd);
		dbg("connect fd %d: server on hold (short connections), plain TCP", fd);
		errno = e;
		return r;
	}
	int saved = errno;
	int r = real.connect(fd, addr, len);
	if (r < 0) {
		/* A blocking connect that timed out (SO_SNDTIMEO) also says
		 * EINPROGRESS: only a non-blocking one is completed here. */
		if (errno != EINPROGRESS)
			return r;
		int e = errno, fl = real.fcntl(fd, F_GETFL);
		errno = e;
		if (fl < 0 || !(fl & O_NONBLOCK))
			return r;
		if (finish_connect(fd) < 0) {
			int e = errno;
			settle(fd);
			errno = e;
			return -1;
		}
	}
	/* exnd may flip O_NONBLOCK on the shared open file (Go's
	 * net.FileConn does): take the flags now and put them back. */
	int fdfl = real.fcntl(fd, F_GETFD), flfl = real.fcntl(fd, F_GETFL);
	char buf[4096];
	struct ctl_resp resp;
	int ufd[CTL_MAXFD];
	if ((fdflags(fd) & F_EPOVF)) {
		dbg("connect fd %d: too many epoll registrations to switch, plain TCP", fd);
		goto tcp;
	}
	switch (ctl_call(CTL_OP_CONNECT, switch_how(fd), fd, -1, buf, sizeof buf, &resp, ufd)) {
	case CTL_NOCONN:
		dbg("connect fd %d: no exnd, plain TCP", fd);
		goto tcp;
	case CTL_BROKEN:
		dbg("connect fd %d: control connection broke", fd);
		disconnect(fd);
		settle(fd);
		errno = ECONNABORTED;
		return -1;
	case CTL_REFUSED:
		dbg("connect fd %d: exnd: %s", fd, buf);
		disconnect(fd);
		settle(fd);
		errno = ECONNREFUSED;
		return -1;
	}
	if ((resp.mode != CTL_MODE_EXTDS && resp.mode != CTL_MODE_DIRECT) || ufd[0] < 0) {
		close_fds(ufd);
		if (resp.mode == CTL_MODE_TCP && resp.hold_ms)
			hold_peer(addr, resp.hold_ms, resp.hold_end);
		dbg("connect fd %d: plain TCP: %s", fd, buf);
		goto tcp;
	}
	uint64_t id = resp.id;
	if (switch_to(fd, &resp, ufd, (fdfl & FD_CLOEXEC) != 0, (flfl & O_NONBLOCK) != 0) < 0) {
		int e = errno;
		dbg("connect fd %d: switch failed: %s", fd, strerror(e));
		disconnect(fd);
		settle(fd);
		errno = e;
		return -1;
	}
	dbg("connect fd %d: EXT-DS id %llu, %s", fd, (unsigned long long)id, resp.mode == CTL_MODE_DIRECT ? "direct" : "relay");
	errno = saved;
	return 0;
tcp:
	if (flfl >= 0)
		real.fcntl(fd, F_SETFL, flfl);
	settle(fd);
	if (g_mode == MODE_FORCE) {
		disconnect(fd);
		errno = ECONNREFUSED;
		return -1;
	}
	errno = saved;
	return 0;
}

EXPORT int listen(int fd, int backlog)
{
	INIT();
	int r = real.listen(fd, backlog);
	if (r < 0 || g_mode == MODE_OFF || !ent(fd))
		return r;
	int saved = errno;
	if (fdflags(fd) & F_LISTEN)
		return r; /* backlog change */
	int family;
	union addr a;
	socklen_t l = sizeof a;
	if (!is_tcp(fd, &family) || real.getsockname(fd, &a.sa, &l) < 0 || is_loopback(&a.sa)) {
		errno = saved;
		return r;
	}
	int port = ntohs(family == AF_INET ? a.in.sin_port : a.in6.sin6_port);
	char buf[4096];
	struct ctl_resp resp;
	int ufd[CTL_MAXFD];
	/* exnd takes the port from the socket itself and checks it listens. */
	int c = ctl_call(CTL_OP_LISTEN, 0, fd, -1, buf, sizeof buf, &resp, ufd);
	close_fds(ufd);
	if (c == CTL_OK) {
		lock();
		struct fdent *e = ent(fd);
		clear_locked(fd);
		e->flags = F_TRACKED | F_LISTEN;
		e->family = family;
		e->port = port;
		e->owner = getpid();
		e->lid = ++g_lid;
		unlock();
		dbg("listen fd %d: port %d registered", fd, port);
	} else {
		dbg("listen fd %d: port %d not registered (%s)", fd, port, c == CTL_NOCONN ? "no exnd" : buf);
	}
	errno = saved;
	return r;
}

static int do_accept(int lfd, struct sockaddr *addr, socklen_t *alen, int flags)
{
	INIT();
	int fd;
	for (;;) {
		fd = real.accept4(lfd, addr, alen, flags);
		if (fd < 0 || !ent(fd))
			return fd;
		int saved = errno;
		lock();
		clear_locked(fd);
		struct fdent *le = ent(lfd);
		int shim = le && (le->flags & F_LISTEN);
		if (le && (le->flags & F_TRACKED)) {
			struct fdent *e = ent(fd);
			e->flags = F_TRACKED;
			e->family = le->family;
		}
		unlock();
		if (!shim || g_mode == MODE_OFF || held_listener(lfd)) {
			errno = saved;
			return fd;
		}
		union addr pa;
		socklen_t pl = sizeof pa;
		if (real.getpeername(fd, &pa.sa, &pl) < 0 || is_loopback(&pa.sa)) {
			errno = saved;
			return fd;
		}
		if (g_upgrade) {
			upg_mark(fd, 1); /* the program's own; it may move later (upgrade.c) */
			errno = saved;
			return fd;
		}
		char buf[4096];
		struct ctl_resp resp;
		int ufd[CTL_MAXFD];
		int c = ctl_call(CTL_OP_ACCEPT, switch_how(fd), fd, -1, buf, sizeof buf, &resp, ufd);
		if (c == CTL_NOCONN) {
			dbg("accept fd %d: no exnd, plain TCP", fd);
			errno = saved;
			return fd;
		}
		if (c == CTL_OK && resp.mode != CTL_MODE_EXTDS && resp.mode != CTL_MODE_DIRECT) {
			close_fds(ufd);
			if (resp.mode == CTL_MODE_TCP && resp.hold_ms)
				hold_listener(lfd, resp.hold_ms, resp.hold_end);
			int fl = real.fcntl(fd, F_GETFL);
			if (fl >= 0 && !!(fl & O_NONBLOCK) != !!(flags & SOCK_NONBLOCK))
				real.fcntl(fd, F_SETFL, (flags & SOCK_NONBLOCK) ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
			dbg("accept fd %d: plain TCP: %s", fd, buf);
			errno = saved;
			return fd;
		}
		if (c == CTL_OK && ufd[0] >= 0) {
			uint64_t id = resp.id;
			if (switch_to(fd, &resp, ufd, (flags & SOCK_CLOEXEC) != 0, (flags & SOCK_NONBLOCK) != 0) == 0) {
				dbg("accept fd %d: EXT-DS id %llu, %s", fd, (unsigned long long)id,
				    resp.mode == CTL_MODE_DIRECT ? "direct" : "relay");
				errno = saved;
				return fd;
			}
		}
		/* exnd failed this connection (its stream may be consumed):
		 * drop it. A blocking listener waits for the next one. */
		dbg("accept fd %d: dropped (%s)", fd, c == CTL_BROKEN ? "control connection broke" : buf);
		lock();
		clear_locked(fd);
		unlock();
		real.close(fd);
		int fl = real.fcntl(lfd, F_GETFL);
		if (fl >= 0 && (fl & O_NONBLOCK)) {
			errno = EAGAIN;
			return -1;
		}
	}
}

EXPORT int accept(int fd, struct sockaddr *addr, socklen_t *len) { return do_accept(fd, addr, len, 0); }

EXPORT int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
	return do_accept(fd, addr, len, flags);
}

/* Whether another descriptor still refers to listener lid. */
static int listener_shared_locked(int fd, uint32_t lid)
{
	for (int i = 0; i < g_ntab; i++)
		if (i != fd && (g_tab[i].flags & F_LISTEN) && g_tab[i].lid == lid)
			return 1;
	return 0;
}

EXPORT int close(int fd)
{
	INIT();
	struct fdent *e = ent(fd);
	if (!e || (!e->flags && !g_nep && !g_ndep))
		return real.close(fd);
	int port = 0;
	lock();
	if (g_nep)
		ep_drop_epfd_locked(fd);
	if (g_ndep)
		direct_epfd_closed_locked(fd);
	/* exnd drops the registration only if the socket is gone (no other
	 * process, e.g. a forked worker, still has it), so any process may
	 * say it closed its last copy. */
	if ((e->flags & F_LISTEN) && !listener_shared_locked(fd, e->lid))
		port = e->port;
	clear_locked(fd);
	unlock();
	int r = real.close(fd);
	if (port) {
		int saved = errno;
		char buf[4096];
		struct ctl_resp resp;
		int ufd[CTL_MAXFD];
		ctl_call(CTL_OP_UNLISTEN, (unsigned)port, -1, -1, buf, sizeof buf, &resp, ufd);
		close_fds(ufd);
		dbg("close fd %d: port %d unregistered", fd, port);
		errno = saved;
	}
	return r;
}

/* After a successful dup of oldfd to newfd: copy the entry. */
static void dup_copy(int oldfd, int newfd)
{
	struct fdent *o = ent(oldfd), *n = ent(newfd);
	if (!n || oldfd == newfd)
		return;
	if (!(o && o->flags) && !n->flags)
		return;
	lock();
	clear_locked(newfd);
	if (o) {
		*n = *o;
		n->nreg = 0;
		n->flags &= ~F_EPOVF;
		if (n->flags & F_DIRECT)
			direct_ref_locked(n);
		else if (n->flags & F_UPG)
			upg_dup_locked(o, n);
	}
	int direct = n->flags & F_DIRECT;
	uint64_t ino = n->ino;
	unlock();
	/* A dup that raced an upgrade's conversion (upgrade.c): the kernel
	 * copied the TCP socket, and the entry it copied says direct by now
	 * (oldfd is V): newfd must be V too. */
	struct stat st;
	if (direct && fstat(newfd, &st) == 0 && st.st_ino != ino) {
		int cl = real.fcntl(newfd, F_GETFD);
		real.dup3(oldfd, newfd, (cl >= 0 && (cl & FD_CLOEXEC)) ? O_CLOEXEC : 0);
	}
}

/* dup_result ends a dup, dup2 or dup3 of fd that returned r: on success
 * the entry is copied to r. Returns r. */
static int dup_result(int fd, int r)
{
	if (r >= 0)
		dup_copy(fd, r);
	return r;
}

EXPORT int dup(int fd)
{
	INIT();
	return dup_result(fd, real.dup(fd));
}

EXPORT int dup2(int fd, int fd2)
{
	INIT();
	return dup_result(fd, real.dup2(fd, fd2));
}

EXPORT int dup3(int fd, int fd2, int flags)
{
	INIT();
	return dup_result(fd, real.dup3(fd, fd2, flags));
}

static int do_fcntl(int (*f)(int, int, ...), int fd, int cmd, void *arg)
{
	INIT();
	int r = f(fd, cmd, arg);
	if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC))
		dup_copy(fd, r);
	if (r >= 0 && cmd == F_SETFL) {
		int saved = errno;
		direct_setfl(fd, (long)arg);
		errno = saved;
	}
	return r;
}

/* fcntl and fcntl64 differ only in the real call; C cannot pass a
 * variadic list on, so each reads the optional argument itself (as a
 * pointer: an int argument fits in it) for do_fcntl. */
#define FCNTL_WRAPPER(name, real)                                                                                      \
	EXPORT int name(int fd, int cmd, ...)                                                                          \
	{                                                                                                              \
		va_list ap;                                                                                            \
		va_start(ap, cmd);                                                                                     \
		void *arg = va_arg(ap, void *);                                                                        \
		va_end(ap);                                                                                            \
		INIT();                                                                                                \
		return do_fcntl(real, fd, cmd, arg);                                                                   \
	}

FCNTL_WRAPPER(fcntl, real.fcntl)
FCNTL_WRAPPER(fcntl64, real.fcntl64)

EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	INIT();
	int r;
	if (d_epoll_ctl(epfd, op, fd, ev, &r))
		return r;
	r = real.epoll_ctl(epfd, op, fd, ev);
	/* Only sockets that may still switch (tracked, not connected through
	 * the shim yet, not listening) need their registrations recorded. */
	int fl = fdflags(fd);
	if (r < 0 || !(fl & F_TRACKED) || (fl & (F_SWITCHED | F_LISTEN)))
		return r;
	lock();
	struct fdent *e = ent(fd);
	int slot = -1, fre = -1;
	for (int i = 0; i < EP_POOL; i++) {
		if (e->nreg > 0 && g_ep[i].fd == fd && g_ep[i].epfd == epfd) {
			slot = i;
			break;
		}
		if (fre < 0 && g_ep[i].fd < 0) {
			fre = i;
			if (e->nreg == 0)
				break;
		}
	}
	switch (op) {
	case EPOLL_CTL_ADD:
	case EPOLL_CTL_MOD:
		if (slot < 0 && fre < 0) {
			e->flags |= F_EPOVF;
			break;
		}
		if (slot < 0) {
			slot = fre;
			g_ep[slot].fd = fd;
			g_ep[slot].epfd = epfd;
			g_nep++;
			e->nreg++;
		}
		g_ep[slot].ev = ev ? *ev : (struct epoll_event){0};
		break;
	case EPOLL_CTL_DEL:
		if (slot >= 0) {
			g_ep[slot].fd = -1;
			g_nep--;
			e->nreg--;
		}
		break;
	}
	unlock();
	return r;
}

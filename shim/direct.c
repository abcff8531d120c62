/*
 * direct.c: direct EXT-DS connections in libextds.so (docs/direct.md):
 * owns their state, the switch to direct (switch_to), the data calls
 * (read, write, readv, writev, recv, send, their _chk forms, sendfile,
 * sendfile64, splice), ioctl and shutdown. Shares via direct.h the
 * state and d_io with direct_poll.c (poll, select), direct_epoll.c (epoll),
 * direct_exec.c (the exec family) and the socket calls (calls.c,
 * sockcalls.c). The buffer itself is dring.c.
 *
 * State: g_dc, one record per direct connection mapped in this process
 * (the dring view and one hidden CLOEXEC descriptor placed high: the
 * side's bell), shared by every descriptor of the dup family (fdent.dc,
 * counted in refs). The dring's V is one of the application's own
 * descriptors of the connection, moved to another when the application
 * closes that one; the last close unmaps the buffer and closes the bell,
 * so E hangs up exactly when the application's last V closes. g_dep:
 * epoll registrations of direct descriptors (each with the bell in that
 * epoll set; a dup only if the set holds two records of one
 * connection). dparty.c: who parks on the bell. Both are plain
 * memory, inherited by fork like the descriptors; changed under the
 * table lock, never held across a blocking call. The data path takes no
 * lock of the shim: dring.c serialises producers and consumers itself.
 *
 * A direct descriptor whose relay[S] is set is used as a plain kernel
 * socket (V): each call falls through to the real one.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctl.h"
#include "direct.h"
#include "shim.h"
#include "upgrade.h"

struct dconn g_dc[DC_MAX];
struct depreg g_dep[DEP_MAX];
struct depset g_dset[DSET_MAX];
int g_ndc, g_ndep;

/* An empty set for epfd (-1: a free slot). */
static struct depset dset_empty(int epfd)
{
	struct depset s = {.epfd = epfd, .hot = -1, .rang = -1};
	for (int q = 0; q < DSET_RECENT; q++)
		s.recent[q] = -1;
	return s;
}

void direct_init(void)
{
	for (int i = 0; i < DEP_MAX; i++)
		g_dep[i].fd = -1;
	for (int i = 0; i < DSET_MAX; i++)
		g_dset[i] = dset_empty(-1);
	dparty_init();
}

struct depset *dset_of_locked(int epfd, int make)
{
	struct depset *free = NULL;
	for (int i = 0; i < DSET_MAX; i++) {
		if (g_dset[i].epfd == epfd)
			return &g_dset[i];
		if (!free && g_dset[i].epfd < 0)
			free = &g_dset[i];
	}
	if (!make || !free)
		return NULL;
	*free = dset_empty(epfd);
	return free;
}

void hot_unlink_locked(struct depset *s, int i)
{
	if (g_dep[i].rang) {
		for (int *p = &s->rang; *p >= 0; p = &g_dep[*p].rang_next)
			if (*p == i) {
				*p = g_dep[i].rang_next;
				break;
			}
		g_dep[i].rang = 0;
	}
	if (!g_dep[i].hot)
		return;
	for (int *p = &s->hot; *p >= 0; p = &g_dep[*p].hot_next)
		if (*p == i) {
			*p = g_dep[i].hot_next;
			break;
		}
	g_dep[i].hot = 0;
}

void dep_free_locked(int i)
{
	struct depreg *r = &g_dep[i];
	if (!r->bell_gone)
		real.epoll_ctl(r->epfd, EPOLL_CTL_DEL, r->hbell, NULL);
	if (r->hdup)
		real.close(r->hbell);
	struct dconn *c = &g_dc[r->dc];
	/* Only the process that armed it: a forked child's copy of the
	 * record was never counted in the shared ring. */
	if (c->refs > 0 && r->owner == dparty_pid()) {
		dring_disarm(&c->d, r->armed);
		party_leave_locked(c);
		c->nrec--;
	}
	struct depset *s = dset_of_locked(r->epfd, 0);
	if (s) {
		hot_unlink_locked(s, i);
		if (--s->n == 0) {
			int k = direct_fkick();
			if (k >= 0)
				real.epoll_ctl(s->epfd, EPOLL_CTL_DEL, k, NULL);
			s->epfd = -1;
		}
	}
	r->fd = -1;
	g_ndep--;
}

/* fd's entry is being cleared (close, reuse): drop its epoll records and its reference. */
void direct_drop_locked(int fd, struct fdent *e)
{
	for (int i = 0, seen = 0; i < DEP_MAX && seen < g_ndep; i++) {
		if (g_dep[i].fd < 0)
			continue;
		seen++;
		if (g_dep[i].fd == fd) {
			/* another descriptor of the file may keep it open */
			real.epoll_ctl(g_dep[i].epfd, EPOLL_CTL_DEL, fd, NULL);
			dep_free_locked(i);
			seen--;
		}
	}
	int dc = e->dc;
	struct dconn *c = &g_dc[dc - 1];
	if (--c->refs > 0) {
		if (c->d.v == fd) /* the dring's V: another of the application's descriptors */
			for (int o = 0; o < g_ntab; o++)
				if (o != fd && (g_tab[o].flags & F_DIRECT) && g_tab[o].dc == dc) {
					c->d.v = o;
					break;
				}
		return;
	}
	dring_detach(&c->d);
	real.close(c->d.bell);
	if (c->vhidden)
		real.close(c->d.v); /* an upgraded connection's own V (upgrade.c) */
	if (c->vclose)
		real.close(c->vclose - 1);
	memset(c, 0, sizeof *c);
	g_ndc--;
}

void direct_epfd_closed_locked(int epfd)
{
	for (int i = 0; i < DEP_MAX && g_ndep > 0; i++)
		if (g_dep[i].fd >= 0 && g_dep[i].epfd == epfd)
			dep_free_locked(i);
}

void direct_ref_locked(struct fdent *e) { g_dc[e->dc - 1].refs++; }

int direct_room(int fd, int extra)
{
	/* The direct table full, or nearly: a switch would find no slot
	 * after exnd made the connection. DC_SLACK covers other threads
	 * switching at the same moment. */
	int ndc = __atomic_load_n(&g_ndc, __ATOMIC_RELAXED);
	return ndc < DC_MAX - DC_SLACK &&
	       fdroom_may_switch(fd, FDROOM_SWITCH_NEED + extra,
				 FDROOM_CONN_KEEP * ndc + FDROOM_EPOLL_KEEP * __atomic_load_n(&g_ndep, __ATOMIC_RELAXED) +
				     __atomic_load_n(&g_upg_asked, __ATOMIC_RELAXED));
}

/*
 * Switch fd to exnd's answer r with descriptors ufd (docs/direct.md):
 * relay (one socketpair end) or direct (V, buffer, the side's bell).
 * Consumes ufd. 0, or -1 with errno (fd untouched).
 */
int switch_to(int fd, const struct ctl_resp *r, int *ufd, int cloexec, int nonblock)
{
	if (r->mode != CTL_MODE_DIRECT) {
		int v = ufd[0];
		ufd[0] = -1;
		close_fds(ufd);
		return do_switch(fd, v, cloexec, nonblock, r->id, -1);
	}
	if (!ent(fd)) {
		close_fds(ufd);
		errno = EPROTO;
		return -1;
	}
	int slot = direct_attach(r, ufd, fd);
	if (slot < 0)
		return -1;
	int v = ufd[0];
	ufd[0] = -1;
	if (direct_install(fd, slot, r->id, v, cloexec, nonblock) < 0) {
		int e = errno;
		direct_unattach(slot);
		errno = e;
		return -1;
	}
	return 0;
}

/*
 * Reserve a slot of g_dc and attach exnd's direct answer r to it: ufd
 * holds V, the buffer and the side's bell; the buffer and the bell are
 * consumed (the bell kept, hidden, in the slot), V stays in ufd[0] and
 * the dring records v as its V. The slot (refs -1: reserved), or -1 with
 * errno (every descriptor of ufd closed).
 */
int direct_attach(const struct ctl_resp *r, int *ufd, int v)
{
	int bad = r->side > 1 || r->ring > EXDD_RING_MAX || ufd[0] < 0 || ufd[3] >= 0;
	for (int i = 1; i < 3; i++)
		bad |= ufd[i] < 0;
	if (bad) {
		close_fds(ufd);
		errno = EPROTO;
		return -1;
	}
	lock();
	int slot = -1;
	for (int i = 0; i < DC_MAX; i++)
		if (g_dc[i].refs == 0) {
			slot = i;
			g_dc[i].refs = -1; /* reserved */
			break;
		}
	unlock();
	if (slot < 0) {
		close_fds(ufd);
		errno = EMFILE;
		return -1;
	}
	struct dconn *c = &g_dc[slot];
	direct_fkick(); /* made before any fork that may share this connection */
	/* The bell out of the program's descriptor space (fdroom.c); exnd's
	 * answer placed it there already unless there was no room. */
	int hb = hide_fd(ufd[2], 0), e = hb < 0 ? EMFILE : 0;
	if (hb >= 0)
		ufd[2] = -1;
	if (!e) {
		int a = dring_attach(&c->d, ufd[1], (int)r->side, (uint32_t)r->ring, hb, v, &g_dhooks);
		e = a < 0 ? -a : 0;
	} else {
		real.close(ufd[1]);
	}
	ufd[1] = -1;
	if (e) {
		close_fds(ufd);
		if (hb >= 0)
			real.close(hb);
		lock();
		memset(c, 0, sizeof *c);
		unlock();
		errno = e;
		return -1;
	}
	return slot;
}

/* Undo direct_attach of a slot that was never installed: unmap, close
 * the bell, free the slot. */
void direct_unattach(int slot)
{
	struct dconn *c = &g_dc[slot];
	dring_detach(&c->d);
	real.close(c->d.bell);
	lock();
	memset(c, 0, sizeof *c);
	unlock();
}

/*
 * Make fd the direct descriptor of g_dc[slot] (attached, refs reserved
 * or counted by the caller): V (consumed) replaces the TCP socket under
 * fd's number (do_switch), and the epoll registrations made on the TCP
 * socket (a non-blocking connect waited for EPOLLOUT; an upgraded
 * connection's whole life so far) become direct registrations. A new
 * connection (refs -1, reserved) is counted here. 0, or -1 with errno
 * (fd untouched, V closed).
 */
int direct_install(int fd, int slot, uint64_t id, int v, int cloexec, int nonblock)
{
	struct dconn *c = &g_dc[slot];
	struct epreg regs[16];
	int nregs = 0;
	if (nonblock < 0)
		nonblock = (real.fcntl(fd, F_GETFL) & O_NONBLOCK) != 0;
	lock();
	struct fdent *pe = ent(fd);
	if (pe && pe->nreg > 0)
		for (int i = 0; i < EP_POOL && nregs < 16; i++)
			if (g_ep[i].fd == fd)
				regs[nregs++] = g_ep[i];
	unlock();
	lock();
	c->id = id;
	int fresh = c->refs < 0;
	if (fresh) {
		c->refs = 1;
		g_ndc++;
	}
	if (!c->vhidden)
		c->d.v = fd;
	unlock();
	if (do_switch(fd, v, cloexec, nonblock, id, slot) < 0) {
		int e = errno;
		lock();
		if (fresh) {
			c->refs = -1;
			g_ndc--;
		}
		unlock();
		errno = e;
		return -1;
	}
	for (int i = 0; i < nregs; i++) {
		int ret;
		real.epoll_ctl(regs[i].epfd, EPOLL_CTL_DEL, fd, NULL);
		if (!d_epoll_ctl(regs[i].epfd, EPOLL_CTL_ADD, fd, &regs[i].ev, &ret) || ret < 0)
			dbg("fd %d: direct epoll re-add on %d: %s", fd, regs[i].epfd, strerror(errno));
	}
	return 0;
}

/* ---- data calls ---- */

static int dflags(int fd, int mflags)
{
	int f = DRING_TIMEO;
	if ((mflags & MSG_DONTWAIT) || (fdflags(fd) & F_NB))
		f |= DRING_NONBLOCK;
	if (mflags & MSG_PEEK)
		f |= DRING_PEEK;
	if (mflags & MSG_WAITALL)
		f |= DRING_WAITALL;
	if (mflags & MSG_TRUNC)
		f |= DRING_TRUNC;
	return f;
}

/* A send (send 1) or receive (send 0) on fd if it is direct: the count, -1
 * with errno, or NOT_DIRECT. A send takes only MSG_DONTWAIT of mflags. */
ssize_t d_io(int fd, const struct iovec *iov, int cnt, int mflags, int send)
{
	/* The flags loaded once: a conversion (upgrade.c) turns F_UPG into
	 * F_DIRECT in one store, and a second look could find neither and
	 * send the call to the real socket, which is V by then. */
	int f = fdflags(fd);
	if (f & F_UPG)
		return upg_io(fd, iov, cnt, mflags, send);
	struct dconn *c = (f & F_DIRECT) ? dcof(fd) : NULL;
	if (!c)
		return NOT_DIRECT;
	return d_ring_io(c, fd, iov, cnt, mflags, send);
}

/* d_io on connection c, mapped here (fd: the descriptor the call came
 * on, for its cached O_NONBLOCK). */
ssize_t d_ring_io(struct dconn *c, int fd, const struct iovec *iov, int cnt, int mflags, int send)
{
	if (mflags & MSG_OOB) {
		errno = send ? EOPNOTSUPP : EINVAL; /* TCP without urgent data */
		return -1;
	}
	int saved = errno;
	ssize_t r;
	if (send)
		r = dring_writev(&c->d, iov, cnt, dflags(fd, mflags & MSG_DONTWAIT));
	else
		r = dring_readv(&c->d, iov, cnt, dflags(fd, mflags));
	if (r == -DRING_RELAYED) {
		errno = saved;
		return NOT_DIRECT;
	}
	if (r < 0) {
		if (send && r == -EPIPE && !(mflags & MSG_NOSIGNAL))
			raise(SIGPIPE);
		errno = (int)-r;
		return -1;
	}
	errno = saved;
	return r;
}

EXPORT ssize_t read(int fd, void *buf, size_t n)
{
	INIT();
	struct iovec v = {buf, n};
	ssize_t r = d_recv(fd, &v, 1, 0);
	return r != NOT_DIRECT ? r : real.read(fd, buf, n);
}

EXPORT ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen)
{
	if (n > buflen)
		abort();
	return read(fd, buf, n);
}

EXPORT ssize_t write(int fd, const void *buf, size_t n)
{
	INIT();
	struct iovec v = {(void *)buf, n};
	ssize_t r = d_send(fd, &v, 1, 0);
	return r != NOT_DIRECT ? r : real.write(fd, buf, n);
}

EXPORT ssize_t readv(int fd, const struct iovec *iov, int cnt)
{
	INIT();
	ssize_t r = d_recv(fd, iov, cnt, 0);
	return r != NOT_DIRECT ? r : real.readv(fd, iov, cnt);
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
	INIT();
	ssize_t r = d_send(fd, iov, cnt, 0);
	return r != NOT_DIRECT ? r : real.writev(fd, iov, cnt);
}

EXPORT ssize_t recv(int fd, void *buf, size_t n, int flags)
{
	INIT();
	struct iovec v = {buf, n};
	ssize_t r = d_recv(fd, &v, 1, flags);
	return r != NOT_DIRECT ? r : real.recv(fd, buf, n, flags);
}

EXPORT ssize_t __recv_chk(int fd, void *buf, size_t n, size_t buflen, int flags)
{
	if (n > buflen)
		abort();
	return recv(fd, buf, n, flags);
}

EXPORT ssize_t send(int fd, const void *buf, size_t n, int flags)
{
	INIT();
	struct iovec v = {(void *)buf, n};
	ssize_t r = d_send(fd, &v, 1, flags);
	return r != NOT_DIRECT ? r : real.send(fd, buf, n, flags);
}

/* sendfile from a file into a direct descriptor: read and write through
 * a bounce buffer on the stack (the kernel would have copied too). */
static ssize_t d_sendfile(int out, int in, off_t *off, size_t n)
{
	char buf[16384];
	size_t done = 0;
	int saved = errno;
	while (done < n) {
		size_t k = n - done < sizeof buf ? n - done : sizeof buf;
		ssize_t r = off ? pread(in, buf, k, *off) : real.read(in, buf, k);
		if (r <= 0) {
			if (r < 0 && done == 0)
				return -1;
			break;
		}
		struct iovec v = {buf, (size_t)r};
		ssize_t w = d_send(out, &v, 1, done ? MSG_NOSIGNAL : 0);
		if (w == NOT_DIRECT) {
			errno = EIO;
			w = -1;
		}
		if (w > 0) {
			done += (size_t)w;
			if (off)
				*off += w;
			else if (w < r)
				lseek(in, (off_t)w - r, SEEK_CUR);
		}
		if (w < r) {
			if (w < 0 && done == 0)
				return -1;
			break;
		}
	}
	errno = saved;
	return (ssize_t)done;
}

/* sendfile on out: 1 and *r set if the shim made the call (upgrading,
 * on TCP: counted, so no move or conversion meets it), 0 if out takes
 * the bounce path (d_sendfile: direct, or moved onto its buffer), -1 if
 * out is a plain socket or relayed (the real call). The flags are
 * loaded once (upgrade.h, upg_wbegin). */
static int sendfile_route(int out)
{
	int f = fdflags(out);
	if (f & F_UPG) {
		struct dconn *c;
		if (upg_wbegin(out, &c) == UPG_W_TCP)
			return 1;
		return 0;
	}
	return (f & F_DIRECT) && dcof(out) ? 0 : -1;
}

EXPORT ssize_t sendfile(int out, int in, off_t *off, size_t n)
{
	INIT();
	int how = sendfile_route(out);
	if (how != 0) {
		ssize_t r = real.sendfile(out, in, off, n);
		if (how > 0)
			upg_wend(out);
		return r;
	}
	return d_sendfile(out, in, off, n);
}

/* What a program built with _FILE_OFFSET_BITS=64 calls (sys/sendfile.h
 * redirects sendfile there); the same on LP64. */
_Static_assert(sizeof(off64_t) == sizeof(off_t), "LP64: off64_t is off_t");
EXPORT ssize_t sendfile64(int out, int in, off64_t *off, size_t n)
{
	return sendfile(out, in, (off_t *)off, n);
}

/*
 * splice with a direct descriptor on one side and a pipe on the other:
 * through a bounce buffer, at most 64 KiB per call (a short splice is
 * legal). Into the ring: a call takes from the pipe only what the ring
 * has room for (a blocking one waits for room first, dring_wait_space),
 * so a failed call leaves the bytes in the pipe, as the kernel's does.
 * Out of the
 * ring: peek, write to the pipe (non-blocking: at most its free room),
 * then consume what it took.
 */
#define SPLICE_MAX 65536

/* splice's look at one side (w: written): the connection its bytes go
 * through (direct, or an upgrading side's buffer), or NULL: a plain
 * descriptor, or an upgrading one on TCP, then *tcp is 1 and the side
 * is counted in until upg_wend or upg_rend, so that no move or
 * conversion meets the call. The flags are loaded once (upgrade.h,
 * upg_wbegin). */
static struct dconn *splice_side(int fd, int w, int *tcp)
{
	int f = fdflags(fd);
	*tcp = 0;
	if (!(f & F_UPG))
		return (f & F_DIRECT) ? dcof(fd) : NULL;
	struct dconn *c;
	int k = w ? upg_wbegin(fd, &c) : upg_rbegin(fd, &c);
	if (k == UPG_W_RING)
		return c;
	*tcp = k == UPG_W_TCP;
	return k == UPG_W_DIRECT ? dcof(fd) : NULL;
}

EXPORT ssize_t splice(int in, loff_t *offin, int out, loff_t *offout, size_t len, unsigned int fl)
{
	INIT();
	int ti, to;
	struct dconn *co = splice_side(out, 1, &to), *ci = splice_side(in, 0, &ti);
	if (!ci && !co) {
		ssize_t r = real.splice(in, offin, out, offout, len, fl);
		if (to)
			upg_wend(out);
		if (ti)
			upg_rend(in);
		if (r != 0 || len == 0 || !ti || !(ci = upg_eof(in)))
			return r;
		/* The upgrade's boundary: converted (call again), or the
		 * buffer's bytes through the bounce path below (d_recv). */
		if (fdflags(in) & F_DIRECT)
			return splice(in, offin, out, offout, len, fl);
		ti = to = 0;
	}
	if (to)
		upg_wend(out); /* a socket on both sides: EINVAL below */
	if (ti)
		upg_rend(in);
	/* as the kernel (fs/splice.c): one side a pipe, else EINVAL; an
	 * offset on the pipe ESPIPE, on the socket EINVAL */
	struct stat st;
	if ((ci && co) || fstat(ci ? out : in, &st) < 0 || !S_ISFIFO(st.st_mode)) {
		errno = errno == EBADF ? EBADF : EINVAL;
		return -1;
	}
	if (offin || offout) {
		errno = (ci ? offout : offin) ? ESPIPE : EINVAL;
		return -1;
	}
	char buf[SPLICE_MAX];
	if (len > sizeof buf)
		len = sizeof buf;
	int nb = (fl & SPLICE_F_NONBLOCK) ? MSG_DONTWAIT : 0;
	int saved = errno;
	if (ci && nb) {
		/* no more than the pipe has room for: a short write would block */
		int used = 0, cap = real.fcntl(out, F_GETPIPE_SZ);
		if (cap > 0 && real.ioctl(out, FIONREAD, &used) == 0 && (size_t)(cap - used) < len)
			len = cap > used ? (size_t)(cap - used) : 0;
		if (len == 0) {
			errno = EAGAIN;
			return -1;
		}
	}
	if (co) {
		struct pollfd pp = {in, POLLIN, 0};
		if (nb && real.poll(&pp, 1, 0) == 0) {
			errno = EAGAIN; /* the pipe is empty */
			return -1;
		}
		/* Only what the ring has room for comes out of the pipe (a
		 * blocking call waits for room first): the kernel leaves in the
		 * pipe what a failed splice did not send, and a program may
		 * read it back. */
		long sp = dring_wait_space(&co->d, DRING_TIMEO | ((nb || (fdflags(out) & F_NB)) ? DRING_NONBLOCK : 0));
		if (sp == -DRING_RELAYED)
			sp = -EIO;
		if (sp < 0) {
			if (sp == -EPIPE)
				raise(SIGPIPE); /* as the kernel's splice into a socket */
			errno = (int)-sp;
			return -1;
		}
		if ((size_t)sp < len)
			len = (size_t)sp;
		ssize_t r = real.read(in, buf, len);
		if (r <= 0)
			return r;
		struct iovec v = {buf, (size_t)r};
		ssize_t w = d_send(out, &v, 1, nb);
		if (w == NOT_DIRECT) {
			errno = EIO;
			return -1;
		}
		if (w < r) /* a signal, SO_SNDTIMEO or a reset in a blocking splice */
			dbg("splice into fd %d: %zd bytes taken from pipe %d not written", out, r - (w > 0 ? w : 0), in);
		if (w >= 0)
			errno = saved;
		return w;
	}
	struct iovec v = {buf, len};
	ssize_t r = d_recv(in, &v, 1, MSG_PEEK | nb);
	if (r <= 0)
		return r == NOT_DIRECT ? (errno = EIO, -1) : r;
	ssize_t w = real.write(out, buf, (size_t)r);
	if (w <= 0)
		return w;
	struct iovec t = {NULL, (size_t)w};
	d_recv(in, &t, 1, MSG_TRUNC | MSG_DONTWAIT); /* consume what the pipe took */
	errno = saved;
	return w;
}

/* ---- control ---- */

static int d_ioctl(int fd, unsigned long req, void *arg, int *handled)
{
	struct dconn *c = dcof(fd);
	*handled = 0;
	if (!c)
		return 0;
	if (req == FIONREAD) {
		long n = dring_nread(&c->d);
		*handled = 1;
		if (n < 0) {
			errno = (int)-n;
			return -1;
		}
		*(int *)arg = n > INT32_MAX ? INT32_MAX : (int)n;
		return 0;
	}
	if (req == FIONBIO) {
		int on = arg && *(int *)arg;
		lock();
		if (on)
			ent(fd)->flags |= F_NB;
		else
			ent(fd)->flags &= ~F_NB;
		unlock();
	}
	return 0;
}

EXPORT int ioctl(int fd, unsigned long req, ...)
{
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	INIT();
	int handled;
	int r = d_ioctl(fd, req, arg, &handled);
	if (handled)
		return r;
	return real.ioctl(fd, req, arg);
}

EXPORT int shutdown(int fd, int how)
{
	INIT();
	struct dconn *c = dcof(fd);
	int ret;
	if (!c && upg_shutdown(fd, how, &ret))
		return ret;
	if (!c)
		c = dcof(fd); /* converted since the first look (upg_shutdown) */
	if (!c)
		return real.shutdown(fd, how);
	if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) {
		errno = EINVAL;
		return -1;
	}
	/* not the real shutdown: V stays open for exnd's liveness watch */
	if (how != SHUT_RD)
		dring_fin(&c->d);
	if (how != SHUT_WR)
		dring_shut_rd(&c->d);
	return 0;
}

/* O_NONBLOCK of a direct descriptor, cached for the data path. */
void direct_setfl(int fd, long fl)
{
	if (!(fdflags(fd) & F_DIRECT))
		return;
	lock();
	if (fl & O_NONBLOCK)
		ent(fd)->flags |= F_NB;
	else
		ent(fd)->flags &= ~F_NB;
	unlock();
}

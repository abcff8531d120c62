/*
 * direct.c: direct EXT-DS connections in the shim (docs/direct.md),
 * #included by libextds.c after the table, the control client and
 * do_switch; the buffer itself is shim/dring.c.
 *
 * State: g_dc, one record per direct connection mapped in this process
 * (the dring view, five hidden CLOEXEC descriptors placed high: V's dup,
 * my data and space bells, the peer's), shared by every descriptor of the dup family
 * (fdent.dc, counted in refs); the last descriptor's close unmaps it and
 * closes the hidden ones, so E hangs up exactly when the application's
 * last V closes. g_dep: epoll registrations of direct descriptors (each
 * with hidden dups of the two bells in that epoll set). Both are plain
 * memory, inherited by fork like the descriptors; changed under the
 * table lock, never held across a blocking call. The data path takes no
 * lock of the shim: dring.c serialises producers and consumers itself.
 *
 * A direct descriptor whose relay[S] is set is used as a plain kernel
 * socket (V): each call falls through to the real one.
 */
#include "dring.h"

#include <signal.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/sendfile.h>

#define DC_MAX 1024
#define DEP_MAX 1024
#define DEP_TAG 0xe8dd5a5e00000000ull /* epoll data of a bell registration: tag | record index */

struct dconn {
	int refs; /* descriptors of this process that refer to it; 0: free */
	uint64_t id;
	int relay_asked;
	struct dring d;
};

struct depreg {
	int epfd, fd, hbell[2]; /* fd < 0: free; dups of my data and space bell */
	struct epoll_event ev; /* the application's */
	int disabled;          /* EPOLLONESHOT fired */
	uint64_t last_in, last_out; /* EPOLLET: cursor state last reported */
};

static struct dconn g_dc[DC_MAX];
static struct depreg g_dep[DEP_MAX];
static int g_ndc, g_ndep;

static ssize_t (*real_read)(int, void *, size_t);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_readv)(int, const struct iovec *, int);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static ssize_t (*real_recv)(int, void *, size_t, int);
static ssize_t (*real_send)(int, const void *, size_t, int);
static ssize_t (*real_sendfile)(int, int, off_t *, size_t);
static ssize_t (*real_sendfile64)(int, int, off64_t *, size_t);
static ssize_t (*real_splice)(int, loff_t *, int, loff_t *, size_t, unsigned int);
static int (*real_ioctl)(int, unsigned long, ...);
static int (*real_shutdown)(int, int);
static int (*real_poll)(struct pollfd *, nfds_t, int);
static int (*real_ppoll)(struct pollfd *, nfds_t, const struct timespec *, const sigset_t *);
static int (*real_select)(int, fd_set *, fd_set *, fd_set *, struct timeval *);
static int (*real_pselect)(int, fd_set *, fd_set *, fd_set *, const struct timespec *, const sigset_t *);
static int (*real_epoll_pwait2)(int, struct epoll_event *, int, const struct timespec *, const sigset_t *);
static int (*real_execve)(const char *, char *const[], char *const[]);
static int (*real_execv)(const char *, char *const[]);
static int (*real_execvp)(const char *, char *const[]);
static int (*real_execvpe)(const char *, char *const[], char *const[]);
static int (*real_fexecve)(int, char *const[], char *const[]);

static void direct_init(void)
{
	for (int i = 0; i < DEP_MAX; i++)
		g_dep[i].fd = -1;
}

static void direct_resolve(void)
{
	RESOLVE(read);
	RESOLVE(write);
	RESOLVE(readv);
	RESOLVE(writev);
	RESOLVE(recv);
	RESOLVE(send);
	RESOLVE(sendfile);
	RESOLVE(sendfile64);
	RESOLVE(splice);
	RESOLVE(ioctl);
	RESOLVE(shutdown);
	RESOLVE(poll);
	RESOLVE(ppoll);
	RESOLVE(select);
	RESOLVE(pselect);
	RESOLVE(epoll_pwait2);
	RESOLVE(execve);
	RESOLVE(execv);
	RESOLVE(execvp);
	RESOLVE(execvpe);
	RESOLVE(fexecve);
}

/* The live, not relayed connection of fd, or NULL. */
static inline struct dconn *dcof(int fd)
{
	if (!(fdflags(fd) & F_DIRECT))
		return NULL;
	struct dconn *c = &g_dc[ent(fd)->dc - 1];
	if (c->refs <= 0 || dring_relayed(&c->d))
		return NULL;
	return c;
}

/* Move fd to a high CLOEXEC number (out of the application's way); keep: dup, else move. */
static int hide_fd(int fd, int keep)
{
	static int lo;
	if (!lo) {
		struct rlimit rl;
		lo = 512;
		if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur > 1024)
			lo = (int)(rl.rlim_cur / 2 > 65536 ? 65536 : rl.rlim_cur / 2);
	}
	int h = real_fcntl(fd, F_DUPFD_CLOEXEC, lo);
	if (h < 0)
		h = real_fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (h >= 0 && !keep)
		real_close(fd);
	return h;
}

static void dep_free_locked(int i)
{
	struct depreg *r = &g_dep[i];
	for (int k = 0; k < 2; k++) {
		real_epoll_ctl(r->epfd, EPOLL_CTL_DEL, r->hbell[k], NULL);
		real_close(r->hbell[k]);
	}
	r->fd = -1;
	g_ndep--;
}

/* fd's entry is being cleared (close, reuse): drop its epoll records and its reference. */
static void direct_drop_locked(int fd, struct fdent *e)
{
	for (int i = 0; i < DEP_MAX && g_ndep > 0; i++)
		if (g_dep[i].fd == fd) {
			real_epoll_ctl(g_dep[i].epfd, EPOLL_CTL_DEL, fd, NULL); /* the hidden V keeps the file open */
			dep_free_locked(i);
		}
	struct dconn *c = &g_dc[e->dc - 1];
	if (--c->refs > 0)
		return;
	dring_detach(&c->d);
	real_close(c->d.v);
	real_close(c->d.dbell);
	real_close(c->d.sbell);
	real_close(c->d.peer_dbell);
	real_close(c->d.peer_sbell);
	memset(c, 0, sizeof *c);
	g_ndc--;
}

static void direct_epfd_closed_locked(int epfd)
{
	for (int i = 0; i < DEP_MAX && g_ndep > 0; i++)
		if (g_dep[i].fd >= 0 && g_dep[i].epfd == epfd)
			dep_free_locked(i);
}

static void direct_ref_locked(struct fdent *e) { g_dc[e->dc - 1].refs++; }

/*
 * Switch fd to exnd's answer r with descriptors ufd (docs/direct.md):
 * relay (one socketpair end) or direct (V, buffer, my data bell, my space
 * bell, peer data bell, peer space bell). Consumes ufd. 0, or -1 with
 * errno (fd untouched).
 */
static int d_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev, int *ret);

static int switch_to(int fd, const struct ctl_resp *r, int *ufd, int cloexec, int nonblock)
{
	if (r->mode != CTL_MODE_DIRECT) {
		int v = ufd[0];
		ufd[0] = -1;
		close_fds(ufd);
		return do_switch(fd, v, cloexec, nonblock, r->id);
	}
	int bad = r->side > 1 || r->ring > EXDD_RING_MAX || !ent(fd);
	for (int i = 1; i < 6; i++)
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
	int hv = hide_fd(ufd[0], 1), hb[4], e = hv < 0 ? EMFILE : 0;
	for (int i = 0; i < 4; i++) {
		hb[i] = hide_fd(ufd[2 + i], 0);
		if (hb[i] < 0)
			e = EMFILE;
		else
			ufd[2 + i] = -1;
	}
	if (!e) {
		int a = dring_attach(&c->d, ufd[1], (int)r->side, (uint32_t)r->ring, hb, hv);
		e = a < 0 ? -a : 0;
	} else {
		real_close(ufd[1]);
	}
	ufd[1] = -1;
	/* Registrations made on the TCP socket before the switch (a
	 * non-blocking connect waited for EPOLLOUT): do_switch moves them to
	 * V as they were; below they become direct registrations. */
	struct epreg regs[16];
	int nregs = 0;
	lock();
	struct fdent *pe = ent(fd);
	if (pe && pe->nreg > 0)
		for (int i = 0; i < EP_POOL && nregs < 16; i++)
			if (g_ep[i].fd == fd)
				regs[nregs++] = g_ep[i];
	unlock();
	if (!e) {
		int v = ufd[0];
		ufd[0] = -1;
		if (do_switch(fd, v, cloexec, nonblock, r->id) < 0) {
			e = errno;
			dring_detach(&c->d);
		}
	}
	if (e) {
		close_fds(ufd);
		if (hv >= 0)
			real_close(hv);
		for (int i = 0; i < 4; i++)
			if (hb[i] >= 0)
				real_close(hb[i]);
		lock();
		memset(c, 0, sizeof *c);
		unlock();
		errno = e;
		return -1;
	}
	lock();
	c->id = r->id;
	c->refs = 1;
	g_ndc++;
	struct fdent *en = ent(fd);
	en->flags |= F_DIRECT | (nonblock ? F_NB : 0);
	en->dc = slot + 1;
	unlock();
	for (int i = 0; i < nregs; i++) {
		int ret;
		real_epoll_ctl(regs[i].epfd, EPOLL_CTL_DEL, fd, NULL);
		if (!d_epoll_ctl(regs[i].epfd, EPOLL_CTL_ADD, fd, &regs[i].ev, &ret) || ret < 0)
			dbg("fd %d: direct epoll re-add on %d: %s", fd, regs[i].epfd, strerror(errno));
	}
	return 0;
}

/* ---- data calls ---- */

#define NOT_DIRECT (-2)

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
static ssize_t d_io(int fd, const struct iovec *iov, int cnt, int mflags, int send)
{
	struct dconn *c = dcof(fd);
	if (!c)
		return NOT_DIRECT;
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

static ssize_t d_recv(int fd, const struct iovec *iov, int cnt, int mflags) { return d_io(fd, iov, cnt, mflags, 0); }

static ssize_t d_send(int fd, const struct iovec *iov, int cnt, int mflags) { return d_io(fd, iov, cnt, mflags, 1); }

EXPORT ssize_t read(int fd, void *buf, size_t n)
{
	INIT();
	struct iovec v = {buf, n};
	ssize_t r = d_recv(fd, &v, 1, 0);
	return r != NOT_DIRECT ? r : real_read(fd, buf, n);
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
	return r != NOT_DIRECT ? r : real_write(fd, buf, n);
}

EXPORT ssize_t readv(int fd, const struct iovec *iov, int cnt)
{
	INIT();
	ssize_t r = d_recv(fd, iov, cnt, 0);
	return r != NOT_DIRECT ? r : real_readv(fd, iov, cnt);
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
	INIT();
	ssize_t r = d_send(fd, iov, cnt, 0);
	return r != NOT_DIRECT ? r : real_writev(fd, iov, cnt);
}

EXPORT ssize_t recv(int fd, void *buf, size_t n, int flags)
{
	INIT();
	struct iovec v = {buf, n};
	ssize_t r = d_recv(fd, &v, 1, flags);
	return r != NOT_DIRECT ? r : real_recv(fd, buf, n, flags);
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
	return r != NOT_DIRECT ? r : real_send(fd, buf, n, flags);
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
		ssize_t r = off ? pread(in, buf, k, *off) : real_read(in, buf, k);
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

EXPORT ssize_t sendfile(int out, int in, off_t *off, size_t n)
{
	INIT();
	if (!dcof(out))
		return real_sendfile(out, in, off, n);
	return d_sendfile(out, in, off, n);
}

/* What a program built with _FILE_OFFSET_BITS=64 calls (sys/sendfile.h
 * redirects sendfile there); the same on LP64. */
_Static_assert(sizeof(off64_t) == sizeof(off_t), "LP64: off64_t is off_t");
EXPORT ssize_t sendfile64(int out, int in, off64_t *off, size_t n)
{
	INIT();
	if (!dcof(out))
		return real_sendfile64(out, in, off, n);
	return d_sendfile(out, in, (off_t *)off, n);
}

/*
 * splice with a direct descriptor on one side and a pipe on the other:
 * through a bounce buffer, at most 64 KiB per call (a short splice is
 * legal). Into the ring: a non-blocking call takes from the pipe only
 * what the ring has room for, so nothing read is dropped. Out of the
 * ring: peek, write to the pipe (non-blocking: at most its free room),
 * then consume what it took.
 */
#define SPLICE_MAX 65536
EXPORT ssize_t splice(int in, loff_t *offin, int out, loff_t *offout, size_t len, unsigned int fl)
{
	INIT();
	struct dconn *ci = dcof(in), *co = dcof(out);
	if (!ci && !co)
		return real_splice(in, offin, out, offout, len, fl);
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
		int used = 0, cap = real_fcntl(out, F_GETPIPE_SZ);
		if (cap > 0 && real_ioctl(out, FIONREAD, &used) == 0 && (size_t)(cap - used) < len)
			len = cap > used ? (size_t)(cap - used) : 0;
		if (len == 0) {
			errno = EAGAIN;
			return -1;
		}
	}
	if (co) {
		struct pollfd pp = {in, POLLIN, 0};
		if (nb && real_poll(&pp, 1, 0) == 0) {
			errno = EAGAIN; /* the pipe is empty */
			return -1;
		}
		if (nb || (fdflags(out) & F_NB)) {
			long sp = dring_space(&co->d);
			if (sp < 0) {
				errno = (int)-sp;
				return -1;
			}
			if (sp == 0) {
				errno = EAGAIN;
				return -1;
			}
			if ((size_t)sp < len)
				len = (size_t)sp;
		}
		ssize_t r = real_read(in, buf, len);
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
	ssize_t w = real_write(out, buf, (size_t)r);
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
	return real_ioctl(fd, req, arg);
}

EXPORT int shutdown(int fd, int how)
{
	INIT();
	struct dconn *c = dcof(fd);
	if (!c)
		return real_shutdown(fd, how);
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
static void direct_setfl(int fd, long fl)
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
				if (real_ppoll(k, n, &zero, mask) != 0)
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
		return real_ppoll(fds, n, tmo, mask);
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
		int r = real_ppoll(k, (nfds_t)j, lp, mask);
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
		return real_poll(fds, n, timeout);
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
		return real_ppoll(fds, n, tmo, mask);
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
	return handled ? ret : real_select(nfds, r, w, x, tv);
}

EXPORT int pselect(int nfds, fd_set *r, fd_set *w, fd_set *x, const struct timespec *tmo, const sigset_t *mask)
{
	INIT();
	int handled;
	int ret = d_select(nfds, r, w, x, tmo, mask, &handled);
	return handled ? ret : real_pselect(nfds, r, w, x, tmo, mask);
}

/* ---- epoll ---- */

/* epoll_ctl on a direct descriptor: V registered with the application's
 * data (it only ever shows the relay or exnd's death), and a hidden dup
 * of the bell with our record. 1 handled (ret in *ret), 0 not direct. */
static int d_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev, int *ret)
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
		if (real_epoll_ctl(epfd, op, fd, &vev) < 0) {
			unlock();
			return 1;
		}
		int hb[2] = {hide_fd(c->d.dbell, 1), hide_fd(c->d.sbell, 1)}, k;
		struct epoll_event bev = {EPOLLIN | (ev->events & EPOLLEXCLUSIVE), {.u64 = DEP_TAG | (uint64_t)slot}};
		for (k = 0; k < 2; k++)
			if (hb[k] < 0 || real_epoll_ctl(epfd, EPOLL_CTL_ADD, hb[k], &bev) < 0)
				break;
		if (k < 2) {
			int e = errno;
			for (int q = 0; q < 2; q++) {
				if (q < k)
					real_epoll_ctl(epfd, EPOLL_CTL_DEL, hb[q], NULL);
				if (hb[q] >= 0)
					real_close(hb[q]);
			}
			real_epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL);
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
		if ((*ret = real_epoll_ctl(epfd, op, fd, &vev)) == 0) {
			g_dep[slot].ev = *ev;
			g_dep[slot].disabled = 0;
			g_dep[slot].last_in = g_dep[slot].last_out = ~0ull;
		}
	} else if (op == EPOLL_CTL_DEL) {
		real_epoll_ctl(epfd, op, fd, NULL);
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
			int r = n < max ? real_epoll_pwait2(epfd, evs + n, max - n, &zero, mask) : 0;
			return r > 0 ? dep_filter(epfd, evs, n, n + r) : n;
		}
		if (it % SPIN_KERNEL_EVERY == 0) {
			int r = real_epoll_pwait2(epfd, evs, max, &zero, mask);
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
		return real_epoll_pwait2(epfd, evs, max, tmo, mask);
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
		int r = real_epoll_pwait2(epfd, evs + n, max - n, lp, mask);
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

/* ---- exec: hand inherited direct descriptors to exnd (shim-relay) ---- */

static void before_exec(void)
{
	if (!g_ndc || !g_tab)
		return;
	int saved = errno;
	for (int fd = 0; fd < g_ntab; fd++) {
		struct dconn *c = dcof(fd);
		if (!c || c->relay_asked)
			continue;
		int fl = real_fcntl(fd, F_GETFD);
		if (fl < 0 || (fl & FD_CLOEXEC))
			continue;
		char buf[512];
		struct ctl_resp resp;
		int ufd[CTL_MAXFD];
		int r = ctl_call(CTL_OP_RELAY, 0, fd, buf, sizeof buf, &resp, ufd);
		close_fds(ufd);
		c->relay_asked = 1;
		if (r == CTL_OK)
			dbg("exec: fd %d (id %llu) relayed by exnd from now on", fd, (unsigned long long)c->id);
		else
			dbg("exec: fd %d (id %llu): exnd did not take the relay (%s); the new program cannot use it", fd,
			    (unsigned long long)c->id, r == CTL_NOCONN ? "no exnd" : buf);
	}
	errno = saved;
}

EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	INIT();
	before_exec();
	return real_execve(path, argv, envp);
}

EXPORT int execv(const char *path, char *const argv[])
{
	INIT();
	before_exec();
	return real_execv(path, argv);
}

EXPORT int execvp(const char *file, char *const argv[])
{
	INIT();
	before_exec();
	return real_execvp(file, argv);
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	INIT();
	before_exec();
	return real_execvpe(file, argv, envp);
}

EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	INIT();
	before_exec();
	return real_fexecve(fd, argv, envp);
}

#define EXECL_MAX 4096

/* The execl family: argv from the variadic list ap (for execle, envp
 * after its NULL), then the v form: execv (kind 'l'), execvp ('p') or
 * execve ('e'). -1 with E2BIG for more than EXECL_MAX arguments. */
static int execl_va(const char *file, const char *arg, va_list ap, char kind)
{
	char *argv[EXECL_MAX];
	int n;
	argv[0] = (char *)arg;
	for (n = 1; argv[n - 1] && n < EXECL_MAX; n++)
		argv[n] = va_arg(ap, char *);
	if (argv[n - 1]) {
		errno = E2BIG;
		return -1;
	}
	if (kind == 'e')
		return execve(file, argv, va_arg(ap, char *const *));
	if (kind == 'p')
		return execvp(file, argv);
	return execv(file, argv);
}

/* execl, execlp and execle differ only in kind; C cannot pass a variadic
 * list on, so each hands execl_va a va_list. */
#define EXECL_WRAPPER(name, kind)                                                                                      \
	EXPORT int name(const char *file, const char *arg, ...)                                                        \
	{                                                                                                              \
		va_list ap;                                                                                            \
		va_start(ap, arg);                                                                                     \
		int r = execl_va(file, arg, ap, kind);                                                                 \
		va_end(ap);                                                                                            \
		return r;                                                                                              \
	}

EXECL_WRAPPER(execl, 'l')
EXECL_WRAPPER(execlp, 'p')
EXECL_WRAPPER(execle, 'e')

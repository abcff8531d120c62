/*
 * libextds.so: LD_PRELOAD socket switch for EXT-DS (docs/shim.md).
 *
 * Unmodified dynamically linked programs get EXT-DS for their TCP
 * connections between fabric peers. The shim lets the kernel set up every
 * connection as plain TCP (over exn0), then hands the connected socket to
 * exnd over its control socket (shim-connect / shim-accept, SCM_RIGHTS).
 * When exnd answers "extds" it returns an AF_UNIX stream socket that it
 * splices onto an EXT-DS connection, and the shim dup3()s it over the
 * application's descriptor, keeping its number and flags. Every
 * descriptor the application sees is therefore a real kernel socket:
 * read/write/poll/select/epoll/fork/exec/shutdown stay in the kernel and
 * are not intercepted. When exnd answers "tcp" (peer not on the fabric,
 * unshimmed listener, plain client) the TCP socket is used as is.
 *
 * Intercepted: socket, connect, listen, accept, accept4, close, dup, dup2,
 * dup3, fcntl (F_DUPFD*), epoll_ctl, getsockname, getpeername,
 * getsockopt, setsockopt, sendto, sendmsg, recvfrom, recvmsg.
 *
 * State: one fixed table indexed by fd (mmap'd at load time, no malloc
 * anywhere in intercepted paths), guarded by one spinlock held only for
 * short copies (never across a blocking call). Plain memory, so a forked
 * child inherits it as it inherits the descriptors. errno is preserved
 * on every path that does not itself fail.
 *
 * Environment: EXTDS_CONTROL (default /run/exn/exnd.sock),
 * EXTDS_MODE=off|auto|force (default auto), EXTDS_DIRECT=0 (relay, do not
 * ask for direct connections), EXTDS_DEBUG=1.
 *
 * One translation unit with dring.c beside it: this file holds the
 * table, init, the control client and the switch, and #includes
 * ctlparse.c, direct.c, direct_poll.c, direct_exec.c, hold.c, then the
 * intercepted calls, calls.c and sockcalls.c.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- real functions ---- */

static int (*real_socket)(int, int, int);
static int (*real_connect)(int, const struct sockaddr *, socklen_t);
static int (*real_listen)(int, int);
static int (*real_accept)(int, struct sockaddr *, socklen_t *);
static int (*real_accept4)(int, struct sockaddr *, socklen_t *, int);
static int (*real_close)(int);
static int (*real_dup)(int);
static int (*real_dup2)(int, int);
static int (*real_dup3)(int, int, int);
static int (*real_fcntl)(int, int, ...);
static int (*real_fcntl64)(int, int, ...);
static int (*real_epoll_ctl)(int, int, int, struct epoll_event *);
static int (*real_getsockname)(int, struct sockaddr *, socklen_t *);
static int (*real_getpeername)(int, struct sockaddr *, socklen_t *);
static int (*real_getsockopt)(int, int, int, void *, socklen_t *);
static int (*real_setsockopt)(int, int, int, const void *, socklen_t);
static ssize_t (*real_sendto)(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
static ssize_t (*real_sendmsg)(int, const struct msghdr *, int);
static ssize_t (*real_recvfrom)(int, void *, size_t, int, struct sockaddr *, socklen_t *);
static ssize_t (*real_recvmsg)(int, struct msghdr *, int);

/* ---- configuration ---- */

enum { MODE_OFF, MODE_AUTO, MODE_FORCE };

static int g_mode = MODE_AUTO;
static int g_debug;
static int g_direct = 1; /* ask exnd for direct connections (EXTDS_DIRECT=0: relay) */
static char g_ctl_path[sizeof(((struct sockaddr_un *)0)->sun_path)] = "/run/exn/exnd.sock";
static volatile int g_ready;   /* init done */
static volatile int g_hello;   /* 0 unknown, 1 exnd speaks shim v2, -1 it does not */

/* Shim protocol version (docs/shim.md "Control protocol"): 2 names no PID
 * (exnd asks the kernel, SO_PEERCRED), shim-listen carries the listening
 * socket, and accepts are claimed out of band before a client writes.
 * ctlparse.c encodes the requests and decodes the responses. */
#include "ctlparse.c"

/* ---- fd table ---- */

#define MAX_FDS (1 << 16)
#define EP_POOL 1024

enum {
	F_TRACKED = 1 << 0,  /* AF_INET/AF_INET6 SOCK_STREAM socket */
	F_LISTEN = 1 << 1,   /* registered with exnd by shim-listen */
	F_SWITCHED = 1 << 2, /* the fd is now exnd's AF_UNIX end */
	F_EPOVF = 1 << 3,    /* an epoll registration did not fit the pool */
	F_NODELAY = 1 << 4,
	F_CORK = 1 << 5,
	F_KEEPALIVE = 1 << 6,
	F_DIRECT = 1 << 7,   /* direct connection (docs/direct.md): fdent.dc */
	F_NB = 1 << 8,       /* F_DIRECT: O_NONBLOCK, cached for the data path */
};

union addr {
	struct sockaddr sa;
	struct sockaddr_in in;
	struct sockaddr_in6 in6;
};

struct fdent {
	uint16_t flags;
	uint16_t family;
	uint16_t port;      /* F_LISTEN: the port told to exnd */
	int32_t owner;      /* F_LISTEN: pid that told exnd */
	uint32_t lid;       /* F_LISTEN: listener identity, shared by dups */
	int32_t nreg;       /* epoll records for this fd */
	uint64_t ino, dev;  /* F_SWITCHED: identity of the unix socket */
	uint64_t id;        /* F_SWITCHED: exnd's connection id */
	int32_t dc;         /* F_DIRECT: index + 1 in direct.c's g_dc */
	int32_t maxseg, tos;
	uint64_t hold_until; /* F_LISTEN: accepts stay plain TCP until then (CLOCK_MONOTONIC ns; hold.c) */
	union addr local, peer;
	socklen_t llen, plen;
};

struct epreg {
	int epfd, fd; /* fd < 0: free */
	struct epoll_event ev;
};

static struct fdent *g_tab;
static int g_ntab;
static struct epreg g_ep[EP_POOL];
static int g_nep; /* records in use */
static uint32_t g_lid;
static volatile int g_lock;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ volatile("yield");
#endif
}

static void lock(void)
{
	while (__atomic_exchange_n(&g_lock, 1, __ATOMIC_ACQUIRE)) {
		while (__atomic_load_n(&g_lock, __ATOMIC_RELAXED))
			cpu_relax();
	}
}

static void unlock(void) { __atomic_store_n(&g_lock, 0, __ATOMIC_RELEASE); }

static inline struct fdent *ent(int fd)
{
	if (!g_tab || fd < 0 || fd >= g_ntab)
		return NULL;
	return &g_tab[fd];
}

/* Flags of fd without the lock (a single aligned load). */
static inline int fdflags(int fd)
{
	struct fdent *e = ent(fd);
	return e ? __atomic_load_n(&e->flags, __ATOMIC_RELAXED) : 0;
}

/* direct.c */
static void direct_drop_locked(int fd, struct fdent *e);
static void direct_epfd_closed_locked(int epfd);
static void direct_ref_locked(struct fdent *e);
static void direct_resolve(void);
static void direct_init(void);
static void direct_setfl(int fd, long fl);

/* ---- debug ---- */

static void dbg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void dbg(const char *fmt, ...)
{
	if (!g_debug)
		return;
	int saved = errno;
	char buf[512];
	int n = snprintf(buf, sizeof buf, "extds[%d]: ", (int)getpid());
	va_list ap;
	va_start(ap, fmt);
	n += vsnprintf(buf + n, sizeof buf - n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof buf - 2)
		n = sizeof buf - 2;
	buf[n++] = '\n';
	ssize_t w = write(2, buf, n);
	(void)w;
	errno = saved;
}

/* ---- init ---- */

#define RESOLVE(name) real_##name = dlsym(RTLD_NEXT, #name)

static void resolve(void)
{
	RESOLVE(socket);
	RESOLVE(connect);
	RESOLVE(listen);
	RESOLVE(accept);
	RESOLVE(accept4);
	RESOLVE(close);
	RESOLVE(dup);
	RESOLVE(dup2);
	RESOLVE(dup3);
	RESOLVE(fcntl);
	RESOLVE(fcntl64);
	if (!real_fcntl64)
		real_fcntl64 = real_fcntl;
	RESOLVE(epoll_ctl);
	RESOLVE(getsockname);
	RESOLVE(getpeername);
	RESOLVE(getsockopt);
	RESOLVE(setsockopt);
	RESOLVE(sendto);
	RESOLVE(sendmsg);
	RESOLVE(recvfrom);
	RESOLVE(recvmsg);
	direct_resolve();
}

static void init(void)
{
	if (__atomic_load_n(&g_ready, __ATOMIC_ACQUIRE))
		return;
	lock();
	if (g_ready) {
		unlock();
		return;
	}
	int saved = errno;
	resolve();
	const char *m = getenv("EXTDS_MODE");
	if (m && (!strcmp(m, "off") || !strcmp(m, "0")))
		g_mode = MODE_OFF;
	else if (m && !strcmp(m, "force"))
		g_mode = MODE_FORCE;
	const char *dr = getenv("EXTDS_DIRECT");
	g_direct = !(dr && !strcmp(dr, "0"));
	const char *d = getenv("EXTDS_DEBUG");
	g_debug = d && *d && strcmp(d, "0");
	const char *p = getenv("EXTDS_CONTROL");
	if (p && *p && strlen(p) < sizeof g_ctl_path)
		strcpy(g_ctl_path, p);
	if (g_mode != MODE_OFF) {
		struct rlimit rl;
		long n = 1024;
		if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
			n = rl.rlim_cur == RLIM_INFINITY ? MAX_FDS : (long)rl.rlim_cur;
		if (n > MAX_FDS)
			n = MAX_FDS;
		if (n < 1024)
			n = 1024;
		void *t = mmap(NULL, (size_t)n * sizeof(struct fdent), PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (t != MAP_FAILED) {
			g_tab = t;
			g_ntab = (int)n;
		}
		for (int i = 0; i < EP_POOL; i++)
			g_ep[i].fd = -1;
		direct_init();
	}
	__atomic_store_n(&g_ready, 1, __ATOMIC_RELEASE);
	unlock();
	dbg("loaded: mode=%s control=%s fds=%d", g_mode == MODE_OFF ? "off" : g_mode == MODE_FORCE ? "force" : "auto",
	    g_ctl_path, g_ntab);
	errno = saved;
}

/* A child forked while another thread held the lock would deadlock on
 * it: fork takes the lock, so the table is consistent in both. */
static void atfork_prepare(void) { if (g_ready) lock(); }
static void atfork_release(void) { if (g_ready) unlock(); }

__attribute__((constructor)) static void ctor(void)
{
	init();
	pthread_atfork(atfork_prepare, atfork_release, atfork_release);
}

#define INIT() do { if (__builtin_expect(!g_ready, 0)) init(); } while (0)

/* ---- table helpers (call with the lock held) ---- */

static void ep_drop_fd_locked(int fd)
{
	struct fdent *e = ent(fd);
	if (e && e->nreg == 0)
		return;
	for (int i = 0; i < EP_POOL && g_nep > 0; i++) {
		if (g_ep[i].fd == fd) {
			g_ep[i].fd = -1;
			g_nep--;
		}
	}
	if (e)
		e->nreg = 0;
}

static void ep_drop_epfd_locked(int epfd)
{
	for (int i = 0; i < EP_POOL && g_nep > 0; i++) {
		if (g_ep[i].fd >= 0 && g_ep[i].epfd == epfd) {
			struct fdent *e = ent(g_ep[i].fd);
			if (e && e->nreg > 0)
				e->nreg--;
			g_ep[i].fd = -1;
			g_nep--;
		}
	}
}

static void clear_locked(int fd)
{
	struct fdent *e = ent(fd);
	if (!e)
		return;
	ep_drop_fd_locked(fd);
	if (e->flags & F_DIRECT)
		direct_drop_locked(fd, e);
	memset(e, 0, sizeof *e);
}

static int is_loopback(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *s = (const void *)sa;
		return (ntohl(s->sin_addr.s_addr) >> 24) == 127;
	}
	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s = (const void *)sa;
		if (IN6_IS_ADDR_LOOPBACK(&s->sin6_addr))
			return 1;
		if (IN6_IS_ADDR_V4MAPPED(&s->sin6_addr))
			return s->sin6_addr.s6_addr[12] == 127;
	}
	return 0;
}

/* Whether fd is a TCP socket (checked with the kernel, not the table). */
static int is_tcp(int fd, int *family)
{
	int v = 0;
	socklen_t l = sizeof v;
	if (real_getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &l) < 0 || (v != AF_INET && v != AF_INET6))
		return 0;
	if (family)
		*family = v;
	l = sizeof v;
	if (real_getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &l) < 0 || v != SOCK_STREAM)
		return 0;
	l = sizeof v;
	if (real_getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &v, &l) < 0 || v != IPPROTO_TCP)
		return 0;
	return 1;
}

/*
 * The switched entry of fd, checked against the descriptor's identity:
 * a descriptor closed behind the shim's back (fclose, raw syscalls) and
 * reused must not keep a stale switched state. Copies the entry into out.
 */
static int switched(int fd, struct fdent *out)
{
	if (!(fdflags(fd) & F_SWITCHED))
		return 0;
	struct stat st;
	if (fstat(fd, &st) < 0)
		return 0;
	lock();
	struct fdent *e = ent(fd);
	int ok = (e->flags & F_SWITCHED) && e->ino == (uint64_t)st.st_ino && e->dev == (uint64_t)st.st_dev;
	if (ok && out)
		*out = *e;
	if (!ok && (e->flags & F_SWITCHED))
		clear_locked(fd);
	unlock();
	return ok;
}

/* ---- control socket ---- */

#define CTL_TIMEOUT_S 10

static void now_ts(struct timespec *t) { clock_gettime(CLOCK_MONOTONIC, t); }

static long ms_since(const struct timespec *t0)
{
	struct timespec t;
	now_ts(&t);
	return (t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
}

static int ctl_open(void)
{
	int s = real_socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -1;
	struct sockaddr_un a;
	memset(&a, 0, sizeof a);
	a.sun_family = AF_UNIX;
	strcpy(a.sun_path, g_ctl_path);
	struct timeval tv = {CTL_TIMEOUT_S, 0};
	real_setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	real_setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	int r;
	do
		r = real_connect(s, (struct sockaddr *)&a, sizeof a);
	while (r < 0 && errno == EINTR);
	if (r < 0) {
		real_close(s);
		return -1;
	}
	return s;
}

/* Send one request line with an optional fd. 0 or -1. */
static int ctl_send(int s, const char *line, int fd)
{
	struct iovec iov = {(void *)line, strlen(line)};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (fd >= 0) {
		memset(&u, 0, sizeof u);
		mh.msg_control = u.buf;
		mh.msg_controllen = sizeof u.buf;
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	while (iov.iov_len > 0) {
		ssize_t n = real_sendmsg(s, &mh, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		iov.iov_base = (char *)iov.iov_base + n;
		iov.iov_len -= (size_t)n;
		mh.msg_control = NULL;
		mh.msg_controllen = 0;
	}
	return 0;
}

#define CTL_MAXFD 8 /* control.MaxFDs; a direct answer has 6 (docs/direct.md) */

static void close_fds(int *fds)
{
	for (int i = 0; i < CTL_MAXFD; i++)
		if (fds[i] >= 0) {
			real_close(fds[i]);
			fds[i] = -1;
		}
}

/*
 * Read one response line into buf (NUL-terminated, without '\n') and the
 * descriptors that came with it, in order, into rfd[0..CTL_MAXFD) (-1
 * where none; more are closed). 0 or -1.
 */
static int ctl_recv(int s, char *buf, size_t size, size_t *linelen, int *rfd)
{
	size_t len = 0;
	int nfd = 0;
	for (int i = 0; i < CTL_MAXFD; i++)
		rfd[i] = -1;
	for (;;) {
		struct iovec iov = {buf + len, size - 1 - len};
		union {
			char b[CMSG_SPACE(16 * sizeof(int))];
			struct cmsghdr align;
		} u;
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof u.b};
		ssize_t n = real_recvmsg(s, &mh, MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		if (n >= 0) {
			for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
				if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
					continue;
				int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
				for (int i = 0; i < k; i++) {
					int f;
					memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
					if (nfd < CTL_MAXFD)
						rfd[nfd++] = f;
					else
						real_close(f);
				}
			}
		}
		if (n <= 0)
			goto fail;
		len += (size_t)n;
		char *nl = memchr(buf, '\n', len);
		if (nl) {
			*nl = 0;
			*linelen = (size_t)(nl - buf);
			return 0;
		}
		if (len >= size - 1)
			goto fail;
	}
fail:
	close_fds(rfd);
	return -1;
}

enum { CTL_NOCONN = -2, CTL_BROKEN = -1, CTL_OK = 0, CTL_REFUSED = 1 };

/*
 * Response decoding: ctl_parse (ctlparse.c), strict, fuzzed against Go's
 * encoding/json by shim/check (FuzzCtlParse). A line it does not accept
 * counts as a broken control connection.
 */

/*
 * One request: a fresh connection (no descriptor of ours lives on in the
 * application's fd space, threads and forked children need no care),
 * the one-time hello, then the request op (arg: its port, for
 * shim-unlisten). Returns CTL_OK (ok:true, *r decoded, buf holds the
 * line), CTL_REFUSED (ok:false), CTL_NOCONN (nothing was sent: no exnd,
 * or it does not speak the shim protocol) or CTL_BROKEN (the request may
 * have reached exnd but no answer, or no answer ctl_parse accepts, came).
 */
static int ctl_call(enum ctl_op op, unsigned arg, int fd, char *buf, size_t size, struct ctl_resp *r, int *rfd)
{
	char line[64];
	size_t n;
	for (int i = 0; i < CTL_MAXFD; i++)
		rfd[i] = -1;
	memset(r, 0, sizeof *r);
	if (ctl_req(line, sizeof line, op, arg) < 0)
		return CTL_NOCONN;
	if (g_hello < 0)
		return CTL_NOCONN;
	int s = ctl_open();
	if (s < 0) {
		dbg("control %s: %s", g_ctl_path, strerror(errno));
		return CTL_NOCONN;
	}
	if (g_hello == 0) {
		int hfd[CTL_MAXFD];
		char hello[32];
		if (ctl_req(hello, sizeof hello, CTL_OP_HELLO, 0) < 0 || ctl_send(s, hello, -1) < 0 ||
		    ctl_recv(s, buf, size, &n, hfd) < 0) {
			real_close(s);
			return CTL_NOCONN;
		}
		close_fds(hfd);
		if (ctl_parse(buf, n, r) < 0 || !r->ok || r->version != 2) {
			dbg("exnd does not speak shim v" SHIM_VERSION ": %s", buf);
			g_hello = -1;
			real_close(s);
			return CTL_NOCONN;
		}
		g_hello = 1;
	}
	int c = CTL_BROKEN;
	if (ctl_send(s, line, fd) == 0 && ctl_recv(s, buf, size, &n, rfd) == 0 && ctl_parse(buf, n, r) == 0)
		c = r->ok ? CTL_OK : CTL_REFUSED;
	int saved = errno;
	real_close(s);
	errno = saved;
	if (c != CTL_OK)
		close_fds(rfd);
	return c;
}


/* ---- the switch ---- */

/*
 * Replace fd by ufd (exnd's AF_UNIX end), keeping the number, FD_CLOEXEC
 * (cloexec < 0: as fd had it) and O_NONBLOCK (nonblock < 0: likewise),
 * the epoll registrations, and the TCP addresses for getsockname and
 * getpeername. Closes ufd. 0, or -1 with errno (fd untouched).
 */
static int do_switch(int fd, int ufd, int cloexec, int nonblock, uint64_t id)
{
	union addr la, pa;
	socklen_t ll = sizeof la, pl = sizeof pa;
	memset(&la, 0, sizeof la);
	memset(&pa, 0, sizeof pa);
	real_getsockname(fd, &la.sa, &ll);
	real_getpeername(fd, &pa.sa, &pl);
	if (cloexec < 0)
		cloexec = (real_fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0;
	if (nonblock < 0)
		nonblock = (real_fcntl(fd, F_GETFL) & O_NONBLOCK) != 0;
	int family = la.sa.sa_family;

	struct epreg regs[16];
	int nregs = 0;
	lock();
	struct fdent *e = ent(fd);
	if (e && e->nreg > 0) {
		for (int i = 0; i < EP_POOL && nregs < 16; i++)
			if (g_ep[i].fd == fd)
				regs[nregs++] = g_ep[i];
	}
	unlock();
	for (int i = 0; i < nregs; i++)
		real_epoll_ctl(regs[i].epfd, EPOLL_CTL_DEL, fd, NULL);

	int fl = real_fcntl(ufd, F_GETFL);
	if (fl >= 0)
		real_fcntl(ufd, F_SETFL, nonblock ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
	if (real_dup3(ufd, fd, cloexec ? O_CLOEXEC : 0) < 0) {
		int saved = errno;
		for (int i = 0; i < nregs; i++)
			real_epoll_ctl(regs[i].epfd, EPOLL_CTL_ADD, fd, &regs[i].ev);
		real_close(ufd);
		errno = saved;
		return -1;
	}
	real_close(ufd);
	for (int i = 0; i < nregs; i++)
		if (real_epoll_ctl(regs[i].epfd, EPOLL_CTL_ADD, fd, &regs[i].ev) < 0)
			dbg("fd %d: epoll re-add on %d: %s", fd, regs[i].epfd, strerror(errno));
	struct stat st;
	memset(&st, 0, sizeof st);
	fstat(fd, &st);

	lock();
	e = ent(fd);
	if (e) {
		int keep = e->flags & (F_NODELAY | F_CORK | F_KEEPALIVE);
		int32_t maxseg = e->maxseg, tos = e->tos;
		clear_locked(fd);
		e->flags = F_TRACKED | F_SWITCHED | keep;
		e->family = family;
		e->ino = st.st_ino;
		e->dev = st.st_dev;
		e->id = id;
		e->maxseg = maxseg;
		e->tos = tos;
		e->local = la;
		e->llen = ll;
		e->peer = pa;
		e->plen = pl;
	}
	unlock();
	return 0;
}

/* Forget the epoll records of a connected socket that stays TCP. */
static void settle(int fd)
{
	if (!(fdflags(fd) & F_TRACKED) || ent(fd)->nreg == 0)
		return;
	lock();
	ep_drop_fd_locked(fd);
	unlock();
}

/* Direct connections: their data path and interposition. */
#include "direct.c"
#include "direct_poll.c"
#include "direct_exec.c"

/* Holds for short-lived connections. */
#include "hold.c"

/* The intercepted calls: descriptors, then addresses, options and messages. */
#include "calls.c"
#include "sockcalls.c"

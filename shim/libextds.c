/*
 * libextds.so: LD_PRELOAD socket switch for EXT-DS (docs/shim.md,
 * docs/direct.md).
 *
 * Unmodified dynamically linked programs get EXT-DS for their TCP
 * connections between fabric peers. The shim lets the kernel set up every
 * connection as plain TCP (over exn0), then hands the connected socket to
 * exnd over its control socket (shim-connect / shim-accept, SCM_RIGHTS).
 * exnd answers one of:
 *
 *   - "tcp" (peer not on the fabric, unshimmed listener, plain client,
 *     or a hold for short connections): the TCP socket is used as is;
 *   - "extds" (relay): an AF_UNIX stream socket that exnd splices onto an
 *     EXT-DS connection; the shim dup3()s it over the application's
 *     descriptor, keeping its number and flags, and the descriptor stays a
 *     real kernel socket that read/write/poll/epoll/fork/exec use as is;
 *   - "direct": the same AF_UNIX socket (V) plus a shared connection
 *     buffer and its bells: the bytes then move through the buffer
 *     (dring.c) with exnd out of the data path, so the shim serves the
 *     data and readiness calls of that descriptor itself, and hands it
 *     to exnd's relay (shim-relay) before an exec that keeps it open.
 *
 * Interposed (exported, exactly the list in libextds.map; the real
 * functions in real.h):
 *   descriptors  socket connect listen accept accept4 close dup dup2 dup3
 *                fcntl fcntl64 epoll_ctl                        (calls.c)
 *   addresses, options, messages  getsockname getpeername getsockopt
 *                setsockopt sendto sendmsg recvfrom __recvfrom_chk
 *                recvmsg                                   (sockcalls.c)
 *   data         read __read_chk write readv writev recv __recv_chk send
 *                sendfile sendfile64 splice ioctl shutdown   (direct.c)
 *   readiness    poll __poll_chk ppoll select pselect   (direct_poll.c)
 *                epoll_wait epoll_pwait epoll_pwait2    (direct_epoll.c)
 *   exec         execve execv execvp execvpe fexecve execl execlp execle
 *                                                        (direct_exec.c)
 * The descriptor calls track TCP sockets in the table, register
 * listeners with exnd (shim-listen, shim-unlisten) and switch connected
 * sockets; the address and option calls answer for switched descriptors
 * from the table; the data, readiness and exec calls fall through to
 * the real ones unless a direct descriptor is involved.
 *
 * State: one fixed table indexed by fd (mmap'd at init, no malloc
 * anywhere in intercepted paths) with a pool of epoll records, guarded by
 * one spinlock held only for short copies (never across a blocking call);
 * direct.c's records of direct connections and hold.c's servers on hold
 * live under the same lock. Plain memory, so a forked child inherits it
 * as it inherits the descriptors (fork takes the lock, pthread_atfork).
 * errno is preserved on every path that does not itself fail.
 *
 * Environment (read once, at init): EXTDS_CONTROL (default
 * /run/exn/exnd.sock), EXTDS_MODE=off|auto|force (default auto; off: no
 * table, every call falls through), EXTDS_DIRECT=0 (relay, do not ask for
 * direct connections), EXTDS_SETUP=upgrade|connect (default upgrade:
 * connections start as TCP and move later, upgrade.c; connect: the switch
 * at connect and accept), EXTDS_DEBUG=1 (a line per decision on stderr).
 *
 * Units (each its own compilation unit; shared declarations in the
 * private headers shim.h, real.h, ctl.h, direct.h, hold.h, dring.h):
 *   libextds.c   this file: the real table and its resolver, init, the
 *                configuration, the fd table and its helpers, do_switch
 *   ctl.c        the control client (ctl_call); ctlparse.c its encoding
 *   calls.c, sockcalls.c  the socket calls above
 *   hold.c       holds for short-lived connections
 *   direct.c, direct_poll.c, direct_epoll.c, direct_exec.c  direct connections
 *   dparty.c     who parks on a direct connection's bell: the fan-out
 *   dring.c      the shared connection buffer
 * shim/Makefile is the one build recipe (sources, flags, libextds.map).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "direct.h"
#include "real.h"
#include "shim.h"
#include "upgrade.h"

/* ---- real functions ---- */

struct shim_real real;

/* Fill real: every call of real.h's list from the next object in the
 * lookup order (libc), once, at init. */
static void resolve(void)
{
#define RESOLVE(ret, name, params) real.name = (ret(*) params)dlsym(RTLD_NEXT, #name);
	SHIM_CALLS(RESOLVE)
#undef RESOLVE
	if (!real.fcntl64)
		real.fcntl64 = real.fcntl;
}

/* ---- configuration ---- */

int g_mode = MODE_AUTO;
int g_debug;
int g_direct = 1;
int g_upgrade;
char g_ctl_path[sizeof(((struct sockaddr_un *)0)->sun_path)] = "/run/exn/exnd.sock";
volatile int g_ready;

/* ---- fd table ---- */

struct fdent *g_tab;
int g_ntab;
struct epreg g_ep[EP_POOL];
int g_nep;
uint32_t g_lid;
volatile int g_lock;

/* ---- debug ---- */

void dbg(const char *fmt, ...)
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

void shim_init(void)
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
	const char *su = getenv("EXTDS_SETUP");
	g_upgrade = g_direct && !(su && !strcmp(su, "connect"));
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
static void atfork_prepare(void)
{
	if (g_ready)
		lock();
	fdroom_atfork_prepare(); /* after lock(): the order of hide_fd's callers */
}
static void atfork_release(void)
{
	fdroom_atfork_release();
	if (g_ready)
		unlock();
}
static void atfork_child(void)
{
	if (g_ready)
		direct_atfork_child(); /* under the lock fork took */
	atfork_release();
}

__attribute__((constructor)) static void ctor(void)
{
	shim_init();
	pthread_atfork(atfork_prepare, atfork_release, atfork_child);
}

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

void ep_drop_epfd_locked(int epfd)
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

void clear_locked(int fd)
{
	struct fdent *e = ent(fd);
	if (!e)
		return;
	ep_drop_fd_locked(fd);
	if (e->flags & F_DIRECT)
		direct_drop_locked(fd, e);
	else if (e->flags & F_UPG)
		upg_drop_locked(fd, e);
	memset(e, 0, sizeof *e);
}

int is_loopback(const struct sockaddr *sa)
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
int is_tcp(int fd, int *family)
{
	int v = 0;
	socklen_t l = sizeof v;
	if (real.getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &l) < 0 || (v != AF_INET && v != AF_INET6))
		return 0;
	if (family)
		*family = v;
	l = sizeof v;
	if (real.getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &l) < 0 || v != SOCK_STREAM)
		return 0;
	l = sizeof v;
	if (real.getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &v, &l) < 0 || v != IPPROTO_TCP)
		return 0;
	return 1;
}

/*
 * The switched entry of fd, checked against the descriptor's identity:
 * a descriptor closed behind the shim's back (fclose, raw syscalls) and
 * reused must not keep a stale switched state. Copies the entry into out.
 */
int switched(int fd, struct fdent *out)
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

/* ---- the switch ---- */

/*
 * Replace fd by ufd (exnd's AF_UNIX end), keeping the number, FD_CLOEXEC
 * (cloexec < 0: as fd had it) and O_NONBLOCK (nonblock < 0: likewise),
 * the epoll registrations, and the TCP addresses for getsockname and
 * getpeername. With dslot >= 0 the entry becomes the direct descriptor of
 * g_dc[dslot] in the same step (direct.c, direct_install), so no call
 * finds it between the two. Closes ufd. 0, or -1 with errno (fd
 * untouched).
 */
int do_switch(int fd, int ufd, int cloexec, int nonblock, uint64_t id, int dslot)
{
	union addr la, pa;
	socklen_t ll = sizeof la, pl = sizeof pa;
	memset(&la, 0, sizeof la);
	memset(&pa, 0, sizeof pa);
	real.getsockname(fd, &la.sa, &ll);
	real.getpeername(fd, &pa.sa, &pl);
	if (cloexec < 0)
		cloexec = (real.fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0;
	if (nonblock < 0)
		nonblock = (real.fcntl(fd, F_GETFL) & O_NONBLOCK) != 0;
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
		real.epoll_ctl(regs[i].epfd, EPOLL_CTL_DEL, fd, NULL);

	int fl = real.fcntl(ufd, F_GETFL);
	if (fl >= 0)
		real.fcntl(ufd, F_SETFL, nonblock ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
	if (real.dup3(ufd, fd, cloexec ? O_CLOEXEC : 0) < 0) {
		int saved = errno;
		for (int i = 0; i < nregs; i++)
			real.epoll_ctl(regs[i].epfd, EPOLL_CTL_ADD, fd, &regs[i].ev);
		real.close(ufd);
		errno = saved;
		return -1;
	}
	real.close(ufd);
	for (int i = 0; i < nregs; i++)
		if (real.epoll_ctl(regs[i].epfd, EPOLL_CTL_ADD, fd, &regs[i].ev) < 0)
			dbg("fd %d: epoll re-add on %d: %s", fd, regs[i].epfd, strerror(errno));
	struct stat st;
	memset(&st, 0, sizeof st);
	fstat(fd, &st);

	lock();
	e = ent(fd);
	if (e) {
		struct fdent n;
		memset(&n, 0, sizeof n);
		n.flags = F_TRACKED | F_SWITCHED | (e->flags & (F_NODELAY | F_CORK | F_KEEPALIVE));
		n.family = family;
		n.ino = st.st_ino;
		n.dev = st.st_dev;
		n.id = id;
		n.maxseg = e->maxseg;
		n.tos = e->tos;
		n.local = la;
		n.llen = ll;
		n.peer = pa;
		n.plen = pl;
		if (dslot >= 0) {
			/* The flags go from the old entry's to the direct one's in
			 * one store: a call of another thread, which reads them
			 * without the lock (fdflags), never finds neither. The old
			 * entry (new, or an upgrade converting: upgrade.c) has
			 * nothing to drop but its epoll records. */
			n.flags |= F_DIRECT | (nonblock ? F_NB : 0);
			n.dc = dslot + 1;
			ep_drop_fd_locked(fd);
			uint16_t f = n.flags;
			n.flags = e->flags;
			*e = n;
			__atomic_store_n(&e->flags, f, __ATOMIC_RELEASE);
		} else {
			clear_locked(fd);
			*e = n;
		}
	}
	unlock();
	return 0;
}

/* Forget the epoll records of a connected socket that stays TCP. */
void settle(int fd)
{
	if (!(fdflags(fd) & F_TRACKED) || ent(fd)->nreg == 0)
		return;
	lock();
	ep_drop_fd_locked(fd);
	unlock();
}

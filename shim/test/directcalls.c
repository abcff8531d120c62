/*
 * directcalls: every call a TCP socket supports, over direct EXT-DS
 * connections (docs/direct.md), both ends under libextds.so
 * (integration TestDirectCalls; the table "On a direct descriptor" in
 * docs/shim.md names these checks).
 *
 *   directcalls server IP PORT
 *       a forking server: it reads a command line ("MODE [ARGS]\n") from
 *       each accepted connection and serves it in a child (modes below);
 *       "quit" ends it once every child is done. Prints "FAIL srv-MODE:
 *       why" for what goes wrong on its side; exits 1 if anything did.
 *   directcalls client IP PORT [CHECK...]
 *       runs the checks (all, in order, by default), one or more fresh
 *       connections each, and prints "ok NAME", "FAIL NAME: why" or
 *       "limit NAME: why" (a documented limit of direct mode) per check,
 *       then "conns N" (connections it made, each verified direct) and
 *       "quit". Exits 1 if any check failed.
 *   directcalls fdcheck FD [ALLOWED,...]
 *       (exec'd without the shim by the cloexec check) exits 0 if FD is
 *       closed and no descriptor but 0, 1, 2 and ALLOWED (what the client
 *       itself inherited when it started) is open.
 *
 * A connection is verified direct on both ends when it is made: the kernel
 * says the descriptor is an AF_UNIX socket (a raw syscall the shim cannot
 * see; plain TCP would say AF_INET) and a connection buffer
 * (/dev/shm/exn-*) got mapped into the process. Every wait is bounded by
 * alarm().
 *
 * Server modes:
 *   echo [DELAY_MS]   write back what arrives (after DELAY_MS), until EOF
 *   sink              read to EOF, check EOF stays EOF, answer "n=N h=HASH\n"
 *   source N CHUNK US [close]
 *                     write N pattern bytes, CHUNK at a time, US µs apart;
 *                     then read to EOF ("close": close at once instead)
 *   fill              send "pid=P\n", wait for SIGUSR1 (the client filled
 *                     the ring), wait 100 ms, then as sink
 *   names             send "local=A peer=B\n" (getsockname, getpeername), then as sink
 *   exec              the connection becomes stdin and stdout of
 *                     /bin/sh -c 'exec cat', exec'd without the shim
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WHYLEN 512
#define FNV0 14695981039346656037ULL

static const char *g_ip;
static int g_port;
static struct sockaddr_in g_srv;
static int g_conns;
static const char *g_check = "?";
static volatile sig_atomic_t g_sigpipe, g_usr1;

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 1099511628211ULL;
	return h;
}

/* Byte i of the test stream. */
static unsigned char pat(uint64_t i) { return (unsigned char)(i * 131 + (i >> 11) + 7); }

static void fill_pat(unsigned char *b, uint64_t off, size_t n)
{
	for (size_t i = 0; i < n; i++)
		b[i] = pat(off + i);
}

static int64_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void msleep(int ms)
{
	struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&t, &t) < 0 && errno == EINTR)
		;
}

/* What the kernel says the descriptor is (a raw syscall: not the shim). */
static int kernel_domain(int fd)
{
	int v = -1;
	socklen_t l = sizeof v;
	if (syscall(SYS_getsockopt, fd, SOL_SOCKET, SO_DOMAIN, &v, &l) < 0)
		return -1;
	return v;
}

/* Connection buffers mapped in this process (docs/direct.md: /dev/shm/exn-*). */
static int ndirect(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	if (!f)
		return -1;
	char line[1024];
	int n = 0;
	while (fgets(line, sizeof line, f))
		if (strstr(line, "/dev/shm/exn-"))
			n++;
	fclose(f);
	return n;
}

static int wr_all(int fd, const void *buf, size_t n)
{
	const char *p = buf;
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* Read up to n bytes, stopping early only at EOF: the count, or -1. */
static ssize_t rd_full(int fd, void *buf, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = read(fd, (char *)buf + got, n - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0)
			break;
		got += (size_t)r;
	}
	return (ssize_t)got;
}

static int rd_line(int fd, char *buf, size_t max)
{
	size_t n = 0;
	while (n + 1 < max) {
		ssize_t r = read(fd, buf + n, 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		if (buf[n] == '\n')
			break;
		n++;
	}
	buf[n] = 0;
	return (int)n;
}

/* Write n pattern bytes at stream offset *off, hashing them into *h. */
static int send_pat(int fd, uint64_t *off, size_t n, uint64_t *h)
{
	static unsigned char b[65536];
	while (n > 0) {
		size_t k = n < sizeof b ? n : sizeof b;
		fill_pat(b, *off, k);
		if (wr_all(fd, b, k) < 0)
			return -1;
		*h = fnv(*h, b, k);
		*off += k;
		n -= k;
	}
	return 0;
}

static void addr_str(const struct sockaddr *sa, char *buf, size_t n)
{
	char ip[INET6_ADDRSTRLEN] = "?";
	int port = 0;
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *a = (const void *)sa;
		inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
		port = ntohs(a->sin_port);
	}
	snprintf(buf, n, "%s:%d/%d", ip, port, sa->sa_family);
}

/* ================= server ================= */

static void srv_fail(const char *mode, const char *fmt, ...)
{
	char why[WHYLEN];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof why, fmt, ap);
	va_end(ap);
	printf("FAIL srv-%s: %s (errno %s)\n", mode, why, strerror(errno));
	fflush(stdout);
	_exit(1);
}

/* Read to EOF; EOF must stay EOF; answer the count and hash. */
static void srv_sink(int c, const char *mode)
{
	static unsigned char b[65536];
	uint64_t h = FNV0, n = 0;
	for (;;) {
		ssize_t r = read(c, b, sizeof b);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			srv_fail(mode, "read after %llu bytes", (unsigned long long)n);
		if (r == 0)
			break;
		h = fnv(h, b, (size_t)r);
		n += (uint64_t)r;
	}
	if (read(c, b, 1) != 0)
		srv_fail(mode, "read after EOF did not return 0 again");
	char line[128];
	int m = snprintf(line, sizeof line, "n=%llu h=%016llx\n", (unsigned long long)n, (unsigned long long)h);
	/* the peer shut down writing: this side can still send (half-close) */
	if (wr_all(c, line, (size_t)m) < 0)
		srv_fail(mode, "write of the answer after the peer's SHUT_WR");
}

static void on_usr1(int s)
{
	(void)s;
	g_usr1 = 1;
}

static void serve(int c, char *cmd)
{
	char *mode = strtok(cmd, " ");
	if (!mode)
		srv_fail("?", "empty command");
	static char name[64];
	snprintf(name, sizeof name, "srv-%s", mode);
	g_check = name;
	alarm(60);
	if (!strcmp(mode, "echo")) {
		char *a = strtok(NULL, " ");
		int delay = a ? atoi(a) : 0;
		static char b[65536];
		for (;;) {
			ssize_t r = read(c, b, sizeof b);
			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0)
				srv_fail(mode, "read");
			if (r == 0)
				break;
			if (delay)
				msleep(delay);
			if (wr_all(c, b, (size_t)r) < 0)
				srv_fail(mode, "write");
		}
	} else if (!strcmp(mode, "sink")) {
		srv_sink(c, mode);
	} else if (!strcmp(mode, "source")) {
		char *a = strtok(NULL, " "), *b = strtok(NULL, " "), *u = strtok(NULL, " "), *cl = strtok(NULL, " ");
		if (!a || !b || !u)
			srv_fail(mode, "usage: source N CHUNK US [close]");
		uint64_t n = strtoull(a, NULL, 10), off = 0, h = FNV0;
		size_t chunk = (size_t)atol(b);
		int us = atoi(u);
		while (off < n) {
			size_t k = n - off < chunk ? (size_t)(n - off) : chunk;
			if (send_pat(c, &off, k, &h) < 0)
				srv_fail(mode, "write at %llu", (unsigned long long)off);
			if (us)
				usleep((useconds_t)us);
		}
		if (!cl) {
			char x[4096];
			ssize_t r;
			while ((r = read(c, x, sizeof x)) > 0 || (r < 0 && errno == EINTR))
				;
		}
	} else if (!strcmp(mode, "fill")) {
		sigset_t s;
		sigemptyset(&s);
		sigaddset(&s, SIGUSR1);
		sigprocmask(SIG_BLOCK, &s, NULL);
		char line[64];
		int m = snprintf(line, sizeof line, "pid=%d\n", (int)getpid());
		if (wr_all(c, line, (size_t)m) < 0)
			srv_fail(mode, "write pid");
		struct timespec t = {30, 0};
		if (sigtimedwait(&s, NULL, &t) != SIGUSR1)
			srv_fail(mode, "no SIGUSR1 from the client in 30 s");
		msleep(100); /* the client parks waiting for space meanwhile */
		srv_sink(c, mode);
	} else if (!strcmp(mode, "names")) {
		struct sockaddr_storage a, b;
		socklen_t al = sizeof a, bl = sizeof b;
		if (getsockname(c, (void *)&a, &al) < 0 || getpeername(c, (void *)&b, &bl) < 0)
			srv_fail(mode, "getsockname/getpeername");
		char sa[80], sb[80], line[200];
		addr_str((void *)&a, sa, sizeof sa);
		addr_str((void *)&b, sb, sizeof sb);
		int m = snprintf(line, sizeof line, "local=%s peer=%s len=%u,%u\n", sa, sb, (unsigned)al, (unsigned)bl);
		if (wr_all(c, line, (size_t)m) < 0)
			srv_fail(mode, "write");
		srv_sink(c, mode);
	} else if (!strcmp(mode, "exec")) {
		if (dup2(c, 0) < 0 || dup2(c, 1) < 0)
			srv_fail(mode, "dup2");
		close(c);
		unsetenv("LD_PRELOAD");
		execl("/bin/sh", "sh", "-c", "exec cat", (char *)NULL);
		srv_fail(mode, "execl /bin/sh");
	} else {
		srv_fail(mode, "unknown mode");
	}
	close(c);
}

/* The server's children and their modes, to name one that fails. */
static struct {
	pid_t pid;
	char mode[32];
} g_kids[256];

static int child_status(pid_t p, int st)
{
	const char *mode = "?";
	for (int i = 0; i < 256; i++)
		if (g_kids[i].pid == p)
			mode = g_kids[i].mode;
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return 0;
	printf("FAIL srv-%s: child %d exited with status 0x%x\n", mode, (int)p, st);
	return 1;
}

static int server(void)
{
	int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (l < 0 || bind(l, (struct sockaddr *)&g_srv, sizeof g_srv) < 0 || listen(l, 64) < 0) {
		perror("directcalls server: listen");
		return 1;
	}
	printf("listening\n");
	fflush(stdout);
	int bad = 0;
	for (;;) {
		int st;
		pid_t p;
		while ((p = waitpid(-1, &st, WNOHANG)) > 0)
			bad |= child_status(p, st);
		int before = ndirect();
		int c = accept4(l, NULL, NULL, SOCK_CLOEXEC);
		if (c < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			perror("directcalls server: accept");
			return 1;
		}
		alarm(30);
		char cmd[256];
		if (rd_line(c, cmd, sizeof cmd) < 0) {
			printf("FAIL srv-accept: no command line (errno %s)\n", strerror(errno));
			bad = 1;
			close(c);
			continue;
		}
		alarm(0);
		if (kernel_domain(c) != AF_UNIX || ndirect() <= before) {
			printf("FAIL srv-%s: connection not direct (kernel domain %d, buffers mapped %d before %d)\n", cmd,
			       kernel_domain(c), ndirect(), before);
			bad = 1;
		}
		fflush(stdout);
		if (!strcmp(cmd, "quit")) {
			close(c);
			break;
		}
		pid_t ch = fork();
		if (ch < 0) {
			perror("directcalls server: fork");
			return 1;
		}
		if (ch == 0) {
			close(l);
			serve(c, cmd);
			_exit(0);
		}
		static int nk;
		g_kids[nk % 256].pid = ch;
		snprintf(g_kids[nk % 256].mode, sizeof g_kids[0].mode, "%.31s", cmd);
		nk++;
		close(c);
	}
	close(l);
	alarm(60);
	int st;
	pid_t p;
	while ((p = wait(&st)) > 0)
		bad |= child_status(p, st);
	printf("server done%s\n", bad ? " (failures)" : "");
	return bad;
}

/* ================= client ================= */

#define FAILIF(cond, ...)                                                                                              \
	do {                                                                                                           \
		if (cond) {                                                                                            \
			int e_ = errno;                                                                                \
			int k_ = snprintf(why, WHYLEN, __VA_ARGS__);                                                   \
			if (k_ >= 0 && k_ < WHYLEN)                                                                    \
				snprintf(why + k_, (size_t)(WHYLEN - k_), " [errno %s, line %d]", strerror(e_), __LINE__); \
			goto out;                                                                                      \
		}                                                                                                      \
	} while (0)

static int xclose(int *fd)
{
	int r = 0;
	if (*fd >= 0)
		r = close(*fd);
	*fd = -1;
	return r;
}

/* A blocking connection to the server in mode cmd, verified direct: the fd or -1 (why set). */
static int dial(const char *cmd, int type, char *why)
{
	int before = ndirect();
	int s = socket(AF_INET, SOCK_STREAM | type, 0);
	if (s < 0) {
		snprintf(why, WHYLEN, "socket: %s", strerror(errno));
		return -1;
	}
	if (connect(s, (struct sockaddr *)&g_srv, sizeof g_srv) < 0) {
		snprintf(why, WHYLEN, "connect: %s", strerror(errno));
		close(s);
		return -1;
	}
	int kd = kernel_domain(s), nd = ndirect();
	if (kd != AF_UNIX || nd <= before) {
		snprintf(why, WHYLEN, "connection not direct (kernel domain %d, buffers mapped %d, before %d)", kd, nd,
			 before);
		close(s);
		return -1;
	}
	g_conns++;
	char line[256];
	int m = snprintf(line, sizeof line, "%s\n", cmd);
	if (wr_all(s, line, (size_t)m) < 0) {
		snprintf(why, WHYLEN, "send command: %s", strerror(errno));
		close(s);
		return -1;
	}
	return s;
}

/* Read the sink's answer and compare it with n bytes hashing to h. */
static int expect_sum(int fd, uint64_t n, uint64_t h, char *why)
{
	char line[128];
	if (rd_line(fd, line, sizeof line) < 0) {
		snprintf(why, WHYLEN, "no answer from the server: %s", strerror(errno));
		return -1;
	}
	unsigned long long sn, sh;
	if (sscanf(line, "n=%llu h=%llx", &sn, &sh) != 2 || sn != n || sh != h) {
		snprintf(why, WHYLEN, "server saw \"%s\", sent n=%llu h=%016llx", line, (unsigned long long)n,
			 (unsigned long long)h);
		return -1;
	}
	return 0;
}

/* Echo round trip of n pattern bytes at offset off through fd. */
static int echo_check(int fd, uint64_t off, size_t n, char *why)
{
	unsigned char *b = malloc(n), *want = malloc(n);
	int rc = -1;
	fill_pat(want, off, n);
	FAILIF(wr_all(fd, want, n) < 0, "write");
	FAILIF(rd_full(fd, b, n) != (ssize_t)n, "echo short");
	FAILIF(memcmp(b, want, n) != 0, "echo differs");
	rc = 0;
out:
	free(b);
	free(want);
	return rc;
}

static int wait_child(pid_t p, char *why, const char *what)
{
	int st;
	while (waitpid(p, &st, 0) < 0)
		if (errno != EINTR) {
			snprintf(why, WHYLEN, "waitpid %s: %s", what, strerror(errno));
			return -1;
		}
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		snprintf(why, WHYLEN, "%s: status 0x%x", what, st);
		return -1;
	}
	return 0;
}

/* ---- the checks: 0 ok, -1 fail, 1 limit (why says which) ---- */

static int c_nb_connect(char *why)
{
	int rc = -1, s = -1, before = ndirect();
	char buf[16];
	s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	FAILIF(s < 0, "socket");
	int r = connect(s, (struct sockaddr *)&g_srv, sizeof g_srv);
	FAILIF(r < 0 && errno != EINPROGRESS, "connect");
	if (r < 0) {
		struct pollfd p = {s, POLLOUT, 0};
		FAILIF(poll(&p, 1, 10000) != 1, "poll for the connect");
	}
	int err = -1;
	socklen_t l = sizeof err;
	FAILIF(getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &l) < 0 || err != 0, "SO_ERROR after connect: %d", err);
	FAILIF(kernel_domain(s) != AF_UNIX || ndirect() <= before, "not direct");
	g_conns++;
	FAILIF(!(fcntl(s, F_GETFL) & O_NONBLOCK), "O_NONBLOCK lost");
	FAILIF(send(s, "echo\n", 5, 0) != 5, "send command");
	errno = 0;
	FAILIF(read(s, buf, sizeof buf) != -1 || (errno != EAGAIN && errno != EWOULDBLOCK),
	       "non-blocking read with nothing there must be EAGAIN");
	FAILIF(write(s, "ping", 4) != 4, "write");
	struct pollfd p = {s, POLLIN, 0};
	FAILIF(poll(&p, 1, 10000) != 1 || !(p.revents & POLLIN), "poll POLLIN");
	FAILIF(read(s, buf, sizeof buf) != 4 || memcmp(buf, "ping", 4), "echo");
	FAILIF(getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &l) < 0 || err != 0, "SO_ERROR later: %d", err);
	rc = 0;
out:
	xclose(&s);
	return rc;
}

static int c_nb_connect_refused(char *why)
{
	int rc = -1, s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	FAILIF(s < 0, "socket");
	struct sockaddr_in a = g_srv;
	a.sin_port = htons((uint16_t)(g_port + 1)); /* nothing listens there */
	int r = connect(s, (struct sockaddr *)&a, sizeof a), err = 0;
	if (r < 0 && errno == EINPROGRESS) {
		struct pollfd p = {s, POLLOUT, 0};
		FAILIF(poll(&p, 1, 10000) != 1, "poll for the connect");
		socklen_t l = sizeof err;
		FAILIF(getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &l) < 0, "SO_ERROR");
	} else {
		FAILIF(r == 0, "connect to a closed port succeeded");
		err = errno;
	}
	errno = err;
	FAILIF(err != ECONNREFUSED, "want ECONNREFUSED");
	rc = 0;
out:
	xclose(&s);
	return rc;
}

static int c_rcvtimeo(char *why)
{
	int rc = -1, s = dial("echo", 0, why);
	if (s < 0)
		return -1;
	char b[8];
	struct timeval tv = {0, 200000}, got = {0, 0};
	socklen_t l = sizeof got;
	FAILIF(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0, "set SO_RCVTIMEO");
	FAILIF(getsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &got, &l) < 0 || got.tv_sec != 0 || got.tv_usec < 190000,
	       "get SO_RCVTIMEO");
	int64_t t0 = now_ms();
	errno = 0;
	ssize_t r = read(s, b, sizeof b);
	int64_t dt = now_ms() - t0;
	FAILIF(r != -1 || (errno != EAGAIN && errno != EWOULDBLOCK), "read with nothing there: %zd, want EAGAIN", r);
	FAILIF(dt < 150 || dt > 5000, "timed out after %lld ms, want about 200", (long long)dt);
	if (echo_check(s, 0, 1000, why) < 0)
		goto out; /* why says what */
	rc = 0;
out:
	xclose(&s);
	return rc;
}

/* Connect to a "fill" server: returns fd and the server child's pid. */
static int dial_fill(pid_t *pid, char *why)
{
	int s = dial("fill", 0, why);
	if (s < 0)
		return -1;
	char line[64];
	int p;
	if (rd_line(s, line, sizeof line) < 0 || sscanf(line, "pid=%d", &p) != 1) {
		snprintf(why, WHYLEN, "no pid from the fill server");
		close(s);
		return -1;
	}
	*pid = p;
	return s;
}

static int c_sndtimeo(char *why)
{
	pid_t pid = 0;
	int rc = -1, s = dial_fill(&pid, why);
	if (s < 0)
		return -1;
	uint64_t off = 0, h = FNV0;
	static unsigned char b[65536];
	struct timeval tv = {0, 200000};
	FAILIF(setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) < 0, "set SO_SNDTIMEO");
	int64_t dt = 0;
	for (int i = 0;; i++) {
		FAILIF(i > 10000, "the ring never filled (%llu bytes)", (unsigned long long)off);
		fill_pat(b, off, sizeof b);
		int64_t t0 = now_ms();
		ssize_t w = write(s, b, sizeof b);
		dt = now_ms() - t0;
		if (w < 0) {
			FAILIF(errno != EAGAIN && errno != EWOULDBLOCK, "write on a full ring: want EAGAIN");
			break;
		}
		h = fnv(h, b, (size_t)w);
		off += (uint64_t)w;
	}
	FAILIF(dt < 150 || dt > 5000, "the write timed out after %lld ms, want about 200", (long long)dt);
	FAILIF(kill(pid, SIGUSR1) < 0, "kill server %d", pid);
	tv.tv_usec = 0;
	FAILIF(setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) < 0, "clear SO_SNDTIMEO");
	FAILIF(send_pat(s, &off, 100000, &h) < 0, "write after the server drained");
	FAILIF(shutdown(s, SHUT_WR) < 0, "shutdown");
	if (expect_sum(s, off, h, why) < 0)
		goto out;
	rc = 0;
out:
	xclose(&s);
	return rc;
}

/* Fill the ring (non-blocking) until EAGAIN. */
static int fill_ring(int s, uint64_t *off, uint64_t *h, char *why)
{
	static unsigned char b[65536];
	for (int i = 0;; i++) {
		if (i > 10000) {
			snprintf(why, WHYLEN, "the ring never filled");
			return -1;
		}
		fill_pat(b, *off, sizeof b);
		ssize_t w = send(s, b, sizeof b, MSG_DONTWAIT);
		if (w < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			snprintf(why, WHYLEN, "write: %s", strerror(errno));
			return -1;
		}
		*h = fnv(*h, b, (size_t)w);
		*off += (uint64_t)w;
	}
}

/* A full ring is not writable until the peer reads, then it is: mux p, s or e. */
static int pollout(char *why, char mux)
{
	pid_t pid = 0;
	int rc = -1, ep = -1, s = dial_fill(&pid, why), n;
	if (s < 0)
		return -1;
	uint64_t off = 0, h = FNV0;
	if (fill_ring(s, &off, &h, why) < 0)
		goto out;
	struct pollfd p = {s, POLLOUT, 0};
	fd_set w;
	struct timeval tv;
	struct epoll_event ev = {EPOLLOUT, {.u64 = 77}};
	if (mux == 'e') {
		ep = epoll_create1(EPOLL_CLOEXEC);
		FAILIF(ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) < 0, "epoll_ctl");
	}
	for (int round = 0; round < 3; round++) {
		/* 0: immediate; 1: parks 200 ms, not writable; 2: the server
		 * drains after SIGUSR1 and 100 ms: writable */
		int tmo = round == 0 ? 0 : round == 1 ? 200 : 10000;
		if (round == 2)
			FAILIF(kill(pid, SIGUSR1) < 0, "kill server %d", pid);
		int64_t t0 = now_ms();
		switch (mux) {
		case 'p':
			p.revents = 0;
			n = poll(&p, 1, tmo);
			FAILIF(n < 0, "poll");
			if (n && !(p.revents & POLLOUT))
				n = 0;
			break;
		case 's':
			FD_ZERO(&w);
			FD_SET(s, &w);
			tv = (struct timeval){tmo / 1000, (tmo % 1000) * 1000};
			n = select(s + 1, NULL, &w, NULL, &tv);
			FAILIF(n < 0, "select");
			FAILIF(n > 0 && !FD_ISSET(s, &w), "select: %d but the fd not set", n);
			break;
		default:
			ev.events = 0;
			n = epoll_wait(ep, &ev, 1, tmo);
			FAILIF(n < 0, "epoll_wait");
			FAILIF(n > 0 && (ev.data.u64 != 77 || !(ev.events & EPOLLOUT)), "epoll: events %#x data %llu",
			       ev.events, (unsigned long long)ev.data.u64);
			break;
		}
		int64_t dt = now_ms() - t0;
		FAILIF(round < 2 && n != 0, "round %d: writable with the ring full (%llu bytes written)", round,
		       (unsigned long long)off);
		FAILIF(round == 1 && dt < 150, "round 1: returned after %lld ms, want 200", (long long)dt);
		FAILIF(round == 2 && n != 1, "round 2: not writable after the peer read (n=%d, %lld ms)", n,
		       (long long)dt);
	}
	FAILIF(send_pat(s, &off, 100000, &h) < 0, "write after the server drained");
	FAILIF(shutdown(s, SHUT_WR) < 0, "shutdown");
	if (expect_sum(s, off, h, why) < 0)
		goto out;
	rc = 0;
out:
	xclose(&ep);
	xclose(&s);
	return rc;
}

static int c_pollout_poll(char *why) { return pollout(why, 'p'); }
static int c_pollout_select(char *why) { return pollout(why, 's'); }
static int c_pollout_epoll(char *why) { return pollout(why, 'e'); }

/* POLLIN: not readable, then readable once the delayed echo comes back
 * (the wait parks); a plain pipe in the same set keeps working. mux p or s. */
static int pollin(char *why, char mux)
{
	int rc = -1, s = dial("echo 50", 0, why), pp[2] = {-1, -1}, n;
	if (s < 0)
		return -1;
	char b[16];
	FAILIF(pipe2(pp, O_CLOEXEC) < 0, "pipe");
	for (int round = 0; round < 3; round++) {
		/* 0: nothing ready (100 ms); 1: the pipe ready, not the socket;
		 * 2: the socket ready (after the echo's 50 ms) */
		if (round == 1)
			FAILIF(write(pp[1], "x", 1) != 1, "pipe write");
		if (round == 2) {
			FAILIF(read(pp[0], b, 1) != 1, "pipe read");
			FAILIF(write(s, "hello", 5) != 5, "write");
		}
		int tmo = round == 0 ? 100 : 10000, sr = 0, pr = 0;
		if (mux == 'p') {
			struct pollfd p[2] = {{pp[0], POLLIN, 0}, {s, POLLIN, 0}};
			n = poll(p, 2, tmo);
			FAILIF(n < 0, "poll");
			pr = !!(p[0].revents & POLLIN);
			sr = !!(p[1].revents & POLLIN);
		} else {
			fd_set r;
			FD_ZERO(&r);
			FD_SET(s, &r);
			FD_SET(pp[0], &r);
			struct timeval tv = {tmo / 1000, (tmo % 1000) * 1000};
			n = select((s > pp[0] ? s : pp[0]) + 1, &r, NULL, NULL, &tv);
			FAILIF(n < 0, "select");
			pr = FD_ISSET(pp[0], &r);
			sr = FD_ISSET(s, &r);
		}
		FAILIF(n != pr + sr, "round %d: returned %d, %d + %d ready", round, n, pr, sr);
		FAILIF(round == 0 && n != 0, "round 0: ready with nothing sent (pipe %d socket %d)", pr, sr);
		FAILIF(round == 1 && (!pr || sr), "round 1: want only the pipe (pipe %d socket %d)", pr, sr);
		FAILIF(round == 2 && (pr || !sr), "round 2: want only the socket (pipe %d socket %d)", pr, sr);
	}
	FAILIF(rd_full(s, b, 5) != 5 || memcmp(b, "hello", 5), "echo");
	rc = 0;
out:
	xclose(&pp[0]);
	xclose(&pp[1]);
	xclose(&s);
	return rc;
}

static int c_pollin_poll(char *why) { return pollin(why, 'p'); }
static int c_pollin_select(char *why) { return pollin(why, 's'); }

static int ep_wait1(int ep, struct epoll_event *ev, int tmo)
{
	int n;
	while ((n = epoll_wait(ep, ev, 1, tmo)) < 0 && errno == EINTR)
		;
	return n;
}

/* Level-triggered: EPOLLOUT at once; EPOLLIN while bytes are left. */
static int c_epoll_lt(char *why)
{
	int rc = -1, ep = -1, s = dial("echo 50", 0, why);
	if (s < 0)
		return -1;
	char b[64];
	struct epoll_event ev = {EPOLLIN | EPOLLOUT, {.u64 = 0x1234567890ull}};
	ep = epoll_create1(EPOLL_CLOEXEC);
	FAILIF(ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) < 0, "epoll_ctl ADD");
	FAILIF(epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) == 0 || errno != EEXIST, "second ADD: want EEXIST");
	FAILIF(ep_wait1(ep, &ev, 0) != 1 || ev.events != EPOLLOUT || ev.data.u64 != 0x1234567890ull,
	       "want EPOLLOUT alone at once: %#x", ev.events);
	ev = (struct epoll_event){EPOLLIN, {.u64 = 42}};
	FAILIF(epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev) < 0, "MOD");
	FAILIF(ep_wait1(ep, &ev, 100) != 0, "EPOLLIN with nothing sent");
	FAILIF(write(s, "0123456789", 10) != 10, "write");
	FAILIF(ep_wait1(ep, &ev, 10000) != 1 || !(ev.events & EPOLLIN) || ev.data.u64 != 42, "no EPOLLIN for the echo");
	FAILIF(read(s, b, 3) != 3, "read 3");
	FAILIF(ep_wait1(ep, &ev, 0) != 1 || !(ev.events & EPOLLIN), "level: EPOLLIN gone with 7 bytes left");
	FAILIF(rd_full(s, b, 7) != 7 || memcmp(b, "3456789", 7), "read the rest");
	FAILIF(ep_wait1(ep, &ev, 50) != 0, "EPOLLIN with the ring empty: %#x", ev.events);
	FAILIF(epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL) < 0, "DEL");
	FAILIF(epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL) == 0 || errno != ENOENT, "second DEL: want ENOENT");
	rc = 0;
out:
	xclose(&ep);
	xclose(&s);
	return rc;
}

/* Edge-triggered: one event per arrival, none for bytes already reported. */
static int c_epoll_et(char *why)
{
	int rc = -1, ep = -1, s = dial("echo 50", 0, why);
	if (s < 0)
		return -1;
	char b[64];
	struct epoll_event ev = {EPOLLIN | EPOLLET, {.u64 = 7}};
	ep = epoll_create1(EPOLL_CLOEXEC);
	FAILIF(ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) < 0, "epoll_ctl ADD");
	FAILIF(write(s, "abcdef", 6) != 6, "write");
	FAILIF(ep_wait1(ep, &ev, 10000) != 1 || !(ev.events & EPOLLIN), "no edge for the echo");
	FAILIF(read(s, b, 2) != 2, "read 2");
	FAILIF(ep_wait1(ep, &ev, 100) != 0, "a second edge with no new bytes");
	FAILIF(write(s, "ghi", 3) != 3, "write");
	FAILIF(ep_wait1(ep, &ev, 10000) != 1 || !(ev.events & EPOLLIN), "no edge for new bytes");
	FAILIF(rd_full(s, b, 7) != 7 || memcmp(b, "cdefghi", 7), "bytes");
	FAILIF(ep_wait1(ep, &ev, 50) != 0, "an edge with nothing new");
	rc = 0;
out:
	xclose(&ep);
	xclose(&s);
	return rc;
}

/* EPOLLONESHOT: one report, then none until EPOLL_CTL_MOD re-arms. */
static int c_epoll_oneshot(char *why)
{
	int rc = -1, ep = -1, s = dial("echo 50", 0, why);
	if (s < 0)
		return -1;
	char b[64];
	struct epoll_event ev = {EPOLLIN | EPOLLONESHOT, {.u64 = 9}};
	ep = epoll_create1(EPOLL_CLOEXEC);
	FAILIF(ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) < 0, "epoll_ctl ADD");
	FAILIF(write(s, "xyz", 3) != 3, "write");
	FAILIF(ep_wait1(ep, &ev, 10000) != 1 || !(ev.events & EPOLLIN) || ev.data.u64 != 9, "no event");
	FAILIF(ep_wait1(ep, &ev, 100) != 0, "a second event before re-arming");
	ev = (struct epoll_event){EPOLLIN | EPOLLONESHOT, {.u64 = 10}};
	FAILIF(epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev) < 0, "MOD");
	FAILIF(ep_wait1(ep, &ev, 10000) != 1 || !(ev.events & EPOLLIN) || ev.data.u64 != 10,
	       "no event after re-arming (bytes still there)");
	FAILIF(ep_wait1(ep, &ev, 100) != 0, "an event after the re-armed one fired");
	FAILIF(rd_full(s, b, 3) != 3 || memcmp(b, "xyz", 3), "bytes");
	rc = 0;
out:
	xclose(&ep);
	xclose(&s);
	return rc;
}

/* Wait until FIONREAD reports want (bounded). */
static int wait_nread(int s, int want)
{
	int n = -1;
	for (int i = 0; i < 1000; i++) {
		if (ioctl(s, FIONREAD, &n) < 0)
			return -2;
		if (n >= want)
			return n;
		msleep(10);
	}
	return n;
}

static int c_msg_peek(char *why)
{
	int rc = -1, s = dial("source 1000 1000 0", 0, why);
	if (s < 0)
		return -1;
	unsigned char b[2000], want[1000];
	fill_pat(want, 0, sizeof want);
	FAILIF(wait_nread(s, 1000) != 1000, "FIONREAD");
	FAILIF(recv(s, b, 100, MSG_PEEK) != 100 || memcmp(b, want, 100), "peek 100");
	FAILIF(recv(s, b, sizeof b, MSG_PEEK | MSG_DONTWAIT) != 1000 || memcmp(b, want, 1000), "peek all");
	int n = -1;
	FAILIF(ioctl(s, FIONREAD, &n) < 0 || n != 1000, "FIONREAD after peeking: %d", n);
	FAILIF(recv(s, b, sizeof b, 0) != 1000 || memcmp(b, want, 1000), "read after peeking");
	FAILIF(ioctl(s, FIONREAD, &n) < 0 || n != 0, "FIONREAD after reading: %d", n);
	rc = 0;
out:
	xclose(&s);
	return rc;
}

static int c_fionread(char *why)
{
	int rc = -1, s = dial("source 12345 12345 0", 0, why), n = -1;
	if (s < 0)
		return -1;
	unsigned char b[1000];
	FAILIF(ioctl(s, FIONREAD, &n) < 0 || (n != 0 && n != 12345), "FIONREAD: %d, want 0 or 12345", n);
	FAILIF((n = wait_nread(s, 12345)) != 12345, "FIONREAD: %d, want 12345", n);
	FAILIF(rd_full(s, b, sizeof b) != sizeof b, "read");
	FAILIF(ioctl(s, FIONREAD, &n) < 0 || n != 12345 - 1000, "FIONREAD after reading 1000: %d", n);
	rc = 0;
out:
	xclose(&s);
	return rc;
}

static int c_msg_waitall(char *why)
{
	enum { N = 200000 };
	int rc = -1, s = dial("source 200000 1000 300", 0, why);
	if (s < 0)
		return -1;
	unsigned char *b = malloc(N), *want = malloc(N);
	fill_pat(want, 0, N);
	ssize_t r = recv(s, b, N, MSG_WAITALL);
	FAILIF(r != N, "MSG_WAITALL returned %zd of %d", r, N);
	FAILIF(memcmp(b, want, N), "bytes differ");
	rc = 0;
out:
	free(b);
	free(want);
	xclose(&s);
	return rc;
}

static int c_msg_dontwait(char *why)
{
	int rc = -1, s = dial("echo", 0, why);
	if (s < 0)
		return -1;
	char b[16];
	int64_t t0 = now_ms();
	errno = 0;
	FAILIF(recv(s, b, sizeof b, MSG_DONTWAIT) != -1 || (errno != EAGAIN && errno != EWOULDBLOCK),
	       "MSG_DONTWAIT with nothing there: want EAGAIN");
	FAILIF(now_ms() - t0 > 100, "MSG_DONTWAIT waited");
	FAILIF(send(s, "hi", 2, MSG_DONTWAIT) != 2, "send MSG_DONTWAIT");
	struct pollfd p = {s, POLLIN, 0};
	FAILIF(poll(&p, 1, 10000) != 1, "poll");
	FAILIF(recv(s, b, sizeof b, MSG_DONTWAIT) != 2 || memcmp(b, "hi", 2), "recv MSG_DONTWAIT");
	FAILIF(fcntl(s, F_GETFL) & O_NONBLOCK, "the descriptor became non-blocking");
	rc = 0;
out:
	xclose(&s);
	return rc;
}

/* shutdown(SHUT_WR): the peer reads EOF and still answers; writing is EPIPE. */
static int c_half_close(char *why)
{
	int rc = -1, s = dial("sink", 0, why);
	if (s < 0)
		return -1;
	uint64_t off = 0, h = FNV0;
	char b[8];
	FAILIF(send_pat(s, &off, 300000, &h) < 0, "write");
	FAILIF(shutdown(s, SHUT_WR) < 0, "shutdown SHUT_WR");
	errno = 0;
	FAILIF(send(s, "x", 1, MSG_NOSIGNAL) != -1 || errno != EPIPE, "send after SHUT_WR: want EPIPE");
	if (expect_sum(s, off, h, why) < 0)
		goto out;
	FAILIF(read(s, b, sizeof b) != 0, "want EOF after the server closed");
	rc = 0;
out:
	xclose(&s);
	return rc;
}

static void on_sigpipe(int s)
{
	(void)s;
	g_sigpipe++;
}

/* The peer closes: POLLIN|POLLRDHUP, the bytes, EOF; then writes fail with EPIPE and SIGPIPE. */
static int c_peer_close(char *why)
{
	int rc = -1, s = dial("source 10 10 0 close", 0, why);
	if (s < 0)
		return -1;
	unsigned char b[16], want[10];
	fill_pat(want, 0, 10);
	struct pollfd p = {s, POLLIN | POLLRDHUP, 0};
	for (int i = 0; i < 100 && !(p.revents & POLLRDHUP); i++) {
		p.revents = 0;
		FAILIF(poll(&p, 1, 10000) != 1, "poll");
		if (!(p.revents & POLLRDHUP))
			msleep(10);
	}
	FAILIF((p.revents & (POLLIN | POLLRDHUP)) != (POLLIN | POLLRDHUP), "want POLLIN|POLLRDHUP: %#x", p.revents);
	FAILIF(rd_full(s, b, sizeof b) != 10 || memcmp(b, want, 10), "bytes then EOF");
	FAILIF(read(s, b, sizeof b) != 0, "EOF again");
	ssize_t w = 0;
	for (int i = 0; i < 500 && w >= 0; i++) {
		w = send(s, "z", 1, MSG_NOSIGNAL);
		if (w >= 0)
			msleep(10);
	}
	FAILIF(w >= 0 || (errno != EPIPE && errno != ECONNRESET), "writes to a closed peer kept working (%zd)", w);
	int before = g_sigpipe;
	w = write(s, "z", 1);
	FAILIF(w >= 0 || (errno != EPIPE && errno != ECONNRESET), "write: %zd", w);
	FAILIF(errno == EPIPE && g_sigpipe != before + 1, "EPIPE without SIGPIPE");
	rc = 0;
out:
	xclose(&s);
	return rc;
}

static int c_readv_writev(char *why)
{
	int rc = -1, s = dial("echo", 0, why);
	if (s < 0)
		return -1;
	enum { NW = 16, NR = 7 };
	static unsigned char src[NW * 997 * 8], dst[sizeof src];
	struct iovec wv[NW], rv[NR];
	size_t total = 0;
	for (int i = 0; i < NW; i++) {
		wv[i] = (struct iovec){src + total, (size_t)(i * 997 + 1)};
		total += wv[i].iov_len;
	}
	fill_pat(src, 0, total);
	ssize_t w = writev(s, wv, NW);
	FAILIF(w != (ssize_t)total, "writev: %zd of %zu", w, total);
	size_t got = 0;
	while (got < total) {
		/* odd sizes across the iovecs, wrapping whatever came */
		size_t rest = total - got, o = got;
		for (int i = 0; i < NR; i++) {
			size_t k = (size_t)(i * 1511 + 3);
			if (k > rest)
				k = rest;
			rv[i] = (struct iovec){dst + o, k};
			o += k;
			rest -= k;
		}
		ssize_t r = readv(s, rv, NR);
		FAILIF(r <= 0, "readv: %zd after %zu", r, got);
		got += (size_t)r;
	}
	FAILIF(memcmp(src, dst, total), "bytes differ");
	rc = 0;
out:
	xclose(&s);
	return rc;
}

static int c_msg_iov64(char *why)
{
	int rc = -1, s = dial("echo", 0, why);
	if (s < 0)
		return -1;
	enum { NV = 64 };
	static unsigned char src[NV * 200 * 70], dst[sizeof src];
	struct iovec wv[NV], rv[NV];
	size_t total = 0;
	for (int i = 0; i < NV; i++) {
		wv[i] = (struct iovec){src + total, (size_t)(i * 131 + 1)};
		total += wv[i].iov_len;
	}
	fill_pat(src, 0, total);
	struct msghdr m = {0};
	m.msg_iov = wv;
	m.msg_iovlen = NV;
	ssize_t w = sendmsg(s, &m, MSG_NOSIGNAL);
	FAILIF(w != (ssize_t)total, "sendmsg: %zd of %zu", w, total);
	size_t got = 0;
	while (got < total) {
		size_t rest = total - got, o = got;
		for (int i = 0; i < NV; i++) {
			size_t k = (size_t)((NV - i) * 97 + 1);
			if (k > rest)
				k = rest;
			rv[i] = (struct iovec){dst + o, k};
			o += k;
			rest -= k;
		}
		struct sockaddr_storage from;
		char ctl[64];
		struct msghdr r = {0};
		r.msg_name = &from;
		r.msg_namelen = sizeof from;
		r.msg_iov = rv;
		r.msg_iovlen = NV;
		r.msg_control = ctl;
		r.msg_controllen = sizeof ctl;
		r.msg_flags = -1;
		ssize_t n = recvmsg(s, &r, 0);
		FAILIF(n <= 0, "recvmsg: %zd after %zu", n, got);
		FAILIF(r.msg_flags != 0 || r.msg_controllen != 0, "recvmsg: flags %#x controllen %zu", r.msg_flags,
		       (size_t)r.msg_controllen);
		got += (size_t)n;
	}
	FAILIF(memcmp(src, dst, total), "bytes differ");
	rc = 0;
out:
	xclose(&s);
	return rc;
}

static int c_sendfile(char *why)
{
	enum { N = 3 << 20, A = 2 << 20, B = 5 << 19 };
	int rc = -1, f = -1, s = dial("sink", 0, why);
	if (s < 0)
		return -1;
	char path[] = "/tmp/directcalls-sendfile-XXXXXX";
	static unsigned char b[N];
	f = mkstemp(path);
	FAILIF(f < 0, "mkstemp");
	unlink(path);
	fill_pat(b, 0, N);
	FAILIF(wr_all(f, b, N) < 0, "write the file");
	uint64_t h = fnv(FNV0, b, N);
	off_t off = 0;
	while (off < A) {
		ssize_t r = sendfile(s, f, &off, (size_t)(A - off));
		FAILIF(r <= 0, "sendfile with an offset: %zd at %lld", r, (long long)off);
	}
	FAILIF(off != A, "offset %lld, want %d", (long long)off, A);
	FAILIF(lseek(f, A, SEEK_SET) != A, "lseek");
	size_t done = A;
	while (done < B) {
		ssize_t r = sendfile(s, f, NULL, B - done);
		FAILIF(r <= 0, "sendfile from the file position: %zd at %zu", r, done);
		done += (size_t)r;
	}
	FAILIF(lseek(f, 0, SEEK_CUR) != B, "file position %lld, want %d", (long long)lseek(f, 0, SEEK_CUR), B);
	/* what a program built with _FILE_OFFSET_BITS=64 calls */
	off64_t o64 = B;
	while (o64 < N) {
		ssize_t r = sendfile64(s, f, &o64, (size_t)(N - o64));
		FAILIF(r <= 0, "sendfile64: %zd at %lld", r, (long long)o64);
	}
	FAILIF(shutdown(s, SHUT_WR) < 0, "shutdown");
	if (expect_sum(s, N, h, why) < 0)
		goto out;
	rc = 0;
out:
	xclose(&f);
	xclose(&s);
	return rc;
}

/* getsockname/getpeername are the TCP addresses, crossed with the server's view. */
static int c_names(char *why)
{
	int rc = -1, s = dial("names", 0, why);
	if (s < 0)
		return -1;
	struct sockaddr_storage a, b;
	socklen_t al = sizeof a, bl = sizeof b;
	FAILIF(getsockname(s, (void *)&a, &al) < 0, "getsockname");
	FAILIF(getpeername(s, (void *)&b, &bl) < 0, "getpeername");
	char sa[80], sb[80], want[200], line[200];
	addr_str((void *)&a, sa, sizeof sa);
	addr_str((void *)&b, sb, sizeof sb);
	FAILIF(al != sizeof(struct sockaddr_in) || bl != sizeof(struct sockaddr_in), "lengths %u %u", (unsigned)al,
	       (unsigned)bl);
	struct sockaddr_in *pb = (void *)&b;
	FAILIF(pb->sin_family != AF_INET || pb->sin_addr.s_addr != g_srv.sin_addr.s_addr || pb->sin_port != g_srv.sin_port,
	       "getpeername %s, want %s:%d", sb, g_ip, g_port);
	int dom = -1;
	socklen_t l = sizeof dom;
	FAILIF(getsockopt(s, SOL_SOCKET, SO_DOMAIN, &dom, &l) < 0 || dom != AF_INET, "SO_DOMAIN %d", dom);
	FAILIF(rd_line(s, line, sizeof line) < 0, "no line from the server");
	snprintf(want, sizeof want, "local=%s peer=%s len=16,16", sb, sa);
	FAILIF(strcmp(line, want), "server says \"%s\", want \"%s\"", line, want);
	FAILIF(shutdown(s, SHUT_WR) < 0, "shutdown");
	if (expect_sum(s, 0, FNV0, why) < 0)
		goto out;
	rc = 0;
out:
	xclose(&s);
	return rc;
}

/* dup, dup2, dup3, F_DUPFD_CLOEXEC: each copy writes; closing copies is not the last close. */
static int c_dup(char *why)
{
	int rc = -1, s = dial("sink", 0, why), d1 = -1, d2 = -1, d3 = -1, d4 = -1;
	if (s < 0)
		return -1;
	uint64_t off = 0, h = FNV0;
	d1 = dup(s);
	FAILIF(d1 < 0, "dup");
	FAILIF(xclose(&s) < 0, "close the original");
	FAILIF(send_pat(d1, &off, 100000, &h) < 0, "write on dup");
	d2 = dup2(d1, 200);
	FAILIF(d2 != 200, "dup2");
	FAILIF(xclose(&d1) < 0, "close");
	FAILIF(send_pat(d2, &off, 100000, &h) < 0, "write on dup2");
	d3 = dup3(d2, 201, O_CLOEXEC);
	FAILIF(d3 != 201, "dup3");
	FAILIF(!(fcntl(d3, F_GETFD) & FD_CLOEXEC), "dup3 O_CLOEXEC not set");
	FAILIF(fcntl(d2, F_GETFD) & FD_CLOEXEC, "dup2's copy has FD_CLOEXEC");
	d4 = fcntl(d3, F_DUPFD_CLOEXEC, 300);
	FAILIF(d4 < 300, "F_DUPFD_CLOEXEC");
	FAILIF(xclose(&d2) < 0, "close");
	FAILIF(send_pat(d3, &off, 100000, &h) < 0, "write on dup3");
	FAILIF(send_pat(d4, &off, 100000, &h) < 0, "write on F_DUPFD_CLOEXEC");
	FAILIF(xclose(&d3) < 0, "close");
	struct sockaddr_in a;
	socklen_t al = sizeof a;
	FAILIF(getpeername(d4, (void *)&a, &al) < 0 || a.sin_port != g_srv.sin_port, "getpeername on the copy");
	FAILIF(shutdown(d4, SHUT_WR) < 0, "shutdown");
	if (expect_sum(d4, off, h, why) < 0)
		goto out;
	rc = 0;
out:
	xclose(&s);
	xclose(&d1);
	xclose(&d2);
	xclose(&d3);
	xclose(&d4);
	return rc;
}

/* The child does all the I/O; the parent closes its copy at once. */
static int c_fork_child(char *why)
{
	int rc = -1, s = dial("sink", 0, why);
	if (s < 0)
		return -1;
	pid_t p = fork();
	FAILIF(p < 0, "fork");
	if (p == 0) {
		alarm(30);
		uint64_t off = 0, h = FNV0;
		char w[WHYLEN] = "";
		if (send_pat(s, &off, 500000, &h) < 0 || shutdown(s, SHUT_WR) < 0) {
			printf("child: write: %s\n", strerror(errno));
			_exit(1);
		}
		if (expect_sum(s, off, h, w) < 0) {
			printf("child: %s\n", w);
			_exit(1);
		}
		_exit(0);
	}
	xclose(&s); /* not the last close: the child has it */
	if (wait_child(p, why, "child") < 0)
		goto out;
	rc = 0;
out:
	xclose(&s);
	return rc;
}

/* Parent writes, the child writes and exits, the parent writes again and reads the answer. */
static int c_fork_both(char *why)
{
	int rc = -1, s = dial("sink", 0, why);
	if (s < 0)
		return -1;
	uint64_t off = 0, h = FNV0;
	FAILIF(send_pat(s, &off, 200000, &h) < 0, "parent write");
	pid_t p = fork();
	FAILIF(p < 0, "fork");
	if (p == 0) {
		alarm(30);
		_exit(send_pat(s, &off, 300000, &h) < 0 ? 1 : 0);
	}
	if (wait_child(p, why, "child") < 0)
		goto out;
	/* the child's bytes, as it hashed them */
	static unsigned char b[300000];
	fill_pat(b, off, sizeof b);
	h = fnv(h, b, sizeof b);
	off += sizeof b;
	FAILIF(send_pat(s, &off, 100000, &h) < 0, "parent write after the child exited");
	FAILIF(shutdown(s, SHUT_WR) < 0, "shutdown");
	if (expect_sum(s, off, h, why) < 0)
		goto out;
	rc = 0;
out:
	xclose(&s);
	return rc;
}

/* The server execs /bin/sh -c 'exec cat' (no shim) on the connection: exnd relays its side. */
static int c_exec_server(char *why)
{
	enum { N = 300000 };
	int rc = -1, s = dial("exec", 0, why);
	if (s < 0)
		return -1;
	static unsigned char b[N + 1], want[N];
	fill_pat(want, 0, N);
	FAILIF(wr_all(s, want, N) < 0, "write");
	FAILIF(shutdown(s, SHUT_WR) < 0, "shutdown");
	ssize_t r = rd_full(s, b, sizeof b);
	FAILIF(r != N, "cat echoed %zd bytes, want %d", r, N);
	FAILIF(memcmp(b, want, N), "cat echoed other bytes");
	rc = 0;
out:
	xclose(&s);
	return rc;
}

/* A child execs /bin/sh (no shim) with the connection as stdout; the
 * parent keeps using it (now relayed by exnd) and reads the answer. */
static int c_exec_client(char *why)
{
	static const char msg[] = "written-by-an-exec-without-the-shim";
	int rc = -1, s = dial("sink", 0, why);
	if (s < 0)
		return -1;
	uint64_t off = 0, h = FNV0;
	FAILIF(send_pat(s, &off, 100000, &h) < 0, "write before the exec");
	fflush(stdout);
	pid_t p = fork();
	FAILIF(p < 0, "fork");
	if (p == 0) {
		alarm(30);
		if (dup2(s, 1) < 0)
			_exit(2);
		unsetenv("LD_PRELOAD");
		execl("/bin/sh", "sh", "-c", "printf '%s' \"$0\"", msg, (char *)NULL);
		_exit(3);
	}
	if (wait_child(p, why, "exec'd child") < 0)
		goto out;
	h = fnv(h, msg, sizeof msg - 1);
	off += sizeof msg - 1;
	/* the pattern continues at off: the sink hashes the stream */
	FAILIF(send_pat(s, &off, 100000, &h) < 0, "write after the exec");
	FAILIF(shutdown(s, SHUT_WR) < 0, "shutdown");
	if (expect_sum(s, off, h, why) < 0)
		goto out;
	rc = 0;
out:
	xclose(&s);
	return rc;
}

/* splice from a pipe into the connection (the pipe filled from a file,
 * splice's "from a file"), and from the connection into a pipe. */
static int c_splice(char *why)
{
	enum { N = 1 << 20 };
	int rc = -1, f = -1, pp[2] = {-1, -1}, s = dial("sink", 0, why), s2 = -1;
	if (s < 0)
		return -1;
	char path[] = "/tmp/directcalls-splice-XXXXXX";
	static unsigned char b[N], got[N];
	f = mkstemp(path);
	FAILIF(f < 0, "mkstemp");
	unlink(path);
	fill_pat(b, 0, N);
	FAILIF(wr_all(f, b, N) < 0, "write the file");
	FAILIF(pipe2(pp, O_CLOEXEC) < 0, "pipe");
	loff_t off = 0;
	size_t done = 0;
	while (done < N) {
		ssize_t k = splice(f, &off, pp[1], NULL, 65536, 0); /* file -> pipe: the kernel's */
		FAILIF(k <= 0, "splice file -> pipe: %zd", k);
		while (k > 0) {
			ssize_t r = splice(pp[0], NULL, s, NULL, (size_t)k, 0);
			FAILIF(r <= 0, "splice pipe -> connection: %zd at %zu", r, done);
			k -= r;
			done += (size_t)r;
		}
	}
	loff_t o = 0;
	errno = 0;
	FAILIF(splice(pp[0], NULL, s, &o, 1, SPLICE_F_NONBLOCK) != -1 || errno != EINVAL, "an offset on the socket: want EINVAL");
	errno = 0;
	FAILIF(splice(pp[0], &o, s, NULL, 1, SPLICE_F_NONBLOCK) != -1 || errno != ESPIPE, "an offset on the pipe: want ESPIPE");
	errno = 0;
	FAILIF(splice(f, NULL, s, NULL, 1, 0) != -1 || errno != EINVAL, "no pipe on either side: want EINVAL");
	FAILIF(shutdown(s, SHUT_WR) < 0, "shutdown");
	if (expect_sum(s, N, fnv(FNV0, b, N), why) < 0)
		goto out;
	/* connection -> pipe */
	s2 = dial("source 1048576 65536 0", 0, why);
	if (s2 < 0)
		goto out;
	done = 0;
	while (done < N) {
		ssize_t k = splice(s2, NULL, pp[1], NULL, N - done, 0);
		FAILIF(k <= 0, "splice connection -> pipe: %zd at %zu", k, done);
		FAILIF(rd_full(pp[0], got + done, (size_t)k) != k, "read the pipe");
		done += (size_t)k;
	}
	FAILIF(memcmp(got, b, N), "bytes spliced out of the connection differ");
	errno = 0;
	FAILIF(splice(s2, NULL, pp[1], NULL, 1, SPLICE_F_NONBLOCK) != -1 || errno != EAGAIN,
	       "SPLICE_F_NONBLOCK with nothing there: want EAGAIN");
	rc = 0;
out:
	xclose(&f);
	xclose(&pp[0]);
	xclose(&pp[1]);
	xclose(&s);
	xclose(&s2);
	return rc;
}

/* On a full ring with O_NONBLOCK, sendfile, sendfile64 and splice say
 * EAGAIN and take nothing (through V they would succeed: bytes behind
 * the ring's back); once the peer reads, they move the rest. */
static int c_full_ring_nb(char *why)
{
	enum { N = 200000 };
	pid_t pid = 0;
	int rc = -1, f = -1, pp[2] = {-1, -1}, s = dial_fill(&pid, why), n = -1;
	if (s < 0)
		return -1;
	uint64_t off = 0, h = FNV0;
	char path[] = "/tmp/directcalls-full-XXXXXX";
	static unsigned char b[N];
	f = mkstemp(path);
	FAILIF(f < 0, "mkstemp");
	unlink(path);
	FAILIF(pipe2(pp, O_CLOEXEC) < 0, "pipe");
	FAILIF(fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK) < 0, "O_NONBLOCK");
	if (fill_ring(s, &off, &h, why) < 0)
		goto out;
	fill_pat(b, off, N);
	FAILIF(wr_all(f, b, N) < 0, "write the file");
	FAILIF(wr_all(pp[1], "0123456789", 10) < 0, "write the pipe");
	off_t o = 0;
	off64_t o64 = 0;
	errno = 0;
	FAILIF(sendfile(s, f, &o, N) != -1 || errno != EAGAIN || o != 0, "sendfile on a full ring: want EAGAIN");
	errno = 0;
	FAILIF(sendfile64(s, f, &o64, N) != -1 || errno != EAGAIN || o64 != 0, "sendfile64 on a full ring: want EAGAIN");
	errno = 0;
	FAILIF(splice(pp[0], NULL, s, NULL, 10, 0) != -1 || errno != EAGAIN, "splice on a full ring: want EAGAIN");
	FAILIF(ioctl(pp[0], FIONREAD, &n) < 0 || n != 10, "the pipe lost bytes: %d left", n);
	FAILIF(kill(pid, SIGUSR1) < 0, "kill server %d", pid);
	FAILIF(fcntl(s, F_SETFL, fcntl(s, F_GETFL) & ~O_NONBLOCK) < 0, "clear O_NONBLOCK");
	while (o64 < N) {
		ssize_t r = sendfile64(s, f, &o64, (size_t)(N - o64));
		FAILIF(r <= 0, "sendfile64: %zd at %lld", r, (long long)o64);
	}
	h = fnv(h, b, N);
	off += N;
	FAILIF(splice(pp[0], NULL, s, NULL, 10, 0) != 10, "splice after the peer read");
	h = fnv(h, "0123456789", 10);
	off += 10;
	FAILIF(shutdown(s, SHUT_WR) < 0, "shutdown");
	if (expect_sum(s, off, h, why) < 0)
		goto out;
	rc = 0;
out:
	xclose(&f);
	xclose(&pp[0]);
	xclose(&pp[1]);
	xclose(&s);
	return rc;
}

static char g_self[PATH_MAX];
/* Descriptors above 2 the client inherited at its start (from whatever
 * ran it): fdcheck allows them. */
static char g_startfds[256];

/* A SOCK_CLOEXEC connection is not handed to exnd and is closed in the
 * new program; this process keeps using it directly. */
static int c_cloexec(char *why)
{
	int rc = -1, s = dial("sink", SOCK_CLOEXEC, why);
	if (s < 0)
		return -1;
	uint64_t off = 0, h = FNV0;
	FAILIF(!(fcntl(s, F_GETFD) & FD_CLOEXEC), "FD_CLOEXEC not set");
	FAILIF(send_pat(s, &off, 100000, &h) < 0, "write");
	fflush(stdout);
	pid_t p = fork();
	FAILIF(p < 0, "fork");
	if (p == 0) {
		char n[16];
		snprintf(n, sizeof n, "%d", s);
		unsetenv("LD_PRELOAD");
		execl(g_self, "directcalls", "fdcheck", n, g_startfds, (char *)NULL);
		_exit(3);
	}
	if (wait_child(p, why, "fdcheck") < 0)
		goto out;
	int before = ndirect();
	FAILIF(before < 1, "the connection buffer is no longer mapped");
	FAILIF(send_pat(s, &off, 100000, &h) < 0, "write after the exec");
	FAILIF(shutdown(s, SHUT_WR) < 0, "shutdown");
	if (expect_sum(s, off, h, why) < 0)
		goto out;
	rc = 0;
out:
	xclose(&s);
	return rc;
}


static void note_start_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return;
	struct dirent *e;
	size_t n = 0;
	while ((e = readdir(d))) {
		int fd = atoi(e->d_name);
		if (e->d_name[0] == '.' || fd <= 2 || fd == dirfd(d))
			continue;
		int k = snprintf(g_startfds + n, sizeof g_startfds - n, "%s%d", n ? "," : "", fd);
		if (k < 0 || (size_t)k >= sizeof g_startfds - n)
			break;
		n += (size_t)k;
	}
	closedir(d);
}

static int allowed(const char *list, int fd)
{
	char buf[256];
	snprintf(buf, sizeof buf, "%s", list ? list : "");
	for (char *t = strtok(buf, ","); t; t = strtok(NULL, ","))
		if (atoi(t) == fd)
			return 1;
	return 0;
}

static int fdcheck(int fd, const char *allow)
{
	int bad = 0;
	if (fd >= 0 && fcntl(fd, F_GETFD) >= 0) {
		printf("fdcheck: descriptor %d is open in the new program\n", fd);
		bad = 1;
	}
	DIR *d = opendir("/proc/self/fd");
	if (!d) {
		perror("fdcheck: /proc/self/fd");
		return 1;
	}
	struct dirent *e;
	while ((e = readdir(d))) {
		int n = atoi(e->d_name);
		if (e->d_name[0] == '.' || n <= 2 || n == dirfd(d) || allowed(allow, n))
			continue;
		char p[64], t[256] = "?";
		snprintf(p, sizeof p, "/proc/self/fd/%d", n);
		ssize_t k = readlink(p, t, sizeof t - 1);
		if (k >= 0)
			t[k] = 0;
		printf("fdcheck: descriptor %d (%s) leaked into the new program\n", n, t);
		bad = 1;
	}
	closedir(d);
	fflush(stdout);
	return bad;
}

struct check {
	const char *name;
	int (*f)(char *why);
};

static const struct check g_checks[] = {
	{"nb-connect", c_nb_connect},
	{"nb-connect-refused", c_nb_connect_refused},
	{"rcvtimeo", c_rcvtimeo},
	{"sndtimeo", c_sndtimeo},
	{"msg-peek", c_msg_peek},
	{"msg-waitall", c_msg_waitall},
	{"msg-dontwait", c_msg_dontwait},
	{"fionread", c_fionread},
	{"half-close", c_half_close},
	{"peer-close", c_peer_close},
	{"readv-writev", c_readv_writev},
	{"msg-iov64", c_msg_iov64},
	{"sendfile", c_sendfile},
	{"splice", c_splice},
	{"full-ring-nb", c_full_ring_nb},
	{"names", c_names},
	{"dup", c_dup},
	{"fork-child", c_fork_child},
	{"fork-both", c_fork_both},
	{"exec-server", c_exec_server},
	{"exec-client", c_exec_client},
	{"cloexec", c_cloexec},
	{"pollin-poll", c_pollin_poll},
	{"pollin-select", c_pollin_select},
	{"pollout-poll", c_pollout_poll},
	{"pollout-select", c_pollout_select},
	{"pollout-epoll", c_pollout_epoll},
	{"epoll-lt", c_epoll_lt},
	{"epoll-et", c_epoll_et},
	{"epoll-oneshot", c_epoll_oneshot},
};

static void on_alarm(int s)
{
	(void)s;
	char line[200];
	int n = snprintf(line, sizeof line, "FAIL %s: timed out (alarm)\n", g_check);
	if (write(1, line, (size_t)n) < 0)
		_exit(2);
	_exit(1);
}

static int client(int argc, char **argv)
{
	ssize_t k = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
	if (k < 0) {
		perror("readlink /proc/self/exe");
		return 1;
	}
	g_self[k] = 0;
	note_start_fds();
	struct sigaction sa = {0};
	sa.sa_handler = on_sigpipe;
	sigaction(SIGPIPE, &sa, NULL);
	int bad = 0;
	size_t nc = sizeof g_checks / sizeof g_checks[0];
	for (size_t i = 0; i < nc; i++) {
		if (argc > 0) {
			int want = 0;
			for (int j = 0; j < argc; j++)
				want |= !strcmp(argv[j], g_checks[i].name);
			if (!want)
				continue;
		}
		char why[WHYLEN] = "";
		g_check = g_checks[i].name;
		alarm(60);
		int r = g_checks[i].f(why);
		alarm(0);
		if (r == 0)
			printf("ok %s\n", g_check);
		else if (r > 0)
			printf("limit %s: %s\n", g_check, why);
		else {
			printf("FAIL %s: %s\n", g_check, why);
			bad = 1;
		}
		fflush(stdout);
	}
	printf("conns %d\n", g_conns);
	char why[WHYLEN];
	g_check = "quit";
	alarm(30);
	int q = dial("quit", 0, why);
	if (q < 0) {
		printf("FAIL quit: %s\n", why);
		return 1;
	}
	close(q);
	printf("quit\n");
	return bad;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if ((argc == 3 || argc == 4) && !strcmp(argv[1], "fdcheck"))
		return fdcheck(atoi(argv[2]), argc == 4 ? argv[3] : NULL);
	if (argc < 4 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
		fprintf(stderr, "usage: directcalls server|client IP PORT [CHECK...] | fdcheck FD\n");
		return 2;
	}
	g_ip = argv[2];
	g_port = atoi(argv[3]);
	g_srv.sin_family = AF_INET;
	g_srv.sin_port = htons((uint16_t)g_port);
	if (inet_pton(AF_INET, g_ip, &g_srv.sin_addr) != 1) {
		fprintf(stderr, "directcalls: bad address %s\n", g_ip);
		return 2;
	}
	struct sigaction sa = {0};
	sa.sa_handler = on_alarm;
	sigaction(SIGALRM, &sa, NULL);
	sa.sa_handler = on_usr1;
	sigaction(SIGUSR1, &sa, NULL);
	if (!strcmp(argv[1], "server"))
		return server();
	return client(argc - 4, argv + 4);
}

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
 * The checks are in directcalls_data.c and directcalls_ready.c
 * (#included here: one test program, one compilation unit).
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

#include "addr.h"
#include "testutil.h"

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

static int64_t now_ms(void) { return now_ns() / 1000000; }

static void msleep(int ms)
{
	struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&t, &t) < 0 && errno == EINTR)
		;
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

/* "IP:PORT/FAMILY" (addr_str of addr.h with the family). */
static void addr_fam_str(const struct sockaddr *sa, char *buf, size_t n)
{
	char ipport[INET6_ADDRSTRLEN + 8];
	addr_str(sa, ipport, sizeof ipport);
	snprintf(buf, n, "%s/%d", ipport, sa->sa_family);
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
		addr_fam_str((void *)&a, sa, sizeof sa);
		addr_fam_str((void *)&b, sb, sizeof sb);
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

/* In a check (why in scope): if cond, why says what (printf-style), with
 * errno and the line, and the check returns -1. Descriptors and buffers a
 * check holds are declared AUTOCLOSE, AUTOCLOSE_PIPE or AUTOFREE: they
 * are released on every return. */
#define FAILIF(cond, ...)                                                                                              \
	do {                                                                                                           \
		if (cond) {                                                                                            \
			int e_ = errno;                                                                                \
			int k_ = snprintf(why, WHYLEN, __VA_ARGS__);                                                   \
			if (k_ >= 0 && k_ < WHYLEN)                                                                    \
				snprintf(why + k_, (size_t)(WHYLEN - k_), " [errno %s, line %d]", strerror(e_), __LINE__); \
			return -1;                                                                                     \
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

static void xclose_pipe(int (*pp)[2])
{
	xclose(&(*pp)[0]);
	xclose(&(*pp)[1]);
}

static void xfree(unsigned char **p) { free(*p); }

#define AUTOCLOSE __attribute__((cleanup(xclose)))
#define AUTOCLOSE_PIPE __attribute__((cleanup(xclose_pipe)))
#define AUTOFREE __attribute__((cleanup(xfree)))

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

/* Shut down writing to the sink on fd and check its answer for n bytes
 * hashing to h. */
static int shut_sum(int fd, uint64_t n, uint64_t h, char *why)
{
	if (shutdown(fd, SHUT_WR) < 0) {
		snprintf(why, WHYLEN, "shutdown: %s", strerror(errno));
		return -1;
	}
	return expect_sum(fd, n, h, why);
}

/* Echo round trip of n pattern bytes at offset off through fd. */
static int echo_check(int fd, uint64_t off, size_t n, char *why)
{
	unsigned char *b AUTOFREE = malloc(n), *want AUTOFREE = malloc(n);
	fill_pat(want, off, n);
	FAILIF(wr_all(fd, want, n) < 0, "write");
	FAILIF(rd_full(fd, b, n) != (ssize_t)n, "echo short");
	FAILIF(memcmp(b, want, n) != 0, "echo differs");
	return 0;
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

#include "directcalls_data.c"
#include "directcalls_ready.c"

/* A check: f, or, for one on a single connection, on with that connection
 * dialed in mode dial (dial's socket type flags type) and closed after it. */
struct check {
	const char *name;
	int (*f)(char *why);
	int (*on)(int s, char *why);
	const char *dial;
	int type;
};

static int run_check(const struct check *c, char *why)
{
	if (!c->on)
		return c->f(why);
	int s = dial(c->dial, c->type, why);
	if (s < 0)
		return -1;
	int r = c->on(s, why);
	xclose(&s);
	return r;
}

static const struct check g_checks[] = {
	{"nb-connect", .f = c_nb_connect},
	{"nb-connect-refused", .f = c_nb_connect_refused},
	{"rcvtimeo", .on = c_rcvtimeo, .dial = "echo"},
	{"sndtimeo", .f = c_sndtimeo},
	{"msg-peek", .on = c_msg_peek, .dial = "source 1000 1000 0"},
	{"msg-waitall", .f = c_msg_waitall},
	{"msg-dontwait", .on = c_msg_dontwait, .dial = "echo"},
	{"fionread", .on = c_fionread, .dial = "source 12345 12345 0"},
	{"half-close", .on = c_half_close, .dial = "sink"},
	{"peer-close", .on = c_peer_close, .dial = "source 10 10 0 close"},
	{"readv-writev", .on = c_readv_writev, .dial = "echo"},
	{"msg-iov64", .on = c_msg_iov64, .dial = "echo"},
	{"sendfile", .f = c_sendfile},
	{"splice", .f = c_splice},
	{"full-ring-nb", .f = c_full_ring_nb},
	{"names", .on = c_names, .dial = "names"},
	{"dup", .f = c_dup},
	{"fork-child", .f = c_fork_child},
	{"fork-both", .on = c_fork_both, .dial = "sink"},
	{"fork-rw", .f = c_fork_rw},
	{"exec-server", .f = c_exec_server},
	{"exec-client", .f = c_exec_client},
	{"cloexec", .on = c_cloexec, .dial = "sink", .type = SOCK_CLOEXEC},
	{"pollin-poll", .f = c_pollin_poll},
	{"pollin-select", .f = c_pollin_select},
	{"pollout-poll", .f = c_pollout_poll},
	{"pollout-select", .f = c_pollout_select},
	{"pollout-epoll", .f = c_pollout_epoll},
	{"epoll-lt", .on = c_epoll_lt, .dial = "echo 50"},
	{"epoll-et", .on = c_epoll_et, .dial = "echo 50"},
	{"epoll-oneshot", .on = c_epoll_oneshot, .dial = "echo 50"},
	{"et-bursts", .on = c_et_bursts, .dial = "sink"},
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
		int r = run_check(&g_checks[i], why);
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

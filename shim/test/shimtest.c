/*
 * shimtest: a small TCP client and server for the libextds.so tests.
 *
 *   shimtest server IP PORT COUNT [fork]
 *       listen on IP:PORT, serve COUNT connections (each in a forked child
 *       with "fork"): read to EOF, answer "bytes=N sum=X kernel=K peer=P\n".
 *   shimtest par N IP PORT BYTES
 *       N clients at once, one per thread, half of them "nb".
 *   shimtest banner IP PORT
 *       a server that speaks first, until killed: for each connection
 *       write "220 banner\r\n", read until EOF or "QUIT", close.
 *   shimtest bannerc IP PORT SECS
 *       for SECS seconds, one short connection after another to a banner
 *       server: read the banner, send "QUIT\r\n", close. Prints
 *       "ok conns=N" and exits 0 when every banner was exact.
 *   shimtest client IP PORT BYTES [nb]
 *       connect (non-blocking, through epoll registered before connect,
 *       with "nb"), send BYTES of a pattern, shut down writing, read the
 *       answer; dup the socket and check its state on the copy. Prints
 *       "ok bytes=N kernel=K server-kernel=K ..." and exits 0 when the
 *       server saw exactly what was sent.
 *
 * "kernel" is what the kernel itself says the descriptor is (a raw
 * syscall the shim cannot see): "unix" when the shim switched it to
 * exnd's AF_UNIX end, "inet" when it stayed TCP.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "addr.h"

static void die(const char *what)
{
	fprintf(stderr, "shimtest: %s: %s\n", what, strerror(errno));
	exit(1);
}

static const char *kernel_kind(int fd)
{
	int v = 0;
	socklen_t l = sizeof v;
	if (syscall(SYS_getsockopt, fd, SOL_SOCKET, SO_DOMAIN, &v, &l) < 0)
		return "error";
	return v == AF_UNIX ? "unix" : (v == AF_INET || v == AF_INET6) ? "inet" : "other";
}

static uint64_t fnv(uint64_t h, const unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 1099511628211ULL;
	return h;
}

static int make_addr(const char *ip, int port, struct sockaddr_storage *ss, socklen_t *len)
{
	memset(ss, 0, sizeof *ss);
	struct sockaddr_in *a = (void *)ss;
	struct sockaddr_in6 *a6 = (void *)ss;
	if (inet_pton(AF_INET, ip, &a->sin_addr) == 1) {
		a->sin_family = AF_INET;
		a->sin_port = htons(port);
		*len = sizeof *a;
		return AF_INET;
	}
	if (inet_pton(AF_INET6, ip, &a6->sin6_addr) == 1) {
		a6->sin6_family = AF_INET6;
		a6->sin6_port = htons(port);
		*len = sizeof *a6;
		return AF_INET6;
	}
	fprintf(stderr, "shimtest: bad address %s\n", ip);
	exit(2);
}

static void serve(int c)
{
	unsigned char buf[65536];
	uint64_t h = 14695981039346656037ULL, total = 0;
	for (;;) {
		ssize_t n = read(c, buf, sizeof buf);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("server read");
		if (n == 0)
			break;
		h = fnv(h, buf, (size_t)n);
		total += (uint64_t)n;
	}
	struct sockaddr_storage ps;
	socklen_t pl = sizeof ps;
	char peer[80] = "?";
	if (getpeername(c, (struct sockaddr *)&ps, &pl) == 0)
		addr_str(&ps, peer, sizeof peer);
	char line[256];
	int m = snprintf(line, sizeof line, "bytes=%llu sum=%016llx kernel=%s peer=%s\n", (unsigned long long)total,
			 (unsigned long long)h, kernel_kind(c), peer);
	if (write(c, line, (size_t)m) != m)
		die("server write");
	fputs(line, stdout);
	fflush(stdout);
	close(c);
}

static int server(const char *ip, int port, int count, int forking)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int fam = make_addr(ip, port, &ss, &len);
	int l = socket(fam, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (l < 0)
		die("socket");
	int one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(l, (struct sockaddr *)&ss, len) < 0)
		die("bind");
	if (listen(l, 64) < 0)
		die("listen");
	printf("listening\n");
	fflush(stdout);
	for (int i = 0; i < count; i++) {
		int c = accept4(l, NULL, NULL, SOCK_CLOEXEC);
		if (c < 0) {
			if (errno == EINTR || errno == ECONNABORTED) {
				i--;
				continue;
			}
			die("accept");
		}
		if (!forking) {
			serve(c);
			continue;
		}
		pid_t p = fork();
		if (p < 0)
			die("fork");
		if (p == 0) {
			close(l);
			serve(c);
			_exit(0);
		}
		close(c);
	}
	close(l);
	int st, bad = 0;
	while (wait(&st) > 0)
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
			bad = 1;
	return bad;
}

static void wait_ev(int ep, int fd, uint32_t want)
{
	struct epoll_event ev;
	for (;;) {
		int n = epoll_wait(ep, &ev, 1, 5000);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("epoll_wait");
		if (n == 0) {
			fprintf(stderr, "shimtest: epoll_wait: no event in 5 s (registration lost?)\n");
			exit(1);
		}
		if ((int)ev.data.fd == fd && (ev.events & (want | EPOLLERR | EPOLLHUP)))
			return;
	}
}

/* io_again says whether to try a read or write that returned r again: after
 * EINTR, or after EAGAIN on a non-blocking socket (nb) once ep reports want
 * for fd. */
static int io_again(ssize_t r, int nb, int ep, int fd, uint32_t want)
{
	if (r >= 0)
		return 0;
	if (errno == EINTR)
		return 1;
	if (errno == EAGAIN && nb) {
		wait_ev(ep, fd, want);
		return 1;
	}
	return 0;
}

static int client(const char *ip, int port, long long bytes, int nb)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int fam = make_addr(ip, port, &ss, &len);
	int s = socket(fam, SOCK_STREAM, 0);
	if (s < 0)
		die("socket");
	int one = 1;
	setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	int ep = -1;
	if (nb) {
		fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
		ep = epoll_create1(EPOLL_CLOEXEC);
		struct epoll_event ev = {.events = EPOLLOUT, .data.fd = s};
		if (epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) < 0)
			die("epoll_ctl");
	}
	if (connect(s, (struct sockaddr *)&ss, len) < 0) {
		if (errno != EINPROGRESS)
			die("connect");
		wait_ev(ep, s, EPOLLOUT);
		int err = 0;
		socklen_t l = sizeof err;
		getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &l);
		if (err) {
			errno = err;
			die("connect (async)");
		}
	}
	if (nb && !(fcntl(s, F_GETFL) & O_NONBLOCK)) {
		fprintf(stderr, "shimtest: O_NONBLOCK lost\n");
		return 1;
	}
	/* Work on a copy: the dup family must carry the shim's state. */
	int d = fcntl(s, F_DUPFD_CLOEXEC, 100);
	if (d < 0)
		die("dup");
	if (nb) {
		/* The registration follows the open file, which d shares. */
	}
	unsigned char buf[65536];
	uint64_t h = 14695981039346656037ULL;
	long long sent = 0;
	while (sent < bytes) {
		size_t n = sizeof buf;
		if ((long long)n > bytes - sent)
			n = (size_t)(bytes - sent);
		for (size_t i = 0; i < n; i++)
			buf[i] = (unsigned char)((sent + (long long)i) * 7 + ((sent + (long long)i) >> 13));
		size_t off = 0;
		while (off < n) {
			ssize_t w = write(s, buf + off, n - off);
			if (io_again(w, nb, ep, s, EPOLLOUT))
				continue;
			if (w < 0)
				die("write");
			off += (size_t)w;
		}
		h = fnv(h, buf, n);
		sent += (long long)n;
	}
	if (shutdown(s, SHUT_WR) < 0)
		die("shutdown");
	if (nb) {
		struct epoll_event ev = {.events = EPOLLIN, .data.fd = s};
		if (epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev) < 0)
			die("epoll_ctl mod");
	}
	char ans[512];
	size_t got = 0;
	for (;;) {
		ssize_t n = read(s, ans + got, sizeof ans - 1 - got);
		if (io_again(n, nb, ep, s, EPOLLIN))
			continue;
		if (n < 0)
			die("read");
		if (n == 0 || got + (size_t)n >= sizeof ans - 1) {
			got += (size_t)(n > 0 ? n : 0);
			break;
		}
		got += (size_t)n;
	}
	ans[got] = 0;
	char *nl = strchr(ans, '\n');
	if (nl)
		*nl = 0;
	char want[64];
	snprintf(want, sizeof want, "bytes=%lld sum=%016llx ", sent, (unsigned long long)h);
	close(s);

	/* State on the copy after the original is closed. */
	struct sockaddr_storage ps, ls;
	socklen_t pl = sizeof ps, ll = sizeof ls;
	char peer[80] = "?", local[80] = "?";
	if (getpeername(d, (struct sockaddr *)&ps, &pl) == 0)
		addr_str(&ps, peer, sizeof peer);
	if (getsockname(d, (struct sockaddr *)&ls, &ll) == 0)
		addr_str(&ls, local, sizeof local);
	struct tcp_info ti;
	socklen_t tl = sizeof ti;
	memset(&ti, 0, sizeof ti);
	int tst = getsockopt(d, IPPROTO_TCP, TCP_INFO, &ti, &tl);
	char cc[16] = "";
	socklen_t cl = sizeof cc;
	getsockopt(d, IPPROTO_TCP, TCP_CONGESTION, cc, &cl);
	int nd = 0, dom = 0;
	socklen_t il = sizeof nd;
	getsockopt(d, IPPROTO_TCP, TCP_NODELAY, &nd, &il);
	il = sizeof dom;
	getsockopt(d, SOL_SOCKET, SO_DOMAIN, &dom, &il);
	const char *sk = strstr(ans, "kernel=");
	char skind[16] = "?";
	if (sk)
		sscanf(sk, "kernel=%15s", skind);
	int ok = strncmp(ans, want, strlen(want)) == 0;
	printf("%s bytes=%lld kernel=%s server-kernel=%s peer=%s local=%s tcpi_state=%d info=%d cc=%s nodelay=%d domain=%s\n",
	       ok ? "ok" : "MISMATCH", sent, kernel_kind(d), skind, peer, local, ti.tcpi_state, tst, cc, nd,
	       dom == AF_INET ? "inet" : dom == AF_INET6 ? "inet6" : "other");
	if (!ok)
		printf("want %s\ngot  %s\n", want, ans);
	close(d);
	return ok ? 0 : 1;
}

#define BANNER "220 banner\r\n"

static _Noreturn void banner(const char *ip, int port)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int fam = make_addr(ip, port, &ss, &len);
	int l = socket(fam, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int one = 1;
	if (l < 0 || setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
	    bind(l, (struct sockaddr *)&ss, len) < 0 || listen(l, 128) < 0)
		die("banner listen");
	printf("listening\n");
	fflush(stdout);
	for (;;) {
		int c = accept(l, NULL, NULL);
		if (c < 0) {
			if (errno == EINTR)
				continue;
			die("banner accept");
		}
		if (write(c, BANNER, strlen(BANNER)) != (ssize_t)strlen(BANNER))
			die("banner write");
		char buf[64];
		ssize_t n;
		while ((n = read(c, buf, sizeof buf)) > 0 && !memmem(buf, (size_t)n, "QUIT", 4))
			;
		close(c);
	}
}

static int bannerc(const char *ip, int port, int secs)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int fam = make_addr(ip, port, &ss, &len);
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	long conns = 0;
	do {
		int c = socket(fam, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (c < 0 || connect(c, (struct sockaddr *)&ss, len) < 0)
			die("bannerc connect");
		char buf[64];
		size_t got = 0;
		while (got < strlen(BANNER)) {
			ssize_t n = read(c, buf + got, strlen(BANNER) - got);
			if (n <= 0)
				die("bannerc read");
			got += (size_t)n;
		}
		if (memcmp(buf, BANNER, strlen(BANNER)) != 0) {
			printf("MISMATCH banner %.*s\n", (int)got, buf);
			return 1;
		}
		if (write(c, "QUIT\r\n", 6) != 6)
			die("bannerc write");
		close(c);
		conns++;
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while (t.tv_sec - t0.tv_sec < secs);
	printf("ok conns=%ld\n", conns);
	return 0;
}

struct par {
	const char *ip;
	int port, nb, rc;
	long long bytes;
};

static void *par_run(void *arg)
{
	struct par *p = arg;
	p->rc = client(p->ip, p->port, p->bytes, p->nb);
	return NULL;
}

static int par(int n, const char *ip, int port, long long bytes)
{
	struct par ps[64];
	pthread_t th[64];
	if (n > 64)
		n = 64;
	for (int i = 0; i < n; i++) {
		ps[i] = (struct par){ip, port, i & 1, 0, bytes};
		if (pthread_create(&th[i], NULL, par_run, &ps[i]) != 0)
			die("pthread_create");
	}
	int bad = 0;
	for (int i = 0; i < n; i++) {
		pthread_join(th[i], NULL);
		bad |= ps[i].rc;
	}
	return bad;
}

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	if (argc >= 5 && !strcmp(argv[1], "server"))
		return server(argv[2], atoi(argv[3]), atoi(argv[4]), argc > 5 && !strcmp(argv[5], "fork"));
	if (argc >= 5 && !strcmp(argv[1], "client"))
		return client(argv[2], atoi(argv[3]), atoll(argv[4]), argc > 5 && !strcmp(argv[5], "nb"));
	if (argc >= 6 && !strcmp(argv[1], "par"))
		return par(atoi(argv[2]), argv[3], atoi(argv[4]), atoll(argv[5]));
	if (argc >= 4 && !strcmp(argv[1], "banner"))
		banner(argv[2], atoi(argv[3]));
	if (argc >= 5 && !strcmp(argv[1], "bannerc"))
		return bannerc(argv[2], atoi(argv[3]), atoi(argv[4]));
	fprintf(stderr, "usage: shimtest server IP PORT COUNT [fork] | client IP PORT BYTES [nb] | par N IP PORT BYTES | banner IP PORT | bannerc IP PORT SECS\n");
	return 2;
}

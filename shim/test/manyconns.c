/*
 * manyconns: many concurrent connections through libextds.so (issue #32,
 * integration/scale_test.go, perf/shim-scale.sh).
 *
 *   manyconns server IP PORT N   epoll (level-triggered) echo server; exits
 *                                once N connections came and all closed
 *   manyconns client IP PORT N R [P]
 *                                opens N connections, then R rounds of a
 *                                16-byte echo on each, checked by content,
 *                                then P timed 16-byte ping-pongs on the
 *                                first while the others stay idle
 *
 * Both print one line of counts that the caller parses:
 *
 *   server accepted A emfile E switched S epoll_err P
 *   client conns C emfile E switched S bad B fds_base F0 fds_open F1
 *
 * "switched": connections whose descriptor the kernel calls AF_UNIX (a
 * raw getsockopt the shim does not see): EXT-DS, direct or relayed.
 * emfile counts EMFILE and ENFILE from socket, connect and accept. fds_*
 * are the entries of /proc/self/fd before the first connection and with
 * all C open: what the program's descriptors cost. Then
 *
 *   client_end direct D fds F   server_end direct D
 *
 * D: connections whose descriptor was AF_UNIX at the end (the client's
 * after its rounds, the server's at its close: those the shim's upgrade
 * moved after they started as TCP count here, not in "switched"), F the
 * client's /proc/self/fd then. With P > 0 also
 *
 *   pingpong n P p50_ns X p99_ns Y
 *
 * and for each pid in $MANYCONNS_WATCH (space-separated, e.g. the exnds)
 * and for /dev/shm, before the first connection and with all open:
 *
 *   watch PID fds F0 F1 rss_kib R0 R1
 *   shm used_kib U0 U1
 *
 * and, once the client closed every connection, the same when the
 * watched descriptors and RSS and /dev/shm are back within 10 % of where
 * they started, or after SETTLE_MS (T: how long it took; the server closes
 * its ends as it reads their EOFs, and exnd its own after that):
 *
 *   watch_after PID fds F2 rss_kib R2
 *   shm_after used_kib U2 ms T
 *
 * With $MANYCONNS_BULK=B (and a watch), before the close every
 * connection echoes B more bytes at once, /dev/shm is read (U3), and
 * then every 250 ms until it is back within 10 % of U1 or after
 * SETTLE_MS (T): rings that grow with traffic and shrink when idle.
 *
 *   bulk bytes B used_kib U3 idle_kib U4 ms T
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

/* Entries of /proc/PID/fd (pid 0: this process, without the directory's
 * own descriptor), -1 if unreadable. */
static int count_pid_fds(int pid)
{
	char path[64];
	if (pid)
		snprintf(path, sizeof path, "/proc/%d/fd", pid);
	else
		snprintf(path, sizeof path, "/proc/self/fd");
	DIR *d = opendir(path);
	if (!d)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return pid ? n : n - 1;
}

static int count_fds(void) { return count_pid_fds(0); }

/* VmRSS of PID in KiB (-1: unreadable). */
static long rss_kib(int pid)
{
	char path[64], line[256];
	snprintf(path, sizeof path, "/proc/%d/status", pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	long v = -1;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "VmRSS: %ld", &v) == 1)
			break;
	fclose(f);
	return v;
}

static long shm_used_kib(void)
{
	struct statvfs s;
	if (statvfs("/dev/shm", &s) < 0)
		return -1;
	return (long)((s.f_blocks - s.f_bfree) * s.f_frsize / 1024);
}

#define WATCH_MAX 8
struct watch {
	int n, pid[WATCH_MAX], fds[WATCH_MAX][3];
	long rss[WATCH_MAX][3], shm[3];
};

static void watch_take(struct watch *w, int k)
{
	if (k == 0) {
		const char *s = getenv("MANYCONNS_WATCH");
		char *end;
		w->n = 0;
		while (s && *s && w->n < WATCH_MAX) {
			long p = strtol(s, &end, 10);
			if (end == s)
				break;
			w->pid[w->n++] = (int)p;
			s = end;
		}
	}
	for (int i = 0; i < w->n; i++) {
		w->fds[i][k] = count_pid_fds(w->pid[i]);
		w->rss[i][k] = rss_kib(w->pid[i]);
	}
	w->shm[k] = shm_used_kib();
}

/* SETTLE_MS bounds the wait for the watched processes and /dev/shm to
 * come back after the last close: 10,000 connections end in a few
 * seconds on two CPUs. */
#define SETTLE_MS 30000

/* settled: sample k of w is within 10 % of sample 0 (and a page of
 * /dev/shm, a descriptor of slack): descriptors, RSS and /dev/shm. */
static int settled(const struct watch *w, int k)
{
	for (int i = 0; i < w->n; i++)
		if (w->fds[i][k] > w->fds[i][0] + w->fds[i][0] / 10 + 1 || w->rss[i][k] > w->rss[i][0] + w->rss[i][0] / 10)
			return 0;
	return w->shm[k] <= w->shm[0] + w->shm[0] / 10 + 4;
}

/* watch_settle takes sample 2 every 100 ms until it settled, at most
 * SETTLE_MS; returns the ms it waited. */
static long watch_settle(struct watch *w)
{
	int64_t t0 = now_ns();
	for (;;) {
		watch_take(w, 2);
		long ms = (long)((now_ns() - t0) / 1000000);
		if (settled(w, 2) || ms >= SETTLE_MS)
			return ms;
		usleep(100000);
	}
}

static int is_emfile(int e) { return e == EMFILE || e == ENFILE; }

static int io_all(int fd, char *buf, size_t n, int wr)
{
	size_t off = 0;
	while (off < n) {
		ssize_t k = wr ? write(fd, buf + off, n - off) : read(fd, buf + off, n - off);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		off += (size_t)k;
	}
	return 0;
}

static int server(struct sockaddr_in *a, int n)
{
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (l < 0 || bind(l, (struct sockaddr *)a, sizeof *a) < 0 || listen(l, 4096) < 0) {
		perror("listen");
		return 1;
	}
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN, .data.fd = l};
	epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev);
	int accepted = 0, emfile = 0, switched = 0, open = 0, epoll_err = 0, direct_end = 0;
	char buf[4096];
	struct epoll_event evs[256];
	while (accepted < n || open > 0) {
		int k = epoll_wait(ep, evs, 256, -1);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0) {
			perror("epoll_wait");
			return 1;
		}
		for (int i = 0; i < k; i++) {
			int fd = evs[i].data.fd;
			if (fd == l) {
				int c = accept4(l, NULL, NULL, SOCK_CLOEXEC);
				if (c < 0) {
					if (is_emfile(errno))
						emfile++;
					continue;
				}
				accepted++;
				open++;
				if (kernel_domain(c) == AF_UNIX)
					switched++;
				struct epoll_event ce = {.events = EPOLLIN, .data.fd = c};
				if (epoll_ctl(ep, EPOLL_CTL_ADD, c, &ce) < 0) {
					fprintf(stderr, "epoll_ctl: %s\n", strerror(errno));
					epoll_err++;
					close(c);
					open--;
				}
				continue;
			}
			ssize_t r = read(fd, buf, sizeof buf);
			if (r < 0 && (errno == EINTR || errno == EAGAIN))
				continue;
			if (r <= 0 || io_all(fd, buf, (size_t)r, 1) < 0) {
				epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
				if (kernel_domain(fd) == AF_UNIX)
					direct_end++;
				close(fd);
				open--;
			}
		}
	}
	printf("server accepted %d emfile %d switched %d epoll_err %d\n", accepted, emfile, switched, epoll_err);
	printf("server_end direct %d\n", direct_end);
	return 0;
}

static int client(struct sockaddr_in *a, int n, int rounds, int pings)
{
	int *fds = calloc((size_t)n, sizeof *fds);
	int conns = 0, emfile = 0, switched = 0, bad = 0;
	struct watch w;
	watch_take(&w, 0);
	int base = count_fds();
	for (int i = 0; i < n; i++) {
		int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (s < 0) {
			emfile += is_emfile(errno);
			fds[i] = -1;
			continue;
		}
		if (connect(s, (struct sockaddr *)a, sizeof *a) < 0) {
			emfile += is_emfile(errno);
			if (!is_emfile(errno))
				fprintf(stderr, "connect %d: %s\n", i, strerror(errno));
			close(s);
			fds[i] = -1;
			continue;
		}
		/* A connection the server never serves fails its echo here
		 * instead of hanging the client. */
		struct timeval tv = {10, 0};
		setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
		fds[i] = s;
		conns++;
		if (kernel_domain(s) == AF_UNIX)
			switched++;
	}
	int open_fds = count_fds();
	watch_take(&w, 1);
	for (int r = 0; r < rounds; r++)
		for (int i = 0; i < n; i++) {
			if (fds[i] < 0)
				continue;
			char out[17], in[16];
			snprintf(out, sizeof out, "%07u:%07u", (unsigned)i % 10000000u, (unsigned)r % 10000000u);
			if (io_all(fds[i], out, 16, 1) < 0 || io_all(fds[i], in, 16, 0) < 0 || memcmp(in, out, 16) != 0)
				bad++;
		}
	if (pings > 0 && fds[0] >= 0) {
		int64_t *lat = calloc((size_t)pings, sizeof *lat);
		char out[16] = "ping-pong-16byte", in[16];
		for (int i = 0; i < pings / 10; i++) /* warm-up */
			if (io_all(fds[0], out, 16, 1) < 0 || io_all(fds[0], in, 16, 0) < 0)
				bad++;
		for (int i = 0; i < pings; i++) {
			int64_t t0 = now_ns();
			if (io_all(fds[0], out, 16, 1) < 0 || io_all(fds[0], in, 16, 0) < 0)
				bad++;
			lat[i] = now_ns() - t0;
		}
		qsort(lat, (size_t)pings, sizeof *lat, cmp64);
		printf("pingpong n %d p50_ns %lld p99_ns %lld\n", pings, (long long)lat[pings / 2],
		       (long long)lat[(long long)pings * 99 / 100]);
		free(lat);
	}
	const char *bulk_env = getenv("MANYCONNS_BULK");
	long bulk = bulk_env ? atol(bulk_env) : 0;
	if (bulk > 0 && w.n > 0) {
		char *out = malloc((size_t)bulk), *in = malloc((size_t)bulk);
		memset(out, 'b', (size_t)bulk);
		for (int i = 0; i < n; i++)
			if (fds[i] >= 0 && (io_all(fds[i], out, (size_t)bulk, 1) < 0 || io_all(fds[i], in, (size_t)bulk, 0) < 0 ||
					    memcmp(in, out, (size_t)bulk) != 0))
				bad++;
		free(out);
		free(in);
		long used = shm_used_kib(), now = used;
		int64_t t0 = now_ns();
		long ms = 0;
		while (now > w.shm[1] + w.shm[1] / 10 && ms < SETTLE_MS) {
			usleep(250000);
			now = shm_used_kib();
			ms = (long)((now_ns() - t0) / 1000000);
		}
		printf("bulk bytes %ld used_kib %ld idle_kib %ld ms %ld\n", bulk, used, now, ms);
	}
	/* At the end: how many are direct now (moved onto a direct
	 * connection after they started as TCP: the shim's upgrade) and what
	 * the descriptors cost then. */
	int direct_end = 0, fds_end = count_fds();
	for (int i = 0; i < n; i++)
		if (fds[i] >= 0 && kernel_domain(fds[i]) == AF_UNIX)
			direct_end++;
	for (int i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	for (int i = 0; i < w.n; i++)
		printf("watch %d fds %d %d rss_kib %ld %ld\n", w.pid[i], w.fds[i][0], w.fds[i][1], w.rss[i][0], w.rss[i][1]);
	if (w.n > 0) {
		printf("shm used_kib %ld %ld\n", w.shm[0], w.shm[1]);
		long ms = watch_settle(&w);
		for (int i = 0; i < w.n; i++)
			printf("watch_after %d fds %d rss_kib %ld\n", w.pid[i], w.fds[i][2], w.rss[i][2]);
		printf("shm_after used_kib %ld ms %ld\n", w.shm[2], ms);
	}
	printf("client conns %d emfile %d switched %d bad %d fds_base %d fds_open %d\n", conns, emfile, switched, bad,
	       base, open_fds);
	printf("client_end direct %d fds %d\n", direct_end, fds_end);
	free(fds);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 5) {
		fprintf(stderr, "usage: manyconns server|client IP PORT N [ROUNDS]\n");
		return 2;
	}
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[3]))};
	if (inet_pton(AF_INET, argv[2], &a.sin_addr) != 1) {
		fprintf(stderr, "bad address %s\n", argv[2]);
		return 2;
	}
	int n = atoi(argv[4]);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(argv[1], "server"))
		return server(&a, n);
	if (!strcmp(argv[1], "client"))
		return client(&a, n, argc > 5 ? atoi(argv[5]) : 3, argc > 6 ? atoi(argv[6]) : 0);
	return 2;
}

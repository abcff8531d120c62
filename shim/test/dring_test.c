/*
 * dring_test: the connection buffer of docs/direct.md (shim/dring.c)
 * between forked processes. The main process plays exnd: it creates the
 * buffer file (unlinked), the bell pair (a socketpair: side s's bell is
 * bell[s], left blocking: dring_attach sets O_NONBLOCK) and the two V/E
 * socketpairs exactly as docs/direct.md says, keeps E0/E1 and both
 * bells, and forks the two sides. Each side attaches with hooks that do
 * what the shim's dparty.c does for the threads of one process: a kick
 * eventfd per thread and the fan-out after a drain. The cases about how
 * waits end without data are in dring_test_ends.c, #included here (one
 * compilation unit). Run by shim/check (TestDringC). Prints "ok NAME" per test, exits 1 on
 * the first failure with the reason.
 *
 *   dring_test [test-name...]
 */
#define _GNU_SOURCE
#include "../dring.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *g_test;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "FAIL %s [pid %d]: ", g_test, (int)getpid());
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

#define CHECK(c, ...)                                                                                                  \
	do {                                                                                                           \
		if (!(c)) {                                                                                            \
			fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #c);                                       \
			die(" " __VA_ARGS__);                                                                          \
		}                                                                                                      \
	} while (0)

static long ms_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* One connection as exnd sets it up. */
struct conn {
	uint32_t ring;
	int buf;       /* the buffer file, unlinked */
	int bell[2];   /* side s's bell: bell[0] and bell[1] are one socketpair */
	int v[2], e[2]; /* V and E of each side */
	uint8_t *map;  /* exnd's own mapping */
};

static char g_dir[256];

static void conn_make(struct conn *c, uint32_t ring)
{
	memset(c, 0, sizeof *c);
	c->ring = ring;
	char path[300];
	snprintf(path, sizeof path, "%s/buf", g_dir);
	c->buf = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	CHECK(c->buf >= 0, "%s", strerror(errno));
	unlink(path);
	size_t len = EXDD_HDR + 2 * (size_t)ring;
	CHECK(ftruncate(c->buf, (off_t)len) == 0);
	c->map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, c->buf, 0);
	CHECK(c->map != MAP_FAILED);
	uint32_t h32[3] = {EXDD_MAGIC, EXDD_VERSION, ring};
	uint64_t sz = len;
	memcpy(c->map, h32, sizeof h32);
	memcpy(c->map + 16, &sz, 8);
	CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, c->bell) == 0);
	for (int s = 0; s < 2; s++) {
		int sv[2];
		CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
		c->v[s] = sv[0];
		c->e[s] = sv[1];
	}
}

static void conn_free(struct conn *c)
{
	munmap(c->map, EXDD_HDR + 2 * (size_t)c->ring);
	close(c->buf);
	for (int s = 0; s < 2; s++) {
		if (c->bell[s] >= 0)
			close(c->bell[s]);
		if (c->v[s] >= 0)
			close(c->v[s]);
		if (c->e[s] >= 0)
			close(c->e[s]);
	}
}

static struct dring_ctl *ctl(struct conn *c, int dir) { return (struct dring_ctl *)(c->map + 1024 + 1024 * dir); }

/* ---- the hooks of one process (as shim/dparty.c, for one connection) ---- */

static pthread_mutex_t g_hmu = PTHREAD_MUTEX_INITIALIZER;
static struct dwaiter *g_hw;
static __thread int t_kick = -1;
static int g_fanouts; /* fan-outs that kicked someone */

static int th_enter(struct dring *d, struct dwaiter *w)
{
	(void)d;
	if (t_kick < 0)
		t_kick = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	CHECK(t_kick >= 0);
	w->kick = w->wait = t_kick;
	pthread_mutex_lock(&g_hmu);
	w->next = g_hw;
	g_hw = w;
	pthread_mutex_unlock(&g_hmu);
	return 0;
}

static void th_leave(struct dring *d, struct dwaiter *w)
{
	(void)d;
	pthread_mutex_lock(&g_hmu);
	for (struct dwaiter **p = &g_hw; *p; p = &(*p)->next)
		if (*p == w) {
			*p = w->next;
			break;
		}
	pthread_mutex_unlock(&g_hmu);
}

static void th_fanout(struct dring *d, struct dwaiter *self)
{
	(void)d;
	uint64_t one = 1;
	pthread_mutex_lock(&g_hmu);
	for (struct dwaiter *w = g_hw; w; w = w->next)
		if (w != self) {
			CHECK(write(w->kick, &one, sizeof one) == sizeof one);
			__atomic_add_fetch(&g_fanouts, 1, __ATOMIC_RELAXED);
		}
	pthread_mutex_unlock(&g_hmu);
}

static const struct dring_hooks g_th = {th_enter, th_leave, th_fanout, NULL};

/* In a side's process: attach as side s (its bell; the peer's is closed
 * here, as it lives in the peer's process). */
static void side_attach(struct conn *c, int s, struct dring *d)
{
	int b = dup(c->buf);
	CHECK(b >= 0);
	int r = dring_attach(d, b, s, c->ring, c->bell[s], c->v[s], &g_th);
	CHECK(r == 0, "attach: %s", strerror(-r));
	CHECK(fcntl(b, F_GETFD) < 0 && errno == EBADF, "attach must close the buffer fd");
}

static pid_t side_fork(struct conn *c, int s, void (*fn)(struct conn *, struct dring *, void *), void *arg)
{
	pid_t p = fork();
	CHECK(p >= 0);
	if (p == 0) {
		close(c->v[1 - s]);
		c->v[1 - s] = -1;
		close(c->bell[1 - s]);
		c->bell[1 - s] = -1;
		close(c->e[0]);
		close(c->e[1]);
		c->e[0] = c->e[1] = -1;
		struct dring d;
		side_attach(c, s, &d);
		fn(c, &d, arg);
		dring_detach(&d);
		exit(0);
	}
	return p;
}

static void reap(pid_t p, const char *who)
{
	int st;
	CHECK(waitpid(p, &st, 0) == p);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s exited with status 0x%x", who, st);
}

/* Run a and b as sides 0 and 1 of a fresh connection of ring R. */
static void pair(uint32_t ring, void (*a)(struct conn *, struct dring *, void *), void (*b)(struct conn *, struct dring *, void *),
		 void *arg)
{
	struct conn c;
	conn_make(&c, ring);
	pid_t pa = side_fork(&c, 0, a, arg), pb = side_fork(&c, 1, b, arg);
	reap(pa, "side 0");
	reap(pb, "side 1");
	conn_free(&c);
}

/* ---- streams ---- */

static uint8_t pat(uint64_t i, unsigned seed) { return (uint8_t)((i * 2654435761u) >> 13) ^ (uint8_t)seed; }

static unsigned rnd(unsigned *s)
{
	*s = *s * 1103515245 + 12345;
	return (*s >> 8) & 0xffffff;
}

static const size_t sizes[] = {1, 7, 4095, 4096, 4097, 12289, 65536, 1 << 20, 3 << 20};
#define NSIZES (sizeof sizes / sizeof sizes[0])

/* Send every size as one stream message (random iovec splits); then
 * receive the other direction's. Both sides run this: side 0 sends
 * first, side 1 receives first. */
static void send_all(struct dring *d, unsigned seed)
{
	static uint8_t buf[3 << 20];
	unsigned r = seed;
	uint64_t pos = 0;
	for (size_t k = 0; k < NSIZES; k++) {
		size_t n = sizes[k];
		for (size_t i = 0; i < n; i++)
			buf[i] = pat(pos + i, seed);
		struct iovec iov[8];
		int cnt = 0;
		size_t off = 0;
		while (off < n && cnt < 8) {
			size_t l = cnt == 7 ? n - off : rnd(&r) % (n - off + 1);
			iov[cnt].iov_base = buf + off;
			iov[cnt].iov_len = l;
			cnt++;
			off += l;
		}
		if (off < n) {
			iov[cnt - 1].iov_len += n - off;
		}
		ssize_t w = dring_writev(d, iov, cnt, 0);
		CHECK(w == (ssize_t)n, "writev %zu: %zd", n, w);
		pos += n;
	}
}

static void recv_all(struct dring *d, unsigned seed)
{
	static uint8_t buf[1 << 16];
	unsigned r = seed * 7 + 1;
	uint64_t total = 0, pos = 0;
	for (size_t k = 0; k < NSIZES; k++)
		total += sizes[k];
	while (pos < total) {
		size_t want = 1 + rnd(&r) % sizeof buf;
		if (want > total - pos)
			want = total - pos;
		size_t h = want / 3;
		struct iovec iov[3] = {{buf, h}, {NULL, 0}, {buf + h, want - h}};
		ssize_t n = dring_readv(d, iov, 3, (r & 1) ? DRING_WAITALL : 0);
		CHECK(n > 0, "readv at %llu: %zd", (unsigned long long)pos, n);
		if (r & 1)
			CHECK((size_t)n == want, "WAITALL gave %zd of %zu", n, want);
		for (ssize_t i = 0; i < n; i++)
			if (buf[i] != pat(pos + i, seed))
				die("byte %llu: got %02x want %02x", (unsigned long long)(pos + i), buf[i], pat(pos + i, seed));
		pos += n;
	}
}

static void streams_a(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	(void)arg;
	send_all(d, 1);
	recv_all(d, 2);
	dring_fin(d);
	char b;
	CHECK(dring_read(d, &b, 1, 0) == 0, "EOF after the peer's fin");
}

static void streams_b(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	(void)arg;
	recv_all(d, 1);
	send_all(d, 2);
	dring_fin(d);
	char b;
	CHECK(dring_read(d, &b, 1, 0) == 0, "EOF after the peer's fin");
	CHECK(dring_write(d, &b, 1, 0) == -EPIPE, "write after SHUT_WR");
}

/* Both directions at once: each side's second thread sends the pattern
 * of seed send while its first receives that of seed recv: a reader and
 * a writer of one process park on the one bell at once. */
struct sender {
	struct dring *d;
	unsigned seed;
};

static void *send_thread(void *arg)
{
	struct sender *s = arg;
	send_all(s->d, s->seed);
	return NULL;
}

static void duplex(struct dring *d, unsigned send, unsigned recv)
{
	pthread_t t;
	struct sender s = {d, send};
	CHECK(pthread_create(&t, NULL, send_thread, &s) == 0);
	recv_all(d, recv);
	CHECK(pthread_join(t, NULL) == 0);
}

static void duplex_a(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	(void)arg;
	duplex(d, 3, 4);
}

static void duplex_b(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	(void)arg;
	duplex(d, 4, 3);
}

/* ---- semantics on one side's view ---- */

static void semantics_a(struct conn *c, struct dring *d, void *arg)
{
	(void)arg;
	char buf[8192];
	/* nonblocking read on an empty ring, FIONREAD, readiness */
	CHECK(dring_read(d, buf, 10, DRING_NONBLOCK) == -EAGAIN);
	CHECK(dring_nread(d) == 0);
	unsigned m = dring_ready(d);
	CHECK(!(m & POLLIN) && (m & POLLOUT), "ready %#x", m);
	/* fill the ring: nonblocking write takes what fits */
	memset(buf, 'x', sizeof buf);
	CHECK(dring_write(d, buf, sizeof buf, DRING_NONBLOCK) == (ssize_t)c->ring);
	CHECK(dring_write(d, buf, 1, DRING_NONBLOCK) == -EAGAIN);
	CHECK(!(dring_ready(d) & POLLOUT));
	/* tell side 1 to drain; poll on my bell wakes when space appears */
	struct pollfd p = {d->bell, POLLIN, 0};
	long t0 = ms_now();
	for (;;) {
		unsigned m = dring_arm(d, POLLOUT);
		if (!(m & POLLOUT)) {
			CHECK(poll(&p, 1, 5000) == 1, "no wake for space");
			CHECK(dring_bell_drain(d, NULL) > 0);
		}
		dring_disarm(d, POLLOUT);
		if (m & POLLOUT)
			break;
	}
	CHECK(ms_now() - t0 < 5000);
	/* epoll on the bell: wakes when data arrives */
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 42};
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, d->bell, &ev) == 0);
	for (;;) {
		unsigned m = dring_arm(d, POLLIN);
		struct epoll_event out;
		if (!(m & POLLIN)) {
			CHECK(epoll_wait(ep, &out, 1, 5000) == 1 && out.data.u64 == 42, "no epoll wake for data");
			dring_bell_drain(d, NULL);
		}
		dring_disarm(d, POLLIN);
		if (m & POLLIN)
			break;
	}
	close(ep);
	CHECK(dring_nread(d) == 5, "FIONREAD %ld", dring_nread(d));
	/* peek does not consume; WAITALL; TRUNC */
	CHECK(dring_read(d, buf, 100, DRING_PEEK) == 5 && memcmp(buf, "hello", 5) == 0);
	CHECK(dring_read(d, buf, 2, 0) == 2 && memcmp(buf, "he", 2) == 0);
	CHECK(dring_read(d, NULL, 1, DRING_TRUNC) == 1);
	CHECK(dring_read(d, buf, 2, DRING_WAITALL) == 2 && memcmp(buf, "lo", 2) == 0);
	/* blocking read wakes on write (side 1 waits 100 ms then writes) */
	t0 = ms_now();
	CHECK(dring_read(d, buf, 100, 0) == 3 && memcmp(buf, "abc", 3) == 0);
	CHECK(ms_now() - t0 >= 50, "read returned before the write");
	/* SO_RCVTIMEO on V: a blocking read times out with EAGAIN */
	struct timeval tv = {0, 100000};
	CHECK(setsockopt(c->v[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0);
	t0 = ms_now();
	CHECK(dring_read(d, buf, 1, DRING_TIMEO) == -EAGAIN);
	CHECK(ms_now() - t0 >= 90 && ms_now() - t0 < 2000, "timeout after %ld ms", ms_now() - t0);
	/* MSG_WAITALL returns what came when fin comes */
	CHECK(dring_read(d, buf, 100, DRING_WAITALL) == 4 && memcmp(buf, "tail", 4) == 0);
	CHECK(dring_read(d, buf, 100, 0) == 0);
	m = dring_ready(d);
	CHECK((m & POLLIN) && (m & POLLRDHUP) && !(m & POLLHUP), "after fin: %#x", m);
	dring_fin(d);
	CHECK(dring_ready(d) & POLLHUP);
}

static void semantics_b(struct conn *c, struct dring *d, void *arg)
{
	(void)arg;
	char buf[8192];
	/* wait until side 0 filled the ring */
	while (dring_nread(d) < (long)c->ring)
		usleep(1000);
	usleep(50000);
	CHECK(dring_read(d, buf, c->ring, DRING_WAITALL) == (ssize_t)c->ring);
	usleep(50000);
	ssize_t w = dring_write(d, "hello", 5, 0);
	CHECK(w == 5, "%zd", w);
	while (__atomic_load_n(&d->out->head, __ATOMIC_ACQUIRE) < 5)
		usleep(1000);
	usleep(100000);
	CHECK(dring_write(d, "abc", 3, 0) == 3);
	while (__atomic_load_n(&d->out->head, __ATOMIC_ACQUIRE) < 8)
		usleep(1000);
	usleep(300000);
	CHECK(dring_write(d, "ta", 2, 0) == 2);
	usleep(20000);
	CHECK(dring_write(d, "il", 2, 0) == 2);
	dring_fin(d);
	CHECK(dring_read(d, buf, 1, 0) == 0);
}

/* ---- wakes on fin and rst ---- */

static void parked_reader_eof(struct conn *c, struct dring *d, void *arg)
{
	(void)arg;
	char b;
	long t0 = ms_now();
	CHECK(dring_read(d, &b, 1, 0) == 0, "fin wakes a parked reader with EOF");
	CHECK(ms_now() - t0 >= 50);
	CHECK(dring_read(d, &b, 1, 0) == 0, "EOF stays");
	/* a writer parked on the full ring: rst ends it with what was written */
	static char big[1 << 16];
	t0 = ms_now();
	ssize_t w = dring_write(d, big, sizeof big, 0);
	CHECK(w == (ssize_t)c->ring, "partial write on reset: %zd", w);
	CHECK(ms_now() - t0 >= 50);
	CHECK(dring_write(d, big, 1, 0) == -ECONNRESET, "rst wakes a parked writer");
}

static void fin_then_rst(struct conn *c, struct dring *d, void *arg)
{
	(void)arg;
	(void)c;
	usleep(100000);
	dring_fin(d);
	/* the peer parks again in its next read: reset wakes it */
	usleep(100000);
	dring_rst(d);
	char b;
	CHECK(dring_read(d, &b, 1, 0) == -ECONNRESET);
	CHECK(dring_write(d, &b, 1, 0) == -ECONNRESET);
	CHECK(dring_error(d) == ECONNRESET);
	unsigned m = dring_ready(d);
	CHECK((m & (POLLERR | POLLHUP | POLLIN | POLLOUT)) == (POLLERR | POLLHUP | POLLIN | POLLOUT), "%#x", m);
}

/* ---- forged cursors ---- */

static void forger(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	(void)arg;
	/* side 1 writes 10 bytes, then forges its tail R+1 beyond head */
	CHECK(dring_write(d, "0123456789", 10, 0) == 10);
	usleep(50000);
	__atomic_store_n(&d->out->tail, d->out->head + d->ring + 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&d->out->cons_wait, __ATOMIC_SEQ_CST)) {
		char b = 1;
		CHECK(write(d->bell, &b, 1) == 1);
	}
}

static void victim(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	(void)arg;
	char buf[64];
	CHECK(dring_read(d, buf, 10, DRING_WAITALL) == 10);
	/* parked when the forged tail comes */
	CHECK(dring_read(d, buf, sizeof buf, 0) == -EIO, "forged tail: EIO");
	CHECK(dring_error(d) == EIO);
	CHECK(__atomic_load_n(&d->out->rst, __ATOMIC_ACQUIRE) == 1, "rst set for the peer");
	CHECK(dring_nread(d) == -EIO);
	CHECK(dring_write(d, buf, 1, 0) == -EIO);
	/* a huge forged head on my outbound ring: no write out of bounds */
	d->failed = 0;
	__atomic_store_n(&d->in->rst, 0, __ATOMIC_SEQ_CST);
	__atomic_store_n(&d->out->rst, 0, __ATOMIC_SEQ_CST);
	__atomic_store_n(&d->out->head, (uint64_t)1 << 62, __ATOMIC_SEQ_CST);
	CHECK(dring_write(d, buf, sizeof buf, 0) == -EIO, "forged head: EIO");
}

static void test_attach(void)
{
	struct conn c;
	conn_make(&c, 4096);
	struct dring d;
	int bad[][2] = {{0, 4096 + 1}, {2, 4096}, {0, 8192}, {0, 2048}};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		CHECK(dring_attach(&d, dup(c.buf), bad[i][0], (uint32_t)bad[i][1], -1, -1, NULL) == -EINVAL, "case %zu", i);
	/* header fields */
	uint32_t keep;
	for (int off = 0; off < 24; off += 4) {
		if (off == 12)
			continue;
		memcpy(&keep, c.map + off, 4);
		uint32_t x = keep ^ 0x100;
		memcpy(c.map + off, &x, 4);
		CHECK(dring_attach(&d, dup(c.buf), 0, 4096, -1, -1, NULL) == -EINVAL, "header word %d", off);
		memcpy(c.map + off, &keep, 4);
	}
	/* a file of the wrong size */
	CHECK(ftruncate(c.buf, 8192) == 0);
	CHECK(dring_attach(&d, dup(c.buf), 0, 4096, -1, -1, NULL) == -EINVAL);
	CHECK(ftruncate(c.buf, EXDD_HDR + 2 * 4096) == 0);
	CHECK(dring_attach(&d, dup(c.buf), 0, 4096, -1, -1, NULL) == 0);
	dring_detach(&d);
	int sv[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	CHECK(dring_attach(&d, sv[0], 0, 4096, -1, -1, NULL) == -EINVAL, "not a regular file");
	CHECK(fcntl(sv[0], F_GETFD) < 0, "closed on failure too");
	close(sv[1]);
	conn_free(&c);
}

#include "dring_test_ends.c"

/* ---- two forked writers share a direction under prod_lock ---- */

#define REC 10000
#define NREC 200

static void two_writers(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	(void)arg;
	pid_t p[2];
	for (int w = 0; w < 2; w++) {
		p[w] = fork();
		CHECK(p[w] >= 0);
		if (p[w] == 0) {
			static char rec[REC];
			memset(rec, 'A' + w, sizeof rec);
			for (int i = 0; i < NREC; i++)
				CHECK(dring_write(d, rec, sizeof rec, 0) == REC);
			exit(0);
		}
	}
	reap(p[0], "writer 0");
	reap(p[1], "writer 1");
	dring_fin(d);
}

static void record_reader(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	(void)arg;
	static char rec[REC];
	int n[2] = {0, 0};
	ssize_t r;
	while ((r = dring_read(d, rec, REC, DRING_WAITALL)) == REC) {
		CHECK(rec[0] == 'A' || rec[0] == 'B');
		for (int i = 1; i < REC; i++)
			if (rec[i] != rec[0])
				die("record %d mixes writers at byte %d", n[0] + n[1], i);
		n[rec[0] - 'A']++;
	}
	CHECK(r == 0, "end %zd", r);
	CHECK(n[0] == NREC && n[1] == NREC, "records %d %d", n[0], n[1]);
}

/* ---- main ---- */

static void t_streams(void) { pair(4096, streams_a, streams_b, NULL); }
static void t_streams_big(void) { pair(1 << 20, streams_a, streams_b, NULL); }
static void t_duplex(void) { pair(8192, duplex_a, duplex_b, NULL); }
static void t_semantics(void) { pair(4096, semantics_a, semantics_b, NULL); }
static void t_wake(void) { pair(4096, parked_reader_eof, fin_then_rst, NULL); }
static void t_forged(void) { pair(4096, victim, forger, NULL); }
static void t_attach(void) { test_attach(); }
static void t_kill_rst(void) { test_death(1); }
static void t_kill_close(void) { test_death(0); }
static void t_exnd_death(void) { test_exnd_death(); }
static void t_relay(void) { test_relay(); }
static void t_lock(void) { pair(4096, two_writers, record_reader, NULL); }
static void t_exnd_reset(void) { test_exnd_reset(); }
static void t_peer_gone(void) { test_peer_gone(); }
static void t_selfwake(void) { pair(4096, selfwake_a, selfwake_b, NULL); }
static void t_upg_wait(void) { test_upg_wait(); }
static void t_space_wait(void) { test_space_wait(); }
static void t_reclaim_lock(void) { test_reclaim_lock(); }
static void t_reclaim_dead(void) { test_reclaim_dead(); }

static const struct {
	const char *name;
	void (*fn)(void);
} tests[] = {
	{"attach", t_attach},	      {"streams", t_streams},	 {"streams_big", t_streams_big}, {"duplex", t_duplex},
	{"semantics", t_semantics},   {"wake", t_wake},		 {"forged", t_forged},		 {"kill_rst", t_kill_rst},
	{"kill_close", t_kill_close}, {"exnd_death", t_exnd_death}, {"relay", t_relay},		 {"lock", t_lock},
	{"exnd_reset", t_exnd_reset}, {"peer_gone", t_peer_gone},   {"selfwake", t_selfwake}, {"upg_wait", t_upg_wait},
	{"space_wait", t_space_wait}, {"reclaim_lock", t_reclaim_lock},
	{"reclaim_dead", t_reclaim_dead},
};

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	const char *tmp = getenv("TMPDIR");
	snprintf(g_dir, sizeof g_dir, "%s/dring-test-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(g_dir)) {
		perror("mkdtemp");
		return 1;
	}
	int rc = 0;
	for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
		int run = argc < 2;
		for (int a = 1; a < argc; a++)
			run |= strcmp(argv[a], tests[i].name) == 0;
		if (!run)
			continue;
		g_test = tests[i].name;
		pid_t p = fork(); /* a failing test exits; the directory is still removed */
		if (p == 0) {
			tests[i].fn();
			exit(0);
		}
		int st;
		waitpid(p, &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			printf("FAIL %s\n", g_test);
			rc = 1;
			break;
		}
		printf("ok %s\n", g_test);
		fflush(stdout);
	}
	rmdir(g_dir);
	return rc;
}

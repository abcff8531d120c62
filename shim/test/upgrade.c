/*
 * upgrade.c: the stress test of the mid-stream upgrade (issue #33;
 * docs/shim.md, "Upgrade"), run under libextds.so with
 * EXTDS_SETUP=upgrade by integration/upgrade_test.go.
 *
 *   upgrade server IP PORT            serve until a connection says "quit"
 *   upgrade client IP PORT N CONC     N connections, CONC at a time
 *   upgrade pingpong IP PORT MS       one connection, 1-byte ping-pong for
 *                                     MS milliseconds: when it became direct
 *   upgrade fds IP PORT N             N connections in ping-pong until each
 *                                     is direct: the descriptors that each
 *                                     connection after the first costs
 *   upgrade noread IP PORT QUIET      one connection whose server writes
 *                                     all it has before it reads, and
 *                                     makes no call for NR_STALL_US after
 *                                     (QUIET 0) or before (QUIET 1), while
 *                                     the client writes more than TCP and
 *                                     the ring hold; both streams checked
 *
 * Each connection starts with the client's 8-byte seed. From it both ends
 * derive everything: how many bytes each direction carries, in which
 * write sizes (1 B to 64 KiB), by which call (write, sendfile, splice, or
 * write on a dup made halfway), whether its reader stops for 300 ms once,
 * with which pauses (0 to 2 ms, so that the
 * connection outlives the shim's UPG_AGE_NS and moves in the middle of
 * its streams), when each side half-closes, and how it waits: two
 * blocking threads, a poll loop or an epoll loop (non-blocking), and
 * whether the server handles it in a forked child (fork and the upgrade's
 * state inherited by the child, a quarter of them). Every
 * byte is checked by content and position on both ends, and the end of
 * each stream by its length. Each end prints "FAIL ..." per broken
 * connection, and at the end "conns N direct D": D of N connections
 * whose descriptor was the shim's direct one (AF_UNIX to the kernel)
 * when they closed.
 */
#include "upgrade.h"

struct plan {
	uint64_t key[2];   /* stream keys: 0 client→server, 1 server→client */
	uint64_t len[2];   /* bytes per direction */
	uint64_t rng[2];   /* write size and pause generators, per writer */
	uint64_t seed;     /* what it was made from */
	int mode;          /* 0 threads, 1 poll, 2 epoll */
	int how[2];        /* per writer: HOW_WRITE, HOW_SENDFILE, HOW_SPLICE, HOW_DUP */
	uint64_t stall[2]; /* per reader: stall STALL_US once at this byte (0: never) */
};

/* How a writer writes (a tenth each but write): write(2); sendfile(2)
 * from a memfd; splice(2) from a pipe; write(2) on a dup of the socket
 * made halfway (after its attach, often: the dups convert together). */
enum { HOW_WRITE, HOW_SENDFILE, HOW_SPLICE, HOW_DUP };

/* A reader that stops reading for a while (an eighth of them, once):
 * longer than an upgrade's agreement, so its peer's move and its own
 * ask meet a side that does not call. */
#define STALL_US 300000

static void plan_of(uint64_t seed, struct plan *p)
{
	p->seed = seed;
	p->key[0] = mix(seed ^ 1);
	p->key[1] = mix(seed ^ 2);
	/* 0 .. 1 MiB, and a fifth of the directions short (< 4 KiB) */
	for (int d = 0; d < 2; d++) {
		uint64_t r = mix(seed ^ (3 + d));
		p->len[d] = (r % 5 == 0) ? (r >> 8) % 4096 : (r >> 8) % (1u << 20);
		p->rng[d] = mix(seed ^ (5 + d));
	}
	p->mode = (int)(mix(seed ^ 7) % 3);
	for (int d = 0; d < 2; d++) {
		uint64_t r = mix(seed ^ (11 + d));
		p->how[d] = r % 10 < 7 ? HOW_WRITE : (int)(r % 10) - 6;
		uint64_t q = mix(seed ^ (13 + d));
		p->stall[d] = q % 8 == 0 && p->len[d] > 1 ? 1 + (q >> 8) % p->len[d] : 0;
	}
}

static uint64_t next(uint64_t *s) { return *s = mix(*s); }

/* The next write size (1 B .. 64 KiB, mostly small) and pause (µs). */
static size_t wsize(uint64_t *s)
{
	uint64_t r = next(s);
	return (r & 3) == 0 ? 1 + (r >> 8) % 65536 : 1 + (r >> 8) % 4096;
}
static unsigned wpause(uint64_t *s) { return (unsigned)(next(s) % 2000); }

/* One end of one connection: writes direction w, reads direction 1-w. */
struct end {
	int fd;
	int wfd;   /* where writes go: fd, or its dup (HOW_DUP) */
	int mfd;   /* HOW_SENDFILE: the memfd the bytes go out of */
	int pp[2]; /* HOW_SPLICE: the pipe they go through */
	int stalled;
	struct plan p;
	int w;
	uint64_t sent, got;
	uint64_t wrng;
	size_t chunk, coff; /* the current write: its size and what is done */
	int wdone, rdone, bad;
	char why[160];
	struct live *live; /* its slot in the tally, or NULL */
};

static void failf(struct end *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void failf(struct end *e, const char *fmt, ...)
{
	if (e->bad++)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->why, sizeof e->why, fmt, ap);
	va_end(ap);
}

/* e's progress into its slot, for the watchdog. */
static void note(struct end *e)
{
	if (!e->live)
		return;
	__atomic_store_n(&e->live->sent, e->sent, __ATOMIC_RELAXED);
	__atomic_store_n(&e->live->got, e->got, __ATOMIC_RELAXED);
	__atomic_store_n(&e->live->wdone, e->wdone, __ATOMIC_RELAXED);
	__atomic_store_n(&e->live->rdone, e->rdone, __ATOMIC_RELAXED);
}

/* Check n received bytes at e->got. */
static void check(struct end *e, const uint8_t *b, size_t n)
{
	uint64_t k = e->p.key[1 - e->w];
	for (size_t i = 0; i < n; i++)
		if (b[i] != sbyte(k, e->got + i)) {
			failf(e, "byte %llu of %llu: got %u want %u", (unsigned long long)(e->got + i),
			      (unsigned long long)e->p.len[1 - e->w], b[i], sbyte(k, e->got + i));
			break;
		}
	e->got += n;
	note(e);
	if (e->got > e->p.len[1 - e->w])
		failf(e, "%llu bytes, more than the %llu sent", (unsigned long long)e->got, (unsigned long long)e->p.len[1 - e->w]);
}

/* One step of writing: 1 progress, 0 would block, -1 error. Pauses
 * between writes when blocking. */
static int step_write(struct end *e, int block)
{
	static __thread uint8_t buf[65536];
	if (e->wdone)
		return 0;
	if (e->sent >= e->p.len[e->w]) {
		if (shutdown(e->fd, SHUT_WR) < 0)
			failf(e, "shutdown: %s", strerror(errno));
		e->wdone = 1;
		note(e);
		return 1;
	}
	if (e->chunk == 0) {
		e->chunk = wsize(&e->wrng);
		if (e->chunk > e->p.len[e->w] - e->sent)
			e->chunk = e->p.len[e->w] - e->sent;
		e->coff = 0;
		if (block)
			sleep_us(wpause(&e->wrng));
	}
	size_t n = e->chunk - e->coff;
	for (size_t i = 0; i < n; i++)
		buf[i] = sbyte(e->p.key[e->w], e->sent + i);
	ssize_t r;
	switch (e->p.how[e->w]) {
	case HOW_SENDFILE: {
		/* each byte at its own place in the file: TCP's sendfile
		 * sends the file's pages, not a copy, so a page written again
		 * before it left would change bytes already "sent" */
		off_t off = (off_t)e->sent;
		if (pwrite(e->mfd, buf, n, off) != (ssize_t)n) {
			failf(e, "memfd: %s", strerror(errno));
			return -1;
		}
		r = sendfile(e->wfd, e->mfd, &off, n);
		break;
	}
	case HOW_SPLICE: {
		if (write(e->pp[1], buf, n) != (ssize_t)n) {
			failf(e, "pipe: %s", strerror(errno));
			return -1;
		}
		r = splice(e->pp[0], NULL, e->wfd, NULL, n, e->p.mode ? SPLICE_F_NONBLOCK : 0);
		int err = errno;
		/* What did not go stays in the pipe, as the kernel's splice
		 * leaves it: out, so that the next step starts from e->sent
		 * again. Less than that there is a splice that lost bytes
		 * (unless the connection failed: then they do not matter). */
		int have = 0;
		ssize_t left = (ssize_t)n - (r > 0 ? r : 0);
		if (ioctl(e->pp[0], FIONREAD, &have) < 0 || ((r >= 0 || err == EAGAIN) && have != left)) {
			failf(e, "splice of %zu returned %zd (%s) and left %d bytes in the pipe, want %zd", n, r,
			      r < 0 ? strerror(err) : "ok", have, left);
			return -1;
		}
		while (have > 0) {
			ssize_t k = read(e->pp[0], buf, (size_t)have);
			if (k <= 0)
				break;
			have -= (int)k;
		}
		errno = err;
		break;
	}
	case HOW_DUP:
		if (e->wfd == e->fd && e->sent >= e->p.len[e->w] / 2)
			e->wfd = dup(e->fd);
		if (e->wfd < 0) {
			failf(e, "dup: %s", strerror(errno));
			return -1;
		}
		/* fall through */
	default:
		r = write(e->wfd, buf, n);
	}
	if (r < 0) {
		if (errno == EAGAIN || errno == EINTR)
			return 0;
		failf(e, "write at %llu (chunk %zu+%zu): %s", (unsigned long long)e->sent, e->chunk, e->coff, strerror(errno));
		return -1;
	}
	e->sent += (uint64_t)r;
	note(e);
	e->coff += (size_t)r;
	if (e->coff == e->chunk)
		e->chunk = 0;
	return 1;
}

/* One step of reading: 1 progress (or EOF), 0 would block, -1 error. */
static int step_read(struct end *e)
{
	uint8_t buf[65536];
	if (e->rdone)
		return 0;
	if (!e->stalled && e->p.stall[1 - e->w] && e->got >= e->p.stall[1 - e->w]) {
		e->stalled = 1;
		sleep_us(STALL_US);
	}
	ssize_t r = read(e->fd, buf, sizeof buf);
	if (r < 0) {
		if (errno == EAGAIN || errno == EINTR)
			return 0;
		failf(e, "read: %s", strerror(errno));
		return -1;
	}
	if (r == 0) {
		if (e->got != e->p.len[1 - e->w])
			failf(e, "EOF after %llu of %llu bytes", (unsigned long long)e->got, (unsigned long long)e->p.len[1 - e->w]);
		e->rdone = 1;
		note(e);
		return 1;
	}
	check(e, buf, (size_t)r);
	return 1;
}


/* The peer's end was reported (POLLRDHUP, EPOLLRDHUP): everything it
 * has not read yet must be readable now. A FIN that only marked where
 * the peer's stream moved onto the buffer (the upgrade's boundary) must
 * not show as the peer's end. */
static void rdhup(struct end *e)
{
	int n = 0;
	uint64_t left = e->p.len[1 - e->w] - e->got;
	if (e->rdone || ioctl(e->fd, FIONREAD, &n) < 0)
		return;
	int err = 0;
	socklen_t l = sizeof err;
	if ((uint64_t)n < left && getsockopt(e->fd, SOL_SOCKET, SO_ERROR, &err, &l) == 0 && err) {
		/* a reset reports RDHUP too (and SO_ERROR takes the error) */
		failf(e, "read: %s", strerror(err));
		return;
	}
	if ((uint64_t)n < left)
		failf(e, "RDHUP with %llu bytes to come and %d readable (descriptor direct then: %d)", (unsigned long long)left, n, is_direct(e->fd));
}

static void *writer(void *a)
{
	struct end *e = a;
	while (!e->wdone && step_write(e, 1) >= 0)
		;
	return NULL;
}

/* Run one connection's end to its finish in its plan's mode. */
static void run_end_how(struct end *e);
static struct live *live_claim(struct end *e);
static void run_end(struct end *e)
{
	e->live = live_claim(e);
	e->wfd = e->fd;
	e->mfd = e->pp[0] = e->pp[1] = -1;
	if (e->p.how[e->w] == HOW_SENDFILE && (e->mfd = memfd_create("upgrade", MFD_CLOEXEC)) < 0)
		failf(e, "memfd_create: %s", strerror(errno));
	if (e->p.how[e->w] == HOW_SPLICE && pipe2(e->pp, O_CLOEXEC) < 0)
		failf(e, "pipe: %s", strerror(errno));
	if (!e->bad)
		run_end_how(e);
	if (e->wfd != e->fd && e->wfd >= 0)
		close(e->wfd);
	if (e->mfd >= 0)
		close(e->mfd);
	if (e->pp[0] >= 0) {
		close(e->pp[0]);
		close(e->pp[1]);
	}
	if (e->live)
		__atomic_store_n(&e->live->seed, 0, __ATOMIC_RELEASE);
}

static void run_end_how(struct end *e)
{
	e->wrng = e->p.rng[e->w];
	if (e->p.mode == 0) {
		pthread_t t;
		pthread_create(&t, NULL, writer, e);
		while (!e->rdone && step_read(e) >= 0)
			;
		pthread_join(t, NULL);
		return;
	}
	fcntl(e->fd, F_SETFL, fcntl(e->fd, F_GETFL) | O_NONBLOCK);
	int ep = -1;
	if (e->p.mode == 2) {
		ep = epoll_create1(EPOLL_CLOEXEC);
		struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLOUT, .data.u64 = 7};
		epoll_ctl(ep, EPOLL_CTL_ADD, e->fd, &ev);
	}
	uint64_t due = 0;
	struct timespec t;
	while ((!e->rdone || !e->wdone) && !e->bad) {
		clock_gettime(CLOCK_MONOTONIC, &t);
		uint64_t now = (uint64_t)t.tv_sec * 1000000 + (uint64_t)t.tv_nsec / 1000;
		int prog = step_read(e);
		if (!e->wdone && now >= due) {
			int w = step_write(e, 0);
			prog |= w;
			if (w > 0 && e->chunk == 0)
				due = now + wpause(&e->wrng);
		}
		if (prog < 0 || prog > 0)
			continue;
		int tmo = e->wdone || due <= now ? -1 : (int)((due - now) / 1000) + 1;
		if (!e->wdone && due <= now)
			tmo = -1;
		if (ep >= 0) {
			struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | (e->wdone || due > now ? 0 : EPOLLOUT), .data.u64 = 7};
			epoll_ctl(ep, EPOLL_CTL_MOD, e->fd, &ev);
			struct epoll_event out[4];
			if (epoll_wait(ep, out, 4, tmo) > 0 && (out[0].events & EPOLLRDHUP))
				rdhup(e);
		} else {
			struct pollfd p = {e->fd, (short)(POLLIN | POLLRDHUP | (e->wdone || due > now ? 0 : POLLOUT)), 0};
			if (poll(&p, 1, tmo) > 0 && (p.revents & POLLRDHUP))
				rdhup(e);
		}
	}
	if (ep >= 0)
		close(ep);
}

struct tally *g_t;
struct sockaddr_in g_addr;

void add(int *v, int n) { __atomic_add_fetch(v, n, __ATOMIC_SEQ_CST); }

void say(const char *fmt, ...)
{
	char b[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(b, sizeof b, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof b - 1)
		n = (int)sizeof b - 1;
	ssize_t w = write(1, b, (size_t)n);
	(void)w;
}

int is_direct(int fd)
{
	struct sockaddr_storage a;
	socklen_t l = sizeof a;
	return syscall(SYS_getsockname, fd, &a, &l) == 0 && a.ss_family == AF_UNIX;
}

int read_full(int fd, void *b, size_t n)
{
	size_t k = 0;
	while (k < n) {
		ssize_t r = read(fd, (char *)b + k, n - k);
		if (r <= 0)
			return -1;
		k += (size_t)r;
	}
	return 0;
}

int dial(void)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&g_addr, sizeof g_addr) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static struct live *live_claim(struct end *e)
{
	for (int i = 0; i < LIVE_MAX; i++) {
		uint64_t z = 0;
		struct live *l = &g_t->live[i];
		if (__atomic_compare_exchange_n(&l->seed, &z, e->p.seed, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
			l->pid = (int)getpid();
			l->fd = e->fd;
			l->w = e->w;
			l->sent = l->got = 0;
			l->wdone = l->rdone = 0;
			return l;
		}
	}
	return NULL;
}

/* The ends still in progress, one line each (their plans by seed). */
static void live_report(const char *who)
{
	for (int i = 0; i < LIVE_MAX; i++) {
		struct live *l = &g_t->live[i];
		uint64_t seed = __atomic_load_n(&l->seed, __ATOMIC_ACQUIRE);
		if (!seed)
			continue;
		struct plan p;
		plan_of(seed, &p);
		say("LIVE %s seed %llx pid %d fd %d mode %d how %d/%d stall %llu/%llu sent %llu/%llu got %llu/%llu wdone %d rdone %d\n",
		    who, (unsigned long long)seed, l->pid, l->fd, p.mode, p.how[0], p.how[1], (unsigned long long)p.stall[0],
		    (unsigned long long)p.stall[1], (unsigned long long)l->sent, (unsigned long long)p.len[l->w],
		    (unsigned long long)l->got, (unsigned long long)p.len[1 - l->w], l->wdone, l->rdone);
	}
}

/* Reports the live ends once when no connection has ended for
 * WATCH_S seconds (a hang's where: the test's timeout kills the
 * program without a word). */
#define WATCH_S 20
static void *watchdog(void *a)
{
	const char *who = a;
	int last = -1, still = 0;
	for (;;) {
		sleep(1);
		int n = __atomic_load_n(&g_t->conns, __ATOMIC_SEQ_CST);
		still = n == last ? still + 1 : 0;
		last = n;
		if (still == WATCH_S) {
			live_report(who);
			if (getenv("UPGRADE_GDB")) /* debugging: every thread's stack of each stuck pid */
				for (int i = 0, seen[LIVE_MAX], ns = 0; i < LIVE_MAX; i++) {
					int pid = __atomic_load_n(&g_t->live[i].pid, __ATOMIC_RELAXED), dup = 0;
					if (!__atomic_load_n(&g_t->live[i].seed, __ATOMIC_ACQUIRE) || pid <= 0)
						continue;
					for (int k = 0; k < ns; k++)
						dup |= seen[k] == pid;
					if (dup)
						continue;
					seen[ns++] = pid;
					char cmd[160];
					snprintf(cmd, sizeof cmd, "env -u LD_PRELOAD gdb -p %d -batch -ex 'thread apply all bt' 2>&1 | grep '^#\\|^Thread'", pid);
					int r = system(cmd);
					(void)r;
				}
		}
	}
	return NULL;
}

static void done(struct end *e, const char *who, uint64_t seed)
{
	int d = is_direct(e->fd);
	add(&g_t->conns, 1);
	add(&g_t->direct, d);
	if (e->bad) {
		add(&g_t->fails, 1);
		say("FAIL %s seed %llx mode %d lens %llu/%llu how %d/%d stall %llu/%llu direct %d: %s (pid %d fd %d)\n", who,
		    (unsigned long long)seed, e->p.mode, (unsigned long long)e->p.len[0], (unsigned long long)e->p.len[1],
		    e->p.how[0], e->p.how[1], (unsigned long long)e->p.stall[0], (unsigned long long)e->p.stall[1], d, e->why,
		    (int)getpid(), e->fd);
	}
}

static void *serve(void *a)
{
	struct job *j = a;
	struct end e = {.fd = j->fd, .w = 1};
	plan_of(j->seed, &e.p);
	run_end(&e);
	done(&e, "server", j->seed);
	close(j->fd);
	add(&g_t->active, -1);
	free(j);
	return NULL;
}

/* The pingpong server: echo every byte until EOF. */
static void *echo(void *a)
{
	struct job *j = a;
	char b[64];
	ssize_t r;
	while ((r = read(j->fd, b, sizeof b)) > 0)
		if (write(j->fd, b, (size_t)r) != r)
			break;
	close(j->fd);
	free(j);
	return NULL;
}

static int g_n, g_next;

static void *client(void *a)
{
	(void)a;
	for (;;) {
		pthread_mutex_lock(&g_mu);
		int i = g_next < g_n ? g_next++ : -1;
		pthread_mutex_unlock(&g_mu);
		if (i < 0)
			return NULL;
		uint64_t seed = mix(0xc0ffee ^ (uint64_t)i) | 1;
		int fd = dial();
		if (fd < 0) {
			add(&g_t->fails, 1);
			say("FAIL client %d: connect: %s\n", i, strerror(errno));
			continue;
		}
		struct end e = {.fd = fd, .w = 0};
		plan_of(seed, &e.p);
		if (write(fd, &seed, sizeof seed) != sizeof seed)
			failf(&e, "seed: %s", strerror(errno));
		else
			run_end(&e);
		done(&e, "client", seed);
		close(fd);
	}
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: upgrade server IP PORT | client IP PORT N CONC\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	g_t = mmap(NULL, sizeof *g_t, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (g_t == MAP_FAILED)
		return 2;
	if (getenv("UPGRADE_NOSIGPIPE")) /* debugging: a write's EPIPE as a FAIL line */
		signal(SIGPIPE, SIG_IGN);
	g_addr.sin_family = AF_INET;
	g_addr.sin_port = htons((uint16_t)atoi(argv[3]));
	if (inet_pton(AF_INET, argv[2], &g_addr.sin_addr) != 1)
		return 2;
	if (!strcmp(argv[1], "server") || !strcmp(argv[1], "client")) {
		pthread_t wd;
		if (pthread_create(&wd, NULL, watchdog, argv[1]) == 0)
			pthread_detach(wd);
	}
	if (!strcmp(argv[1], "server")) {
		int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
		setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(l, (struct sockaddr *)&g_addr, sizeof g_addr) < 0 || listen(l, 1024) < 0) {
			perror("listen");
			return 1;
		}
		for (;;) {
			int fd = accept(l, NULL, NULL);
			if (fd < 0)
				continue;
			uint64_t seed;
			if (read_full(fd, &seed, sizeof seed) < 0) {
				close(fd);
				continue;
			}
			if (seed == 2) { /* pingpong: echo until EOF */
				struct job *j = malloc(sizeof *j);
				j->fd = fd;
				j->seed = seed;
				pthread_t t;
				pthread_create(&t, NULL, echo, j);
				pthread_detach(t);
				continue;
			}
			if (seed == NR_SEED || seed == NR_SEED_QUIET) { /* noread */
				struct job *j = malloc(sizeof *j);
				j->fd = fd;
				j->seed = seed;
				add(&g_t->active, 1);
				pthread_t t;
				pthread_create(&t, NULL, nr_serve, j);
				pthread_detach(t);
				continue;
			}
			if (seed == 0) { /* quit: after the client's last connection ended */
				close(fd);
				break;
			}
			struct job *j = malloc(sizeof *j);
			j->fd = fd;
			j->seed = seed;
			add(&g_t->active, 1);
			if (mix(seed ^ 9) % 4 == 0) {
				/* In a forked child, with the upgrade's state it inherits. */
				pid_t pid = fork();
				if (pid == 0) {
					serve(j);
					_exit(0);
				}
				if (pid < 0) {
					say("FAIL server: fork: %s\n", strerror(errno));
					add(&g_t->fails, 1);
					add(&g_t->active, -1);
				}
				close(fd);
				free(j);
				while (waitpid(-1, NULL, WNOHANG) > 0)
					;
				continue;
			}
			pthread_t t;
			pthread_attr_t at;
			pthread_attr_init(&at);
			pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
			if (pthread_create(&t, &at, serve, j) != 0) {
				say("FAIL server: pthread_create\n");
				add(&g_t->fails, 1);
				add(&g_t->active, -1);
				close(fd);
				free(j);
			}
		}
		for (int i = 0; i < 3000; i++) { /* 30 s */
			while (waitpid(-1, NULL, WNOHANG) > 0)
				;
			if (__atomic_load_n(&g_t->active, __ATOMIC_SEQ_CST) == 0)
				break;
			usleep(10000);
		}
		if (g_t->active) {
			say("FAIL server: %d connections did not end\n", g_t->active);
			live_report("server");
			add(&g_t->fails, 1);
		}
		say("conns %d direct %d fails %d\n", g_t->conns, g_t->direct, g_t->fails);
		return g_t->fails ? 1 : 0;
	}
	if (!strcmp(argv[1], "pingpong"))
		return pingpong(atoi(argv[4]));
	if (!strcmp(argv[1], "fds"))
		return fds_per_conn(atoi(argv[4]));
	if (!strcmp(argv[1], "noread"))
		return noread(atoi(argv[4]));
	g_n = atoi(argv[4]);
	int conc = argc > 5 ? atoi(argv[5]) : 16;
	pthread_t t[256];
	if (conc > 256)
		conc = 256;
	for (int i = 0; i < conc; i++)
		pthread_create(&t[i], NULL, client, NULL);
	for (int i = 0; i < conc; i++)
		pthread_join(t[i], NULL);
	int q = dial();
	uint64_t zero = 0;
	if (q >= 0) {
		ssize_t w = write(q, &zero, sizeof zero);
		(void)w;
		close(q);
	}
	say("conns %d direct %d fails %d\n", g_t->conns, g_t->direct, g_t->fails);
	return g_t->fails ? 1 : 0;
}

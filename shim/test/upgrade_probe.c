/*
 * upgrade_probe.c: the single-connection modes of the upgrade's test
 * program (shim/test/upgrade.c has the stress test and main): pingpong
 * (when a connection becomes direct, its round trips before and after),
 * fds (what a moved connection costs in descriptors) and noread (a
 * program that does not read). Shared declarations in upgrade.h.
 */
#include "upgrade.h"

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

/* One connection, 1-byte ping-pong for ms milliseconds from connect:
 * prints when its descriptor became direct (µs after connect, -1:
 * never) and the round-trip p50 before and after that. */
int pingpong(int ms)
{
	static uint32_t rtt[1 << 22];
	uint64_t t0 = now_ns(), direct_at = 0;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&g_addr, sizeof g_addr) < 0) {
		printf("FAIL pingpong: connect: %s\n", strerror(errno));
		return 1;
	}
	uint64_t seed = 2;
	if (write(fd, &seed, sizeof seed) != sizeof seed)
		return 1;
	size_t n = 0, nbefore = 0;
	for (uint64_t t = now_ns(); t - t0 < (uint64_t)ms * 1000000 && n < sizeof rtt / sizeof rtt[0]; ) {
		char c = 'x';
		if (write(fd, &c, 1) != 1 || read(fd, &c, 1) != 1) {
			printf("FAIL pingpong: %s\n", strerror(errno));
			return 1;
		}
		uint64_t u = now_ns();
		rtt[n++] = (uint32_t)(u - t);
		t = u;
		if (!direct_at && (n & 15) == 0 && is_direct(fd)) {
			direct_at = u - t0;
			nbefore = n;
		}
	}
	close(fd);
	uint32_t p50b = 0, p50a = 0;
	size_t nb = direct_at ? nbefore : n;
	if (nb) {
		qsort(rtt, nb, sizeof rtt[0], cmp_u32);
		p50b = rtt[nb / 2];
	}
	if (n > nb) {
		qsort(rtt + nb, n - nb, sizeof rtt[0], cmp_u32);
		p50a = rtt[nb + (n - nb) / 2];
	}
	printf("pingpong direct_after_us %lld before_p50_us %.2f after_p50_us %.2f round_trips %zu\n",
	       direct_at ? (long long)(direct_at / 1000) : -1LL, p50b / 1000.0, p50a / 1000.0, n);
	return 0;
}

/* A program that does not read (issue #33): the server of a "noread"
 * connection (seed NR_SEED or NR_SEED_QUIET) writes all its NR_S bytes
 * before it reads anything, more than TCP's buffers and the ring hold
 * (its first writes slowly enough to ask for and take the upgrade), and
 * makes no call at all for NR_STALL_US after (QUIET: before), longer
 * than exnd's claim timeout (1 s). The client writes NR_C bytes, also
 * more than they hold, so its writer blocks on TCP until the server
 * reads, while its reader must read the server's NR_S bytes: if a read
 * of the client waited for the client's own write (a conversion does),
 * neither would ever go on. Both streams must arrive whole. */
#define NR_S (16u << 20)
#define NR_C (64u << 20)
#define NR_SLOW 16 /* of NR_S's 64 KiB writes, the first with 2 ms pauses */
#define NR_STALL_US 1500000
#define NR_KEY_S 0x5e4e4ull
#define NR_KEY_C 0xc11e47ull

static int nr_write(int fd, uint64_t key, uint64_t len, unsigned chunk, unsigned pause_us, int npause)
{
	static __thread uint8_t buf[65536];
	for (uint64_t off = 0; off < len;) {
		size_t n = len - off < chunk ? (size_t)(len - off) : chunk;
		for (size_t i = 0; i < n; i++)
			buf[i] = sbyte(key, off + i);
		ssize_t w = write(fd, buf, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		off += (uint64_t)w;
		if (npause > 0) {
			npause--;
			sleep_us(pause_us);
		}
	}
	return 0;
}

/* Read to EOF: 0 when exactly len bytes of key came, else -1 with why. */
static int nr_read(int fd, uint64_t key, uint64_t len, char *why, size_t wl)
{
	static __thread uint8_t buf[65536];
	uint64_t got = 0;
	for (;;) {
		ssize_t r = read(fd, buf, sizeof buf);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			snprintf(why, wl, "read after %llu: %s", (unsigned long long)got, strerror(errno));
			return -1;
		}
		if (r == 0)
			break;
		for (ssize_t i = 0; i < r; i++)
			if (buf[i] != sbyte(key, got + (uint64_t)i)) {
				snprintf(why, wl, "byte %llu: got %u want %u", (unsigned long long)(got + (uint64_t)i), buf[i],
					 sbyte(key, got + (uint64_t)i));
				return -1;
			}
		got += (uint64_t)r;
	}
	if (got != len) {
		snprintf(why, wl, "EOF after %llu of %llu bytes", (unsigned long long)got, (unsigned long long)len);
		return -1;
	}
	return 0;
}

void *nr_serve(void *a)
{
	struct job *j = a;
	int quiet = j->seed == NR_SEED_QUIET, bad = 0;
	char why[160] = "";
	/* the first writes with 2 ms pauses: the connection ages, asks and
	 * attaches; the rest blocks until the client has read it */
	if (!quiet && nr_write(j->fd, NR_KEY_S, NR_S, 65536, 2000, NR_SLOW) < 0) {
		snprintf(why, sizeof why, "write: %s", strerror(errno));
		bad = 1;
	}
	sleep_us(NR_STALL_US);
	if (!bad && quiet && nr_write(j->fd, NR_KEY_S, NR_S, 65536, 2000, NR_SLOW) < 0) {
		snprintf(why, sizeof why, "write: %s", strerror(errno));
		bad = 1;
	}
	if (!bad && shutdown(j->fd, SHUT_WR) < 0) {
		snprintf(why, sizeof why, "shutdown: %s", strerror(errno));
		bad = 1;
	}
	if (!bad && nr_read(j->fd, NR_KEY_C, NR_C, why, sizeof why) < 0)
		bad = 1;
	int d = is_direct(j->fd);
	if (bad)
		say("FAIL noread server quiet %d direct %d: %s\n", quiet, d, why);
	else
		say("noread server quiet %d ok direct %d\n", quiet, d);
	add(&g_t->conns, 1);
	add(&g_t->direct, d);
	add(&g_t->fails, bad);
	close(j->fd);
	add(&g_t->active, -1);
	free(j);
	return NULL;
}

struct nr_client {
	int fd, bad;
	uint8_t *buf; /* NR_C bytes of NR_KEY_C, made before the connect */
	char why[160];
};

/* The client's NR_C bytes in one write(2) from the connect on: it is on
 * TCP, blocked, before the connection is old enough to ask for the
 * upgrade, and stays there until the server reads. */
static void *nr_writer(void *a)
{
	struct nr_client *k = a;
	uint8_t *b = k->buf;
	for (uint64_t off = 0; off < NR_C;) {
		ssize_t w = write(k->fd, b + off, NR_C - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			snprintf(k->why, sizeof k->why, "write at %llu: %s", (unsigned long long)off, strerror(errno));
			k->bad = 1;
			break;
		}
		off += (uint64_t)w;
	}
	if (!k->bad && shutdown(k->fd, SHUT_WR) < 0) {
		snprintf(k->why, sizeof k->why, "shutdown: %s", strerror(errno));
		k->bad = 1;
	}
	return NULL;
}

int noread(int quiet)
{
	uint8_t *buf = malloc(NR_C);
	if (!buf)
		return 1;
	for (uint64_t i = 0; i < NR_C; i++)
		buf[i] = sbyte(NR_KEY_C, i);
	int fd = dial();
	uint64_t seed = quiet ? NR_SEED_QUIET : NR_SEED;
	if (fd < 0 || write(fd, &seed, sizeof seed) != sizeof seed) {
		printf("FAIL noread client: connect: %s\n", strerror(errno));
		return 1;
	}
	struct nr_client k = {.fd = fd, .buf = buf};
	pthread_t t;
	if (pthread_create(&t, NULL, nr_writer, &k) != 0)
		return 1;
	char why[160] = "";
	uint64_t t0 = now_ns();
	int bad = nr_read(fd, NR_KEY_S, NR_S, why, sizeof why) < 0;
	double read_ms = (double)(now_ns() - t0) / 1e6;
	pthread_join(t, NULL);
	free(buf);
	int d = is_direct(fd);
	close(fd);
	if (bad || k.bad) {
		printf("FAIL noread client quiet %d direct %d: %s%s\n", quiet, d, bad ? why : "", k.bad ? k.why : "");
		return 1;
	}
	printf("noread client quiet %d ok direct %d read_ms %.1f\n", quiet, d, read_ms);
	return 0;
}

/* Open descriptors of this process now. */
static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;
	if (!d)
		return -1;
	while (readdir(d))
		n++;
	closedir(d);
	return n - 3; /* ".", ".." and the directory's own */
}

/* One ping-pong on fd, then whether it is direct. */
static int ping_direct(int fd)
{
	char c = 'x';
	if (write(fd, &c, 1) != 1 || read(fd, &c, 1) != 1)
		return -1;
	return is_direct(fd);
}

/* Ping-pong on fds[0..n) until each is direct, for at most 10 s. 0, or
 * -1 with a FAIL line. */
static int until_direct(int *fds, int n)
{
	uint64_t t0 = now_ns();
	for (int left = n; left > 0;) {
		left = 0;
		for (int i = 0; i < n; i++) {
			int r = ping_direct(fds[i]);
			if (r < 0) {
				printf("FAIL fds: connection %d: %s\n", i, strerror(errno));
				return -1;
			}
			left += !r;
		}
		if (now_ns() - t0 > 10000000000ull) {
			printf("FAIL fds: %d of %d connections still TCP after 10 s\n", left, n);
			return -1;
		}
		usleep(1000);
	}
	return 0;
}

/* The descriptors an upgraded connection costs once direct: n
 * connections in ping-pong until each is direct, then what closing all
 * but the first gives back, per connection. */
int fds_per_conn(int n)
{
	static int fds[1024];
	if (n < 2 || n > 1024)
		return 2;
	uint64_t seed = 2;
	for (int i = 0; i < n; i++) {
		fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fds[i] < 0 || connect(fds[i], (struct sockaddr *)&g_addr, sizeof g_addr) < 0 ||
		    write(fds[i], &seed, sizeof seed) != sizeof seed) {
			printf("FAIL fds: connect: %s\n", strerror(errno));
			return 1;
		}
		if (i > 0)
			continue;
		if (until_direct(fds, 1) < 0)
			return 1;
	}
	if (until_direct(fds, n) < 0)
		return 1;
	/* What closing the other n-1 gives back is what they cost: the
	 * process's own objects (the family kick, each thread's kick, made
	 * at a first park) stay with the first. */
	int all = count_fds();
	for (int i = 1; i < n; i++)
		close(fds[i]);
	int one = count_fds();
	close(fds[0]);
	printf("fds conns %d first %d all %d per_conn %.2f\n", n, one, all, (double)(all - one) / (n - 1));
	return 0;
}


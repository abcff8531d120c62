/*
 * tap_fwd: the smallest user-space TAP gateways for throughput, for
 * perf/tap-relay.sh (BenchmarkTAPRelay, perf/taprelay_test.go). Its TAPs
 * take the virtio-net header and the offloads exnd asks for (checksum,
 * TSO4/6 with ECN, USO4/6 where the kernel has them; internal/sys
 * OpenTAPVnet), so super-frames and partial checksums cross whole, as
 * they do over exn0. It relays each frame with its header verbatim: no
 * protocol, no batching, no runtime, one blocking thread per direction.
 *
 *   tap_fwd pair NAME_A NAME_B
 *       two TAPs in one process, each frame read from one written to the
 *       other: the two copies any TAP gateway makes and nothing else
 *       (the caller moves NAME_B into the other namespace; its fd stays).
 *   tap_fwd shm NAME_A NAME_B
 *       two processes, each holding one TAP, joined by a shared-memory
 *       ring of 64 frame slots per direction (exnd's slot count): the
 *       reader reads a frame from its TAP straight into a slot, the other
 *       process writes it to its TAP straight from the slot. Two copies,
 *       and the cross-process wake-up of a two-gateway design: a process
 *       that finds its ring empty parks in a blocking read of a pipe,
 *       which the producer writes only when it sees it parked (the
 *       doorbell of fabric/shm, docs/wakeup.md). It is exnd on shm with
 *       nothing but its wake-ups and one copy fewer (no GET).
 *   tap_fwd listen NAME IP PORT | tap_fwd connect NAME IP PORT
 *       one TAP and one TCP connection over the underlay, each frame as
 *       a 4-byte length and the header and frame: the four copies of a
 *       TAP gateway over a TCP underlay (exnd on the net fabric makes
 *       the same four).
 *
 * A frame a TAP refuses (EIO while it is down, EINVAL) is dropped, as a
 * NIC would. It prints "ready" once its TAPs and connection exist and
 * runs until killed or the connection ends; the kernel removes the TAPs
 * when it exits.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* VNET is struct virtio_net_hdr's size; BUF holds it and the largest
 * frame a TAP passes (MTU 65521 + 14). */
enum { VNET = 10, BUF = 65536 + 64 };

#ifndef TUN_F_USO4
#define TUN_F_USO4 0x20
#define TUN_F_USO6 0x40
#endif

static void ready(void);

static void die(const char *what) {
	perror(what);
	exit(1);
}

static int open_tap(const char *name) {
	int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
	if (fd < 0)
		die("/dev/net/tun");
	struct ifreq ifr;
	memset(&ifr, 0, sizeof ifr);
	ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
	snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", name);
	if (ioctl(fd, TUNSETIFF, &ifr) < 0)
		die("TUNSETIFF");
	int sz = VNET;
	if (ioctl(fd, TUNSETVNETHDRSZ, &sz) < 0)
		die("TUNSETVNETHDRSZ");
	unsigned base = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN;
	if (ioctl(fd, TUNSETOFFLOAD, base | TUN_F_USO4 | TUN_F_USO6) < 0 && ioctl(fd, TUNSETOFFLOAD, base) < 0)
		die("TUNSETOFFLOAD");
	return fd;
}

/* tap_write writes one header+frame, dropping what the TAP refuses. */
static void tap_write(int fd, const char *b, size_t n) {
	if (write(fd, b, n) < 0 && errno != EINVAL && errno != EIO)
		die("write tap");
}

static ssize_t tap_read(int fd, char *b) {
	for (;;) {
		ssize_t n = read(fd, b, BUF);
		if (n >= 0 || errno != EINTR)
			return n;
	}
}

struct pair {
	int from, to;
};

static void *tap_to_tap(void *arg) {
	struct pair *p = arg;
	char *b = malloc(BUF);
	if (!b)
		die("malloc");
	for (;;) {
		ssize_t n = tap_read(p->from, b);
		if (n < 0)
			die("read tap");
		tap_write(p->to, b, (size_t)n);
	}
	return NULL;
}

struct stream {
	int tap, sock;
};

/* read_full reads exactly n bytes; 0 at a clean end of the stream. */
static int read_full(int fd, char *b, size_t n) {
	for (size_t got = 0; got < n;) {
		ssize_t r = recv(fd, b + got, n - got, MSG_WAITALL);
		if (r == 0)
			return 0;
		if (r < 0) {
			if (errno == EINTR)
				continue;
			die("recv");
		}
		got += (size_t)r;
	}
	return 1;
}

static void *tap_to_sock(void *arg) {
	struct stream *s = arg;
	char *b = malloc(BUF);
	if (!b)
		die("malloc");
	for (;;) {
		ssize_t n = tap_read(s->tap, b);
		if (n < 0)
			die("read tap");
		uint32_t len = htonl((uint32_t)n);
		struct iovec iov[2] = {{&len, sizeof len}, {b, (size_t)n}};
		size_t want = sizeof len + (size_t)n;
		for (size_t done = 0; done < want;) {
			ssize_t w = writev(s->sock, iov, 2);
			if (w < 0) {
				if (errno == EINTR)
					continue;
				die("writev");
			}
			done += (size_t)w;
			for (int i = 0; i < 2; i++) { /* advance past what went */
				size_t k = (size_t)w < iov[i].iov_len ? (size_t)w : iov[i].iov_len;
				iov[i].iov_base = (char *)iov[i].iov_base + k;
				iov[i].iov_len -= k;
				w -= (ssize_t)k;
			}
		}
	}
	return NULL;
}

static void sock_to_tap(struct stream *s) {
	char *b = malloc(BUF);
	if (!b)
		die("malloc");
	for (;;) {
		uint32_t len;
		if (!read_full(s->sock, (char *)&len, sizeof len))
			exit(0);
		len = ntohl(len);
		if (len < VNET || len > BUF) {
			fprintf(stderr, "tap_fwd: frame of %u bytes\n", len);
			exit(1);
		}
		if (!read_full(s->sock, b, len))
			exit(0);
		tap_write(s->tap, b, len);
	}
}

static int tcp(const char *mode, const char *ip, const char *port) {
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(port))};
	if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
		fprintf(stderr, "tap_fwd: bad address %s\n", ip);
		exit(2);
	}
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		die("socket");
	int one = 1;
	if (strcmp(mode, "listen") == 0) {
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 1) < 0)
			die("listen");
		int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
		if (c < 0)
			die("accept");
		close(fd);
		fd = c;
	} else {
		/* The listener may not be up yet: try for 5 s. */
		int i = 0;
		while (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
			if (++i == 500)
				die("connect");
			close(fd);
			usleep(10000);
			if ((fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
				die("socket");
		}
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	return fd;
}

/* ring is one direction of the shm mode, in a shared mapping. head and
 * tail count frames; the producer owns head and the consumer tail. parked
 * and space_wait say a side waits in a blocking read of its pipe. */
enum { SLOTS = 64 };
struct ring {
	uint32_t head, tail;
	int parked, space_wait;
	uint32_t len[SLOTS];
	char slot[SLOTS][BUF];
};

struct shm_dir {
	struct ring *r;
	int tap;             /* the TAP read (producer) or written (consumer) */
	int bell[2];         /* consumer parks on bell[0] */
	int space[2];        /* producer parks on space[0] when full */
};

/* kick writes a byte to a pipe if *flag says its reader waits. */
static void kick(int *flag, int fd) {
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (__atomic_load_n(flag, __ATOMIC_RELAXED) && __atomic_exchange_n(flag, 0, __ATOMIC_ACQ_REL)) {
		char c = 1;
		if (write(fd, &c, 1) < 0 && errno != EAGAIN)
			die("write bell");
	}
}

/* park waits on pipe fd unless *word moved from seen after *flag was set. */
static void park(int *flag, uint32_t *word, uint32_t seen, int fd) {
	__atomic_store_n(flag, 1, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (__atomic_load_n(word, __ATOMIC_ACQUIRE) == seen) {
		char c[64];
		if (read(fd, c, sizeof c) < 0 && errno != EINTR)
			die("read bell");
	}
	__atomic_store_n(flag, 0, __ATOMIC_RELAXED);
}

static void *shm_produce(void *arg) {
	struct shm_dir *d = arg;
	struct ring *r = d->r;
	for (uint32_t h = 0;;) {
		uint32_t t = __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE);
		if (h - t == SLOTS) {
			park(&r->space_wait, &r->tail, t, d->space[0]);
			continue;
		}
		ssize_t n = tap_read(d->tap, r->slot[h % SLOTS]);
		if (n < 0)
			die("read tap");
		r->len[h % SLOTS] = (uint32_t)n;
		__atomic_store_n(&r->head, ++h, __ATOMIC_RELEASE);
		kick(&r->parked, d->bell[1]);
	}
	return NULL;
}

static void *shm_consume(void *arg) {
	struct shm_dir *d = arg;
	struct ring *r = d->r;
	for (uint32_t t = 0;;) {
		if (__atomic_load_n(&r->head, __ATOMIC_ACQUIRE) == t) {
			park(&r->parked, &r->head, t, d->bell[0]);
			continue;
		}
		tap_write(d->tap, r->slot[t % SLOTS], r->len[t % SLOTS]);
		__atomic_store_n(&r->tail, ++t, __ATOMIC_RELEASE);
		kick(&r->space_wait, d->space[1]);
	}
	return NULL;
}

/* shm_mode runs the shm mode: this process keeps TAP a, a child TAP b. */
static void shm_mode(const char *name_a, const char *name_b) {
	int a = open_tap(name_a), b = open_tap(name_b);
	struct ring *rings = mmap(NULL, 2 * sizeof(struct ring), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (rings == MAP_FAILED)
		die("mmap");
	/* dir[0]: a to b, dir[1]: b to a. */
	static struct shm_dir out, in;
	int bells[2][2], spaces[2][2];
	for (int i = 0; i < 2; i++)
		if (pipe2(bells[i], O_CLOEXEC) < 0 || pipe2(spaces[i], O_CLOEXEC) < 0)
			die("pipe");
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	int mine = pid == 0 ? b : a, other = pid == 0 ? a : b;
	int o = pid == 0 ? 1 : 0; /* the direction this process produces */
	close(other);
	if (pid == 0 && prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
		die("prctl");
	out = (struct shm_dir){&rings[o], mine, {bells[o][0], bells[o][1]}, {spaces[o][0], spaces[o][1]}};
	in = (struct shm_dir){&rings[1 - o], mine, {bells[1 - o][0], bells[1 - o][1]}, {spaces[1 - o][0], spaces[1 - o][1]}};
	if (pid != 0)
		ready();
	pthread_t t;
	if (pthread_create(&t, NULL, shm_produce, &out) != 0)
		die("pthread_create");
	shm_consume(&in);
}

static void ready(void) {
	printf("ready\n");
	fflush(stdout);
}

int main(int argc, char **argv) {
	pthread_t t;
	if (argc == 4 && strcmp(argv[1], "pair") == 0) {
		static struct pair ab, ba;
		int a = open_tap(argv[2]), b = open_tap(argv[3]);
		ab = (struct pair){a, b};
		ba = (struct pair){b, a};
		ready();
		if (pthread_create(&t, NULL, tap_to_tap, &ab) != 0)
			die("pthread_create");
		tap_to_tap(&ba);
		return 0;
	}
	if (argc == 4 && strcmp(argv[1], "shm") == 0) {
		shm_mode(argv[2], argv[3]);
		return 0;
	}
	if (argc == 5 && (strcmp(argv[1], "listen") == 0 || strcmp(argv[1], "connect") == 0)) {
		static struct stream s;
		s.tap = open_tap(argv[2]);
		s.sock = tcp(argv[1], argv[3], argv[4]);
		ready();
		if (pthread_create(&t, NULL, tap_to_sock, &s) != 0)
			die("pthread_create");
		sock_to_tap(&s);
		return 0;
	}
	fprintf(stderr, "usage: tap_fwd pair|shm NAME_A NAME_B | tap_fwd listen|connect NAME IP PORT\n");
	return 2;
}

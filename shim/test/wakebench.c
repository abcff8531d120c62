/*
 * wakebench: what a cross-process wake-up costs with each kernel object
 * a direct connection could park on (issue #32, docs/direct.md
 * "Descriptors"). Two processes (fork) ping-pong ROUNDS times; each side
 * parks in the way named and the other wakes it:
 *
 *   fifo        poll() on its FIFO, the other writes a byte to it
 *   socketpair  poll() on its end, the other writes a byte into its own
 *   eventfd     poll() on its eventfd, the other writes 1 to it
 *   futex       FUTEX_WAIT on a word of a shared mapping, FUTEX_WAKE
 *
 * The three descriptors can sit in poll/epoll beside the program's own;
 * a futex cannot. Usage: wakebench [ROUNDS]. Prints one line per way:
 *
 *   way NAME rtt_p50_ns X rtt_p99_ns Y
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

enum way { FIFO, SOCKETPAIR, EVENTFD, FUTEX, NWAYS };
static const char *names[NWAYS] = {"fifo", "socketpair", "eventfd", "futex"};

/* The objects of one way: park[i] is what side i parks on, ring[i] what
 * it writes to wake the other. */
struct objs {
	int park[2], ring[2];
	uint32_t *word; /* futex: word[i] is side i's sequence */
};

static void park(enum way w, struct objs *o, int i, uint32_t *seen)
{
	if (w == FUTEX) {
		while (__atomic_load_n(&o->word[i], __ATOMIC_ACQUIRE) == *seen)
			syscall(SYS_futex, &o->word[i], FUTEX_WAIT, *seen, NULL, NULL, 0);
		*seen = __atomic_load_n(&o->word[i], __ATOMIC_ACQUIRE);
		return;
	}
	struct pollfd p = {o->park[i], POLLIN, 0};
	while (poll(&p, 1, -1) < 0 && errno == EINTR)
		;
	uint64_t b;
	while (read(o->park[i], &b, w == EVENTFD ? 8 : 1) < 0 && errno == EINTR)
		;
}

static void ring(enum way w, struct objs *o, int i)
{
	if (w == FUTEX) {
		__atomic_add_fetch(&o->word[1 - i], 1, __ATOMIC_RELEASE);
		syscall(SYS_futex, &o->word[1 - i], FUTEX_WAKE, 1, NULL, NULL, 0);
		return;
	}
	uint64_t one = 1;
	while (write(o->ring[i], &one, w == EVENTFD ? 8 : 1) < 0 && errno == EINTR)
		;
}

static int setup(enum way w, struct objs *o, const char *dir)
{
	memset(o, 0, sizeof *o);
	o->word = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (o->word == MAP_FAILED)
		return -1;
	switch (w) {
	case FIFO:
		for (int i = 0; i < 2; i++) {
			char path[256];
			snprintf(path, sizeof path, "%s/wakebench-%d-%d", dir, (int)getpid(), i);
			unlink(path);
			if (mkfifo(path, 0600) < 0)
				return -1;
			o->park[i] = open(path, O_RDWR);
			o->ring[1 - i] = open(path, O_RDWR);
			unlink(path);
		}
		return 0;
	case SOCKETPAIR: {
		int sv[2];
		if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0)
			return -1;
		o->park[0] = o->ring[0] = sv[0];
		o->park[1] = o->ring[1] = sv[1];
		return 0;
	}
	case EVENTFD:
		for (int i = 0; i < 2; i++)
			o->park[i] = o->ring[1 - i] = eventfd(0, 0);
		return 0;
	default:
		return 0;
	}
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 20000;
	const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
	int64_t *lat = calloc((size_t)rounds, sizeof *lat);
	for (int w = 0; w < NWAYS; w++) {
		struct objs o;
		if (setup((enum way)w, &o, dir) < 0) {
			perror(names[w]);
			return 1;
		}
		pid_t pid = fork();
		if (pid == 0) {
			uint32_t seen = 0;
			for (int r = 0; r < rounds + rounds / 10; r++) {
				park((enum way)w, &o, 1, &seen);
				ring((enum way)w, &o, 1);
			}
			_exit(0);
		}
		uint32_t seen = 0;
		for (int r = 0; r < rounds + rounds / 10; r++) {
			int64_t t0 = now_ns();
			ring((enum way)w, &o, 0);
			park((enum way)w, &o, 0, &seen);
			if (r >= rounds / 10)
				lat[r - rounds / 10] = now_ns() - t0;
		}
		waitpid(pid, NULL, 0);
		qsort(lat, (size_t)rounds, sizeof *lat, cmp64);
		printf("way %s rtt_p50_ns %lld rtt_p99_ns %lld\n", names[w], (long long)lat[rounds / 2],
		       (long long)lat[(long long)rounds * 99 / 100]);
	}
	free(lat);
	return 0;
}

/*
 * upgrade.h: what shim/test/upgrade.c (the stress test, the server and
 * main) and shim/test/upgrade_probe.c (pingpong, fds, noread) share.
 * One test program; integration/upgrade_test.go compiles both files.
 */
#ifndef EXN_UPGRADE_TEST_H
#define EXN_UPGRADE_TEST_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static inline uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Byte i of the stream named by key. */
static inline uint8_t sbyte(uint64_t key, uint64_t i) { return (uint8_t)(mix(key ^ (i >> 3) * 0x100000001b3ull) >> ((i & 7) * 8)); }

static inline void sleep_us(unsigned us)
{
	struct timespec t = {0, (long)us * 1000};
	if (us)
		nanosleep(&t, NULL);
}

static inline uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* A connection's end in progress, in the shared tally (forked children
 * too), for the watchdog's report of connections that stop moving. */
struct live {
	uint64_t seed, sent, got;
	int pid, fd, w, wdone, rdone;
};
#define LIVE_MAX 256

/* The tally, in a shared mapping: forked children count in it too. */
struct tally {
	int conns, direct, fails, active;
	struct live live[LIVE_MAX];
};
extern struct tally *g_t;

struct job {
	int fd;
	uint64_t seed;
};

/* "noread" connections (upgrade_probe.c) start with one of these seeds. */
#define NR_SEED 4
#define NR_SEED_QUIET 6

extern struct sockaddr_in g_addr;

void add(int *v, int n);
/* One line to stdout with write(2): a forked child of a threaded
 * process must not take stdio's locks. */
void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Whether fd is the shim's direct descriptor: the kernel says AF_UNIX
 * (the shim itself answers with the TCP addresses). */
int is_direct(int fd);
/* A connection to g_addr, or -1. */
int dial(void);
/* Read exactly n bytes: 0, or -1. */
int read_full(int fd, void *b, size_t n);

/* upgrade_probe.c's modes (their comments there). */
int pingpong(int ms);
int fds_per_conn(int n);
int noread(int quiet);
void *nr_serve(void *a);

#endif

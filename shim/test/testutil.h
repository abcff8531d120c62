/*
 * testutil.h: clock, sorting and descriptor helpers shared by the shim's
 * C test programs (manyconns.c, wakebench.c, directcalls.c), as static
 * inline functions so that each program still builds from its one .c
 * file. Include it after the system headers (with _GNU_SOURCE defined
 * first).
 */
#ifndef EXN_SHIM_TEST_TESTUTIL_H
#define EXN_SHIM_TEST_TESTUTIL_H

#include <stdint.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* CLOCK_MONOTONIC in nanoseconds. */
static inline int64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* qsort order of int64_t values (latencies), ascending. */
static inline int cmp64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

/* What the kernel says the descriptor is, its SO_DOMAIN (a raw syscall
 * the shim does not see: to getsockopt it answers for a switched
 * connection with the TCP socket's family), AF_UNIX once switched; -1 if
 * fd is not a socket. */
static inline int kernel_domain(int fd)
{
	int v = -1;
	socklen_t l = sizeof v;
	if (syscall(SYS_getsockopt, fd, SOL_SOCKET, SO_DOMAIN, &v, &l) < 0)
		return -1;
	return v;
}

#endif

/*
 * dring_peer: the C half of the cross-language test of the direct
 * connection buffer (shim/check/dring_test.go against extds/dring).
 *
 *   dring_peer SIDE RING MODE [N]
 *
 * Descriptors from the Go test: 3 the buffer, 4 my bell (its other end is
 * the Go side's), 5 V. No hooks: one waiter at a time in this process.
 * MODE: echo (write back everything read, then fin), send N (N pattern
 * bytes, then fin), recv N (read to EOF, check N pattern bytes), eio
 * (read; expect EIO from a forged cursor). It prints one line: "ok ..."
 * or "FAIL ...", and exits 0 or 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../dring.h"

static unsigned char pat(long long i) { return (unsigned char)(i * 7 + (i >> 13)); }

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: dring_peer SIDE RING MODE [N]\n");
		return 2;
	}
	int side = atoi(argv[1]);
	uint32_t ring = (uint32_t)strtoul(argv[2], NULL, 0);
	const char *mode = argv[3];
	long long n = argc > 4 ? atoll(argv[4]) : 0;
	struct dring d;
	int r = dring_attach(&d, 3, side, ring, 4, 5, NULL);
	if (r < 0) {
		printf("FAIL attach: %s\n", strerror(-r));
		return 1;
	}
	static unsigned char buf[100000];
	long long total = 0;
	if (!strcmp(mode, "echo")) {
		for (;;) {
			ssize_t k = dring_read(&d, buf, sizeof buf, 0);
			if (k == 0)
				break;
			if (k < 0) {
				printf("FAIL echo read: %s\n", strerror((int)-k));
				return 1;
			}
			ssize_t w = dring_write(&d, buf, (size_t)k, 0);
			if (w != k) {
				printf("FAIL echo write: %zd of %zd\n", w, k);
				return 1;
			}
			total += k;
		}
		dring_fin(&d);
		printf("ok echoed %lld\n", total);
		return 0;
	}
	if (!strcmp(mode, "send")) {
		while (total < n) {
			size_t k = sizeof buf;
			if ((long long)k > n - total)
				k = (size_t)(n - total);
			for (size_t i = 0; i < k; i++)
				buf[i] = pat(total + (long long)i);
			ssize_t w = dring_write(&d, buf, k, 0);
			if (w != (ssize_t)k) {
				printf("FAIL send: %zd of %zu: %s\n", w, k, w < 0 ? strerror((int)-w) : "");
				return 1;
			}
			total += (long long)k;
		}
		dring_fin(&d);
		printf("ok sent %lld\n", total);
		return 0;
	}
	if (!strcmp(mode, "recv") || !strcmp(mode, "eio")) {
		for (;;) {
			ssize_t k = dring_read(&d, buf, sizeof buf, 0);
			if (k == 0)
				break;
			if (k < 0) {
				if (!strcmp(mode, "eio") && k == -EIO) {
					printf("ok eio after %lld\n", total);
					return 0;
				}
				printf("FAIL recv after %lld: %s\n", total, strerror((int)-k));
				return 1;
			}
			for (ssize_t i = 0; i < k; i++)
				if (buf[i] != pat(total + i)) {
					printf("FAIL recv: byte %lld\n", total + i);
					return 1;
				}
			total += k;
		}
		if (!strcmp(mode, "eio") || total != n) {
			printf("FAIL recv: EOF after %lld, want %lld\n", total, n);
			return 1;
		}
		printf("ok received %lld\n", total);
		return 0;
	}
	printf("FAIL mode %s\n", mode);
	return 2;
}

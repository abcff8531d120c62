/*
 * fifo_pingpong: the floor of any wake-up design that parks. Two
 * processes ping-pong one byte through two FIFOs, each parked in poll(2)
 * between messages, so one round trip is two cross-process wake-ups and
 * nothing else. BenchmarkWakeup (perf/wakeup_test.go) runs it beside
 * exn's own round trips, in the same run.
 *
 * usage: fifo_pingpong DIR COUNT GAP_US
 * prints: p50_us p90_us
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void park(int fd)
{
	struct pollfd p = {fd, POLLIN, 0};
	char b[64];
	poll(&p, 1, -1);
	while (read(fd, b, sizeof b) > 0)
		;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	if (argc != 4)
		return 2;
	int n = atoi(argv[2]), gap = atoi(argv[3]);
	if (n <= 0 || gap < 0)
		return 2;
	char a[4096], b[4096];
	snprintf(a, sizeof a, "%s/ping", argv[1]);
	snprintf(b, sizeof b, "%s/pong", argv[1]);
	if (mkfifo(a, 0600) || mkfifo(b, 0600))
		return 1;
	int fa = open(a, O_RDWR | O_NONBLOCK), fb = open(b, O_RDWR | O_NONBLOCK);
	if (fa < 0 || fb < 0)
		return 1;
	pid_t child = fork();
	if (child < 0)
		return 1;
	if (child == 0) {
		for (int i = 0; i < n; i++) {
			park(fa);
			if (write(fb, "x", 1) != 1)
				_exit(1);
		}
		_exit(0);
	}
	double *r = malloc(n * sizeof *r);
	if (!r)
		return 1;
	for (int i = 0; i < n; i++) {
		if (gap)
			usleep(gap);
		double t = now_us();
		if (write(fa, "x", 1) != 1)
			return 1;
		park(fb);
		r[i] = now_us() - t;
	}
	int st;
	waitpid(child, &st, 0);
	qsort(r, n, sizeof *r, cmp);
	printf("%.1f %.1f\n", r[n / 2], r[n * 9 / 10]);
	return 0;
}

/*
 * hold_conns: opens (client) or accepts (server) N TCP connections and
 * holds them open and idle until it is killed: the idle load of
 * BenchmarkShimXHost (perf/shimxhost_test.go), run under libextds.so on
 * two nodes so that the connections are direct across hosts.
 *
 * usage: hold_conns server|client IPV4 PORT N
 * prints "accepted N" or "connected N" once all are open, then sleeps.
 * SIGUSR1 makes the server close its listener (it prints "unlistened"),
 * so that only the connections are left.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static volatile sig_atomic_t unlisten;

static void on_usr1(int sig)
{
	(void)sig;
	unlisten = 1;
}

static void die(const char *what, int i)
{
	fprintf(stderr, "hold_conns: %s (connection %d): ", what, i);
	perror(NULL);
	exit(1);
}

int main(int argc, char **argv)
{
	if (argc != 5 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
		fprintf(stderr, "usage: hold_conns server|client IPV4 PORT N\n");
		return 2;
	}
	int server = !strcmp(argv[1], "server"), n = atoi(argv[4]), one = 1, l = -1;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[3]))};
	if (inet_pton(AF_INET, argv[2], &a.sin_addr) != 1 || n <= 0) {
		fprintf(stderr, "hold_conns: bad address %s or count %s\n", argv[2], argv[4]);
		return 2;
	}
	/* SIGUSR1 stays blocked but inside sigsuspend: no EINTR, none lost. */
	struct sigaction sa = {.sa_handler = on_usr1};
	sigset_t usr1, waitmask;
	sigemptyset(&sa.sa_mask);
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	if (sigaction(SIGUSR1, &sa, NULL) < 0 || sigprocmask(SIG_BLOCK, &usr1, &waitmask) < 0)
		die("signals", 0);
	sigdelset(&waitmask, SIGUSR1);
	int *fds = calloc(n, sizeof *fds);
	if (!fds)
		die("calloc", 0);
	if (server) {
		l = socket(AF_INET, SOCK_STREAM, 0);
		if (l < 0 || setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0)
			die("socket", 0);
		if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, n) < 0)
			die("bind/listen", 0);
	}
	for (int i = 0; i < n; i++) {
		if (server) {
			fds[i] = accept(l, NULL, NULL);
			if (fds[i] < 0)
				die("accept", i);
			continue;
		}
		fds[i] = socket(AF_INET, SOCK_STREAM, 0);
		if (fds[i] < 0)
			die("socket", i);
		if (connect(fds[i], (struct sockaddr *)&a, sizeof a) < 0)
			die("connect", i);
	}
	printf("%s %d\n", server ? "accepted" : "connected", n);
	fflush(stdout);
	for (;;) {
		sigsuspend(&waitmask);
		if (unlisten && l >= 0) {
			close(l); /* the shim's close: exnd drops the registration */
			l = -1;
			printf("unlistened\n");
			fflush(stdout);
		}
	}
}

/*
 * forksrv: the server shapes of issue #18 for integration/safety_test.go.
 *
 *   forksrv server IP PORT WORKERS MODE   MODE: setuid | exec-plain | exec-off | gated | otheruid
 *   forksrv worker FD                     (exec'd by exec-* modes)
 *   forksrv client IP PORT SIZE COUNT
 *
 * The server's parent (root) listens, forks WORKERS processes that accept
 * on the one inherited listener (pre-fork accept), then closes its own
 * copy of the listener while the workers serve. setuid: each worker drops
 * to nobody (65534) before accepting, still under the shim. exec-plain /
 * exec-off: each worker execs this program without LD_PRELOAD, or with
 * EXTDS_MODE=off, keeping the listener (the probe/accept disagreements).
 * gated: each worker stays root and accepts only once the file named by
 * $FORKSRV_GATE exists (at most 60 s), so a test can restart exnd between
 * a client's connect (its probe) and the server's accept.
 * otheruid: a child that dropped to nobody (65534) listens (so the
 * registration is nobody's) and passes the listener over a socketpair
 * to WORKERS children running as uid 65533, which accept: an acceptor
 * under another uid than the registrant's (exnd refuses it: not_owner).
 * A worker reads exactly "GET n\n" and answers n pattern bytes, then
 * closes; anything else is answered "BAD" (a foreign byte in the stream
 * shows up as a failed request). The client checks every byte.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <grp.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static unsigned char pat(size_t i) { return (unsigned char)(i * 131 + 7); }

static int readline(int fd, char *buf, int max)
{
	int n = 0;
	while (n < max - 1) {
		ssize_t r = read(fd, buf + n, 1);
		if (r <= 0)
			return -1;
		if (buf[n++] == '\n')
			break;
	}
	buf[n] = 0;
	return n;
}

static void gate(void)
{
	const char *g = getenv("FORKSRV_GATE");
	for (int i = 0; g && i < 6000 && access(g, F_OK) != 0; i++)
		usleep(10000);
}

static int drop_to(uid_t uid)
{
	return setgroups(0, NULL) < 0 || setgid(uid) < 0 || setuid(uid) < 0 ? -1 : 0;
}

/* One byte with room for one SCM_RIGHTS descriptor. */
struct fdmsg {
	char c;
	struct iovec iov;
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} u;
	struct msghdr m;
};

static void fdmsg_init(struct fdmsg *f)
{
	f->c = 0;
	f->iov = (struct iovec){&f->c, 1};
	f->m = (struct msghdr){.msg_iov = &f->iov, .msg_iovlen = 1, .msg_control = f->u.b, .msg_controllen = sizeof f->u.b};
}

static void send_fd(int sock, int fd)
{
	struct fdmsg f;
	fdmsg_init(&f);
	struct cmsghdr *h = CMSG_FIRSTHDR(&f.m);
	h->cmsg_level = SOL_SOCKET;
	h->cmsg_type = SCM_RIGHTS;
	h->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(h), &fd, sizeof fd);
	if (sendmsg(sock, &f.m, 0) < 0)
		perror("sendmsg");
}

static int recv_fd(int sock)
{
	struct fdmsg f;
	fdmsg_init(&f);
	if (recvmsg(sock, &f.m, 0) <= 0 || !CMSG_FIRSTHDR(&f.m))
		return -1;
	int fd;
	memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&f.m)), sizeof fd);
	return fd;
}

static void serve(int lfd);

/* otheruid mode (see the top): returns after the children started. */
static int other_uid(const struct sockaddr_in *a, int workers)
{
	int sp[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp) < 0) {
		perror("socketpair");
		return -1;
	}
	if (fork() == 0) {
		if (drop_to(65534) < 0)
			_exit(1);
		int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
		setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(s, (const struct sockaddr *)a, sizeof *a) < 0 || listen(s, 128) < 0) {
			perror("listen (nobody)");
			_exit(1);
		}
		send_fd(sp[0], s);
		pause();
		_exit(0);
	}
	int s = recv_fd(sp[1]);
	if (s < 0) {
		fprintf(stderr, "no listener from the nobody child\n");
		return -1;
	}
	for (int i = 0; i < workers; i++)
		if (fork() == 0) {
			if (drop_to(65533) < 0)
				_exit(1);
			serve(s);
		}
	close(s);
	return 0;
}

static void serve(int lfd)
{
	for (;;) {
		int c = accept(lfd, NULL, NULL);
		if (c < 0) {
			if (errno == EINTR)
				continue;
			_exit(0);
		}
		char line[64];
		long n = -1;
		if (readline(c, line, sizeof line) > 0 && sscanf(line, "GET %ld\n", &n) == 1 && n >= 0 &&
		    strlen(line) == (size_t)snprintf(NULL, 0, "GET %ld\n", n)) {
			static unsigned char buf[65536];
			for (long off = 0; off < n;) {
				long k = n - off < (long)sizeof buf ? n - off : (long)sizeof buf;
				for (long i = 0; i < k; i++)
					buf[i] = pat((size_t)(off + i));
				ssize_t w = write(c, buf, (size_t)k);
				if (w <= 0)
					break;
				off += w;
			}
		} else {
			ssize_t w = write(c, "BAD", 3);
			(void)w;
		}
		close(c);
	}
}

static int client(const char *ip, int port, long size, int count)
{
	for (int r = 0; r < count; r++) {
		int s = socket(AF_INET, SOCK_STREAM, 0);
		struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
		inet_pton(AF_INET, ip, &a.sin_addr);
		if (connect(s, (struct sockaddr *)&a, sizeof a) < 0) {
			printf("FAIL request %d: connect: %s\n", r, strerror(errno));
			return 1;
		}
		char req[64];
		int l = snprintf(req, sizeof req, "GET %ld\n", size);
		if (write(s, req, l) != l) {
			printf("FAIL request %d: write: %s\n", r, strerror(errno));
			return 1;
		}
		static unsigned char buf[65536];
		long got = 0;
		for (;;) {
			ssize_t k = read(s, buf, sizeof buf);
			if (k < 0) {
				printf("FAIL request %d: read after %ld: %s\n", r, got, strerror(errno));
				return 1;
			}
			if (k == 0)
				break;
			for (ssize_t i = 0; i < k; i++)
				if (got + i >= size || buf[i] != pat((size_t)(got + i))) {
					printf("FAIL request %d: byte %ld wrong (%.3s)\n", r, (long)(got + i), (char *)buf);
					return 1;
				}
			got += k;
		}
		close(s);
		if (got != size) {
			printf("FAIL request %d: %ld bytes, want %ld\n", r, got, size);
			return 1;
		}
	}
	printf("ok %d requests of %ld bytes\n", count, size);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	if (argc == 3 && !strcmp(argv[1], "worker")) {
		serve(atoi(argv[2]));
		return 0;
	}
	if (argc == 6 && !strcmp(argv[1], "client"))
		return client(argv[2], atoi(argv[3]), atol(argv[4]), atoi(argv[5]));
	if (argc != 6 || strcmp(argv[1], "server")) {
		fprintf(stderr, "usage: see forksrv.c\n");
		return 2;
	}
	int workers = atoi(argv[4]);
	const char *mode = argv[5];
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[3]))};
	inet_pton(AF_INET, argv[2], &a.sin_addr);
	if (!strcmp(mode, "otheruid")) {
		if (other_uid(&a, workers) < 0)
			return 1;
		printf("listening workers=%d mode=%s\n", workers, mode);
		goto wait;
	}
	int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 128) < 0) {
		perror("listen");
		return 1;
	}
	for (int i = 0; i < workers; i++) {
		pid_t p = fork();
		if (p < 0) {
			perror("fork");
			return 1;
		}
		if (p > 0)
			continue;
		if (!strcmp(mode, "setuid")) {
			if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0) {
				perror("setuid nobody");
				_exit(1);
			}
			serve(s);
		}
		if (!strcmp(mode, "gated")) {
			gate();
			serve(s);
		}
		char fd[16];
		snprintf(fd, sizeof fd, "%d", s);
		if (!strcmp(mode, "exec-plain"))
			unsetenv("LD_PRELOAD");
		else
			setenv("EXTDS_MODE", "off", 1);
		execl("/proc/self/exe", argv[0], "worker", fd, (char *)NULL);
		perror("exec");
		_exit(1);
	}
	close(s); /* the parent lets go of the listener while workers serve */
	printf("listening workers=%d mode=%s\n", workers, mode);
wait:;
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigprocmask(SIG_BLOCK, &set, NULL);
	int sig;
	sigwait(&set, &sig);
	kill(0, SIGTERM);
	while (wait(NULL) > 0)
		;
	return 0;
}

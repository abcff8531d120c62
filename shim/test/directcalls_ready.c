/*
 * directcalls_ready.c: the readiness and process checks of directcalls
 * (poll, select, epoll level/edge/oneshot, fork, exec with and without
 * FD_CLOEXEC, and the fdcheck helper the cloexec check execs).
 * #included by directcalls.c after directcalls_data.c (fill_ring,
 * dial_fill).
 */

/* An epoll set (CLOEXEC) watching s for ev: its descriptor, or -1 (errno
 * set). */
static int ep_with(int s, struct epoll_event *ev)
{
	int ep = epoll_create1(EPOLL_CLOEXEC);
	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, s, ev) == 0)
		return ep;
	int e = errno;
	close(ep);
	errno = e;
	return -1;
}

/* A full ring is not writable until the peer reads, then it is: mux p, s or e. */
static int pollout(char *why, char mux)
{
	pid_t pid = 0;
	int s AUTOCLOSE = dial_fill(&pid, why), ep AUTOCLOSE = -1, n; /* ep closes first */
	if (s < 0)
		return -1;
	uint64_t off = 0, h = FNV0;
	if (fill_ring(s, &off, &h, why) < 0)
		return -1;
	struct pollfd p = {s, POLLOUT, 0};
	fd_set w;
	struct timeval tv;
	struct epoll_event ev = {EPOLLOUT, {.u64 = 77}};
	if (mux == 'e')
		FAILIF((ep = ep_with(s, &ev)) < 0, "epoll_ctl");
	for (int round = 0; round < 3; round++) {
		/* 0: immediate; 1: parks 200 ms, not writable; 2: the server
		 * drains after SIGUSR1 and 100 ms: writable */
		int tmo = round == 0 ? 0 : round == 1 ? 200 : 10000;
		if (round == 2)
			FAILIF(kill(pid, SIGUSR1) < 0, "kill server %d", pid);
		int64_t t0 = now_ms();
		switch (mux) {
		case 'p':
			p.revents = 0;
			n = poll(&p, 1, tmo);
			FAILIF(n < 0, "poll");
			if (n && !(p.revents & POLLOUT))
				n = 0;
			break;
		case 's':
			FD_ZERO(&w);
			FD_SET(s, &w);
			tv = (struct timeval){tmo / 1000, (tmo % 1000) * 1000};
			n = select(s + 1, NULL, &w, NULL, &tv);
			FAILIF(n < 0, "select");
			FAILIF(n > 0 && !FD_ISSET(s, &w), "select: %d but the fd not set", n);
			break;
		default:
			ev.events = 0;
			n = epoll_wait(ep, &ev, 1, tmo);
			FAILIF(n < 0, "epoll_wait");
			FAILIF(n > 0 && (ev.data.u64 != 77 || !(ev.events & EPOLLOUT)), "epoll: events %#x data %llu",
			       ev.events, (unsigned long long)ev.data.u64);
			break;
		}
		int64_t dt = now_ms() - t0;
		FAILIF(round < 2 && n != 0, "round %d: writable with the ring full (%llu bytes written)", round,
		       (unsigned long long)off);
		FAILIF(round == 1 && dt < 150, "round 1: returned after %lld ms, want 200", (long long)dt);
		FAILIF(round == 2 && n != 1, "round 2: not writable after the peer read (n=%d, %lld ms)", n,
		       (long long)dt);
	}
	FAILIF(send_pat(s, &off, 100000, &h) < 0, "write after the server drained");
	return shut_sum(s, off, h, why);
}

static int c_pollout_poll(char *why) { return pollout(why, 'p'); }
static int c_pollout_select(char *why) { return pollout(why, 's'); }
static int c_pollout_epoll(char *why) { return pollout(why, 'e'); }

/* POLLIN: not readable, then readable once the delayed echo comes back
 * (the wait parks); a plain pipe in the same set keeps working. mux p or s. */
static int pollin(char *why, char mux)
{
	int s AUTOCLOSE = dial("echo 50", 0, why), pp[2] AUTOCLOSE_PIPE = {-1, -1}, n;
	if (s < 0)
		return -1;
	char b[16];
	FAILIF(pipe2(pp, O_CLOEXEC) < 0, "pipe");
	for (int round = 0; round < 3; round++) {
		/* 0: nothing ready (100 ms); 1: the pipe ready, not the socket;
		 * 2: the socket ready (after the echo's 50 ms) */
		if (round == 1)
			FAILIF(write(pp[1], "x", 1) != 1, "pipe write");
		if (round == 2) {
			FAILIF(read(pp[0], b, 1) != 1, "pipe read");
			FAILIF(write(s, "hello", 5) != 5, "write");
		}
		int tmo = round == 0 ? 100 : 10000, sr = 0, pr = 0;
		if (mux == 'p') {
			struct pollfd p[2] = {{pp[0], POLLIN, 0}, {s, POLLIN, 0}};
			n = poll(p, 2, tmo);
			FAILIF(n < 0, "poll");
			pr = !!(p[0].revents & POLLIN);
			sr = !!(p[1].revents & POLLIN);
		} else {
			fd_set r;
			FD_ZERO(&r);
			FD_SET(s, &r);
			FD_SET(pp[0], &r);
			struct timeval tv = {tmo / 1000, (tmo % 1000) * 1000};
			n = select((s > pp[0] ? s : pp[0]) + 1, &r, NULL, NULL, &tv);
			FAILIF(n < 0, "select");
			pr = FD_ISSET(pp[0], &r);
			sr = FD_ISSET(s, &r);
		}
		FAILIF(n != pr + sr, "round %d: returned %d, %d + %d ready", round, n, pr, sr);
		FAILIF(round == 0 && n != 0, "round 0: ready with nothing sent (pipe %d socket %d)", pr, sr);
		FAILIF(round == 1 && (!pr || sr), "round 1: want only the pipe (pipe %d socket %d)", pr, sr);
		FAILIF(round == 2 && (pr || !sr), "round 2: want only the socket (pipe %d socket %d)", pr, sr);
	}
	FAILIF(rd_full(s, b, 5) != 5 || memcmp(b, "hello", 5), "echo");
	return 0;
}

static int c_pollin_poll(char *why) { return pollin(why, 'p'); }
static int c_pollin_select(char *why) { return pollin(why, 's'); }

static int ep_wait1(int ep, struct epoll_event *ev, int tmo)
{
	int n;
	while ((n = epoll_wait(ep, ev, 1, tmo)) < 0 && errno == EINTR)
		;
	return n;
}

/* Level-triggered: EPOLLOUT at once; EPOLLIN while bytes are left. */
static int c_epoll_lt(int s, char *why)
{
	char b[64];
	struct epoll_event ev = {EPOLLIN | EPOLLOUT, {.u64 = 0x1234567890ull}};
	int ep AUTOCLOSE = ep_with(s, &ev);
	FAILIF(ep < 0, "epoll_ctl ADD");
	FAILIF(epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) == 0 || errno != EEXIST, "second ADD: want EEXIST");
	FAILIF(ep_wait1(ep, &ev, 0) != 1 || ev.events != EPOLLOUT || ev.data.u64 != 0x1234567890ull,
	       "want EPOLLOUT alone at once: %#x", ev.events);
	ev = (struct epoll_event){EPOLLIN, {.u64 = 42}};
	FAILIF(epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev) < 0, "MOD");
	FAILIF(ep_wait1(ep, &ev, 100) != 0, "EPOLLIN with nothing sent");
	FAILIF(write(s, "0123456789", 10) != 10, "write");
	FAILIF(ep_wait1(ep, &ev, 10000) != 1 || !(ev.events & EPOLLIN) || ev.data.u64 != 42, "no EPOLLIN for the echo");
	FAILIF(read(s, b, 3) != 3, "read 3");
	FAILIF(ep_wait1(ep, &ev, 0) != 1 || !(ev.events & EPOLLIN), "level: EPOLLIN gone with 7 bytes left");
	FAILIF(rd_full(s, b, 7) != 7 || memcmp(b, "3456789", 7), "read the rest");
	FAILIF(ep_wait1(ep, &ev, 50) != 0, "EPOLLIN with the ring empty: %#x", ev.events);
	FAILIF(epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL) < 0, "DEL");
	FAILIF(epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL) == 0 || errno != ENOENT, "second DEL: want ENOENT");
	return 0;
}

/*
 * s registered for ev in a new epoll set, msg written (the echo server
 * sends it back) and its first EPOLLIN, with ev's data, waited for
 * (what: the failure's name): the epoll descriptor, or -1 with why set.
 */
static int ep_echoed(int s, struct epoll_event *ev, const char *msg, const char *what, char *why)
{
	uint64_t data = ev->data.u64;
	int ep AUTOCLOSE = ep_with(s, ev);
	FAILIF(ep < 0, "epoll_ctl ADD");
	FAILIF(write(s, msg, strlen(msg)) != (ssize_t)strlen(msg), "write");
	FAILIF(ep_wait1(ep, ev, 10000) != 1 || !(ev->events & EPOLLIN) || ev->data.u64 != data, "%s", what);
	int r = ep;
	ep = -1;
	return r;
}

/* Edge-triggered: one event per arrival, none for bytes already reported. */
static int c_epoll_et(int s, char *why)
{
	char b[64];
	struct epoll_event ev = {EPOLLIN | EPOLLET, {.u64 = 7}};
	int ep AUTOCLOSE = ep_echoed(s, &ev, "abcdef", "no edge for the echo", why);
	if (ep < 0)
		return -1;
	FAILIF(read(s, b, 2) != 2, "read 2");
	FAILIF(ep_wait1(ep, &ev, 100) != 0, "a second edge with no new bytes");
	FAILIF(write(s, "ghi", 3) != 3, "write");
	FAILIF(ep_wait1(ep, &ev, 10000) != 1 || !(ev.events & EPOLLIN), "no edge for new bytes");
	FAILIF(rd_full(s, b, 7) != 7 || memcmp(b, "cdefghi", 7), "bytes");
	FAILIF(ep_wait1(ep, &ev, 50) != 0, "an edge with nothing new");
	return 0;
}

/* EPOLLONESHOT: one report, then none until EPOLL_CTL_MOD re-arms. */
static int c_epoll_oneshot(int s, char *why)
{
	char b[64];
	struct epoll_event ev = {EPOLLIN | EPOLLONESHOT, {.u64 = 9}};
	int ep AUTOCLOSE = ep_echoed(s, &ev, "xyz", "no event", why);
	if (ep < 0)
		return -1;
	FAILIF(ep_wait1(ep, &ev, 100) != 0, "a second event before re-arming");
	ev = (struct epoll_event){EPOLLIN | EPOLLONESHOT, {.u64 = 10}};
	FAILIF(epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev) < 0, "MOD");
	FAILIF(ep_wait1(ep, &ev, 10000) != 1 || !(ev.events & EPOLLIN) || ev.data.u64 != 10,
	       "no event after re-arming (bytes still there)");
	FAILIF(ep_wait1(ep, &ev, 100) != 0, "an event after the re-armed one fired");
	FAILIF(rd_full(s, b, 3) != 3 || memcmp(b, "xyz", 3), "bytes");
	return 0;
}

/* Write n pattern bytes from offset 0 into s, then shutdown(SHUT_WR);
 * their hash in *h. 0 or -1 (errno set). */
static int send_shut(int s, uint64_t n, uint64_t *h)
{
	uint64_t off = 0;
	*h = FNV0;
	return send_pat(s, &off, n, h) < 0 || shutdown(s, SHUT_WR) < 0 ? -1 : 0;
}

/* The child does all the I/O; the parent closes its copy at once. */
static int c_fork_child(char *why)
{
	int s AUTOCLOSE = dial("sink", 0, why);
	if (s < 0)
		return -1;
	pid_t p = fork();
	FAILIF(p < 0, "fork");
	if (p == 0) {
		alarm(30);
		uint64_t h;
		char w[WHYLEN] = "";
		if (send_shut(s, 500000, &h) < 0) {
			printf("child: write: %s\n", strerror(errno));
			_exit(1);
		}
		if (expect_sum(s, 500000, h, w) < 0) {
			printf("child: %s\n", w);
			_exit(1);
		}
		_exit(0);
	}
	xclose(&s); /* not the last close: the child has it */
	return wait_child(p, why, "child");
}

/* Parent writes, the child writes and exits, the parent writes again and reads the answer. */
static int c_fork_both(int s, char *why)
{
	uint64_t off = 0, h = FNV0;
	FAILIF(send_pat(s, &off, 200000, &h) < 0, "parent write");
	pid_t p = fork();
	FAILIF(p < 0, "fork");
	if (p == 0) {
		alarm(30);
		_exit(send_pat(s, &off, 300000, &h) < 0 ? 1 : 0);
	}
	if (wait_child(p, why, "child") < 0)
		return -1;
	/* the child's bytes, as it hashed them */
	static unsigned char b[300000];
	fill_pat(b, off, sizeof b);
	h = fnv(h, b, sizeof b);
	off += sizeof b;
	FAILIF(send_pat(s, &off, 100000, &h) < 0, "parent write after the child exited");
	return shut_sum(s, off, h, why);
}

/* A reader and a writer of one side, in two processes, parked at once on
 * the one bell: the parent waits for the server's answer while a child
 * writes into the full ring (the "fill" server reads nothing until
 * SIGUSR1, which a second child sends 300 ms later). Whoever drains the
 * bell kicks the other process through the family kick (docs/direct.md,
 * "The fan-out"): every byte arrives, and nobody hangs. */
static int c_fork_rw(char *why)
{
	enum { N = 3 << 20 };
	pid_t srv = 0;
	int s AUTOCLOSE = dial_fill(&srv, why);
	if (s < 0)
		return -1;
	pid_t w = fork();
	FAILIF(w < 0, "fork writer");
	if (w == 0) {
		alarm(30);
		uint64_t h;
		_exit(send_shut(s, N, &h) < 0 ? 1 : 0);
	}
	pid_t k = fork();
	FAILIF(k < 0, "fork signaller");
	if (k == 0) {
		usleep(300000);
		_exit(kill(srv, SIGUSR1) < 0 ? 1 : 0);
	}
	static unsigned char b[N];
	fill_pat(b, 0, N);
	int r = expect_sum(s, N, fnv(FNV0, b, N), why);
	if (wait_child(w, why, "writer") < 0 || wait_child(k, why, "signaller") < 0)
		return -1;
	return r;
}

/* The server execs /bin/sh -c 'exec cat' (no shim) on the connection: exnd relays its side. */
static int c_exec_server(char *why)
{
	enum { N = 300000 };
	int s AUTOCLOSE = dial("exec", 0, why);
	if (s < 0)
		return -1;
	static unsigned char b[N + 1], want[N];
	fill_pat(want, 0, N);
	FAILIF(wr_all(s, want, N) < 0, "write");
	FAILIF(shutdown(s, SHUT_WR) < 0, "shutdown");
	ssize_t r = rd_full(s, b, sizeof b);
	FAILIF(r != N, "cat echoed %zd bytes, want %d", r, N);
	FAILIF(memcmp(b, want, N), "cat echoed other bytes");
	return 0;
}

/* A child execs /bin/sh (no shim) with the connection as stdout; the
 * parent keeps using it (now relayed by exnd) and reads the answer. */
static int c_exec_client(char *why)
{
	static const char msg[] = "written-by-an-exec-without-the-shim";
	int s AUTOCLOSE = dial("sink", 0, why);
	if (s < 0)
		return -1;
	uint64_t off = 0, h = FNV0;
	FAILIF(send_pat(s, &off, 100000, &h) < 0, "write before the exec");
	fflush(stdout);
	pid_t p = fork();
	FAILIF(p < 0, "fork");
	if (p == 0) {
		alarm(30);
		if (dup2(s, 1) < 0)
			_exit(2);
		unsetenv("LD_PRELOAD");
		execl("/bin/sh", "sh", "-c", "printf '%s' \"$0\"", msg, (char *)NULL);
		_exit(3);
	}
	if (wait_child(p, why, "exec'd child") < 0)
		return -1;
	h = fnv(h, msg, sizeof msg - 1);
	off += sizeof msg - 1;
	/* the pattern continues at off: the sink hashes the stream */
	FAILIF(send_pat(s, &off, 100000, &h) < 0, "write after the exec");
	return shut_sum(s, off, h, why);
}

/* splice from a pipe into the connection (the pipe filled from a file,
 * splice's "from a file"), and from the connection into a pipe. */
static char g_self[PATH_MAX];
/* Descriptors above 2 the client inherited at its start (from whatever
 * ran it): fdcheck allows them. */
static char g_startfds[256];

/* A SOCK_CLOEXEC connection is not handed to exnd and is closed in the
 * new program; this process keeps using it directly. */
static int c_cloexec(int s, char *why)
{
	uint64_t off = 0, h = FNV0;
	FAILIF(!(fcntl(s, F_GETFD) & FD_CLOEXEC), "FD_CLOEXEC not set");
	FAILIF(send_pat(s, &off, 100000, &h) < 0, "write");
	fflush(stdout);
	pid_t p = fork();
	FAILIF(p < 0, "fork");
	if (p == 0) {
		char n[16];
		snprintf(n, sizeof n, "%d", s);
		unsetenv("LD_PRELOAD");
		execl(g_self, "directcalls", "fdcheck", n, g_startfds, (char *)NULL);
		_exit(3);
	}
	if (wait_child(p, why, "fdcheck") < 0)
		return -1;
	int before = ndirect();
	FAILIF(before < 1, "the connection buffer is no longer mapped");
	FAILIF(send_pat(s, &off, 100000, &h) < 0, "write after the exec");
	return shut_sum(s, off, h, why);
}


static void note_start_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return;
	struct dirent *e;
	size_t n = 0;
	while ((e = readdir(d))) {
		int fd = atoi(e->d_name);
		if (e->d_name[0] == '.' || fd <= 2 || fd == dirfd(d))
			continue;
		int k = snprintf(g_startfds + n, sizeof g_startfds - n, "%s%d", n ? "," : "", fd);
		if (k < 0 || (size_t)k >= sizeof g_startfds - n)
			break;
		n += (size_t)k;
	}
	closedir(d);
}

static int allowed(const char *list, int fd)
{
	char buf[256];
	snprintf(buf, sizeof buf, "%s", list ? list : "");
	for (char *t = strtok(buf, ","); t; t = strtok(NULL, ","))
		if (atoi(t) == fd)
			return 1;
	return 0;
}

static int fdcheck(int fd, const char *allow)
{
	int bad = 0;
	if (fd >= 0 && fcntl(fd, F_GETFD) >= 0) {
		printf("fdcheck: descriptor %d is open in the new program\n", fd);
		bad = 1;
	}
	DIR *d = opendir("/proc/self/fd");
	if (!d) {
		perror("fdcheck: /proc/self/fd");
		return 1;
	}
	struct dirent *e;
	while ((e = readdir(d))) {
		int n = atoi(e->d_name);
		if (e->d_name[0] == '.' || n <= 2 || n == dirfd(d) || allowed(allow, n))
			continue;
		char p[64], t[256] = "?";
		snprintf(p, sizeof p, "/proc/self/fd/%d", n);
		ssize_t k = readlink(p, t, sizeof t - 1);
		if (k >= 0)
			t[k] = 0;
		printf("fdcheck: descriptor %d (%s) leaked into the new program\n", n, t);
		bad = 1;
	}
	closedir(d);
	fflush(stdout);
	return bad;
}


/* Bursts of non-blocking writes into a sink, an edge-triggered EPOLLOUT
 * wait after each EAGAIN, and a pause after each burst long enough for
 * exnd's reclaimer (TestDirectCalls runs exnd with a 10 ms
 * --extds-reclaim-idle) to punch the empty ring out under its lock
 * (docs/direct.md, "Rings that shrink when idle"): a write that meets
 * that lock must wait it out, not fail with EAGAIN, since on an empty
 * ring no edge would ever come (the wait below would time out). The
 * sink's hash says no byte was lost to a punched page. */
static int c_et_bursts(int s, char *why)
{
	static unsigned char b[65536];
	int fl = fcntl(s, F_GETFL);
	FAILIF(fl < 0 || fcntl(s, F_SETFL, fl | O_NONBLOCK) < 0, "O_NONBLOCK");
	struct epoll_event ev = {EPOLLOUT | EPOLLET, {.u64 = 11}};
	int ep AUTOCLOSE = epoll_create1(EPOLL_CLOEXEC);
	FAILIF(ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) < 0, "epoll");
	FAILIF(ep_wait1(ep, &ev, 1000) != 1 || !(ev.events & EPOLLOUT), "no first EPOLLOUT");
	uint64_t off = 0, h = FNV0;
	for (int burst = 0; burst < 40; burst++) {
		size_t left = burst % 4 == 3 ? (3u << 19) : (300u << 10); /* some fill the 1 MiB ring */
		while (left > 0) {
			size_t k = left < sizeof b ? left : sizeof b;
			fill_pat(b, off, k);
			ssize_t w = write(s, b, k);
			if (w < 0 && errno == EAGAIN) {
				FAILIF(ep_wait1(ep, &ev, 5000) != 1, "burst %d: EAGAIN, then no EPOLLOUT edge for 5 s", burst);
				continue;
			}
			FAILIF(w <= 0, "burst %d: write", burst);
			h = fnv(h, b, (size_t)w);
			off += (uint64_t)w;
			left -= (size_t)w;
		}
		usleep(30000);
	}
	FAILIF(fcntl(s, F_SETFL, fl) < 0, "blocking again");
	return shut_sum(s, off, h, why);
}

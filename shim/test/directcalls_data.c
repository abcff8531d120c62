/*
 * directcalls_data.c: the data-path checks of directcalls (connect,
 * timeouts, MSG_* flags, half-close, vectored I/O, sendfile, splice,
 * FIONREAD, addresses, dup). #included by directcalls.c, which holds the
 * helpers and the table of checks; each check returns 0 (ok), -1 (fail,
 * why says what) or 1 (a documented limit).
 */

/* ---- the checks: 0 ok, -1 fail, 1 limit (why says which) ---- */

static int c_nb_connect(char *why)
{
	int s AUTOCLOSE = -1, before = ndirect();
	char buf[16];
	s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	FAILIF(s < 0, "socket");
	int r = connect(s, (struct sockaddr *)&g_srv, sizeof g_srv);
	FAILIF(r < 0 && errno != EINPROGRESS, "connect");
	if (r < 0) {
		struct pollfd p = {s, POLLOUT, 0};
		FAILIF(poll(&p, 1, 10000) != 1, "poll for the connect");
	}
	int err = -1;
	socklen_t l = sizeof err;
	FAILIF(getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &l) < 0 || err != 0, "SO_ERROR after connect: %d", err);
	FAILIF(kernel_domain(s) != AF_UNIX || ndirect() <= before, "not direct");
	g_conns++;
	FAILIF(!(fcntl(s, F_GETFL) & O_NONBLOCK), "O_NONBLOCK lost");
	FAILIF(send(s, "echo\n", 5, 0) != 5, "send command");
	errno = 0;
	FAILIF(read(s, buf, sizeof buf) != -1 || (errno != EAGAIN && errno != EWOULDBLOCK),
	       "non-blocking read with nothing there must be EAGAIN");
	FAILIF(write(s, "ping", 4) != 4, "write");
	struct pollfd p = {s, POLLIN, 0};
	FAILIF(poll(&p, 1, 10000) != 1 || !(p.revents & POLLIN), "poll POLLIN");
	FAILIF(read(s, buf, sizeof buf) != 4 || memcmp(buf, "ping", 4), "echo");
	FAILIF(getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &l) < 0 || err != 0, "SO_ERROR later: %d", err);
	return 0;
}

static int c_nb_connect_refused(char *why)
{
	int s AUTOCLOSE = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	FAILIF(s < 0, "socket");
	struct sockaddr_in a = g_srv;
	a.sin_port = htons((uint16_t)(g_port + 1)); /* nothing listens there */
	int r = connect(s, (struct sockaddr *)&a, sizeof a), err = 0;
	if (r < 0 && errno == EINPROGRESS) {
		struct pollfd p = {s, POLLOUT, 0};
		FAILIF(poll(&p, 1, 10000) != 1, "poll for the connect");
		socklen_t l = sizeof err;
		FAILIF(getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &l) < 0, "SO_ERROR");
	} else {
		FAILIF(r == 0, "connect to a closed port succeeded");
		err = errno;
	}
	errno = err;
	FAILIF(err != ECONNREFUSED, "want ECONNREFUSED");
	return 0;
}

static int c_rcvtimeo(int s, char *why)
{
	char b[8];
	struct timeval tv = {0, 200000}, got = {0, 0};
	socklen_t l = sizeof got;
	FAILIF(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0, "set SO_RCVTIMEO");
	FAILIF(getsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &got, &l) < 0 || got.tv_sec != 0 || got.tv_usec < 190000,
	       "get SO_RCVTIMEO");
	int64_t t0 = now_ms();
	errno = 0;
	ssize_t r = read(s, b, sizeof b);
	int64_t dt = now_ms() - t0;
	FAILIF(r != -1 || (errno != EAGAIN && errno != EWOULDBLOCK), "read with nothing there: %zd, want EAGAIN", r);
	FAILIF(dt < 150 || dt > 5000, "timed out after %lld ms, want about 200", (long long)dt);
	return echo_check(s, 0, 1000, why);
}

/* Connect to a "fill" server: returns fd and the server child's pid. */
static int dial_fill(pid_t *pid, char *why)
{
	int s = dial("fill", 0, why);
	if (s < 0)
		return -1;
	char line[64];
	int p;
	if (rd_line(s, line, sizeof line) < 0 || sscanf(line, "pid=%d", &p) != 1) {
		snprintf(why, WHYLEN, "no pid from the fill server");
		close(s);
		return -1;
	}
	*pid = p;
	return s;
}

static int c_sndtimeo(char *why)
{
	pid_t pid = 0;
	int s AUTOCLOSE = dial_fill(&pid, why);
	if (s < 0)
		return -1;
	uint64_t off = 0, h = FNV0;
	static unsigned char b[65536];
	struct timeval tv = {0, 200000};
	FAILIF(setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) < 0, "set SO_SNDTIMEO");
	int64_t dt = 0;
	for (int i = 0;; i++) {
		FAILIF(i > 10000, "the ring never filled (%llu bytes)", (unsigned long long)off);
		fill_pat(b, off, sizeof b);
		int64_t t0 = now_ms();
		ssize_t w = write(s, b, sizeof b);
		dt = now_ms() - t0;
		if (w < 0) {
			FAILIF(errno != EAGAIN && errno != EWOULDBLOCK, "write on a full ring: want EAGAIN");
			break;
		}
		h = fnv(h, b, (size_t)w);
		off += (uint64_t)w;
	}
	FAILIF(dt < 150 || dt > 5000, "the write timed out after %lld ms, want about 200", (long long)dt);
	FAILIF(kill(pid, SIGUSR1) < 0, "kill server %d", pid);
	tv.tv_usec = 0;
	FAILIF(setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) < 0, "clear SO_SNDTIMEO");
	FAILIF(send_pat(s, &off, 100000, &h) < 0, "write after the server drained");
	return shut_sum(s, off, h, why);
}

/* Fill the ring (non-blocking) until EAGAIN. */
static int fill_ring(int s, uint64_t *off, uint64_t *h, char *why)
{
	static unsigned char b[65536];
	for (int i = 0;; i++) {
		if (i > 10000) {
			snprintf(why, WHYLEN, "the ring never filled");
			return -1;
		}
		fill_pat(b, *off, sizeof b);
		ssize_t w = send(s, b, sizeof b, MSG_DONTWAIT);
		if (w < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			snprintf(why, WHYLEN, "write: %s", strerror(errno));
			return -1;
		}
		*h = fnv(*h, b, (size_t)w);
		*off += (uint64_t)w;
	}
}

/* Wait until FIONREAD reports want (bounded). */
static int wait_nread(int s, int want)
{
	int n = -1;
	for (int i = 0; i < 1000; i++) {
		if (ioctl(s, FIONREAD, &n) < 0)
			return -2;
		if (n >= want)
			return n;
		msleep(10);
	}
	return n;
}

static int c_msg_peek(int s, char *why)
{
	unsigned char b[2000], want[1000];
	fill_pat(want, 0, sizeof want);
	FAILIF(wait_nread(s, 1000) != 1000, "FIONREAD");
	FAILIF(recv(s, b, 100, MSG_PEEK) != 100 || memcmp(b, want, 100), "peek 100");
	FAILIF(recv(s, b, sizeof b, MSG_PEEK | MSG_DONTWAIT) != 1000 || memcmp(b, want, 1000), "peek all");
	int n = -1;
	FAILIF(ioctl(s, FIONREAD, &n) < 0 || n != 1000, "FIONREAD after peeking: %d", n);
	FAILIF(recv(s, b, sizeof b, 0) != 1000 || memcmp(b, want, 1000), "read after peeking");
	FAILIF(ioctl(s, FIONREAD, &n) < 0 || n != 0, "FIONREAD after reading: %d", n);
	return 0;
}

static int c_fionread(int s, char *why)
{
	int n = -1;
	unsigned char b[1000];
	FAILIF(ioctl(s, FIONREAD, &n) < 0 || (n != 0 && n != 12345), "FIONREAD: %d, want 0 or 12345", n);
	FAILIF((n = wait_nread(s, 12345)) != 12345, "FIONREAD: %d, want 12345", n);
	FAILIF(rd_full(s, b, sizeof b) != sizeof b, "read");
	FAILIF(ioctl(s, FIONREAD, &n) < 0 || n != 12345 - 1000, "FIONREAD after reading 1000: %d", n);
	return 0;
}

static int c_msg_waitall(char *why)
{
	enum { N = 200000 };
	int s AUTOCLOSE = dial("source 200000 1000 300", 0, why);
	if (s < 0)
		return -1;
	unsigned char *b AUTOFREE = malloc(N), *want AUTOFREE = malloc(N);
	fill_pat(want, 0, N);
	ssize_t r = recv(s, b, N, MSG_WAITALL);
	FAILIF(r != N, "MSG_WAITALL returned %zd of %d", r, N);
	FAILIF(memcmp(b, want, N), "bytes differ");
	return 0;
}

static int c_msg_dontwait(int s, char *why)
{
	char b[16];
	int64_t t0 = now_ms();
	errno = 0;
	FAILIF(recv(s, b, sizeof b, MSG_DONTWAIT) != -1 || (errno != EAGAIN && errno != EWOULDBLOCK),
	       "MSG_DONTWAIT with nothing there: want EAGAIN");
	FAILIF(now_ms() - t0 > 100, "MSG_DONTWAIT waited");
	FAILIF(send(s, "hi", 2, MSG_DONTWAIT) != 2, "send MSG_DONTWAIT");
	struct pollfd p = {s, POLLIN, 0};
	FAILIF(poll(&p, 1, 10000) != 1, "poll");
	FAILIF(recv(s, b, sizeof b, MSG_DONTWAIT) != 2 || memcmp(b, "hi", 2), "recv MSG_DONTWAIT");
	FAILIF(fcntl(s, F_GETFL) & O_NONBLOCK, "the descriptor became non-blocking");
	return 0;
}

/* shutdown(SHUT_WR): the peer reads EOF and still answers; writing is EPIPE. */
static int c_half_close(int s, char *why)
{
	uint64_t off = 0, h = FNV0;
	char b[8];
	FAILIF(send_pat(s, &off, 300000, &h) < 0, "write");
	FAILIF(shutdown(s, SHUT_WR) < 0, "shutdown SHUT_WR");
	errno = 0;
	FAILIF(send(s, "x", 1, MSG_NOSIGNAL) != -1 || errno != EPIPE, "send after SHUT_WR: want EPIPE");
	if (expect_sum(s, off, h, why) < 0)
		return -1;
	FAILIF(read(s, b, sizeof b) != 0, "want EOF after the server closed");
	return 0;
}

static void on_sigpipe(int s)
{
	(void)s;
	g_sigpipe++;
}

/* The peer closes: POLLIN|POLLRDHUP, the bytes, EOF; then writes fail with EPIPE and SIGPIPE. */
static int c_peer_close(int s, char *why)
{
	unsigned char b[16], want[10];
	fill_pat(want, 0, 10);
	struct pollfd p = {s, POLLIN | POLLRDHUP, 0};
	for (int i = 0; i < 100 && !(p.revents & POLLRDHUP); i++) {
		p.revents = 0;
		FAILIF(poll(&p, 1, 10000) != 1, "poll");
		if (!(p.revents & POLLRDHUP))
			msleep(10);
	}
	FAILIF((p.revents & (POLLIN | POLLRDHUP)) != (POLLIN | POLLRDHUP), "want POLLIN|POLLRDHUP: %#x", p.revents);
	FAILIF(rd_full(s, b, sizeof b) != 10 || memcmp(b, want, 10), "bytes then EOF");
	FAILIF(read(s, b, sizeof b) != 0, "EOF again");
	ssize_t w = 0;
	for (int i = 0; i < 500 && w >= 0; i++) {
		w = send(s, "z", 1, MSG_NOSIGNAL);
		if (w >= 0)
			msleep(10);
	}
	FAILIF(w >= 0 || (errno != EPIPE && errno != ECONNRESET), "writes to a closed peer kept working (%zd)", w);
	int before = g_sigpipe;
	w = write(s, "z", 1);
	FAILIF(w >= 0 || (errno != EPIPE && errno != ECONNRESET), "write: %zd", w);
	FAILIF(errno == EPIPE && g_sigpipe != before + 1, "EPIPE without SIGPIPE");
	return 0;
}

/* Lay n iovecs over buf, back to back: iovec i has first + i * step bytes,
 * cut to the cap bytes buf has. The bytes laid. */
static size_t iov_lay(struct iovec *v, int n, unsigned char *buf, size_t cap, long first, long step)
{
	size_t total = 0;
	for (int i = 0; i < n; i++) {
		size_t k = (size_t)(first + i * step);
		if (k > cap - total)
			k = cap - total;
		v[i] = (struct iovec){buf + total, k};
		total += k;
	}
	return total;
}

static int c_readv_writev(int s, char *why)
{
	enum { NW = 16, NR = 7 };
	static unsigned char src[NW * 997 * 8], dst[sizeof src];
	struct iovec wv[NW], rv[NR];
	size_t total = iov_lay(wv, NW, src, sizeof src, 1, 997);
	fill_pat(src, 0, total);
	ssize_t w = writev(s, wv, NW);
	FAILIF(w != (ssize_t)total, "writev: %zd of %zu", w, total);
	size_t got = 0;
	while (got < total) {
		/* odd sizes across the iovecs, wrapping whatever came */
		iov_lay(rv, NR, dst + got, total - got, 3, 1511);
		ssize_t r = readv(s, rv, NR);
		FAILIF(r <= 0, "readv: %zd after %zu", r, got);
		got += (size_t)r;
	}
	FAILIF(memcmp(src, dst, total), "bytes differ");
	return 0;
}

static int c_msg_iov64(int s, char *why)
{
	enum { NV = 64 };
	static unsigned char src[NV * 200 * 70], dst[sizeof src];
	struct iovec wv[NV], rv[NV];
	size_t total = iov_lay(wv, NV, src, sizeof src, 1, 131);
	fill_pat(src, 0, total);
	struct msghdr m = {0};
	m.msg_iov = wv;
	m.msg_iovlen = NV;
	ssize_t w = sendmsg(s, &m, MSG_NOSIGNAL);
	FAILIF(w != (ssize_t)total, "sendmsg: %zd of %zu", w, total);
	size_t got = 0;
	while (got < total) {
		iov_lay(rv, NV, dst + got, total - got, NV * 97 + 1, -97); /* sizes going down */
		struct sockaddr_storage from;
		char ctl[64];
		struct msghdr r = {0};
		r.msg_name = &from;
		r.msg_namelen = sizeof from;
		r.msg_iov = rv;
		r.msg_iovlen = NV;
		r.msg_control = ctl;
		r.msg_controllen = sizeof ctl;
		r.msg_flags = -1;
		ssize_t n = recvmsg(s, &r, 0);
		FAILIF(n <= 0, "recvmsg: %zd after %zu", n, got);
		FAILIF(r.msg_flags != 0 || r.msg_controllen != 0, "recvmsg: flags %#x controllen %zu", r.msg_flags,
		       (size_t)r.msg_controllen);
		got += (size_t)n;
	}
	FAILIF(memcmp(src, dst, total), "bytes differ");
	return 0;
}

static int c_sendfile(char *why)
{
	enum { N = 3 << 20, A = 2 << 20, B = 5 << 19 };
	int f AUTOCLOSE = -1, s AUTOCLOSE = dial("sink", 0, why);
	if (s < 0)
		return -1;
	char path[] = "/tmp/directcalls-sendfile-XXXXXX";
	static unsigned char b[N];
	f = mkstemp(path);
	FAILIF(f < 0, "mkstemp");
	unlink(path);
	fill_pat(b, 0, N);
	FAILIF(wr_all(f, b, N) < 0, "write the file");
	uint64_t h = fnv(FNV0, b, N);
	off_t off = 0;
	while (off < A) {
		ssize_t r = sendfile(s, f, &off, (size_t)(A - off));
		FAILIF(r <= 0, "sendfile with an offset: %zd at %lld", r, (long long)off);
	}
	FAILIF(off != A, "offset %lld, want %d", (long long)off, A);
	FAILIF(lseek(f, A, SEEK_SET) != A, "lseek");
	size_t done = A;
	while (done < B) {
		ssize_t r = sendfile(s, f, NULL, B - done);
		FAILIF(r <= 0, "sendfile from the file position: %zd at %zu", r, done);
		done += (size_t)r;
	}
	FAILIF(lseek(f, 0, SEEK_CUR) != B, "file position %lld, want %d", (long long)lseek(f, 0, SEEK_CUR), B);
	/* what a program built with _FILE_OFFSET_BITS=64 calls */
	off64_t o64 = B;
	while (o64 < N) {
		ssize_t r = sendfile64(s, f, &o64, (size_t)(N - o64));
		FAILIF(r <= 0, "sendfile64: %zd at %lld", r, (long long)o64);
	}
	return shut_sum(s, N, h, why);
}

/* getsockname/getpeername are the TCP addresses, crossed with the server's view. */
static int c_names(int s, char *why)
{
	struct sockaddr_storage a, b;
	socklen_t al = sizeof a, bl = sizeof b;
	FAILIF(getsockname(s, (void *)&a, &al) < 0, "getsockname");
	FAILIF(getpeername(s, (void *)&b, &bl) < 0, "getpeername");
	char sa[80], sb[80], want[200], line[200];
	addr_fam_str((void *)&a, sa, sizeof sa);
	addr_fam_str((void *)&b, sb, sizeof sb);
	FAILIF(al != sizeof(struct sockaddr_in) || bl != sizeof(struct sockaddr_in), "lengths %u %u", (unsigned)al,
	       (unsigned)bl);
	struct sockaddr_in *pb = (void *)&b;
	FAILIF(pb->sin_family != AF_INET || pb->sin_addr.s_addr != g_srv.sin_addr.s_addr || pb->sin_port != g_srv.sin_port,
	       "getpeername %s, want %s:%d", sb, g_ip, g_port);
	int dom = -1;
	socklen_t l = sizeof dom;
	FAILIF(getsockopt(s, SOL_SOCKET, SO_DOMAIN, &dom, &l) < 0 || dom != AF_INET, "SO_DOMAIN %d", dom);
	FAILIF(rd_line(s, line, sizeof line) < 0, "no line from the server");
	snprintf(want, sizeof want, "local=%s peer=%s len=16,16", sb, sa);
	FAILIF(strcmp(line, want), "server says \"%s\", want \"%s\"", line, want);
	return shut_sum(s, 0, FNV0, why);
}

/* dup, dup2, dup3, F_DUPFD_CLOEXEC: each copy writes; closing copies is not the last close. */
static int c_dup(char *why)
{
	int s AUTOCLOSE = dial("sink", 0, why), d1 AUTOCLOSE = -1, d2 AUTOCLOSE = -1, d3 AUTOCLOSE = -1,
	    d4 AUTOCLOSE = -1;
	if (s < 0)
		return -1;
	uint64_t off = 0, h = FNV0;
	d1 = dup(s);
	FAILIF(d1 < 0, "dup");
	FAILIF(xclose(&s) < 0, "close the original");
	FAILIF(send_pat(d1, &off, 100000, &h) < 0, "write on dup");
	d2 = dup2(d1, 200);
	FAILIF(d2 != 200, "dup2");
	FAILIF(xclose(&d1) < 0, "close");
	FAILIF(send_pat(d2, &off, 100000, &h) < 0, "write on dup2");
	d3 = dup3(d2, 201, O_CLOEXEC);
	FAILIF(d3 != 201, "dup3");
	FAILIF(!(fcntl(d3, F_GETFD) & FD_CLOEXEC), "dup3 O_CLOEXEC not set");
	FAILIF(fcntl(d2, F_GETFD) & FD_CLOEXEC, "dup2's copy has FD_CLOEXEC");
	d4 = fcntl(d3, F_DUPFD_CLOEXEC, 300);
	FAILIF(d4 < 300, "F_DUPFD_CLOEXEC");
	FAILIF(xclose(&d2) < 0, "close");
	FAILIF(send_pat(d3, &off, 100000, &h) < 0, "write on dup3");
	FAILIF(send_pat(d4, &off, 100000, &h) < 0, "write on F_DUPFD_CLOEXEC");
	FAILIF(xclose(&d3) < 0, "close");
	struct sockaddr_in a;
	socklen_t al = sizeof a;
	FAILIF(getpeername(d4, (void *)&a, &al) < 0 || a.sin_port != g_srv.sin_port, "getpeername on the copy");
	return shut_sum(d4, off, h, why);
}

static int c_splice(char *why)
{
	enum { N = 1 << 20 };
	int f AUTOCLOSE = -1, pp[2] AUTOCLOSE_PIPE = {-1, -1}, s AUTOCLOSE = dial("sink", 0, why), s2 AUTOCLOSE = -1;
	if (s < 0)
		return -1;
	char path[] = "/tmp/directcalls-splice-XXXXXX";
	static unsigned char b[N], got[N];
	f = mkstemp(path);
	FAILIF(f < 0, "mkstemp");
	unlink(path);
	fill_pat(b, 0, N);
	FAILIF(wr_all(f, b, N) < 0, "write the file");
	FAILIF(pipe2(pp, O_CLOEXEC) < 0, "pipe");
	loff_t off = 0;
	size_t done = 0;
	while (done < N) {
		ssize_t k = splice(f, &off, pp[1], NULL, 65536, 0); /* file -> pipe: the kernel's */
		FAILIF(k <= 0, "splice file -> pipe: %zd", k);
		while (k > 0) {
			ssize_t r = splice(pp[0], NULL, s, NULL, (size_t)k, 0);
			FAILIF(r <= 0, "splice pipe -> connection: %zd at %zu", r, done);
			k -= r;
			done += (size_t)r;
		}
	}
	loff_t o = 0;
	errno = 0;
	FAILIF(splice(pp[0], NULL, s, &o, 1, SPLICE_F_NONBLOCK) != -1 || errno != EINVAL, "an offset on the socket: want EINVAL");
	errno = 0;
	FAILIF(splice(pp[0], &o, s, NULL, 1, SPLICE_F_NONBLOCK) != -1 || errno != ESPIPE, "an offset on the pipe: want ESPIPE");
	errno = 0;
	FAILIF(splice(f, NULL, s, NULL, 1, 0) != -1 || errno != EINVAL, "no pipe on either side: want EINVAL");
	if (shut_sum(s, N, fnv(FNV0, b, N), why) < 0)
		return -1;
	/* connection -> pipe */
	s2 = dial("source 1048576 65536 0", 0, why);
	if (s2 < 0)
		return -1;
	done = 0;
	while (done < N) {
		ssize_t k = splice(s2, NULL, pp[1], NULL, N - done, 0);
		FAILIF(k <= 0, "splice connection -> pipe: %zd at %zu", k, done);
		FAILIF(rd_full(pp[0], got + done, (size_t)k) != k, "read the pipe");
		done += (size_t)k;
	}
	FAILIF(memcmp(got, b, N), "bytes spliced out of the connection differ");
	errno = 0;
	FAILIF(splice(s2, NULL, pp[1], NULL, 1, SPLICE_F_NONBLOCK) != -1 || errno != EAGAIN,
	       "SPLICE_F_NONBLOCK with nothing there: want EAGAIN");
	return 0;
}

/* On a full ring with O_NONBLOCK, sendfile, sendfile64 and splice say
 * EAGAIN and take nothing (through V they would succeed: bytes behind
 * the ring's back); once the peer reads, they move the rest. */
static int c_full_ring_nb(char *why)
{
	enum { N = 200000 };
	pid_t pid = 0;
	int f AUTOCLOSE = -1, pp[2] AUTOCLOSE_PIPE = {-1, -1}, s AUTOCLOSE = dial_fill(&pid, why), n = -1;
	if (s < 0)
		return -1;
	uint64_t off = 0, h = FNV0;
	char path[] = "/tmp/directcalls-full-XXXXXX";
	static unsigned char b[N];
	f = mkstemp(path);
	FAILIF(f < 0, "mkstemp");
	unlink(path);
	FAILIF(pipe2(pp, O_CLOEXEC) < 0, "pipe");
	FAILIF(fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK) < 0, "O_NONBLOCK");
	if (fill_ring(s, &off, &h, why) < 0)
		return -1;
	fill_pat(b, off, N);
	FAILIF(wr_all(f, b, N) < 0, "write the file");
	FAILIF(wr_all(pp[1], "0123456789", 10) < 0, "write the pipe");
	off_t o = 0;
	off64_t o64 = 0;
	errno = 0;
	FAILIF(sendfile(s, f, &o, N) != -1 || errno != EAGAIN || o != 0, "sendfile on a full ring: want EAGAIN");
	errno = 0;
	FAILIF(sendfile64(s, f, &o64, N) != -1 || errno != EAGAIN || o64 != 0, "sendfile64 on a full ring: want EAGAIN");
	errno = 0;
	FAILIF(splice(pp[0], NULL, s, NULL, 10, 0) != -1 || errno != EAGAIN, "splice on a full ring: want EAGAIN");
	FAILIF(ioctl(pp[0], FIONREAD, &n) < 0 || n != 10, "the pipe lost bytes: %d left", n);
	FAILIF(kill(pid, SIGUSR1) < 0, "kill server %d", pid);
	FAILIF(fcntl(s, F_SETFL, fcntl(s, F_GETFL) & ~O_NONBLOCK) < 0, "clear O_NONBLOCK");
	while (o64 < N) {
		ssize_t r = sendfile64(s, f, &o64, (size_t)(N - o64));
		FAILIF(r <= 0, "sendfile64: %zd at %lld", r, (long long)o64);
	}
	h = fnv(h, b, N);
	off += N;
	FAILIF(splice(pp[0], NULL, s, NULL, 10, 0) != 10, "splice after the peer read");
	h = fnv(h, "0123456789", 10);
	off += 10;
	return shut_sum(s, off, h, why);
}


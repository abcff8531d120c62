/*
 * ctl.c: the control client of libextds.so (docs/shim.md, "Control
 * protocol"): owns the connection to exnd's control socket (EXTDS_CONTROL)
 * and whether exnd speaks this shim's protocol version (g_hello, learned
 * once per process by shim-hello). ctl_call and close_fds are shared via
 * ctl.h; the lines it sends and reads are encoded and decoded by
 * ctlparse.c. Every call on its own sockets goes through real (real.h),
 * never back into the shim.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>

#include "ctl.h"
#include "fdroom.h"
#include "shim.h"

static volatile int g_hello; /* 0 unknown, 1 exnd speaks shim v2, -1 it does not */

#define CTL_TIMEOUT_S 10

static int ctl_open(void)
{
	int s = real.socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -1;
	struct sockaddr_un a;
	memset(&a, 0, sizeof a);
	a.sun_family = AF_UNIX;
	strcpy(a.sun_path, g_ctl_path);
	struct timeval tv = {CTL_TIMEOUT_S, 0};
	real.setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	real.setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	int r;
	do
		r = real.connect(s, (struct sockaddr *)&a, sizeof a);
	while (r < 0 && errno == EINTR);
	if (r < 0) {
		real.close(s);
		return -1;
	}
	return s;
}

/* Send one request line with up to two descriptors (fd, then fd2; -1:
 * none). 0 or -1. */
static int ctl_send(int s, const char *line, int fd, int fd2)
{
	struct iovec iov = {(void *)line, strlen(line)};
	union {
		char buf[CMSG_SPACE(2 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	int fds[2] = {fd, fd2}, nfd = fd < 0 ? 0 : fd2 < 0 ? 1 : 2;
	if (nfd > 0) {
		memset(&u, 0, sizeof u);
		mh.msg_control = u.buf;
		mh.msg_controllen = CMSG_SPACE(nfd * sizeof(int));
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(nfd * sizeof(int));
		memcpy(CMSG_DATA(c), fds, nfd * sizeof(int));
	}
	while (iov.iov_len > 0) {
		ssize_t n = real.sendmsg(s, &mh, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		iov.iov_base = (char *)iov.iov_base + n;
		iov.iov_len -= (size_t)n;
		mh.msg_control = NULL;
		mh.msg_controllen = 0;
	}
	return 0;
}

void close_fds(int *fds)
{
	for (int i = 0; i < CTL_MAXFD; i++)
		if (fds[i] >= 0) {
			real.close(fds[i]);
			fds[i] = -1;
		}
}

/*
 * Read one response line into buf (NUL-terminated, without '\n') and the
 * descriptors that came with it, in order, into rfd[0..CTL_MAXFD) (-1
 * where none; more are closed). 0 or -1.
 */
static int ctl_recv(int s, char *buf, size_t size, size_t *linelen, int *rfd)
{
	size_t len = 0;
	int nfd = 0;
	for (int i = 0; i < CTL_MAXFD; i++)
		rfd[i] = -1;
	for (;;) {
		struct iovec iov = {buf + len, size - 1 - len};
		union {
			char b[CMSG_SPACE(16 * sizeof(int))];
			struct cmsghdr align;
		} u;
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof u.b};
		/* Wait outside the window (fdroom.c), then take the answer and
		 * its descriptors inside it, above the program's soft limit. */
		struct pollfd pf = {.fd = s, .events = POLLIN};
		int pr = real.poll(&pf, 1, CTL_TIMEOUT_S * 1000);
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr == 0)
			errno = ETIMEDOUT;
		if (pr <= 0)
			goto fail;
		struct fdroom room;
		fdroom_begin(&room);
		ssize_t n = real.recvmsg(s, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
		if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
			fdroom_end(&room);
			continue;
		}
		if (n >= 0) {
			for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
				if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
					continue;
				int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
				for (int i = 0; i < k; i++) {
					int f;
					memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
					if (nfd < CTL_MAXFD) {
						int h = fdroom_place(&room, f, 0);
						rfd[nfd++] = h >= 0 ? h : f;
					} else {
						real.close(f);
					}
				}
			}
		}
		fdroom_end(&room);
		if (n <= 0)
			goto fail;
		len += (size_t)n;
		char *nl = memchr(buf, '\n', len);
		if (nl) {
			*nl = 0;
			*linelen = (size_t)(nl - buf);
			return 0;
		}
		if (len >= size - 1)
			goto fail;
	}
fail:
	close_fds(rfd);
	return -1;
}

/*
 * Response decoding: ctl_parse (ctlparse.c), strict, fuzzed against Go's
 * encoding/json by shim/check (FuzzCtlParse). A line it does not accept
 * counts as a broken control connection.
 */

/*
 * The first half of a request: a fresh connection (no descriptor of ours
 * lives on in the application's fd space, threads and forked children
 * need no care), the one-time hello, then the request op (arg: its port,
 * for shim-unlisten) with the descriptors fd and fd2. Returns the
 * connection (the caller ends it with ctl_finish), or CTL_NOCONN (nothing
 * was sent: no exnd, or it does not speak the shim protocol) or
 * CTL_BROKEN (the request may have reached exnd). buf holds the hello's
 * answer on a failed hello.
 */
int ctl_start(enum ctl_op op, unsigned arg, int fd, int fd2, char *buf, size_t size)
{
	char line[64];
	size_t n;
	if (ctl_req(line, sizeof line, op, arg) < 0)
		return CTL_NOCONN;
	if (g_hello < 0)
		return CTL_NOCONN;
	int s = ctl_open();
	if (s < 0) {
		dbg("control %s: %s", g_ctl_path, strerror(errno));
		return CTL_NOCONN;
	}
	if (g_hello == 0) {
		int hfd[CTL_MAXFD];
		char hello[32];
		struct ctl_resp r;
		if (ctl_req(hello, sizeof hello, CTL_OP_HELLO, 0) < 0 || ctl_send(s, hello, -1, -1) < 0 ||
		    ctl_recv(s, buf, size, &n, hfd) < 0) {
			real.close(s);
			return CTL_NOCONN;
		}
		close_fds(hfd);
		if (ctl_parse(buf, n, &r) < 0 || !r.ok || r.version != SHIM_VERSION_NUM) {
			dbg("exnd does not speak shim v" SHIM_VERSION ": %s", buf);
			g_hello = -1;
			real.close(s);
			return CTL_NOCONN;
		}
		g_hello = 1;
	}
	if (ctl_send(s, line, fd, fd2) < 0) {
		real.close(s);
		return CTL_BROKEN;
	}
	return s;
}

/*
 * The second half: read the answer on s (from ctl_start), decode it into
 * *r (buf holds the line, rfd the descriptors that came with it) and
 * close s. Returns CTL_OK (ok:true), CTL_REFUSED (ok:false) or
 * CTL_BROKEN (no answer, or none ctl_parse accepts).
 */
int ctl_finish(int s, char *buf, size_t size, struct ctl_resp *r, int *rfd)
{
	size_t n;
	int c = CTL_BROKEN;
	memset(r, 0, sizeof *r);
	for (int i = 0; i < CTL_MAXFD; i++)
		rfd[i] = -1;
	if (ctl_recv(s, buf, size, &n, rfd) == 0 && ctl_parse(buf, n, r) == 0)
		c = r->ok ? CTL_OK : CTL_REFUSED;
	int saved = errno;
	real.close(s);
	errno = saved;
	if (c != CTL_OK)
		close_fds(rfd);
	return c;
}

/* One request, start to finish (ctl_start, ctl_finish). */
int ctl_call(enum ctl_op op, unsigned arg, int fd, int fd2, char *buf, size_t size, struct ctl_resp *r, int *rfd)
{
	for (int i = 0; i < CTL_MAXFD; i++)
		rfd[i] = -1;
	memset(r, 0, sizeof *r);
	int s = ctl_start(op, arg, fd, fd2, buf, size);
	if (s < 0)
		return s;
	return ctl_finish(s, buf, size, r, rfd);
}

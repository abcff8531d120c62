/*
 * sockcalls.c: owns the intercepted calls on a socket's addresses, options
 * and messages (getsockname, getpeername, getsockopt, setsockopt, sendto,
 * sendmsg, recvfrom, __recvfrom_chk, recvmsg): a switched descriptor
 * answers with the TCP connection's addresses and options kept in its
 * entry (shim.h), a direct one sends and receives through direct.c's
 * d_io (direct.h). No state of its own.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "direct.h"
#include "shim.h"

static int copy_addr(const union addr *a, socklen_t alen, struct sockaddr *out, socklen_t *len)
{
	if (!out || !len) {
		errno = EFAULT;
		return -1;
	}
	socklen_t n = *len < alen ? *len : alen;
	memcpy(out, a, n);
	*len = alen;
	return 0;
}

/* getsockname (peer 0) or getpeername (peer 1): a switched socket's TCP
 * address from its entry, else the kernel's answer. */
static int sock_name(int fd, int peer, struct sockaddr *addr, socklen_t *len)
{
	INIT();
	struct fdent e;
	if (!switched(fd, &e))
		return (peer ? real.getpeername : real.getsockname)(fd, addr, len);
	if (peer)
		return copy_addr(&e.peer, e.plen, addr, len);
	return copy_addr(&e.local, e.llen, addr, len);
}

EXPORT int getsockname(int fd, struct sockaddr *addr, socklen_t *len) { return sock_name(fd, 0, addr, len); }

EXPORT int getpeername(int fd, struct sockaddr *addr, socklen_t *len) { return sock_name(fd, 1, addr, len); }

#define EXTDS_MSS 65483 /* exn0 MTU 65521 - 20 IP - 18 TCP options... as TCP over exn0 reports */

static int put_int(void *val, socklen_t *len, int v)
{
	if (!val || !len) {
		errno = EFAULT;
		return -1;
	}
	if (*len >= sizeof(int)) {
		memcpy(val, &v, sizeof(int));
		*len = sizeof(int);
	} else if (*len > 0) {
		*(unsigned char *)val = (unsigned char)v;
		*len = 1;
	}
	return 0;
}

EXPORT int getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
	INIT();
	struct fdent e;
	if (!(fdflags(fd) & F_SWITCHED) || !switched(fd, &e))
		return real.getsockopt(fd, level, name, val, len);
	int saved = errno, r;
	if (level == SOL_SOCKET) {
		switch (name) {
		case SO_DOMAIN:
			return put_int(val, len, e.family);
		case SO_PROTOCOL:
			return put_int(val, len, IPPROTO_TCP);
		case SO_KEEPALIVE:
			return put_int(val, len, !!(e.flags & F_KEEPALIVE));
		case SO_ACCEPTCONN:
			return put_int(val, len, 0);
		case SO_ERROR: {
			struct dconn *c = dcof(fd);
			if (!c)
				return real.getsockopt(fd, level, name, val, len);
			return put_int(val, len, dring_error(&c->d));
		}
		default:
			return real.getsockopt(fd, level, name, val, len);
		}
	}
	if (level == IPPROTO_TCP) {
		int mss = e.maxseg > 0 ? e.maxseg : EXTDS_MSS;
		switch (name) {
		case TCP_NODELAY:
			return put_int(val, len, !!(e.flags & F_NODELAY));
		case TCP_CORK:
			return put_int(val, len, !!(e.flags & F_CORK));
		case TCP_MAXSEG:
			return put_int(val, len, mss);
		case TCP_INFO: {
			if (!val || !len) {
				errno = EFAULT;
				return -1;
			}
			struct tcp_info ti;
			memset(&ti, 0, sizeof ti);
			ti.tcpi_state = TCP_ESTABLISHED;
			ti.tcpi_snd_mss = mss;
			ti.tcpi_rcv_mss = mss;
			ti.tcpi_advmss = mss;
			ti.tcpi_pmtu = 65521;
			ti.tcpi_snd_cwnd = 10;
			ti.tcpi_snd_ssthresh = 0x7fffffff;
			ti.tcpi_rcv_space = 65535;
			ti.tcpi_rtt = 10;
			ti.tcpi_rttvar = 5;
			socklen_t n = *len < sizeof ti ? *len : sizeof ti;
			memcpy(val, &ti, n);
			*len = n;
			return 0;
		}
		case TCP_CONGESTION: {
			if (!val || !len) {
				errno = EFAULT;
				return -1;
			}
			char name16[16] = "extds";
			socklen_t n = *len < sizeof name16 ? *len : sizeof name16;
			memcpy(val, name16, n);
			*len = n;
			return 0;
		}
		default:
			r = put_int(val, len, 0);
			errno = saved;
			return r;
		}
	}
	if (level == IPPROTO_IP || level == IPPROTO_IPV6) {
		if ((level == IPPROTO_IP && name == IP_TOS) || (level == IPPROTO_IPV6 && name == IPV6_TCLASS))
			return put_int(val, len, e.tos);
		return put_int(val, len, 0);
	}
	return real.getsockopt(fd, level, name, val, len);
}

static int get_int(const void *val, socklen_t len, int *out)
{
	if (!val || len < 1) {
		errno = EINVAL;
		return -1;
	}
	if (len >= sizeof(int))
		memcpy(out, val, sizeof(int));
	else
		*out = *(const unsigned char *)val;
	return 0;
}

/* Set or clear flag f of a switched fd's entry. */
static void set_flag(int fd, int f, int on)
{
	lock();
	struct fdent *e = ent(fd);
	if (on)
		e->flags |= f;
	else
		e->flags &= ~f;
	unlock();
}

EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
	INIT();
	if (!(fdflags(fd) & F_SWITCHED) || !switched(fd, NULL)) {
		int saved = errno;
		int r = real.setsockopt(fd, level, name, val, len);
		/* Remember options set before a connect switches the socket. */
		if (r == 0 && (fdflags(fd) & F_TRACKED) && !(fdflags(fd) & F_SWITCHED)) {
			int v;
			if (get_int(val, len, &v) == 0) {
				if (level == IPPROTO_TCP && name == TCP_NODELAY)
					set_flag(fd, F_NODELAY, v);
				else if (level == IPPROTO_TCP && name == TCP_CORK)
					set_flag(fd, F_CORK, v);
				else if (level == SOL_SOCKET && name == SO_KEEPALIVE)
					set_flag(fd, F_KEEPALIVE, v);
				else if ((level == IPPROTO_IP && name == IP_TOS) || (level == IPPROTO_IPV6 && name == IPV6_TCLASS))
					ent(fd)->tos = v;
				else if (level == IPPROTO_TCP && name == TCP_MAXSEG)
					ent(fd)->maxseg = v;
			}
			errno = saved;
		}
		return r;
	}
	int v = 0;
	if (level == SOL_SOCKET) {
		if (name == SO_KEEPALIVE) {
			if (get_int(val, len, &v) < 0)
				return -1;
			set_flag(fd, F_KEEPALIVE, v);
			return 0;
		}
		return real.setsockopt(fd, level, name, val, len);
	}
	if (level == IPPROTO_TCP) {
		switch (name) {
		case TCP_CONGESTION:
			if (!val) {
				errno = EFAULT;
				return -1;
			}
			return 0;
		case TCP_NODELAY:
		case TCP_CORK:
		case TCP_MAXSEG:
			if (get_int(val, len, &v) < 0)
				return -1;
			if (name == TCP_MAXSEG) {
				lock();
				ent(fd)->maxseg = v;
				unlock();
			} else {
				set_flag(fd, name == TCP_NODELAY ? F_NODELAY : F_CORK, v);
			}
			return 0;
		default:
			return 0; /* accepted, no effect */
		}
	}
	if (level == IPPROTO_IP || level == IPPROTO_IPV6) {
		if ((level == IPPROTO_IP && name == IP_TOS) || (level == IPPROTO_IPV6 && name == IPV6_TCLASS)) {
			if (get_int(val, len, &v) < 0)
				return -1;
			lock();
			ent(fd)->tos = v;
			unlock();
		}
		return 0;
	}
	return real.setsockopt(fd, level, name, val, len);
}

/* A connected unix stream socket refuses a destination address where
 * TCP ignores it, and reports the unix peer where TCP reports none. */

EXPORT ssize_t sendto(int fd, const void *buf, size_t n, int flags, const struct sockaddr *addr, socklen_t alen)
{
	INIT();
	struct iovec v = {(void *)buf, n};
	ssize_t d = d_send(fd, &v, 1, flags);
	if (d != NOT_DIRECT)
		return d;
	if (addr && (fdflags(fd) & F_SWITCHED))
		addr = NULL, alen = 0;
	return real.sendto(fd, buf, n, flags, addr, alen);
}

/* sendmsg (send 1) or recvmsg (send 0) on fd if it is direct: as d_send
 * or d_recv, and EMSGSIZE for more than IOV_MAX iovecs, as the kernel. */
static ssize_t d_msg(int fd, const struct msghdr *msg, int flags, int send)
{
	if (!msg || (!dcof(fd) && !(fdflags(fd) & F_UPG)))
		return NOT_DIRECT;
	if (msg->msg_iovlen > IOV_MAX) {
		errno = EMSGSIZE;
		return -1;
	}
	return d_io(fd, msg->msg_iov, (int)msg->msg_iovlen, flags, send);
}

EXPORT ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
	INIT();
	ssize_t d = d_msg(fd, msg, flags, 1);
	if (d != NOT_DIRECT)
		return d;
	if (msg && msg->msg_name && (fdflags(fd) & F_SWITCHED)) {
		struct msghdr m = *msg;
		m.msg_name = NULL;
		m.msg_namelen = 0;
		return real.sendmsg(fd, &m, flags);
	}
	return real.sendmsg(fd, msg, flags);
}

EXPORT ssize_t recvfrom(int fd, void *buf, size_t n, int flags, struct sockaddr *addr, socklen_t *alen)
{
	INIT();
	struct iovec v = {buf, n};
	ssize_t d = d_recv(fd, &v, 1, flags);
	if (d != NOT_DIRECT) {
		if (d >= 0 && addr && alen)
			*alen = 0;
		return d;
	}
	if (addr && (fdflags(fd) & F_SWITCHED)) {
		ssize_t r = real.recvfrom(fd, buf, n, flags, NULL, NULL);
		if (r >= 0 && alen)
			*alen = 0;
		return r;
	}
	return real.recvfrom(fd, buf, n, flags, addr, alen);
}

EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t n, size_t buflen, int flags, struct sockaddr *addr,
			      socklen_t *alen)
{
	if (n > buflen)
		abort();
	return recvfrom(fd, buf, n, flags, addr, alen);
}

EXPORT ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
	INIT();
	ssize_t d = d_msg(fd, msg, flags, 0);
	if (d != NOT_DIRECT) {
		if (d >= 0) {
			msg->msg_namelen = 0;
			msg->msg_controllen = 0;
			msg->msg_flags = 0;
		}
		return d;
	}
	ssize_t r = real.recvmsg(fd, msg, flags);
	if (r >= 0 && msg && msg->msg_name && (fdflags(fd) & F_SWITCHED))
		msg->msg_namelen = 0;
	return r;
}

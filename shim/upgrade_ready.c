/*
 * upgrade_ready.c: readiness at the upgrade's boundary (docs/shim.md,
 * "Readiness at the boundary"; upgrade.h, upg_poll_filter). The FIN
 * that marks where the peer's stream went on in the buffer is neither
 * data nor an end: poll, select and epoll must not report it as either.
 * The stages and locks are upgrade.c's; this file only filters results.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <sys/epoll.h>

#include "direct.h"
#include "shim.h"
#include "upgrade.h"

/* Whether fd is attached (not converted) and a FIN on it is the peer's
 * move, not its end. */
static int upg_fin_moved(int fd)
{
	struct dconn *c = upg_conn(fd);
	if (!c)
		return 0;
	uint32_t w = __atomic_load_n(dring_upg(&c->d), __ATOMIC_ACQUIRE);
	return (w & UPG_MOV(1 - c->d.side)) != 0;
}

int upg_attached(int fd) { return (fdflags(fd) & F_UPG) && upg_conn(fd) != NULL; }

/*
 * The readiness of an attached descriptor that a readiness call found
 * readable, hung up or at RDHUP: r, or what it is at the boundary. When
 * the peer moved and TCP holds nothing but the FIN that marks it, the
 * FIN is no data and no end: fd converts now (the read would have done
 * it, and a blocking read after a readiness call must not wait for
 * bytes the readiness promised; TestShimManyConns under the upgrade: a
 * blocking epoll server hung in such a read), and its readiness is its
 * buffer's, within want (the events asked, poll(2) bits, which epoll's
 * share). When it does not convert (TCP still has bytes before the FIN,
 * or the conversion failed), the FIN's RDHUP and HUP are taken off
 * (POLLIN stays: the read converts it).
 */
static unsigned upg_ready(int fd, unsigned r, unsigned want)
{
	if (!(r & (POLLIN | POLLRDHUP | POLLHUP)) || !(fdflags(fd) & F_UPG) || !upg_fin_moved(fd))
		return r;
	if (tcp_at_eof(fd) && upg_convert(fd) == 0 && (fdflags(fd) & F_DIRECT)) {
		struct dconn *c = dcof(fd);
		if (c)
			return dring_ready(&c->d) & (want | POLLERR | POLLHUP);
	}
	unsigned keep = r & ~(unsigned)(POLLRDHUP | POLLHUP);
	return keep ? keep : r; /* a lone POLLHUP is left as it is */
}

int upg_poll_filter(struct pollfd *fds, nfds_t n, int ret)
{
	for (nfds_t i = 0; i < n; i++) {
		if (!fds[i].revents)
			continue;
		short r = (short)upg_ready(fds[i].fd, (unsigned short)fds[i].revents, (unsigned short)fds[i].events);
		if (!r)
			ret--;
		fds[i].revents = r;
	}
	return ret;
}

int upg_epoll_filter(int epfd, struct epoll_event *evs, int n)
{
	int k = 0;
	for (int i = 0; i < n; i++) {
		uint32_t ev = evs[i].events, want = 0;
		int fd = -1;
		if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)) {
			lock();
			for (int j = 0; j < EP_POOL && fd < 0; j++)
				if (g_ep[j].fd >= 0 && g_ep[j].epfd == epfd && g_ep[j].ev.data.u64 == evs[i].data.u64 &&
				    (g_tab[g_ep[j].fd].flags & F_UPG)) {
					fd = g_ep[j].fd;
					want = g_ep[j].ev.events;
				}
			unlock();
		}
		if (fd >= 0)
			ev = (ev & ~(uint32_t)(EPOLLIN | EPOLLRDNORM | EPOLLOUT | EPOLLWRNORM | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) |
			     upg_ready(fd, ev & 0xffff, want & 0xffff);
		if (!(ev & 0xffff))
			continue; /* converted, and its buffer is not ready: no event */
		evs[k] = evs[i];
		evs[k++].events = ev;
	}
	return k;
}

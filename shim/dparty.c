/*
 * dparty.c: who parks on a direct connection's bell in this process
 * (docs/direct.md, "One bell per side"): owns the hooks every
 * connection's dring calls around its waits (g_dhooks), the per-thread
 * kick eventfds, the per-process kick eventfd of the epoll sets, the
 * party[S] claim in the buffer, and the hand-over to exnd's relay
 * (direct_relay) that a second process parking on the same side
 * takes. Shared via direct.h with direct.c and direct_poll.c.
 *
 * Why: readers, writers, pollers and epoll records of a side all park on
 * the side's one bell B_S, and whoever drains it may take the byte
 * another one needed; nobody can ring their own bell (writing to B_S
 * rings the peer). So the drainer makes the others look again: blocking
 * waiters and pollers through their thread's kick eventfd, epoll records
 * by putting them on their sets' hot lists and writing the process's
 * epoll kick (registered EPOLLET in every set with direct records, never
 * drained: each write is one edge in every set). Only one process may
 * park on a side at a time (party[S], its pid): a second one hands the
 * connection to exnd's relay, where the kernel wakes every waiter of the
 * plain socket V.
 *
 * State: per connection (struct dconn: nparty, the waiters list, whose
 * nodes live on the waiters' stacks), under the table lock; t_kick per
 * thread (closed by a pthread key's destructor at thread exit); g_ekick
 * per process. A forked child starts with none of the parent's parties
 * (direct_atfork_child).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ctl.h"
#include "direct.h"
#include "shim.h"

static __thread int t_kick = -1;
static pthread_key_t g_kick_key;
static int g_ekick = -1;
static int g_pid; /* getpid(), cached: glibc asks the kernel each time */

/* The self of fan-outs from the epoll path, which holds the table lock. */
struct dwaiter g_dep_self = {-1, NULL};

static void kick_dtor(void *p)
{
	int fd = (int)(intptr_t)p - 1;
	if (fd >= 0)
		real.close(fd);
}

void dparty_init(void)
{
	g_pid = (int)getpid();
	pthread_key_create(&g_kick_key, kick_dtor);
}

int dparty_pid(void) { return g_pid; }

/* A new eventfd, non-blocking, close-on-exec, out of the program's
 * descriptor space (fdroom.c); -1 if none. */
static int new_kick(void)
{
	int fd = (int)syscall(SYS_eventfd2, 0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (fd < 0)
		return -1;
	int h = hide_fd(fd, 0);
	return h >= 0 ? h : fd;
}

static int thread_kick(void)
{
	if (t_kick < 0 && (t_kick = new_kick()) >= 0)
		pthread_setspecific(g_kick_key, (void *)(intptr_t)(t_kick + 1));
	return t_kick;
}

int direct_ekick_locked(void)
{
	if (g_ekick < 0)
		g_ekick = new_kick();
	return g_ekick;
}

static void kick(int fd)
{
	uint64_t one = 1;
	if (fd >= 0)
		(void)syscall(SYS_write, fd, &one, sizeof one);
}

void direct_atfork_child(void)
{
	g_pid = (int)getpid();
	if (t_kick >= 0) {
		real.close(t_kick); /* the parent's thread owns that eventfd */
		t_kick = -1;
		pthread_setspecific(g_kick_key, NULL);
	}
	for (int i = 0, seen = 0; i < DC_MAX && seen < g_ndc; i++)
		if (g_dc[i].refs) {
			seen++;
			g_dc[i].nparty = 0;
			g_dc[i].waiters = NULL;
		}
}

int party_join_locked(struct dconn *c)
{
	if (c->nparty++ > 0)
		return 0;
	uint32_t me = (uint32_t)g_pid, old = 0;
	if (__atomic_compare_exchange_n(c->d.party, &old, me, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST) || old == me)
		return 0;
	int e = errno;
	/* a process that died parked leaves its pid behind */
	int dead = syscall(SYS_kill, (pid_t)old, 0) < 0 && errno == ESRCH;
	errno = e;
	if (dead && __atomic_compare_exchange_n(c->d.party, &old, me, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
		return 0;
	c->nparty--;
	return -1;
}

void party_leave_locked(struct dconn *c)
{
	if (c->nparty > 0 && --c->nparty == 0) {
		uint32_t me = (uint32_t)g_pid;
		__atomic_compare_exchange_n(c->d.party, &me, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
	}
}

int direct_relay(struct dconn *c)
{
	if (dring_relayed(&c->d))
		return 0;
	if (c->relay_asked)
		return -1;
	char buf[512];
	struct ctl_resp resp;
	int ufd[CTL_MAXFD];
	int r = ctl_call(CTL_OP_RELAY, 0, c->d.v, c->d.bell, buf, sizeof buf, &resp, ufd);
	close_fds(ufd);
	c->relay_asked = 1;
	dbg("direct id %llu: %s", (unsigned long long)c->id,
	    r == CTL_OK ? "another process parks on it: relayed by exnd from now on" : "relay refused");
	return r == CTL_OK && dring_relayed(&c->d) ? 0 : -1;
}

int party_join_or_relay(struct dconn *c)
{
	lock();
	int r = party_join_locked(c);
	unlock();
	if (r == 0)
		return 0;
	if (direct_relay(c) == 0)
		return 1;
	/* No relay (exnd refused or is gone): park anyway. A drain in the
	 * other process may then take a byte this one needed. */
	lock();
	c->nparty++;
	unlock();
	return 0;
}

static struct dconn *conn_of(struct dring *d) { return (struct dconn *)(void *)((char *)d - offsetof(struct dconn, d)); }

static int h_enter(struct dring *d, struct dwaiter *w)
{
	struct dconn *c = conn_of(d);
	w->kick = thread_kick();
	if (party_join_or_relay(c))
		return -DRING_RELAYED;
	lock();
	w->next = c->waiters;
	c->waiters = w;
	unlock();
	return 0;
}

static void h_leave(struct dring *d, struct dwaiter *w)
{
	struct dconn *c = conn_of(d);
	lock();
	for (struct dwaiter **p = &c->waiters; *p; p = &(*p)->next)
		if (*p == w) {
			*p = w->next;
			break;
		}
	party_leave_locked(c);
	unlock();
}

/* Make this process's parties of c other than self look again: kick the
 * waiters, put the epoll records on their sets' hot lists and kick the
 * sets. With the lock held; returns the epoll kick to write after
 * unlocking, or -1. */
static int fanout_locked(struct dconn *c, struct dwaiter *self)
{
	for (struct dwaiter *w = c->waiters; w; w = w->next)
		if (w != self)
			kick(w->kick);
	int idx = (int)(c - g_dc), any = 0;
	for (int i = 0, seen = 0; i < DEP_MAX && seen < g_ndep; i++) {
		struct depreg *r = &g_dep[i];
		if (r->fd < 0)
			continue;
		seen++;
		if (r->dc != idx || r->owner != g_pid)
			continue;
		struct depset *s = dset_of_locked(r->epfd, 0);
		if (s) {
			hot_push_locked(s, i);
			any = 1;
		}
	}
	return any ? g_ekick : -1;
}

static void h_fanout(struct dring *d, struct dwaiter *self)
{
	struct dconn *c = conn_of(d);
	/* The fast path: the caller is the only party of this process. */
	if (__atomic_load_n(&c->nparty, __ATOMIC_RELAXED) <= (self ? 1 : 0))
		return;
	if (self == &g_dep_self) { /* the epoll path: the lock is held */
		kick(fanout_locked(c, self));
		return;
	}
	lock();
	int k = fanout_locked(c, self);
	unlock();
	kick(k);
}

const struct dring_hooks g_dhooks = {h_enter, h_leave, h_fanout};

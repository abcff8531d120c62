/*
 * dparty.c: who parks on a direct connection's bell (docs/direct.md,
 * "One bell per side"): owns the hooks every connection's dring calls
 * around its waits (g_dhooks), the per-thread kicks, the family kick,
 * and the pwait[S] count in the buffer. Shared via direct.h with
 * direct.c, direct_poll.c, direct_epoll.c and direct_exec.c.
 *
 * Why: readers, writers, pollers and epoll records of a side all park on
 * the side's one bell B_S, and whoever drains it may take the byte
 * another one needed; nobody can ring their own bell (writing to B_S
 * rings the peer). So the drainer makes the others look again (the
 * fan-out):
 *
 *   - waiters of its own process: each parked waiter's thread has a kick
 *     eventfd (t_kick), written for exactly the waiters of that
 *     connection;
 *   - epoll records of its own process: put on their sets' hot lists;
 *   - everyone else of the family: the processes that share connections
 *     through fork share one family kick eventfd (g_fkick, made at the
 *     process's first direct connection, so before any fork that shares
 *     one, and inherited), never drained, registered EPOLLET in every
 *     epoll set with direct records and in every parked thread's wait
 *     epoll (t_wait: its kick, level, and the family kick, EPOLLET, so
 *     that each thread consumes each edge once for itself). It is
 *     written when this process marked epoll records hot, or when the
 *     side's pwait count (parked parties of every process, in the buffer)
 *     is more than this process's own: a waiter in another process.
 *
 * A set woken by the family kick looks at every record it holds (the
 * kick does not say which): rare, since a lone party (one thread or one
 * epoll set on a connection: nparty 1, pwait 1) never fans out.
 *
 * State: per connection (struct dconn: nparty, the waiters list, whose
 * nodes live on the waiters' stacks), under the table lock; per thread
 * t_kick and t_wait (closed by a pthread key's destructor at thread
 * exit); per family g_fkick. A forked child starts with none of the
 * parent's parties and makes its own thread's descriptors
 * (direct_atfork_child); the parent's parties stay in pwait.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "direct.h"
#include "shim.h"

struct tkick {
	int kick, wait;
};

static __thread struct tkick t_k = {-1, -1};
static pthread_key_t g_kick_key;
static int g_fkick = -1;
static int g_pid; /* getpid(), cached: glibc asks the kernel each time */

/* The self of fan-outs from the epoll path, which holds the table lock. */
struct dwaiter g_dep_self = {-1, -1, NULL};

static void tkick_close(struct tkick *k)
{
	if (k->kick >= 0)
		real.close(k->kick);
	if (k->wait >= 0)
		real.close(k->wait);
	k->kick = k->wait = -1;
}

static void kick_dtor(void *p)
{
	(void)p;
	tkick_close(&t_k);
}

void dparty_init(void)
{
	g_pid = (int)getpid();
	pthread_key_create(&g_kick_key, kick_dtor);
}

int dparty_pid(void) { return g_pid; }

/* fd out of the program's descriptor space (fdroom.c), or fd itself. */
static int hide(int fd)
{
	if (fd < 0)
		return -1;
	int h = hide_fd(fd, 0);
	return h >= 0 ? h : fd;
}

static int new_eventfd(void) { return hide((int)syscall(SYS_eventfd2, 0, EFD_NONBLOCK | EFD_CLOEXEC)); }

int direct_fkick(void)
{
	int k = __atomic_load_n(&g_fkick, __ATOMIC_ACQUIRE);
	if (k >= 0)
		return k;
	int n = new_eventfd(), old = -1;
	if (n >= 0 && !__atomic_compare_exchange_n(&g_fkick, &old, n, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
		real.close(n); /* another thread made it first */
		return old;
	}
	return n;
}

/* This thread's kick and wait epoll (made on its first park); wait -1
 * if they cannot be made (then the waiter misses fan-outs). */
static struct tkick thread_kick(void)
{
	if (t_k.wait >= 0)
		return t_k;
	int f = direct_fkick();
	t_k.kick = new_eventfd();
	t_k.wait = hide((int)syscall(SYS_epoll_create1, EPOLL_CLOEXEC));
	struct epoll_event kev = {EPOLLIN, {.u32 = 0}}, fev = {EPOLLIN | EPOLLET, {.u32 = 1}};
	if (t_k.kick < 0 || t_k.wait < 0 || f < 0 || real.epoll_ctl(t_k.wait, EPOLL_CTL_ADD, t_k.kick, &kev) < 0 ||
	    real.epoll_ctl(t_k.wait, EPOLL_CTL_ADD, f, &fev) < 0) {
		tkick_close(&t_k);
		return t_k;
	}
	pthread_setspecific(g_kick_key, &t_k);
	return t_k;
}

static void kick(int fd)
{
	uint64_t one = 1;
	if (fd >= 0)
		(void)syscall(SYS_write, fd, &one, sizeof one);
}

void direct_kick_family(void) { kick(__atomic_load_n(&g_fkick, __ATOMIC_ACQUIRE)); }

void direct_atfork_child(void)
{
	g_pid = (int)getpid();
	/* the forking thread's descriptors are the parent thread's objects */
	tkick_close(&t_k);
	pthread_setspecific(g_kick_key, NULL);
	for (int i = 0, seen = 0; i < DC_MAX && seen < g_ndc; i++)
		if (g_dc[i].refs) {
			seen++;
			g_dc[i].nparty = 0;
			g_dc[i].waiters = NULL;
		}
}

void party_join_locked(struct dconn *c)
{
	c->nparty++;
	__atomic_add_fetch(c->d.pwait, 1, __ATOMIC_SEQ_CST);
}

void party_leave_locked(struct dconn *c)
{
	if (c->nparty <= 0)
		return;
	c->nparty--;
	__atomic_sub_fetch(c->d.pwait, 1, __ATOMIC_SEQ_CST);
}

static struct dconn *conn_of(struct dring *d) { return (struct dconn *)(void *)((char *)d - offsetof(struct dconn, d)); }

static int h_enter(struct dring *d, struct dwaiter *w)
{
	struct dconn *c = conn_of(d);
	struct tkick k = thread_kick();
	w->kick = k.kick;
	w->wait = k.wait;
	lock();
	party_join_locked(c);
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
	if (c->vclose && !c->waiters) {
		/* the last waiter that may have loaded the replaced V left */
		real.close(c->vclose - 1);
		c->vclose = 0;
	}
	unlock();
}

static void h_kicked(struct dwaiter *w)
{
	struct epoll_event ev[2];
	(void)syscall(SYS_epoll_pwait, w->wait, ev, 2, 0, NULL, (size_t)8); /* the family kick's edge */
	dring_drain(w->kick);
}

/* Make the parties of c other than self look again: kick this process's
 * waiters, put its epoll records on their sets' hot lists; the family
 * kick if a record was marked or another process has parties of the
 * side. With the lock held; returns the descriptor to write after
 * unlocking, or -1. */
static int fanout_locked(struct dconn *c, struct dwaiter *self)
{
	for (struct dwaiter *w = c->waiters; w; w = w->next)
		if (w != self)
			kick(w->kick);
	int idx = (int)(c - g_dc), any = 0;
	if (c->nrec > 0)
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
	int others = (int)__atomic_load_n(c->d.pwait, __ATOMIC_SEQ_CST) > c->nparty;
	return any || others ? g_fkick : -1;
}

static void h_fanout(struct dring *d, struct dwaiter *self)
{
	struct dconn *c = conn_of(d);
	/* The fast path: the caller is the only party of the side, in every
	 * process. */
	if (__atomic_load_n(d->pwait, __ATOMIC_SEQ_CST) <= (uint32_t)(self ? 1 : 0))
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

const struct dring_hooks g_dhooks = {h_enter, h_leave, h_fanout, h_kicked};

/*
 * direct.h: direct EXT-DS connections in libextds.so (docs/direct.md),
 * shared by direct.c (the state, the switch to direct, the data calls),
 * direct_poll.c and direct_epoll.c (readiness: poll and select; epoll),
 * direct_exec.c (the exec
 * family) and the socket calls (calls.c, sockcalls.c). The buffer
 * itself is dring.c (dring.h).
 */
#ifndef EXN_SHIM_DIRECT_H
#define EXN_SHIM_DIRECT_H

#include <stdint.h>
#include <sys/epoll.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "dring.h"
#include "fdroom.h"
#include "shim.h"

#pragma GCC visibility push(hidden)

/* Direct connections and epoll records per process: 16384 covers the
 * 10,000 connections of issue #32 with room; the tables are zero pages
 * until used (about 3 MiB of address space). */
#define DC_MAX 16384
#define DC_SLACK 16 /* slots left to concurrent switches (direct_room) */
#define DEP_MAX 16384
#define DSET_MAX 256 /* epoll sets with direct records at once */
/* epoll data of a bell registration: tag | record index; of the
 * family kick (dparty.c): tag | DEP_KICK */
#define DEP_TAG 0xe8dd5a5e00000000ull
#define DEP_KICK 0x7fffffffu

struct dconn {
	int refs; /* descriptors of this process that refer to it; 0: free */
	uint64_t id;
	int relay_asked;
	int vhidden;              /* V is the shim's own hidden descriptor (an upgrade not yet installed, upgrade.c) */
	int vclose;               /* 1 + a hidden V that upgrade.c's conversion replaced while waiters parked on it: closed by the last one's leave (dparty.c); 0: none */
	int nparty;               /* this process's waiters and epoll records parked on the bell */
	int nrec;                 /* this process's epoll records of it */
	struct dwaiter *waiters;  /* this process's blocking waiters (their kicks), on their stacks */
	struct dring d;
};

/*
 * An epoll registration of a direct descriptor (direct_epoll.c, "epoll in
 * O(ready)"): armed for its events from EPOLL_CTL_ADD to its end, so the
 * peer rings its bells whenever something comes; on its set's hot list
 * while it may be ready (a bell fired, just added or modified, or a
 * level-triggered report that may still hold).
 */
struct depreg {
	int epfd, fd;           /* fd < 0: free */
	int hbell;              /* the bell as registered in epfd: the connection's, or a dup (hdup) */
	int hdup;               /* hbell is a dup of the bell (epfd holds another record of the connection) */
	int bell_gone;          /* the bell reached EOF: taken out of epfd */
	int dc;                 /* index in g_dc */
	unsigned armed;         /* POLLIN/POLLOUT counted in the ring (dring_arm) */
	int owner;              /* the pid that armed it: a forked child's copy never disarms */
	int hot, hot_next;      /* on its set's hot list; next index or -1 */
	unsigned rang;          /* the bell fired and is not drained yet */
	int rang_next;          /* next on its set's rang list, -1: none */
	struct epoll_event ev;  /* the application's */
	int disabled;           /* EPOLLONESHOT fired */
	uint64_t last_in, last_out; /* EPOLLET: cursor state last reported */
};

/* An epoll set with direct records: how many, its hot list, and the
 * records it reported last, which epoll_wait's spin watches on the rings
 * themselves (direct_epoll.c). */
#define DSET_RECENT 4
struct depset {
	int epfd; /* -1: free */
	int n;    /* records */
	int hot;  /* first hot record, -1: none */
	int rang; /* first record with a bell that fired and is not drained, -1: none */
	int recent[DSET_RECENT]; /* record indices, -1: none */
	unsigned nrecent;        /* reports so far (recent[] is a ring) */
};

/* direct.c's state; changed under the table lock. */
extern struct dconn g_dc[DC_MAX];    /* direct connections mapped here */
extern struct depreg g_dep[DEP_MAX]; /* epoll registrations of direct descriptors */
extern struct depset g_dset[DSET_MAX];
extern int g_ndc, g_ndep; /* records in use */

/* With the lock held: epfd's set, made if make and there is room; NULL if none. */
struct depset *dset_of_locked(int epfd, int make);
/* With the lock held: take record i off its set's hot list, and off its
 * rang list. */
void hot_unlink_locked(struct depset *s, int i);
/* With the lock held: put record i on s's hot list (once). */
void hot_push_locked(struct depset *s, int i);

/* The live, not relayed connection of fd, or NULL. */
static inline struct dconn *dcof(int fd)
{
	if (!(fdflags(fd) & F_DIRECT))
		return NULL;
	struct dconn *c = &g_dc[ent(fd)->dc - 1];
	if (c->refs <= 0 || dring_relayed(&c->d))
		return NULL;
	return c;
}

/* ---- direct.c ---- */

/* shim_init's part: the free g_dep records, then dparty_init. */
void direct_init(void);

/* With the lock held: fd's entry is being cleared (close, reuse): drop
 * its epoll records and its reference. */
void direct_drop_locked(int fd, struct fdent *e);

/* With the lock held: epfd closes, drop its direct records. */
void direct_epfd_closed_locked(int epfd);

/* With the lock held: e now also refers to its connection (a dup). */
void direct_ref_locked(struct fdent *e);

/* O_NONBLOCK of a direct descriptor, cached for the data path. */
void direct_setfl(int fd, long fl);

/* With the lock held: free record i of g_dep (its bell registration). */
void dep_free_locked(int i);

struct ctl_resp;

/* Switch fd to exnd's answer r with descriptors ufd: relay or direct.
 * Consumes ufd. 0, or -1 with errno (fd untouched). */
int switch_to(int fd, const struct ctl_resp *r, int *ufd, int cloexec, int nonblock);

/* Whether the process has room for one more direct connection: a slot
 * of g_dc, and the descriptors a switch of fd takes (fdroom.c) plus extra
 * more (an upgrade's control connection, kept while it waits). */
int direct_room(int fd, int extra);

/* switch_to's parts, shared with upgrade.c: attach exnd's direct answer
 * to a reserved slot (V left in ufd[0]); undo that; install a slot's
 * connection under fd (V consumed). See direct.c. */
int direct_attach(const struct ctl_resp *r, int *ufd, int v);
void direct_unattach(int slot);
int direct_install(int fd, int slot, uint64_t id, int v, int cloexec, int nonblock);

/* What d_io returns for a descriptor that is not (or no longer) direct. */
#define NOT_DIRECT (-2)

/* A send (send 1) or receive (send 0) on fd if it is direct: the count, -1
 * with errno, or NOT_DIRECT. A send takes only MSG_DONTWAIT of mflags. */
ssize_t d_io(int fd, const struct iovec *iov, int cnt, int mflags, int send);

/* d_io on c, a connection mapped here; fd is the descriptor the call
 * came on (its cached O_NONBLOCK). */
ssize_t d_ring_io(struct dconn *c, int fd, const struct iovec *iov, int cnt, int mflags, int send);

static inline ssize_t d_recv(int fd, const struct iovec *iov, int cnt, int mflags) { return d_io(fd, iov, cnt, mflags, 0); }

static inline ssize_t d_send(int fd, const struct iovec *iov, int cnt, int mflags) { return d_io(fd, iov, cnt, mflags, 1); }

/* How often a readiness spin (direct_poll.c, direct_epoll.c) also asks
 * the kernel about the other descriptors (a zero-timeout poll or
 * epoll_wait, about 0.5 µs): every 16 checks of the rings keeps a plain
 * socket's event within a fraction of the budget while the rings are
 * checked without system calls. */
#define SPIN_KERNEL_EVERY 16

/* ---- direct_epoll.c ---- */

/* epoll_ctl on a direct descriptor: 1 handled (ret in *ret), 0 not direct. */
int d_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev, int *ret);

/* ---- dparty.c ---- */

/* direct_init's part: the pid, the kick key. */
void dparty_init(void);
/* getpid(), cached (and renewed in a forked child). */
int dparty_pid(void);

/* pthread_atfork child: this thread's kick descriptors and the parties
 * belong to the parent. */
void direct_atfork_child(void);

/* The hooks of every connection's dring: the parties, the kicks and the
 * fan-out (docs/direct.md, "One bell per side"). */
extern const struct dring_hooks g_dhooks;

/* The fan-out self of the epoll path (dring_bell_drain under the table
 * lock). */
extern struct dwaiter g_dep_self;

/* With the lock held: this process's waiter or epoll record joins c's
 * parties (nparty, and pwait[S] in the buffer); party_leave_locked
 * undoes it. */
void party_join_locked(struct dconn *c);
void party_leave_locked(struct dconn *c);

/* The family kick (made on first use, before any fork that shares a
 * connection: switch_to asks for it): registered EPOLLET in epoll sets
 * with direct records and in every parked thread's wait; -1 if it cannot
 * be made. */
int direct_fkick(void);
/* Write the family kick: every parked party of the family looks again. */
void direct_kick_family(void);

#pragma GCC visibility pop

#endif

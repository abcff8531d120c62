/*
 * direct.h: direct EXT-DS connections in libextds.so (docs/direct.md),
 * shared by direct.c (the state, the switch to direct, the data calls),
 * direct_poll.c (readiness: poll, select, epoll), direct_exec.c (the exec
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

#define DC_MAX 1024
#define DC_SLACK 16 /* slots left to concurrent switches (calls.c, switch_how) */
#define DEP_MAX 1024
#define DEP_TAG 0xe8dd5a5e00000000ull /* epoll data of a bell registration: tag | record index */

struct dconn {
	int refs; /* descriptors of this process that refer to it; 0: free */
	uint64_t id;
	int relay_asked;
	struct dring d;
};

struct depreg {
	int epfd, fd, hbell[2]; /* fd < 0: free; dups of my data and space bell */
	struct epoll_event ev; /* the application's */
	int disabled;          /* EPOLLONESHOT fired */
	uint64_t last_in, last_out; /* EPOLLET: cursor state last reported */
};

/* direct.c's state; changed under the table lock. */
extern struct dconn g_dc[DC_MAX];   /* direct connections mapped here */
extern struct depreg g_dep[DEP_MAX]; /* epoll registrations of direct descriptors */
extern int g_ndc, g_ndep;            /* records in use */

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

/* shim_init's part: the free g_dep records. */
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


/* With the lock held: free record i of g_dep (its hidden bells). */
void dep_free_locked(int i);

struct ctl_resp;

/* Switch fd to exnd's answer r with descriptors ufd: relay or direct.
 * Consumes ufd. 0, or -1 with errno (fd untouched). */
int switch_to(int fd, const struct ctl_resp *r, int *ufd, int cloexec, int nonblock);

/* What d_io returns for a descriptor that is not (or no longer) direct. */
#define NOT_DIRECT (-2)

/* A send (send 1) or receive (send 0) on fd if it is direct: the count, -1
 * with errno, or NOT_DIRECT. A send takes only MSG_DONTWAIT of mflags. */
ssize_t d_io(int fd, const struct iovec *iov, int cnt, int mflags, int send);

static inline ssize_t d_recv(int fd, const struct iovec *iov, int cnt, int mflags) { return d_io(fd, iov, cnt, mflags, 0); }

static inline ssize_t d_send(int fd, const struct iovec *iov, int cnt, int mflags) { return d_io(fd, iov, cnt, mflags, 1); }

/* ---- direct_poll.c ---- */

/* epoll_ctl on a direct descriptor: 1 handled (ret in *ret), 0 not direct. */
int d_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev, int *ret);

#pragma GCC visibility pop

#endif

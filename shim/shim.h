/*
 * shim.h: the state of libextds.so that its units share, all of it
 * defined in libextds.c: the configuration read from the environment,
 * the fd table and its epoll records under the one spinlock, init
 * (INIT), debug output, the table helpers and the switch of a descriptor
 * to exnd's AF_UNIX end (do_switch). Private to the shim: every
 * declaration here is hidden; only EXPORT definitions leave the library
 * (libextds.map).
 *
 * Each unit starts with #define _GNU_SOURCE, then includes this header.
 */
#ifndef EXN_SHIM_H
#define EXN_SHIM_H

#include <netinet/in.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>

#include "real.h"

/* An interposed libc entry point (listed in libextds.map). */
#define EXPORT __attribute__((visibility("default")))

#pragma GCC visibility push(hidden)

/* ---- configuration (shim_init, from the environment) ---- */

enum { MODE_OFF, MODE_AUTO, MODE_FORCE };

extern int g_mode;   /* EXTDS_MODE */
extern int g_debug;  /* EXTDS_DEBUG */
extern int g_direct; /* ask exnd for direct connections (EXTDS_DIRECT=0: relay) */
extern int g_upgrade; /* EXTDS_SETUP=upgrade (the default with EXTDS_DIRECT): connections start as TCP and move later (upgrade.c) */
extern char g_ctl_path[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* EXTDS_CONTROL */
extern volatile int g_ready; /* init done */

/* ---- fd table ---- */

#define MAX_FDS (1 << 16)
#define EP_POOL 1024

enum {
	F_TRACKED = 1 << 0,  /* AF_INET/AF_INET6 SOCK_STREAM socket */
	F_LISTEN = 1 << 1,   /* registered with exnd by shim-listen */
	F_SWITCHED = 1 << 2, /* the fd is now exnd's AF_UNIX end */
	F_EPOVF = 1 << 3,    /* an epoll registration did not fit the pool */
	F_NODELAY = 1 << 4,
	F_CORK = 1 << 5,
	F_KEEPALIVE = 1 << 6,
	F_DIRECT = 1 << 7,   /* direct connection (docs/direct.md): fdent.dc */
	F_NB = 1 << 8,       /* F_DIRECT: O_NONBLOCK, cached for the data path */
	F_UPG = 1 << 9,      /* a TCP connection that may still move onto a direct one (upgrade.c): fdent.ust */
};

union addr {
	struct sockaddr sa;
	struct sockaddr_in in;
	struct sockaddr_in6 in6;
};

/* Calls of this process in flight through one step of an upgrade, and
 * whether a drain waits for them (upgrade.c). */
struct ucount {
	uint32_t n, waiting;
};

struct fdent {
	uint16_t flags;
	uint16_t family;
	uint16_t port;      /* F_LISTEN: the port told to exnd */
	int32_t owner;      /* F_LISTEN: pid that told exnd */
	uint32_t lid;       /* F_LISTEN: listener identity, shared by dups */
	int32_t nreg;       /* epoll records for this fd */
	uint64_t ino, dev;  /* F_SWITCHED: identity of the unix socket */
	uint64_t id;        /* F_SWITCHED: exnd's connection id */
	int32_t dc;         /* F_DIRECT: index + 1 in direct.c's g_dc */
	int32_t maxseg, tos;
	uint64_t hold_until; /* F_LISTEN: accepts stay plain TCP until then (CLOCK_MONOTONIC ns; hold.c) */
	uint64_t uat;        /* F_UPG, U_YOUNG: ask exnd at or after this CLOCK_MONOTONIC ns (upgrade.c) */
	int32_t ucl;         /* F_UPG, U_ASKED: the control connection that will carry exnd's answer */
	uint8_t ust;         /* F_UPG: the upgrade's state, U_* (upgrade.h) */
	uint8_t uside;       /* F_UPG: 0 connected, 1 accepted */
	uint8_t utries;      /* F_UPG: upgrades asked for */
	uint8_t uwsh;        /* F_UPG: the program shut the TCP write side before attaching */
	struct ucount utw, utr, umv; /* F_UPG: this process's TCP writes, TCP reads and moves in flight (upgrade.c) */
	union addr local, peer;
	socklen_t llen, plen;
};

struct epreg {
	int epfd, fd; /* fd < 0: free */
	struct epoll_event ev;
};

extern struct fdent *g_tab; /* g_ntab entries, mmap'd by shim_init; NULL: EXTDS_MODE=off */
extern int g_ntab;
extern struct epreg g_ep[EP_POOL]; /* epoll registrations of sockets that may still switch */
extern int g_nep;                  /* records in use */
extern uint32_t g_lid;             /* the last listener identity given out */
extern volatile int g_lock;        /* the table lock: lock(), unlock() */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ volatile("yield");
#endif
}

static inline void lock(void)
{
	while (__atomic_exchange_n(&g_lock, 1, __ATOMIC_ACQUIRE)) {
		while (__atomic_load_n(&g_lock, __ATOMIC_RELAXED))
			cpu_relax();
	}
}

static inline void unlock(void) { __atomic_store_n(&g_lock, 0, __ATOMIC_RELEASE); }

static inline struct fdent *ent(int fd)
{
	if (!g_tab || fd < 0 || fd >= g_ntab)
		return NULL;
	return &g_tab[fd];
}

/* Flags of fd without the lock (a single aligned load). */
static inline int fdflags(int fd)
{
	struct fdent *e = ent(fd);
	return e ? __atomic_load_n(&e->flags, __ATOMIC_RELAXED) : 0;
}

/* ---- init, debug ---- */

/* Resolve real, read the environment, map the table; once. */
void shim_init(void);

#define INIT() do { if (__builtin_expect(!g_ready, 0)) shim_init(); } while (0)

/* One line to stderr when EXTDS_DEBUG is set; errno preserved. */
void dbg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static inline void now_ts(struct timespec *t) { clock_gettime(CLOCK_MONOTONIC, t); }

static inline long ms_since(const struct timespec *t0)
{
	struct timespec t;
	now_ts(&t);
	return (t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
}

/* CLOCK_MONOTONIC in ns. */
static inline int64_t mono_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* What is left of timeout tmo (NULL: none) started at t0; 0 once it ran
 * out. */
static inline int time_left(const struct timespec *tmo, const struct timespec *t0, struct timespec *left)
{
	if (!tmo)
		return 1;
	long long ns = (long long)tmo->tv_sec * 1000000000 + tmo->tv_nsec - (long long)ms_since(t0) * 1000000;
	if (ns <= 0)
		return 0;
	*left = (struct timespec){ns / 1000000000, ns % 1000000000};
	return 1;
}

/* ---- table helpers (libextds.c) ---- */

/* With the lock held: forget the epoll records made on epfd (it closes). */
void ep_drop_epfd_locked(int epfd);

/* With the lock held: clear fd's entry (its epoll records, its direct reference). */
void clear_locked(int fd);

int is_loopback(const struct sockaddr *sa);

/* Whether fd is a TCP socket (checked with the kernel, not the table). */
int is_tcp(int fd, int *family);

/* The switched entry of fd, checked against the descriptor's identity
 * (copied into out if not NULL); a stale one is cleared. */
int switched(int fd, struct fdent *out);

/* Replace fd by exnd's AF_UNIX end ufd, keeping what the application
 * sees; dslot >= 0: as the direct descriptor of that slot of direct.c's
 * g_dc (libextds.c). 0, or -1 with errno (fd untouched). */
int do_switch(int fd, int ufd, int cloexec, int nonblock, uint64_t id, int dslot);

/* Forget the epoll records of a connected socket that stays TCP. */
void settle(int fd);

#pragma GCC visibility pop

#endif

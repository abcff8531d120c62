/*
 * shmfab_internal.h: what the C client's units share and nothing else
 * includes: the access helpers for shared words, the VPID file geometry,
 * the library's private types, and the functions one unit defines for
 * another (prefixed sfab_, hidden from a shared object's dynamic symbol
 * table). The public API is shmfab.h.
 *
 *   shmfab.c         files, names, peers and the rings (push, notes,
 *                    doorbells, orphaned slots)
 *   shmfab_attach.c  the lease token, attach and detach
 *   shmfab_ep.c      endpoints, their data path, regions and RMA
 */
#ifndef EXN_SHMFAB_INTERNAL_H
#define EXN_SHMFAB_INTERNAL_H

#include "shmfab.h"

#include <stddef.h>
#include <stdint.h>

#define PATHLEN 512
#define MAX_PEERS 32
#define RR_CACHE 16
#define CLAIM_RETRIES 4096

/* ---- shared words ------------------------------------------------------ */

static inline uint64_t *w64(uint8_t *b, size_t off) { return (uint64_t *)(void *)(b + off); }
static inline uint32_t *w32(uint8_t *b, size_t off) { return (uint32_t *)(void *)(b + off); }
static inline uint64_t ld64(uint64_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
static inline uint32_t ld32(uint32_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
static inline void st64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
static inline void st32(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
static inline uint32_t add32(uint32_t *p, uint32_t v) { return __atomic_add_fetch(p, v, __ATOMIC_SEQ_CST); }
static inline uint64_t add64(uint64_t *p, uint64_t v) { return __atomic_add_fetch(p, v, __ATOMIC_SEQ_CST); }
static inline int cas64(uint64_t *p, uint64_t old, uint64_t new)
{
	return __atomic_compare_exchange_n(p, &old, new, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
static inline uint32_t xchg32(uint32_t *p, uint32_t v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }

static inline int pow2_in(uint32_t v, uint32_t lo, uint32_t hi) { return v >= lo && v <= hi && (v & (v - 1)) == 0; }

/* ---- types ------------------------------------------------------------- */

/* vmap is a mapping of one VPID file: ours, or a producer's view of a
 * peer's. Geometry fields are validated copies, never re-read. */
struct vmap {
	uint8_t *b;
	size_t size;
	uint32_t slots, depth;
	int bell;   /* wait mode SHMFAB_WAIT_BELL */
	int bellfd; /* producer: opened on first ring (-1); owner: its own */
	int spacefd; /* owner: its space bell, rung for parked senders (-1: none, and producers' views) */
	char bellpath[PATHLEN + 8];
};

struct rregion {
	uint32_t idx, gen;
	uint64_t size;
	uint8_t *b;
};

struct peer {
	int used, self, down;
	uint16_t id;
	uint64_t inc;
	int fd; /* node file, for the flock probe (-1: self) */
	uint8_t *b;
	struct vmap *v[256];
	struct rregion rr[RR_CACHE];
	int rrnext;
};

struct lregion {
	int used;
	uint32_t gen;
	uint8_t owner;
	uint64_t size;
	uint8_t *b;
	char path[PATHLEN];
};

struct consumer {
	uint64_t head, stuck_pos;
	int64_t stuck_since; /* 0: not stuck */
};

struct shmfab_ep {
	shmfab_node *n;
	uint8_t vpid;
	int fd;
	struct vmap v;
	char path[PATHLEN];
	struct consumer rc, nc;
};

struct shmfab_node {
	char dir[256];
	char fab[65];
	uint16_t node;
	uint64_t inc;
	int slot;
	uint64_t secret[2];
	unsigned base, count;
	int fabfd, nodefd, afd;
	uint8_t *nb;
	char apath[PATHLEN];
	uint32_t reglo;
	struct peer self;
	struct peer peers[MAX_PEERS];
	shmfab_ep *eps[256];
	struct lregion regs[SHMFAB_LEASE_REGIONS];
	uint32_t gens[SHMFAB_LEASE_REGIONS];
	struct shmfab_stats st;
};

/* ---- VPID file geometry -------------------------------------------------- */

static inline size_t vpid_file_size(uint32_t slots, uint32_t depth)
{
	return SHMFAB_V_OFF_MAILBOX + (size_t)slots * SHMFAB_SLOT_SIZE + (size_t)depth * SHMFAB_NOTIFY_ENTRY;
}

static inline uint64_t *slot_word(struct vmap *v, uint64_t pos)
{
	return w64(v->b, SHMFAB_V_OFF_MAILBOX + (size_t)(pos & (v->slots - 1)) * SHMFAB_SLOT_SIZE);
}
static inline uint8_t *slot_data(struct vmap *v, uint64_t pos) { return (uint8_t *)slot_word(v, pos) + 8; }
static inline uint8_t *nentry(struct vmap *v, uint64_t pos)
{
	return v->b + SHMFAB_V_OFF_MAILBOX + (size_t)v->slots * SHMFAB_SLOT_SIZE +
	       (size_t)(pos & (v->depth - 1)) * SHMFAB_NOTIFY_ENTRY;
}

static inline uint64_t seq23(uint64_t p) { return p & SHMFAB_SEQ_MASK; }
static inline int32_t seq_diff(uint64_t a, uint64_t b)
{
	return (int32_t)((uint32_t)((a - b) & SHMFAB_SEQ_MASK) << 9) >> 9;
}

/* ---- shared functions (hidden) ------------------------------------------- */

#pragma GCC visibility push(hidden)

/* shmfab.c: system helpers. */
int64_t sfab_now_ns(void);
void sfab_futex_wait(uint32_t *addr, uint32_t val, int64_t ns);
int sfab_futex_wake(uint32_t *addr);
int sfab_try_lock(int fd, int how);
int sfab_create_file(const char *path, size_t size);
void *sfab_map_fd(int fd, size_t size);
int64_t sfab_file_size(int fd);

/* shmfab.c: names. */
void sfab_inc_prefix(const shmfab_node *n, char *out, size_t len, uint16_t id, uint64_t inc, const char *rest);
void sfab_vpid_path(const shmfab_node *n, char *out, uint16_t id, uint64_t inc, unsigned v);
void sfab_region_path(const shmfab_node *n, char *out, uint16_t id, uint64_t inc, uint32_t idx, uint32_t gen);
void sfab_node_path(const shmfab_node *n, char *out, uint16_t id);

/* shmfab.c: peers. */
void sfab_peer_drop(struct peer *p);
int sfab_probe_dead(int fd);
int sfab_peer_up(shmfab_node *n, struct peer *p, int probe);
int sfab_decode_node_header(const uint8_t *b, uint16_t want, uint64_t *inc, uint32_t *state, uint32_t *pid);
int sfab_get_peer(shmfab_node *n, uint16_t id, struct peer **out);
int sfab_get_vmap(shmfab_node *n, struct peer *p, unsigned v, struct vmap **out);

/* shmfab.c: rings. */
int sfab_push(struct vmap *v, uint64_t desc, uint16_t src, const void *p, size_t len);
int sfab_ring_fifo(int fd);
void sfab_ring_doorbell(shmfab_node *n, struct vmap *v);
void sfab_wake_senders(struct vmap *v);
int sfab_push_note(struct vmap *v, const struct shmfab_note *nt, uint16_t src);
int sfab_orphaned(shmfab_node *n, struct consumer *c, uint64_t pos, int known, uint16_t claimer);

/* shmfab_ep.c: a lease region's release (detach, close, deregister). */
void sfab_drop_region(shmfab_node *n, uint32_t i);

#pragma GCC visibility pop

#endif

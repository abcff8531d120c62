/*
 * shmfab: the shm fabric's data plane in C. See shmfab.h for the API and
 * docs/shm-abi.md for the layout and protocols this file implements;
 * the Go implementation it must agree with is fabric/shm (layout.go,
 * ring.go, rma.go, attach.go, endpoint.go).
 *
 * Stages, per call:
 *   send:  target lookup (peer node file, cached VPID file mapping,
 *          header validated) -> claim (CAS tail) -> mark -> fill ->
 *          publish (status word last) -> doorbell (futex wake if
 *          sleepers, one FIFO byte if bellW and we win rung 0->1).
 *          Full ring: poll SHMFAB_SPIN_NS, then futex slices
 *          on the target's space word with liveness checks between.
 *   recv/poll: consume from head, classify every status word, free
 *          slots (status last), wake blocked senders once per batch.
 *   wait:  spin SHMFAB_SPIN_NS, then clear rung, bellW++, re-check,
 *          ppoll() the doorbell FIFO, drain, bellW--.
 *   post:  local region check (our table) -> peer region entry read as a
 *          seqlock (the only size trusted) -> region file of exactly that
 *          generation mapped (cached) -> entry re-checked -> one memmove
 *          -> notifications (Table 3.1) with the publish-last protocol.
 *
 * Memory ordering: every shared word is accessed with __atomic builtins,
 * sequentially consistent, matching Go's sync/atomic; payloads are plain
 * copies ordered by the publishing store (release) and the consuming
 * load (acquire). The doorbell is the Dekker pair documented in
 * docs/shm-abi.md.
 */
#define _GNU_SOURCE
#include "shmfab.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define PATHLEN 512
#define MAX_PEERS 32
#define RR_CACHE 16
#define CLAIM_RETRIES 4096
#define DEFAULT_DEPTH 4096u
#define OPEN_RETRIES 200

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

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* Shared (not private) futex operations: the words live in files mapped
 * by several processes. */
static void futex_wait(uint32_t *addr, uint32_t val, int64_t ns)
{
	struct timespec ts = {.tv_sec = ns / 1000000000ll, .tv_nsec = ns % 1000000000ll};
	syscall(SYS_futex, addr, FUTEX_WAIT, val, ns >= 0 ? &ts : NULL, NULL, 0);
}
static int futex_wake(uint32_t *addr) { return (int)syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

/* try_lock takes flock(how|LOCK_NB): 1 taken, 0 held elsewhere, -errno. */
static int try_lock(int fd, int how)
{
	for (;;) {
		if (flock(fd, how | LOCK_NB) == 0)
			return 1;
		if (errno == EINTR)
			continue;
		return errno == EWOULDBLOCK ? 0 : -errno;
	}
}

static int same_file(int fd, const char *path)
{
	struct stat a, b;
	if (fstat(fd, &a) != 0 || stat(path, &b) != 0)
		return 0;
	return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

static int create_file(const char *path, size_t size)
{
	int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)size) != 0) {
		int e = -errno;
		close(fd);
		unlink(path);
		return e;
	}
	return fd;
}

static void *map_fd(int fd, size_t size)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	return p == MAP_FAILED ? NULL : p;
}

static int64_t file_size(int fd)
{
	struct stat st;
	return fstat(fd, &st) == 0 ? (int64_t)st.st_size : -1;
}

static int pow2_in(uint32_t v, uint32_t lo, uint32_t hi) { return v >= lo && v <= hi && (v & (v - 1)) == 0; }

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

/* ---- names --------------------------------------------------------------- */

static void inc_prefix(const shmfab_node *n, char *out, size_t len, uint16_t id, uint64_t inc, const char *rest)
{
	snprintf(out, len, "%s/exn-%s-n%u.%016llx-%s", n->dir, n->fab, id, (unsigned long long)inc, rest);
}
static void vpid_path(const shmfab_node *n, char *out, uint16_t id, uint64_t inc, unsigned v)
{
	char r[16];
	snprintf(r, sizeof r, "v%u", v);
	inc_prefix(n, out, PATHLEN, id, inc, r);
}
static void region_path(const shmfab_node *n, char *out, uint16_t id, uint64_t inc, uint32_t idx, uint32_t gen)
{
	char r[32];
	snprintf(r, sizeof r, "r%u.%u", idx, gen);
	inc_prefix(n, out, PATHLEN, id, inc, r);
}
static void node_path(const shmfab_node *n, char *out, uint16_t id)
{
	snprintf(out, PATHLEN, "%s/exn-%s-n%u", n->dir, n->fab, id);
}

/* ---- lease view -------------------------------------------------------------- */

static uint8_t *lease(shmfab_node *n) { return n->nb + SHMFAB_N_OFF_LEASES + (size_t)n->slot * SHMFAB_LEASE_SIZE; }

static int lease_ours(shmfab_node *n)
{
	uint8_t *l = lease(n);
	uint64_t a = ld64(w64(l, SHMFAB_L_OFF_SECRET)) ^ n->secret[0];
	uint64_t b = ld64(w64(l, SHMFAB_L_OFF_SECRET + 8)) ^ n->secret[1];
	return ld32(w32(l, SHMFAB_L_OFF_STATE)) == SHMFAB_LEASE_GRANTED && (a | b) == 0;
}

/* ---- VPID file geometry -------------------------------------------------------- */

static size_t vpid_file_size(uint32_t slots, uint32_t depth)
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

/* decode_vpid_header validates a VPID header (hb: a private copy) for
 * file size `size`, promising to be (node, vpid). */
static int decode_vpid_header(const uint8_t *hb, uint16_t node, unsigned vpid, int64_t size, struct vmap *v)
{
	uint64_t magic;
	uint32_t ver, hn, hv, slots, depth, mode;
	memcpy(&magic, hb + SHMFAB_V_OFF_MAGIC, 8);
	memcpy(&ver, hb + SHMFAB_V_OFF_VERSION, 4);
	memcpy(&hn, hb + SHMFAB_V_OFF_NODE, 4);
	memcpy(&hv, hb + SHMFAB_V_OFF_VPID, 4);
	memcpy(&slots, hb + SHMFAB_V_OFF_SLOTS, 4);
	memcpy(&depth, hb + SHMFAB_V_OFF_DEPTH, 4);
	memcpy(&mode, hb + SHMFAB_V_OFF_WAITMODE, 4);
	if (magic != SHMFAB_VPID_MAGIC || ver != SHMFAB_LAYOUT_VERSION)
		return -EPROTO;
	if (hn != node || hv != vpid || !pow2_in(slots, SHMFAB_MIN_SLOTS, SHMFAB_MAX_SLOTS) ||
	    !pow2_in(depth, SHMFAB_MIN_DEPTH, SHMFAB_MAX_DEPTH) || mode > SHMFAB_WAIT_BELL ||
	    (int64_t)vpid_file_size(slots, depth) > size)
		return -EINVAL;
	v->slots = slots;
	v->depth = depth;
	v->bell = mode == SHMFAB_WAIT_BELL;
	v->size = vpid_file_size(slots, depth);
	return 0;
}

static void vmap_release(struct vmap *v)
{
	if (!v)
		return;
	if (v->b)
		munmap(v->b, v->size);
	if (v->bellfd >= 0)
		close(v->bellfd);
	free(v);
}

/* ---- peers --------------------------------------------------------------------- */

static void peer_drop(struct peer *p)
{
	for (int i = 0; i < 256; i++) {
		vmap_release(p->v[i]);
		p->v[i] = NULL;
	}
	for (int i = 0; i < RR_CACHE; i++) {
		if (p->rr[i].b)
			munmap(p->rr[i].b, p->rr[i].size);
		p->rr[i].b = NULL;
	}
	if (!p->self) {
		if (p->b)
			munmap(p->b, SHMFAB_NODE_FILE_SIZE);
		if (p->fd >= 0)
			close(p->fd);
		p->b = NULL;
		p->fd = -1;
	}
}

/* probe_dead: 1 if the node file's lock can be taken (its owner is dead;
 * the lock is dropped at once: a restarting node or a reclaiming peer
 * needs it), 0 otherwise. */
static int probe_dead(int fd)
{
	if (try_lock(fd, LOCK_EX) == 1) {
		flock(fd, LOCK_UN);
		return 1;
	}
	return 0;
}

/* peer_up: the peer's lock is held and its state says alive; marks it
 * down otherwise. */
static int peer_up(shmfab_node *n, struct peer *p, int probe)
{
	if (p->self)
		return shmfab_owner_alive(n) == 0;
	if (p->down)
		return 0;
	if (ld32(w32(p->b, SHMFAB_N_OFF_STATE)) != SHMFAB_NODE_ALIVE || (probe && probe_dead(p->fd))) {
		p->down = 1;
		return 0;
	}
	return 1;
}

static int decode_node_header(const uint8_t *b, uint16_t want, uint64_t *inc, uint32_t *state, uint32_t *pid)
{
	uint64_t magic, i;
	uint32_t ver, node, s, pd;
	memcpy(&magic, b + SHMFAB_N_OFF_MAGIC, 8);
	memcpy(&ver, b + SHMFAB_N_OFF_VERSION, 4);
	memcpy(&node, b + SHMFAB_N_OFF_NODE, 4);
	memcpy(&pd, b + SHMFAB_N_OFF_PID, 4);
	s = ld32(w32((uint8_t *)b, SHMFAB_N_OFF_STATE));
	memcpy(&i, b + SHMFAB_N_OFF_INC, 8);
	if (magic != SHMFAB_NODE_MAGIC || ver != SHMFAB_LAYOUT_VERSION)
		return -EPROTO;
	if (node != want || i == 0 || s < SHMFAB_NODE_ALIVE || s > SHMFAB_NODE_RECLAIMING)
		return -EINVAL;
	*inc = i;
	*state = s;
	if (pid)
		*pid = pd;
	return 0;
}

/* get_peer returns node id's peer if it is up, discovering it (opening
 * and validating its node file) if need be. */
static int get_peer(shmfab_node *n, uint16_t id, struct peer **out)
{
	if (id == n->node) {
		*out = &n->self;
		return 0;
	}
	struct peer *free_slot = NULL;
	int gone = 0;
	for (int i = 0; i < MAX_PEERS; i++) {
		struct peer *p = &n->peers[i];
		if (!p->used) {
			if (!free_slot)
				free_slot = p;
			continue;
		}
		if (p->id != id)
			continue;
		if (peer_up(n, p, 0)) {
			*out = p;
			return 0;
		}
		peer_drop(p);
		p->used = 0;
		gone = 1;
		if (!free_slot)
			free_slot = p;
	}
	char path[PATHLEN];
	node_path(n, path, id);
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? (gone ? -EHOSTDOWN : -ENOENT) : -errno;
	if (probe_dead(fd)) {
		close(fd);
		return -EHOSTDOWN;
	}
	if (file_size(fd) < (int64_t)SHMFAB_NODE_FILE_SIZE) {
		close(fd);
		n->st.corrupt++;
		return -EINVAL;
	}
	uint8_t *b = map_fd(fd, SHMFAB_NODE_FILE_SIZE);
	if (!b) {
		int e = -errno;
		close(fd);
		return e;
	}
	uint64_t inc;
	uint32_t state;
	int err = decode_node_header(b, id, &inc, &state, NULL);
	if (err == 0 && state != SHMFAB_NODE_ALIVE)
		err = -EHOSTDOWN;
	if (err == 0 && !free_slot)
		err = -ENOSPC;
	if (err) {
		if (err == -EPROTO || err == -EINVAL)
			n->st.corrupt++;
		munmap(b, SHMFAB_NODE_FILE_SIZE);
		close(fd);
		return err;
	}
	memset(free_slot, 0, sizeof *free_slot);
	free_slot->used = 1;
	free_slot->id = id;
	free_slot->inc = inc;
	free_slot->fd = fd;
	free_slot->b = b;
	*out = free_slot;
	return 0;
}

/* get_vmap returns p's cached mapping of VPID v's file, opening and
 * validating it if it is not cached or was closed. */
static int get_vmap(shmfab_node *n, struct peer *p, unsigned v, struct vmap **out)
{
	struct vmap *c = p->v[v];
	if (c) {
		if (ld32(w32(c->b, SHMFAB_V_OFF_STATE)) == SHMFAB_VPID_OPEN) {
			*out = c;
			return 0;
		}
		vmap_release(c);
		p->v[v] = NULL;
	}
	char path[PATHLEN];
	vpid_path(n, path, p->id, p->inc, v);
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return peer_up(n, p, 1) ? -ENOENT : -EHOSTDOWN;
		return -errno;
	}
	int64_t size = file_size(fd);
	uint8_t hb[SHMFAB_V_OFF_MAILBOX];
	if (size < SHMFAB_V_OFF_MAILBOX || pread(fd, hb, sizeof hb, 0) != (ssize_t)sizeof hb) {
		close(fd);
		n->st.corrupt++;
		return -EINVAL;
	}
	c = calloc(1, sizeof *c);
	if (!c) {
		close(fd);
		return -ENOMEM;
	}
	c->bellfd = -1;
	c->spacefd = -1;
	int err = decode_vpid_header(hb, p->id, v, size, c);
	if (err) {
		close(fd);
		free(c);
		n->st.corrupt++;
		return err;
	}
	c->b = map_fd(fd, c->size);
	err = -errno;
	close(fd);
	if (!c->b) {
		free(c);
		return err;
	}
	snprintf(c->bellpath, sizeof c->bellpath, "%s.bell", path);
	p->v[v] = c;
	*out = c;
	return 0;
}

/* ---- rings ---------------------------------------------------------------------- */

static inline uint64_t seq23(uint64_t p) { return p & SHMFAB_SEQ_MASK; }
static inline int32_t seq_diff(uint64_t a, uint64_t b)
{
	return (int32_t)((uint32_t)((a - b) & SHMFAB_SEQ_MASK) << 9) >> 9;
}

/* push tries once to put a message into v's mailbox; 0 if it is full. */
static int push(struct vmap *v, uint64_t desc, uint16_t src, const void *p, size_t len)
{
	uint64_t *tail = w64(v->b, SHMFAB_V_OFF_TAIL);
	for (int try = 0; try < CLAIM_RETRIES; try++) {
		uint64_t pos = ld64(tail);
		uint64_t *st = slot_word(v, pos);
		int32_t d = seq_diff(ld64(st) >> SHMFAB_SEQ_SHIFT, pos);
		if (d == 0) {
			if (!cas64(tail, pos, pos + 1))
				continue;
			st64(st, seq23(pos) << SHMFAB_SEQ_SHIFT | SHMFAB_CLAIM_MARK | src);
			memcpy(slot_data(v, pos), p, len);
			st64(st, seq23(pos + 1) << SHMFAB_SEQ_SHIFT | desc);
			return 1;
		}
		if (d < 0)
			return 0;
	}
	return 0;
}

/* ring_fifo writes one byte to a bell FIFO: 0, also when it is full (a
 * ring is pending), or -1. */
static int ring_fifo(int fd)
{
	uint8_t one = 1;
	ssize_t r;
	do
		r = write(fd, &one, 1);
	while (r < 0 && errno == EINTR);
	return r == 1 || (r < 0 && errno == EAGAIN) ? 0 : -1;
}

/* ring_doorbell wakes v's consumer if it announced sleep (see
 * docs/shm-abi.md "Wake-up protocol"). */
static void ring_doorbell(shmfab_node *n, struct vmap *v)
{
	if (ld32(w32(v->b, SHMFAB_V_OFF_SLEEPERS)) != 0) {
		add32(w32(v->b, SHMFAB_V_OFF_DOORBELL), 1);
		futex_wake(w32(v->b, SHMFAB_V_OFF_DOORBELL));
		n->st.futex_wakes++;
	}
	if (!v->bell || ld32(w32(v->b, SHMFAB_V_OFF_BELLW)) == 0)
		return;
	uint32_t *rung = w32(v->b, SHMFAB_V_OFF_RUNG);
	if (ld32(rung) != 0 || xchg32(rung, 1) != 0)
		return;
	if (v->bellfd < 0 && v->bellpath[0]) {
		int fd = open(v->bellpath, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
		struct stat st;
		if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode))) {
			close(fd);
			fd = -1;
		}
		v->bellfd = fd;
	}
	if (v->bellfd >= 0 && ring_fifo(v->bellfd) == 0) {
		n->st.bell_rings++;
		return;
	}
	n->st.ring_failed++;
	st32(rung, 0); /* let another producer try */
}

/* After freeing slots: wake senders on the space futex (C senders, Go
 * senders without a space bell) and, the first time since a parked sender
 * cleared spaceRung, those parked on the space bell (docs/shm-abi.md). */
static void wake_senders(struct vmap *v)
{
	if (ld32(w32(v->b, SHMFAB_V_OFF_SPACEW)) == 0)
		return;
	add32(w32(v->b, SHMFAB_V_OFF_SPACE), 1);
	futex_wake(w32(v->b, SHMFAB_V_OFF_SPACE));
	uint32_t *rung = w32(v->b, SHMFAB_V_OFF_SPACERUNG);
	if (v->spacefd < 0 || ld32(rung) != 0 || xchg32(rung, 1) != 0)
		return;
	if (ring_fifo(v->spacefd) < 0)
		st32(rung, 0);
}

void shmfab_encode_note(const struct shmfab_note *nt, uint8_t body[16])
{
	uint64_t w0 = (uint64_t)(nt->op & 3) | (uint64_t)(nt->kind & 3) << 2 | (uint64_t)(nt->err & 0xF) << 4 |
	              (uint64_t)nt->node << 8 | (uint64_t)nt->vpid << 24 | (uint64_t)(nt->len & 0xFFFFFF) << 32;
	memcpy(body, &w0, 8);
	memcpy(body + 8, &nt->local, 8);
}

int shmfab_decode_note(const uint8_t body[16], struct shmfab_note *out)
{
	uint64_t w0, w1;
	memcpy(&w0, body, 8);
	memcpy(&w1, body + 8, 8);
	struct shmfab_note nt = {
	    .op = w0 & 3,
	    .kind = w0 >> 2 & 3,
	    .err = w0 >> 4 & 0xF,
	    .node = (uint16_t)(w0 >> 8),
	    .vpid = (uint8_t)(w0 >> 24),
	    .len = (uint32_t)(w0 >> 32 & 0xFFFFFF),
	    .local = w1,
	};
	if ((w0 & SHMFAB_NOTIFY_RESERVED) || (nt.op != SHMFAB_OP_PUT && nt.op != SHMFAB_OP_GET) || nt.kind == 0 ||
	    nt.err > SHMFAB_NERR_PEERDOWN || nt.len > SHMFAB_MAX_RMA_LEN)
		return -EINVAL;
	*out = nt;
	return 0;
}

/* push_note appends one notification; a full queue counts the overflow in
 * the queue's header and drops it (the RMA unit never blocks). */
static int push_note(struct vmap *v, const struct shmfab_note *nt, uint16_t src)
{
	uint64_t *ntail = w64(v->b, SHMFAB_V_OFF_NTAIL);
	for (int try = 0; try < CLAIM_RETRIES; try++) {
		uint64_t pos = ld64(ntail);
		uint8_t *e = nentry(v, pos);
		int64_t d = (int64_t)(ld64(w64(e, 0)) - pos);
		if (d == 0) {
			if (!cas64(ntail, pos, pos + 1))
				continue;
			st64(w64(e, 24), (uint64_t)src + 1);
			shmfab_encode_note(nt, e + 8);
			st64(w64(e, 0), pos + 1);
			add64(w64(v->b, SHMFAB_V_OFF_STATS + 8 * (SHMFAB_VSTAT_KIND + nt->kind - 1)), 1);
			if (nt->err >= 1 && nt->err <= 3)
				add64(w64(v->b, SHMFAB_V_OFF_STATS + 8 * (SHMFAB_VSTAT_ERR + nt->err - 1)), 1);
			return 1;
		}
		if (d < 0)
			break;
	}
	add64(w64(v->b, SHMFAB_V_OFF_STATS + 8 * SHMFAB_VSTAT_OVERFLOW), 1);
	return 0;
}

/* orphaned: skip the claimed, unpublished position pos? At once if the
 * claimer (known) is probed dead, else after SHMFAB_ORPHAN_NS. */
static int orphaned(shmfab_node *n, struct consumer *c, uint64_t pos, int known, uint16_t claimer)
{
	if (known && claimer != n->node) {
		for (int i = 0; i < MAX_PEERS; i++) {
			struct peer *p = &n->peers[i];
			if (p->used && p->id == claimer && !peer_up(n, p, 1))
				return 1;
		}
	}
	int64_t now = now_ns();
	if (c->stuck_pos != pos || c->stuck_since == 0) {
		c->stuck_pos = pos;
		c->stuck_since = now;
		return 0;
	}
	return now - c->stuck_since >= SHMFAB_ORPHAN_NS;
}

/* ---- attach ---------------------------------------------------------------------- */

static int hexval(const char *s, size_t n, uint64_t *out)
{
	uint64_t v = 0;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
		if (d < 0)
			return -EINVAL;
		v = v << 4 | (uint64_t)d;
	}
	*out = v;
	return 0;
}

/* parse_token parses "s<slot>.<16 hex inc>.<32 hex secret>"
 * (fabric/shm/attach.go parseToken). */
static int parse_token(const char *t, int *slot, uint64_t *inc, uint64_t sec[2])
{
	if (!t || t[0] != 's')
		return -EINVAL;
	const char *dot = strchr(t, '.');
	if (!dot || dot - t < 2 || dot - t > 3)
		return -EINVAL;
	int s = 0;
	for (const char *c = t + 1; c < dot; c++) {
		if (*c < '0' || *c > '9')
			return -EINVAL;
		s = s * 10 + (*c - '0');
	}
	if (s >= SHMFAB_MAX_LEASES || (dot - t == 3 && t[1] == '0'))
		return -EINVAL;
	const char *rest = dot + 1;
	if (strlen(rest) != 16 + 1 + 32 || rest[16] != '.')
		return -EINVAL;
	if (hexval(rest, 16, inc) || hexval(rest + 17, 16, &sec[0]) || hexval(rest + 33, 16, &sec[1]))
		return -EINVAL;
	if (*inc == 0 || (sec[0] | sec[1]) == 0)
		return -EINVAL;
	*slot = s;
	return 0;
}

static int valid_name(const char *s)
{
	size_t l = strlen(s);
	if (l == 0 || l > 64 || !strcmp(s, ".") || !strcmp(s, ".."))
		return 0;
	for (size_t i = 0; i < l; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.'))
			return 0;
	}
	return 1;
}

/* join_fabric holds a shared flock on exn-F-fabric for the attachment's
 * lifetime (fabric/shm/nic.go joinFabric): the last process out unlinks
 * it. */
static int join_fabric(shmfab_node *n)
{
	char path[PATHLEN];
	snprintf(path, PATHLEN, "%s/exn-%s-fabric", n->dir, n->fab);
	for (int try = 0; try < OPEN_RETRIES; try++) {
		int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (fd < 0)
			return -errno;
		int ok = try_lock(fd, LOCK_SH);
		if (ok == 1 && same_file(fd, path)) {
			if (file_size(fd) < SHMFAB_PAGE && ftruncate(fd, SHMFAB_PAGE) != 0) {
				close(fd);
				return -errno;
			}
			uint8_t *b = map_fd(fd, SHMFAB_PAGE);
			if (b) {
				cas64(w64(b, 0), 0, SHMFAB_FABRIC_MAGIC);
				munmap(b, SHMFAB_PAGE);
			}
			n->fabfd = fd;
			return 0;
		}
		close(fd);
		if (ok < 0)
			return ok;
		usleep(1000); /* the last node out is unlinking it */
	}
	return -EADDRINUSE;
}

static void leave_fabric(shmfab_node *n)
{
	if (n->fabfd < 0)
		return;
	char path[PATHLEN];
	snprintf(path, PATHLEN, "%s/exn-%s-fabric", n->dir, n->fab);
	if (try_lock(n->fabfd, LOCK_EX) == 1 && same_file(n->fabfd, path))
		unlink(path);
	close(n->fabfd);
	n->fabfd = -1;
}

/* take_attach_file creates and flocks the lease's attach file
 * (fabric/shm/attach.go takeAttachFile). */
static int take_attach_file(shmfab_node *n)
{
	char r[16], tmp[PATHLEN + 32];
	snprintf(r, sizeof r, "a%d", n->slot);
	inc_prefix(n, n->apath, PATHLEN, n->node, n->inc, r);
	snprintf(tmp, sizeof tmp, "%s.tmp%d", n->apath, (int)getpid());
	for (int try = 0; try < OPEN_RETRIES; try++) {
		int fd = create_file(tmp, 8);
		if (fd < 0)
			return fd;
		if (try_lock(fd, LOCK_EX) != 1) {
			close(fd);
			unlink(tmp);
			return -EADDRINUSE;
		}
		int lerr = link(tmp, n->apath) == 0 ? 0 : errno;
		unlink(tmp);
		if (lerr == 0) {
			n->afd = fd;
			return 0;
		}
		close(fd);
		if (lerr != EEXIST)
			return -lerr;
		int old = open(n->apath, O_RDWR | O_CLOEXEC);
		if (old < 0)
			continue;
		if (try_lock(old, LOCK_EX) != 1) {
			close(old);
			return -EADDRINUSE; /* attached by a live process */
		}
		if (same_file(old, n->apath))
			unlink(n->apath); /* a dead holder's; we hold its lock */
		close(old);
	}
	return -EADDRINUSE;
}

int shmfab_attach(const char *dir, const char *fabric, uint16_t node, const char *token, unsigned base,
                  unsigned count, shmfab_node **out)
{
	if (!dir)
		dir = "/dev/shm";
	if (!fabric || !valid_name(fabric) || strlen(dir) >= 200 || count < 1 || base == 0 || base + count > 256 || !out)
		return -EINVAL;
	shmfab_node *n = calloc(1, sizeof *n);
	if (!n)
		return -ENOMEM;
	n->fabfd = n->nodefd = n->afd = -1;
	snprintf(n->dir, sizeof n->dir, "%s", dir);
	snprintf(n->fab, sizeof n->fab, "%s", fabric);
	n->node = node;
	n->base = base;
	n->count = count;
	int err = parse_token(token, &n->slot, &n->inc, n->secret);
	if (err)
		goto fail;
	if ((err = join_fabric(n)))
		goto fail;
	char path[PATHLEN];
	node_path(n, path, node);
	n->nodefd = open(path, O_RDWR | O_CLOEXEC);
	if (n->nodefd < 0) {
		err = errno == ENOENT ? -EHOSTDOWN : -errno;
		goto fail;
	}
	if (probe_dead(n->nodefd)) {
		err = -EHOSTDOWN;
		goto fail;
	}
	if (file_size(n->nodefd) < (int64_t)SHMFAB_NODE_FILE_SIZE) {
		/* A node file of another layout is another size: check the
		 * header words we can read before calling it invalid. */
		uint8_t hb[16];
		err = -EINVAL;
		if (pread(n->nodefd, hb, sizeof hb, 0) == (ssize_t)sizeof hb) {
			uint64_t magic;
			uint32_t ver;
			memcpy(&magic, hb, 8);
			memcpy(&ver, hb + 8, 4);
			if (magic != SHMFAB_NODE_MAGIC || ver != SHMFAB_LAYOUT_VERSION)
				err = -EPROTO;
		}
		goto fail;
	}
	n->nb = map_fd(n->nodefd, SHMFAB_NODE_FILE_SIZE);
	if (!n->nb) {
		err = -errno;
		goto fail;
	}
	uint64_t inc;
	uint32_t state;
	if ((err = decode_node_header(n->nb, node, &inc, &state, NULL)))
		goto fail;
	if (state != SHMFAB_NODE_ALIVE) {
		err = -EHOSTDOWN;
		goto fail;
	}
	if (inc != n->inc) {
		err = -EINVAL; /* a grant of an earlier incarnation */
		goto fail;
	}
	uint8_t *l = lease(n);
	uint32_t pid = ld32(w32(l, SHMFAB_L_OFF_PID));
	if (!lease_ours(n) || ld32(w32(l, SHMFAB_L_OFF_BASE)) != base || ld32(w32(l, SHMFAB_L_OFF_COUNT)) != count ||
	    (pid != 0 && pid != (uint32_t)getpid())) {
		err = -EINVAL;
		goto fail;
	}
	if ((err = take_attach_file(n)))
		goto fail;
	st32(w32(l, SHMFAB_L_OFF_HOLDER), (uint32_t)getpid());
	st32(w32(l, SHMFAB_L_OFF_HOLD), SHMFAB_HOLD_ATTACHED);
	if (!lease_ours(n)) { /* revoked while we attached */
		err = -EINVAL;
		goto fail;
	}
	n->reglo = SHMFAB_MAX_NODE_REGIONS + 1 + (uint32_t)n->slot * SHMFAB_LEASE_REGIONS;
	for (uint32_t i = 0; i < SHMFAB_LEASE_REGIONS; i++)
		n->gens[i] = (uint32_t)(ld64(w64(n->nb, SHMFAB_N_OFF_REGIONS + (size_t)(n->reglo + i - 1) * SHMFAB_REGION_ENTRY)) >> 32);
	n->self.used = n->self.self = 1;
	n->self.id = node;
	n->self.inc = n->inc;
	n->self.fd = -1;
	n->self.b = n->nb;
	*out = n;
	return 0;
fail:
	shmfab_detach(n);
	return err;
}

int shmfab_owner_alive(shmfab_node *n)
{
	if (!n->nb || probe_dead(n->nodefd) || ld32(w32(n->nb, SHMFAB_N_OFF_STATE)) != SHMFAB_NODE_ALIVE || !lease_ours(n))
		return -EHOSTDOWN;
	return 0;
}

int shmfab_alive(shmfab_node *n, uint16_t id)
{
	struct peer *p;
	int err = get_peer(n, id, &p);
	if (err)
		return err;
	return peer_up(n, p, 1) ? 0 : -EHOSTDOWN;
}

void shmfab_get_stats(shmfab_node *n, struct shmfab_stats *s) { *s = n->st; }

static void drop_region(shmfab_node *n, uint32_t i)
{
	struct lregion *r = &n->regs[i];
	st64(w64(n->nb, SHMFAB_N_OFF_REGIONS + (size_t)(n->reglo + i - 1) * SHMFAB_REGION_ENTRY), (uint64_t)r->gen << 32);
	unlink(r->path);
	munmap(r->b, r->size);
	r->used = 0;
}

void shmfab_detach(shmfab_node *n)
{
	if (!n)
		return;
	for (int v = 0; v < 256; v++)
		if (n->eps[v])
			shmfab_close(n->eps[v]);
	for (uint32_t i = 0; i < SHMFAB_LEASE_REGIONS; i++)
		if (n->regs[i].used)
			drop_region(n, i);
	for (int i = 0; i < MAX_PEERS; i++)
		if (n->peers[i].used)
			peer_drop(&n->peers[i]);
	if (n->self.used)
		peer_drop(&n->self);
	if (n->afd >= 0) {
		uint8_t *l = lease(n);
		if (ld32(w32(l, SHMFAB_L_OFF_HOLD)) == SHMFAB_HOLD_ATTACHED && lease_ours(n))
			st32(w32(l, SHMFAB_L_OFF_HOLD), SHMFAB_HOLD_DETACHED);
		if (same_file(n->afd, n->apath))
			unlink(n->apath);
		close(n->afd);
	}
	if (n->nb)
		munmap(n->nb, SHMFAB_NODE_FILE_SIZE);
	if (n->nodefd >= 0)
		close(n->nodefd);
	leave_fabric(n);
	free(n);
}

/* ---- endpoints ---------------------------------------------------------------------- */

int shmfab_open(shmfab_node *n, unsigned v, unsigned slots, shmfab_ep **out)
{
	if (slots == 0)
		slots = SHMFAB_DEFAULT_SLOTS;
	if (v < n->base || v >= n->base + n->count || !pow2_in(slots, SHMFAB_MIN_SLOTS, SHMFAB_MAX_SLOTS)) {
		n->st.invalid++;
		return -EINVAL;
	}
	if (n->eps[v])
		return -EADDRINUSE;
	if (shmfab_owner_alive(n)) {
		n->st.peer_down++;
		return -EHOSTDOWN;
	}
	shmfab_ep *e = calloc(1, sizeof *e);
	if (!e)
		return -ENOMEM;
	e->n = n;
	e->vpid = (uint8_t)v;
	e->fd = -1;
	e->v.bellfd = -1;
	e->v.spacefd = -1;
	vpid_path(n, e->path, n->node, n->inc, v);
	char tmp[PATHLEN + 16], tmpbell[PATHLEN + 16], tmpspace[PATHLEN + 16], space[PATHLEN + 16];
	snprintf(tmp, sizeof tmp, "%s.tmp", e->path);
	snprintf(tmpbell, sizeof tmpbell, "%s.tmp.bell", e->path);
	snprintf(tmpspace, sizeof tmpspace, "%s.tmp.space", e->path);
	snprintf(space, sizeof space, "%s.space", e->path);
	snprintf(e->v.bellpath, sizeof e->v.bellpath, "%s.bell", e->path);
	size_t size = vpid_file_size(slots, DEFAULT_DEPTH);
	int err = 0, fd = create_file(tmp, size);
	if (fd < 0) {
		free(e);
		return fd == -EEXIST ? -EADDRINUSE : fd;
	}
	if (try_lock(fd, LOCK_EX) != 1 || !(e->v.b = map_fd(fd, size))) {
		err = -EADDRINUSE;
		goto fail;
	}
	e->fd = fd;
	e->v.size = size;
	e->v.slots = slots;
	e->v.depth = DEFAULT_DEPTH;
	/* The doorbell FIFO; without one the VPID's consumer sleeps on the
	 * futex (wait mode SHMFAB_WAIT_FUTEX), as in Go. */
	unlink(tmpbell);
	if (mkfifo(tmpbell, 0600) == 0) {
		e->v.bellfd = open(tmpbell, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
		if (e->v.bellfd < 0)
			unlink(tmpbell);
	}
	e->v.bell = e->v.bellfd >= 0;
	/* Its space bell, with the doorbell: Go senders blocked on a full
	 * mailbox park on it; without one they sleep on the space futex. */
	if (e->v.bell) {
		unlink(tmpspace);
		if (mkfifo(tmpspace, 0600) == 0) {
			e->v.spacefd = open(tmpspace, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
			if (e->v.spacefd < 0)
				unlink(tmpspace);
		}
	}
	uint8_t *b = e->v.b;
	*w64(b, SHMFAB_V_OFF_MAGIC) = SHMFAB_VPID_MAGIC;
	*w32(b, SHMFAB_V_OFF_VERSION) = SHMFAB_LAYOUT_VERSION;
	*w32(b, SHMFAB_V_OFF_NODE) = n->node;
	*w32(b, SHMFAB_V_OFF_VPID) = v;
	*w32(b, SHMFAB_V_OFF_SLOTS) = slots;
	*w32(b, SHMFAB_V_OFF_DEPTH) = DEFAULT_DEPTH;
	*w32(b, SHMFAB_V_OFF_WAITMODE) = e->v.bell ? SHMFAB_WAIT_BELL : SHMFAB_WAIT_FUTEX;
	*w32(b, SHMFAB_V_OFF_STATE) = SHMFAB_VPID_OPEN;
	for (uint64_t i = 0; i < slots; i++)
		*slot_word(&e->v, i) = seq23(i) << SHMFAB_SEQ_SHIFT;
	for (uint64_t i = 0; i < DEFAULT_DEPTH; i++)
		*w64(nentry(&e->v, i), 0) = i;
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (link(tmp, e->path) != 0) {
		err = errno == EEXIST ? -EADDRINUSE : -errno;
		goto fail;
	}
	unlink(tmp);
	if (e->v.bell && rename(tmpbell, e->v.bellpath) != 0) {
		err = -errno;
		st32(w32(b, SHMFAB_V_OFF_STATE), SHMFAB_VPID_CLOSED);
		unlink(e->path);
		goto fail;
	}
	if (e->v.spacefd >= 0 && rename(tmpspace, space) != 0) {
		close(e->v.spacefd);
		e->v.spacefd = -1;
		unlink(tmpspace);
	}
	n->eps[v] = e;
	*out = e;
	return 0;
fail:
	unlink(tmp);
	if (e->v.bellfd >= 0) {
		close(e->v.bellfd);
		unlink(tmpbell);
	}
	if (e->v.spacefd >= 0) {
		close(e->v.spacefd);
		unlink(tmpspace);
	}
	if (e->v.b)
		munmap(e->v.b, size);
	close(fd);
	free(e);
	return err;
}

void shmfab_close(shmfab_ep *e)
{
	if (!e)
		return;
	shmfab_node *n = e->n;
	uint8_t *b = e->v.b;
	st32(w32(b, SHMFAB_V_OFF_STATE), SHMFAB_VPID_CLOSED);
	add32(w32(b, SHMFAB_V_OFF_SPACE), 1);
	futex_wake(w32(b, SHMFAB_V_OFF_SPACE));
	if (e->v.spacefd >= 0)
		ring_fifo(e->v.spacefd); /* senders parked on the space bell see the state */
	for (uint32_t i = 0; i < SHMFAB_LEASE_REGIONS; i++)
		if (n->regs[i].used && n->regs[i].owner == e->vpid)
			drop_region(n, i);
	unlink(e->path);
	if (e->v.bell)
		unlink(e->v.bellpath);
	if (e->v.bellfd >= 0)
		close(e->v.bellfd);
	if (e->v.spacefd >= 0) {
		char space[PATHLEN + 16];
		snprintf(space, sizeof space, "%s.space", e->path);
		unlink(space);
		close(e->v.spacefd);
	}
	munmap(b, e->v.size);
	close(e->fd);
	n->eps[e->vpid] = NULL;
	free(e);
}

unsigned shmfab_ep_vpid(const shmfab_ep *e) { return e->vpid; }
int shmfab_bell_fd(const shmfab_ep *e) { return e->v.bell ? e->v.bellfd : -1; }

int shmfab_send(shmfab_ep *e, uint16_t node, unsigned vpid, uint8_t tag, const void *p, size_t len, int timeout_ms)
{
	shmfab_node *n = e->n;
	if (len > SHMFAB_MAX_PAYLOAD || vpid > 255 || (len && !p)) {
		n->st.invalid++;
		return -EINVAL;
	}
	struct peer *pr;
	struct vmap *v;
	int err = get_peer(n, node, &pr);
	if (!err)
		err = get_vmap(n, pr, vpid, &v);
	if (err) {
		if (err == -EHOSTDOWN)
			n->st.peer_down++;
		return err;
	}
	uint64_t desc = (uint64_t)n->node | (uint64_t)e->vpid << 16 | (uint64_t)tag << 24 | (uint64_t)len << 32;
	if (push(v, desc, n->node, p, len))
		goto sent;
	n->st.send_blocked++;
	ring_doorbell(n, v); /* the consumer may be asleep with a full ring */
	for (int64_t t0 = now_ns(); now_ns() - t0 < SHMFAB_SPIN_NS;) {
		if (push(v, desc, n->node, p, len))
			goto sent;
	}
	int64_t deadline = timeout_ms < 0 ? INT64_MAX : now_ns() + (int64_t)timeout_ms * 1000000;
	uint32_t *space = w32(v->b, SHMFAB_V_OFF_SPACE), *spacew = w32(v->b, SHMFAB_V_OFF_SPACEW);
	for (;;) {
		if (!peer_up(n, pr, 1)) {
			n->st.peer_down++;
			return -EHOSTDOWN;
		}
		if (ld32(w32(v->b, SHMFAB_V_OFF_STATE)) != SHMFAB_VPID_OPEN)
			return -ENOENT;
		int64_t left = deadline - now_ns();
		if (left <= 0)
			return -ETIMEDOUT;
		add32(spacew, 1);
		uint32_t s = ld32(space);
		if (push(v, desc, n->node, p, len)) {
			add32(spacew, (uint32_t)-1);
			goto sent;
		}
		ring_doorbell(n, v);
		futex_wait(space, s, left < SHMFAB_SEND_SLICE_NS ? left : SHMFAB_SEND_SLICE_NS);
		add32(spacew, (uint32_t)-1);
		if (push(v, desc, n->node, p, len))
			goto sent;
	}
sent:
	ring_doorbell(n, v);
	n->st.velo_sent++;
	return 0;
}

int shmfab_recv(shmfab_ep *e, struct shmfab_msg *msgs, int max)
{
	shmfab_node *n = e->n;
	struct vmap *v = &e->v;
	uint64_t *tail = w64(v->b, SHMFAB_V_OFF_TAIL);
	uint64_t head = e->rc.head;
	int got = 0, freed = 0;
	while (got < max) {
		uint64_t *st = slot_word(v, head);
		uint64_t s = ld64(st);
		uint64_t seq = s >> SHMFAB_SEQ_SHIFT, low = s & SHMFAB_LOW_MASK;
		if (seq == seq23(head + 1)) { /* published */
			uint64_t d = low & SHMFAB_DESC_MASK;
			uint8_t len = (uint8_t)(d >> 32 & 0x7F);
			if ((low & (1ull << 39)) || len > SHMFAB_MAX_PAYLOAD) {
				n->st.corrupt++;
			} else {
				struct shmfab_msg *m = &msgs[got++];
				m->node = (uint16_t)d;
				m->vpid = (uint8_t)(d >> 16);
				m->tag = (uint8_t)(d >> 24);
				m->len = len;
				m->mc = (low & SHMFAB_MC_FLAG) != 0;
				memcpy(m->data, slot_data(v, head), len);
			}
		} else if (seq == seq23(head) && (low == 0 || low >> 16 == SHMFAB_CLAIM_MARK >> 16)) {
			/* free or claimed: empty, or a producer still filling it */
			if (ld64(tail) <= head)
				break;
			if (!orphaned(n, &e->rc, head, low != 0, (uint16_t)low))
				break;
			n->st.corrupt++; /* its producer never published it */
		} else { /* no legal state for head */
			n->st.corrupt++;
			if (ld64(tail) <= head) {
				cas64(st, s, seq23(head) << SHMFAB_SEQ_SHIFT); /* unclaimed: repair */
				break;
			}
		}
		st64(st, seq23(head + v->slots) << SHMFAB_SEQ_SHIFT);
		head++;
		freed++;
	}
	if (freed) {
		e->rc.head = head;
		wake_senders(v);
	}
	n->st.velo_recv += (uint64_t)got;
	return got;
}

int shmfab_poll(shmfab_ep *e, struct shmfab_note *ns, int max)
{
	shmfab_node *n = e->n;
	struct vmap *v = &e->v;
	uint64_t *ntail = w64(v->b, SHMFAB_V_OFF_NTAIL);
	uint64_t head = e->nc.head;
	int got = 0;
	while (got < max) {
		uint8_t *en = nentry(v, head);
		uint64_t *st = w64(en, 0), *cl = w64(en, 24);
		uint64_t s = ld64(st), c = ld64(cl);
		if (s == head + 1) {
			uint8_t body[16];
			memcpy(body, en + 8, 16);
			if (shmfab_decode_note(body, &ns[got]) == 0)
				got++;
			else
				n->st.corrupt++;
		} else if (s == head && c <= (1u << 16)) {
			if (ld64(ntail) <= head)
				break;
			if (!orphaned(n, &e->nc, head, c != 0, (uint16_t)(c - 1)))
				break;
			n->st.corrupt++;
		} else {
			n->st.corrupt++;
			if (ld64(ntail) <= head) {
				st64(cl, 0);
				cas64(st, s, head);
				break;
			}
		}
		st64(cl, 0);
		st64(st, head + v->depth);
		head++;
	}
	e->nc.head = head;
	n->st.notes_recv += (uint64_t)got;
	return got;
}

int shmfab_ready(shmfab_ep *e)
{
	struct vmap *v = &e->v;
	uint64_t h = e->rc.head, nh = e->nc.head;
	return ld64(slot_word(v, h)) >> SHMFAB_SEQ_SHIFT == seq23(h + 1) || ld64(w64(v->b, SHMFAB_V_OFF_TAIL)) > h ||
	       ld64(w64(nentry(v, nh), 0)) == nh + 1 || ld64(w64(v->b, SHMFAB_V_OFF_NTAIL)) > nh;
}

static void drain_bell(int fd)
{
	uint8_t buf[64];
	while (read(fd, buf, sizeof buf) == (ssize_t)sizeof buf)
		;
}

int shmfab_wait(shmfab_ep *e, int timeout_ms)
{
	shmfab_node *n = e->n;
	struct vmap *v = &e->v;
	int64_t start = now_ns();
	for (int i = 1;; i++) {
		if (shmfab_ready(e))
			return 0;
		if (i % 64 == 0) {
			int64_t spun = now_ns() - start;
			if (spun > SHMFAB_SPIN_NS || (timeout_ms >= 0 && spun >= (int64_t)timeout_ms * 1000000))
				break;
		}
	}
	int64_t deadline = timeout_ms < 0 ? INT64_MAX : start + (int64_t)timeout_ms * 1000000;
	for (;;) {
		int64_t left = deadline - now_ns();
		if (left <= 0)
			return shmfab_ready(e) ? 0 : -ETIMEDOUT;
		if (v->bell) {
			/* Clear rung before announcing sleep: a producer that then
			 * sees bellW also sees rung clear and writes a byte. */
			st32(w32(v->b, SHMFAB_V_OFF_RUNG), 0);
			add32(w32(v->b, SHMFAB_V_OFF_BELLW), 1);
			if (shmfab_ready(e)) {
				add32(w32(v->b, SHMFAB_V_OFF_BELLW), (uint32_t)-1);
				return 0;
			}
			n->st.bell_sleeps++;
			struct pollfd pfd = {.fd = v->bellfd, .events = POLLIN};
			struct timespec ts = {.tv_sec = left / 1000000000ll, .tv_nsec = left % 1000000000ll};
			if (ppoll(&pfd, 1, timeout_ms < 0 ? NULL : &ts, NULL) > 0)
				drain_bell(v->bellfd);
			add32(w32(v->b, SHMFAB_V_OFF_BELLW), (uint32_t)-1);
		} else {
			uint32_t *db = w32(v->b, SHMFAB_V_OFF_DOORBELL);
			add32(w32(v->b, SHMFAB_V_OFF_SLEEPERS), 1);
			uint32_t s = ld32(db);
			if (shmfab_ready(e)) {
				add32(w32(v->b, SHMFAB_V_OFF_SLEEPERS), (uint32_t)-1);
				return 0;
			}
			n->st.futex_sleeps++;
			futex_wait(db, s, timeout_ms < 0 ? -1 : left);
			add32(w32(v->b, SHMFAB_V_OFF_SLEEPERS), (uint32_t)-1);
		}
		if (shmfab_ready(e))
			return 0;
	}
}

/* ---- regions and RMA ------------------------------------------------------------------ */

static inline uint64_t *entry_w0(uint8_t *nb, uint32_t idx)
{
	return w64(nb, SHMFAB_N_OFF_REGIONS + (size_t)(idx - 1) * SHMFAB_REGION_ENTRY);
}

int shmfab_register(shmfab_ep *e, size_t size, uint64_t *nla, void **buf)
{
	shmfab_node *n = e->n;
	if (size == 0 || size > SHMFAB_MAX_REGION_BYTES) {
		n->st.invalid++;
		return -EINVAL;
	}
	uint32_t i = 0;
	while (i < SHMFAB_LEASE_REGIONS && n->regs[i].used)
		i++;
	if (i == SHMFAB_LEASE_REGIONS)
		return -ENOSPC;
	struct lregion *r = &n->regs[i];
	uint32_t idx = n->reglo + i, gen = n->gens[i] + 1;
	char path[PATHLEN];
	region_path(n, path, n->node, n->inc, idx, gen);
	memcpy(r->path, path, PATHLEN);
	int fd = create_file(r->path, size);
	if (fd < 0)
		return fd;
	r->b = map_fd(fd, size);
	int err = -errno;
	close(fd);
	if (!r->b) {
		unlink(r->path);
		return err;
	}
	n->gens[i] = gen;
	r->used = 1;
	r->gen = gen;
	r->owner = e->vpid;
	r->size = size;
	uint64_t *w0 = entry_w0(n->nb, idx);
	st64(w0 + 1, size); /* the size before word 0 publishes the entry */
	st64(w0, (uint64_t)gen << 32 | SHMFAB_REGION_VALID | e->vpid);
	*nla = (uint64_t)idx << SHMFAB_NLA_OFFSET_BITS;
	*buf = r->b;
	return 0;
}

int shmfab_deregister(shmfab_ep *e, uint64_t nla)
{
	shmfab_node *n = e->n;
	uint32_t idx = (uint32_t)(nla >> SHMFAB_NLA_OFFSET_BITS);
	uint32_t i = idx - n->reglo;
	if (idx < n->reglo || i >= SHMFAB_LEASE_REGIONS || !n->regs[i].used || n->regs[i].owner != e->vpid ||
	    (nla & ((1ull << SHMFAB_NLA_OFFSET_BITS) - 1))) {
		n->st.invalid++;
		return -EINVAL;
	}
	drop_region(n, i);
	return 0;
}

uint64_t shmfab_last_frame(uint64_t start, uint32_t len)
{
	if (len == 0)
		return start;
	uint32_t rest = len % SHMFAB_RMA_MTU;
	return rest == 0 ? start + len - SHMFAB_RMA_MTU : start + len - rest;
}

static int check_range(uint64_t a, uint64_t len, uint64_t size)
{
	uint64_t off = a & ((1ull << SHMFAB_NLA_OFFSET_BITS) - 1);
	return off <= size && len <= size - off;
}

/* remote_buf resolves [a, a+len) in a region registered to VPID owner on
 * p: the table entry read as a seqlock is the only size trusted; the
 * region file of exactly that generation is mapped (cached) and must be
 * at least that large. Returns a NERR code. */
static int remote_buf(shmfab_node *n, struct peer *p, uint8_t owner, uint64_t a, uint32_t len, uint8_t **out)
{
	uint32_t idx = (uint32_t)(a >> SHMFAB_NLA_OFFSET_BITS);
	if (idx == 0 || idx > SHMFAB_MAX_TABLE_REGIONS)
		return SHMFAB_NERR_ACCESS;
	if (!p->self && !peer_up(n, p, 0))
		return SHMFAB_NERR_PEERDOWN;
	uint64_t *w0p = entry_w0(p->b, idx);
	uint64_t w0 = 0, size = 0;
	int try;
	for (try = 0; try < CLAIM_RETRIES; try++) {
		w0 = ld64(w0p);
		size = ld64(w0p + 1);
		if (ld64(w0p) == w0)
			break;
	}
	if (try == CLAIM_RETRIES)
		return SHMFAB_NERR_ACCESS;
	if (!(w0 & SHMFAB_REGION_VALID))
		return SHMFAB_NERR_ACCESS;
	if ((w0 & SHMFAB_REGION_RESERVED) || size == 0 || size > SHMFAB_MAX_REGION_BYTES) {
		n->st.corrupt++;
		return SHMFAB_NERR_ACCESS;
	}
	uint32_t gen = (uint32_t)(w0 >> 32);
	if ((uint8_t)w0 != owner)
		return SHMFAB_NERR_ACCESS;
	if (!check_range(a, len, size))
		return SHMFAB_NERR_BOUNDS;
	struct rregion *rr = NULL;
	for (int i = 0; i < RR_CACHE; i++) {
		struct rregion *c = &p->rr[i];
		if (c->b && c->idx == idx) {
			if (c->gen == gen && c->size == size) {
				rr = c;
			} else { /* a stale generation: never used again */
				munmap(c->b, c->size);
				c->b = NULL;
			}
		}
	}
	if (!rr) {
		char path[PATHLEN];
		region_path(n, path, p->id, p->inc, idx, gen);
		int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
		if (fd < 0)
			return SHMFAB_NERR_ACCESS;
		if (file_size(fd) < (int64_t)size) {
			close(fd);
			n->st.corrupt++;
			return SHMFAB_NERR_ACCESS;
		}
		uint8_t *b = map_fd(fd, size);
		close(fd);
		if (!b)
			return SHMFAB_NERR_ACCESS;
		rr = &p->rr[p->rrnext];
		p->rrnext = (p->rrnext + 1) % RR_CACHE;
		if (rr->b)
			munmap(rr->b, rr->size);
		*rr = (struct rregion){.idx = idx, .gen = gen, .size = size, .b = b};
	}
	/* A Deregister between the read and the mapping must not let this
	 * request through. */
	if (ld64(w0p) != w0)
		return SHMFAB_NERR_ACCESS;
	*out = rr->b + (a & ((1ull << SHMFAB_NLA_OFFSET_BITS) - 1));
	return SHMFAB_NERR_NONE;
}

int shmfab_post(shmfab_ep *e, const struct shmfab_rma *r)
{
	shmfab_node *n = e->n;
	uint32_t lidx = (uint32_t)(r->local >> SHMFAB_NLA_OFFSET_BITS), li = lidx - n->reglo;
	if ((r->op != SHMFAB_OP_PUT && r->op != SHMFAB_OP_GET) || r->len == 0 || r->len > SHMFAB_MAX_RMA_LEN ||
	    (r->notify & ~7) || (r->op == SHMFAB_OP_PUT && (r->notify & SHMFAB_NOTIFY_RESPONDER)) || lidx < n->reglo ||
	    li >= SHMFAB_LEASE_REGIONS || !n->regs[li].used || n->regs[li].owner != e->vpid ||
	    !check_range(r->local, r->len, n->regs[li].size)) {
		n->st.invalid++;
		return -EINVAL;
	}
	uint8_t *lbuf = n->regs[li].b + (r->local & ((1ull << SHMFAB_NLA_OFFSET_BITS) - 1));
	n->st.rma_posted++;
	struct shmfab_note nt = {.kind = SHMFAB_KIND_REQUESTER, .op = r->op, .node = r->node, .vpid = r->vpid,
	                         .len = r->len, .local = r->local};
	struct peer *p;
	uint8_t *rbuf = NULL;
	int ne = get_peer(n, r->node, &p) ? SHMFAB_NERR_PEERDOWN : remote_buf(n, p, r->vpid, r->remote, r->len, &rbuf);
	if (ne != SHMFAB_NERR_NONE) {
		nt.err = (uint8_t)ne;
		n->st.rma_faults++;
		push_note(&e->v, &nt, n->node);
		ring_doorbell(n, &e->v);
		return 0;
	}
	if (r->op == SHMFAB_OP_PUT)
		memmove(rbuf, lbuf, r->len);
	else
		memmove(lbuf, rbuf, r->len);
	n->st.rma_bytes += r->len;
	uint64_t local_last = shmfab_last_frame(r->local, r->len), remote_last = shmfab_last_frame(r->remote, r->len);
	uint8_t peer_kind = 0;
	if (r->op == SHMFAB_OP_PUT && (r->notify & SHMFAB_NOTIFY_COMPLETER))
		peer_kind = SHMFAB_KIND_COMPLETER;
	else if (r->op == SHMFAB_OP_GET && (r->notify & SHMFAB_NOTIFY_RESPONDER))
		peer_kind = SHMFAB_KIND_RESPONDER;
	struct vmap *pv;
	if (peer_kind && get_vmap(n, p, r->vpid, &pv) == 0) {
		struct shmfab_note pn = {.kind = peer_kind, .op = r->op, .node = n->node, .vpid = e->vpid,
		                         .len = r->len, .local = remote_last};
		push_note(pv, &pn, n->node);
		ring_doorbell(n, pv);
	}
	int own = 0;
	nt.local = local_last;
	if (r->notify & SHMFAB_NOTIFY_REQUESTER) {
		push_note(&e->v, &nt, n->node);
		own = 1;
	}
	if (r->op == SHMFAB_OP_GET && (r->notify & SHMFAB_NOTIFY_COMPLETER)) {
		nt.kind = SHMFAB_KIND_COMPLETER;
		push_note(&e->v, &nt, n->node);
		own = 1;
	}
	if (own)
		ring_doorbell(n, &e->v);
	return 0;
}

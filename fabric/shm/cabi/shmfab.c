/*
 * shmfab.c: the shared layer of the shm fabric's C client (API in
 * shmfab.h; the layout and protocols in docs/shm-abi.md; the Go
 * implementation it must agree with is fabric/shm: layout.go, ring.go,
 * rma.go, attach.go, endpoint.go, wait.go). This unit owns the system
 * helpers (clock, futex, flock, files), the file names, the VPID header
 * check, the peer table (discovery, liveness, cached VPID mappings) and
 * the ring protocol (push, notifications, doorbells, orphaned
 * positions), shared with shmfab_attach.c (attach, detach) and
 * shmfab_ep.c (endpoints, their data path, regions and RMA) through
 * shmfab_internal.h.
 *
 * Memory ordering: every shared word is accessed with __atomic builtins,
 * sequentially consistent, matching Go's sync/atomic; payloads are plain
 * copies ordered by the publishing store (release) and the consuming
 * load (acquire). The doorbell is the Dekker pair documented in
 * docs/shm-abi.md.
 */
#define _GNU_SOURCE
#include "shmfab_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ---- system helpers ---------------------------------------------------- */

int64_t sfab_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* Shared (not private) futex operations: the words live in files mapped
 * by several processes. */
void sfab_futex_wait(uint32_t *addr, uint32_t val, int64_t ns)
{
	struct timespec ts = {.tv_sec = ns / 1000000000ll, .tv_nsec = ns % 1000000000ll};
	syscall(SYS_futex, addr, FUTEX_WAIT, val, ns >= 0 ? &ts : NULL, NULL, 0);
}
int sfab_futex_wake(uint32_t *addr) { return (int)syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

/* sfab_try_lock takes flock(how|LOCK_NB): 1 taken, 0 held elsewhere,
 * -errno. */
int sfab_try_lock(int fd, int how)
{
	for (;;) {
		if (flock(fd, how | LOCK_NB) == 0)
			return 1;
		if (errno == EINTR)
			continue;
		return errno == EWOULDBLOCK ? 0 : -errno;
	}
}

int sfab_create_file(const char *path, size_t size)
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

void *sfab_map_fd(int fd, size_t size)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	return p == MAP_FAILED ? NULL : p;
}

int64_t sfab_file_size(int fd)
{
	struct stat st;
	return fstat(fd, &st) == 0 ? (int64_t)st.st_size : -1;
}

/* ---- names --------------------------------------------------------------- */

void sfab_inc_prefix(const shmfab_node *n, char *out, size_t len, uint16_t id, uint64_t inc, const char *rest)
{
	snprintf(out, len, "%s/exn-%s-n%u.%016llx-%s", n->dir, n->fab, id, (unsigned long long)inc, rest);
}
void sfab_vpid_path(const shmfab_node *n, char *out, uint16_t id, uint64_t inc, unsigned v)
{
	char r[16];
	snprintf(r, sizeof r, "v%u", v);
	sfab_inc_prefix(n, out, PATHLEN, id, inc, r);
}
void sfab_region_path(const shmfab_node *n, char *out, uint16_t id, uint64_t inc, uint32_t idx, uint32_t gen)
{
	char r[32];
	snprintf(r, sizeof r, "r%u.%u", idx, gen);
	sfab_inc_prefix(n, out, PATHLEN, id, inc, r);
}
void sfab_node_path(const shmfab_node *n, char *out, uint16_t id)
{
	snprintf(out, PATHLEN, "%s/exn-%s-n%u", n->dir, n->fab, id);
}

/* ---- VPID header -------------------------------------------------------------- */


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

void sfab_peer_drop(struct peer *p)
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

/* sfab_probe_dead: 1 if the node file's lock can be taken (its owner is dead;
 * the lock is dropped at once: a restarting node or a reclaiming peer
 * needs it), 0 otherwise. */
int sfab_probe_dead(int fd)
{
	if (sfab_try_lock(fd, LOCK_EX) == 1) {
		flock(fd, LOCK_UN);
		return 1;
	}
	return 0;
}

/* sfab_peer_up: the peer's lock is held and its state says alive; marks it
 * down otherwise. */
int sfab_peer_up(shmfab_node *n, struct peer *p, int probe)
{
	if (p->self)
		return shmfab_owner_alive(n) == 0;
	if (p->down)
		return 0;
	if (ld32(w32(p->b, SHMFAB_N_OFF_STATE)) != SHMFAB_NODE_ALIVE || (probe && sfab_probe_dead(p->fd))) {
		p->down = 1;
		return 0;
	}
	return 1;
}

int sfab_decode_node_header(const uint8_t *b, uint16_t want, uint64_t *inc, uint32_t *state, uint32_t *pid)
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

/* sfab_get_peer returns node id's peer if it is up, discovering it (opening
 * and validating its node file) if need be. */
int sfab_get_peer(shmfab_node *n, uint16_t id, struct peer **out)
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
		if (sfab_peer_up(n, p, 0)) {
			*out = p;
			return 0;
		}
		sfab_peer_drop(p);
		p->used = 0;
		gone = 1;
		if (!free_slot)
			free_slot = p;
	}
	char path[PATHLEN];
	sfab_node_path(n, path, id);
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? (gone ? -EHOSTDOWN : -ENOENT) : -errno;
	if (sfab_probe_dead(fd)) {
		close(fd);
		return -EHOSTDOWN;
	}
	if (sfab_file_size(fd) < (int64_t)SHMFAB_NODE_FILE_SIZE) {
		close(fd);
		n->st.corrupt++;
		return -EINVAL;
	}
	uint8_t *b = sfab_map_fd(fd, SHMFAB_NODE_FILE_SIZE);
	if (!b) {
		int e = -errno;
		close(fd);
		return e;
	}
	uint64_t inc;
	uint32_t state;
	int err = sfab_decode_node_header(b, id, &inc, &state, NULL);
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

/* sfab_get_vmap returns p's cached mapping of VPID v's file, opening and
 * validating it if it is not cached or was closed. */
int sfab_get_vmap(shmfab_node *n, struct peer *p, unsigned v, struct vmap **out)
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
	sfab_vpid_path(n, path, p->id, p->inc, v);
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return sfab_peer_up(n, p, 1) ? -ENOENT : -EHOSTDOWN;
		return -errno;
	}
	int64_t size = sfab_file_size(fd);
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
	c->b = sfab_map_fd(fd, c->size);
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

/* sfab_push tries once to put a message into v's mailbox; 0 if it is full. */
int sfab_push(struct vmap *v, uint64_t desc, uint16_t src, const void *p, size_t len)
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

/* sfab_ring_fifo writes one byte to a bell FIFO: 0, also when it is full (a
 * ring is pending), or -1. */
int sfab_ring_fifo(int fd)
{
	uint8_t one = 1;
	ssize_t r;
	do
		r = write(fd, &one, 1);
	while (r < 0 && errno == EINTR);
	return r == 1 || (r < 0 && errno == EAGAIN) ? 0 : -1;
}

/* sfab_ring_doorbell wakes v's consumer if it announced sleep (see
 * docs/shm-abi.md "Wake-up protocol"). */
void sfab_ring_doorbell(shmfab_node *n, struct vmap *v)
{
	if (ld32(w32(v->b, SHMFAB_V_OFF_SLEEPERS)) != 0) {
		add32(w32(v->b, SHMFAB_V_OFF_DOORBELL), 1);
		sfab_futex_wake(w32(v->b, SHMFAB_V_OFF_DOORBELL));
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
	if (v->bellfd >= 0 && sfab_ring_fifo(v->bellfd) == 0) {
		n->st.bell_rings++;
		return;
	}
	n->st.ring_failed++;
	st32(rung, 0); /* let another producer try */
}

/* After freeing slots: wake senders on the space futex (C senders, Go
 * senders without a space bell) and, the first time since a parked sender
 * cleared spaceRung, those parked on the space bell (docs/shm-abi.md). */
void sfab_wake_senders(struct vmap *v)
{
	if (ld32(w32(v->b, SHMFAB_V_OFF_SPACEW)) == 0)
		return;
	add32(w32(v->b, SHMFAB_V_OFF_SPACE), 1);
	sfab_futex_wake(w32(v->b, SHMFAB_V_OFF_SPACE));
	uint32_t *rung = w32(v->b, SHMFAB_V_OFF_SPACERUNG);
	if (v->spacefd < 0 || ld32(rung) != 0 || xchg32(rung, 1) != 0)
		return;
	if (sfab_ring_fifo(v->spacefd) < 0)
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

/* sfab_push_note appends one notification; a full queue counts the
 * overflow in the queue's header and drops it (the RMA unit never
 * blocks). */
int sfab_push_note(struct vmap *v, const struct shmfab_note *nt, uint16_t src)
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

/* sfab_orphaned: skip the claimed, unpublished position pos? At once if the
 * claimer (known) is probed dead, else after SHMFAB_ORPHAN_NS. */
int sfab_orphaned(shmfab_node *n, struct consumer *c, uint64_t pos, int known, uint16_t claimer)
{
	if (known && claimer != n->node) {
		for (int i = 0; i < MAX_PEERS; i++) {
			struct peer *p = &n->peers[i];
			if (p->used && p->id == claimer && !sfab_peer_up(n, p, 1))
				return 1;
		}
	}
	int64_t now = sfab_now_ns();
	if (c->stuck_pos != pos || c->stuck_since == 0) {
		c->stuck_pos = pos;
		c->stuck_since = now;
		return 0;
	}
	return now - c->stuck_since >= SHMFAB_ORPHAN_NS;
}

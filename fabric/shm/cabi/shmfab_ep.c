/*
 * shmfab_ep.c: endpoints on an attached node (docs/shm-abi.md). This unit
 * owns shmfab_open and shmfab_close, the data path (shmfab_send,
 * shmfab_recv, shmfab_poll, shmfab_ready, shmfab_wait), and regions and
 * RMA (shmfab_register, shmfab_deregister, shmfab_post, and the lease
 * region release detach shares). Peers and the ring protocol come from
 * shmfab.c (shmfab_internal.h).
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
 */
#define _GNU_SOURCE
#include "shmfab_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_DEPTH 4096u

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
	sfab_vpid_path(n, e->path, n->node, n->inc, v);
	char tmp[PATHLEN + 16], tmpbell[PATHLEN + 16], tmpspace[PATHLEN + 16], space[PATHLEN + 16];
	snprintf(tmp, sizeof tmp, "%s.tmp", e->path);
	snprintf(tmpbell, sizeof tmpbell, "%s.tmp.bell", e->path);
	snprintf(tmpspace, sizeof tmpspace, "%s.tmp.space", e->path);
	snprintf(space, sizeof space, "%s.space", e->path);
	snprintf(e->v.bellpath, sizeof e->v.bellpath, "%s.bell", e->path);
	size_t size = vpid_file_size(slots, DEFAULT_DEPTH);
	int err = 0, fd = sfab_create_file(tmp, size);
	if (fd < 0) {
		free(e);
		return fd == -EEXIST ? -EADDRINUSE : fd;
	}
	if (sfab_try_lock(fd, LOCK_EX) != 1 || !(e->v.b = sfab_map_fd(fd, size))) {
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
	sfab_futex_wake(w32(b, SHMFAB_V_OFF_SPACE));
	if (e->v.spacefd >= 0)
		sfab_ring_fifo(e->v.spacefd); /* senders parked on the space bell see the state */
	for (uint32_t i = 0; i < SHMFAB_LEASE_REGIONS; i++)
		if (n->regs[i].used && n->regs[i].owner == e->vpid)
			sfab_drop_region(n, i);
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
	int err = sfab_get_peer(n, node, &pr);
	if (!err)
		err = sfab_get_vmap(n, pr, vpid, &v);
	if (err) {
		if (err == -EHOSTDOWN)
			n->st.peer_down++;
		return err;
	}
	uint64_t desc = (uint64_t)n->node | (uint64_t)e->vpid << 16 | (uint64_t)tag << 24 | (uint64_t)len << 32;
	if (sfab_push(v, desc, n->node, p, len))
		goto sent;
	n->st.send_blocked++;
	sfab_ring_doorbell(n, v); /* the consumer may be asleep with a full ring */
	for (int64_t t0 = sfab_now_ns(); sfab_now_ns() - t0 < SHMFAB_SPIN_NS;) {
		if (sfab_push(v, desc, n->node, p, len))
			goto sent;
	}
	int64_t deadline = timeout_ms < 0 ? INT64_MAX : sfab_now_ns() + (int64_t)timeout_ms * 1000000;
	uint32_t *space = w32(v->b, SHMFAB_V_OFF_SPACE), *spacew = w32(v->b, SHMFAB_V_OFF_SPACEW);
	for (;;) {
		if (!sfab_peer_up(n, pr, 1)) {
			n->st.peer_down++;
			return -EHOSTDOWN;
		}
		if (ld32(w32(v->b, SHMFAB_V_OFF_STATE)) != SHMFAB_VPID_OPEN)
			return -ENOENT;
		int64_t left = deadline - sfab_now_ns();
		if (left <= 0)
			return -ETIMEDOUT;
		add32(spacew, 1);
		uint32_t s = ld32(space);
		if (sfab_push(v, desc, n->node, p, len)) {
			add32(spacew, (uint32_t)-1);
			goto sent;
		}
		sfab_ring_doorbell(n, v);
		sfab_futex_wait(space, s, left < SHMFAB_SEND_SLICE_NS ? left : SHMFAB_SEND_SLICE_NS);
		add32(spacew, (uint32_t)-1);
		if (sfab_push(v, desc, n->node, p, len))
			goto sent;
	}
sent:
	sfab_ring_doorbell(n, v);
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
			if (!sfab_orphaned(n, &e->rc, head, low != 0, (uint16_t)low))
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
		sfab_wake_senders(v);
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
			if (!sfab_orphaned(n, &e->nc, head, c != 0, (uint16_t)(c - 1)))
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
	int64_t start = sfab_now_ns();
	for (int i = 1;; i++) {
		if (shmfab_ready(e))
			return 0;
		if (i % 64 == 0) {
			int64_t spun = sfab_now_ns() - start;
			if (spun > SHMFAB_SPIN_NS || (timeout_ms >= 0 && spun >= (int64_t)timeout_ms * 1000000))
				break;
		}
	}
	int64_t deadline = timeout_ms < 0 ? INT64_MAX : start + (int64_t)timeout_ms * 1000000;
	for (;;) {
		int64_t left = deadline - sfab_now_ns();
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
			sfab_futex_wait(db, s, timeout_ms < 0 ? -1 : left);
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

/* sfab_drop_region releases lease region i: its table entry (the
 * generation kept, not valid), its file and its mapping. */
void sfab_drop_region(shmfab_node *n, uint32_t i)
{
	struct lregion *r = &n->regs[i];
	st64(entry_w0(n->nb, n->reglo + i), (uint64_t)r->gen << 32);
	unlink(r->path);
	munmap(r->b, r->size);
	r->used = 0;
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
	sfab_region_path(n, path, n->node, n->inc, idx, gen);
	memcpy(r->path, path, PATHLEN);
	int fd = sfab_create_file(r->path, size);
	if (fd < 0)
		return fd;
	r->b = sfab_map_fd(fd, size);
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
	sfab_drop_region(n, i);
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
	if (!p->self && !sfab_peer_up(n, p, 0))
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
		sfab_region_path(n, path, p->id, p->inc, idx, gen);
		int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
		if (fd < 0)
			return SHMFAB_NERR_ACCESS;
		if (sfab_file_size(fd) < (int64_t)size) {
			close(fd);
			n->st.corrupt++;
			return SHMFAB_NERR_ACCESS;
		}
		uint8_t *b = sfab_map_fd(fd, size);
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
	int ne = sfab_get_peer(n, r->node, &p) ? SHMFAB_NERR_PEERDOWN : remote_buf(n, p, r->vpid, r->remote, r->len, &rbuf);
	if (ne != SHMFAB_NERR_NONE) {
		nt.err = (uint8_t)ne;
		n->st.rma_faults++;
		sfab_push_note(&e->v, &nt, n->node);
		sfab_ring_doorbell(n, &e->v);
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
	if (peer_kind && sfab_get_vmap(n, p, r->vpid, &pv) == 0) {
		struct shmfab_note pn = {.kind = peer_kind, .op = r->op, .node = n->node, .vpid = e->vpid,
		                         .len = r->len, .local = remote_last};
		sfab_push_note(pv, &pn, n->node);
		sfab_ring_doorbell(n, pv);
	}
	int own = 0;
	nt.local = local_last;
	if (r->notify & SHMFAB_NOTIFY_REQUESTER) {
		sfab_push_note(&e->v, &nt, n->node);
		own = 1;
	}
	if (r->op == SHMFAB_OP_GET && (r->notify & SHMFAB_NOTIFY_COMPLETER)) {
		nt.kind = SHMFAB_KIND_COMPLETER;
		sfab_push_note(&e->v, &nt, n->node);
		own = 1;
	}
	if (own)
		sfab_ring_doorbell(n, &e->v);
	return 0;
}

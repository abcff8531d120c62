/*
 * shmfab_attach.c: attaching a node to the shm fabric and detaching it
 * (docs/shm-abi.md). This unit owns the lease token and the lease view,
 * the fabric and attach file locks, shmfab_attach, shmfab_owner_alive,
 * shmfab_alive, shmfab_get_stats and shmfab_detach. Files, names and
 * peers come from shmfab.c, endpoint and region teardown from
 * shmfab_ep.c (shmfab_internal.h).
 */
#define _GNU_SOURCE
#include "shmfab_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define OPEN_RETRIES 200

static int same_file(int fd, const char *path)
{
	struct stat a, b;
	if (fstat(fd, &a) != 0 || stat(path, &b) != 0)
		return 0;
	return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
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
		int ok = sfab_try_lock(fd, LOCK_SH);
		if (ok == 1 && same_file(fd, path)) {
			if (sfab_file_size(fd) < SHMFAB_PAGE && ftruncate(fd, SHMFAB_PAGE) != 0) {
				close(fd);
				return -errno;
			}
			uint8_t *b = sfab_map_fd(fd, SHMFAB_PAGE);
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
	if (sfab_try_lock(n->fabfd, LOCK_EX) == 1 && same_file(n->fabfd, path))
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
	sfab_inc_prefix(n, n->apath, PATHLEN, n->node, n->inc, r);
	snprintf(tmp, sizeof tmp, "%s.tmp%d", n->apath, (int)getpid());
	for (int try = 0; try < OPEN_RETRIES; try++) {
		int fd = sfab_create_file(tmp, 8);
		if (fd < 0)
			return fd;
		if (sfab_try_lock(fd, LOCK_EX) != 1) {
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
		if (sfab_try_lock(old, LOCK_EX) != 1) {
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
	sfab_node_path(n, path, node);
	n->nodefd = open(path, O_RDWR | O_CLOEXEC);
	if (n->nodefd < 0) {
		err = errno == ENOENT ? -EHOSTDOWN : -errno;
		goto fail;
	}
	if (sfab_probe_dead(n->nodefd)) {
		err = -EHOSTDOWN;
		goto fail;
	}
	if (sfab_file_size(n->nodefd) < (int64_t)SHMFAB_NODE_FILE_SIZE) {
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
	n->nb = sfab_map_fd(n->nodefd, SHMFAB_NODE_FILE_SIZE);
	if (!n->nb) {
		err = -errno;
		goto fail;
	}
	uint64_t inc;
	uint32_t state;
	if ((err = sfab_decode_node_header(n->nb, node, &inc, &state, NULL)))
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
	if (!n->nb || sfab_probe_dead(n->nodefd) || ld32(w32(n->nb, SHMFAB_N_OFF_STATE)) != SHMFAB_NODE_ALIVE || !lease_ours(n))
		return -EHOSTDOWN;
	return 0;
}

int shmfab_alive(shmfab_node *n, uint16_t id)
{
	struct peer *p;
	int err = sfab_get_peer(n, id, &p);
	if (err)
		return err;
	return sfab_peer_up(n, p, 1) ? 0 : -EHOSTDOWN;
}

void shmfab_get_stats(shmfab_node *n, struct shmfab_stats *s) { *s = n->st; }

void shmfab_detach(shmfab_node *n)
{
	if (!n)
		return;
	for (int v = 0; v < 256; v++)
		if (n->eps[v])
			shmfab_close(n->eps[v]);
	for (uint32_t i = 0; i < SHMFAB_LEASE_REGIONS; i++)
		if (n->regs[i].used)
			sfab_drop_region(n, i);
	for (int i = 0; i < MAX_PEERS; i++)
		if (n->peers[i].used)
			sfab_peer_drop(&n->peers[i]);
	if (n->self.used)
		sfab_peer_drop(&n->self);
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

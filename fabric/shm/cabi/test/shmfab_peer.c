/*
 * shmfab_peer: the C endpoint of fabric/shm/cabi_test.go. It runs one
 * command per stdin line against the C client in fabric/shm/cabi/
 * (shmfab.c, shmfab_attach.c, shmfab_ep.c) and answers one line on
 * stdout ("ok ...", "err <negative errno>", or a result line). Besides
 * the library's API it writes forged words into a peer's VPID file the
 * way a buggy or hostile process could, using only the ABI constants of
 * shmfab.h (docs/shm-abi.md), so the Go side's validation is tested by
 * a second implementation of the layout.
 *
 * Commands (numbers decimal, payloads hex, "-" for none):
 *   attach DIR FAB NODE BASE COUNT TOKEN | open V SLOTS | close V
 *   send V NODE DV TAG HEX TIMEOUT_MS     | recv V TIMEOUT_MS
 *   echo V N TIMEOUT_MS                   | ping V NODE DV N
 *   flood V NODE DV TAG N TIMEOUT_MS      | reg V SIZE
 *   fill NLA LEN SEED | dump NLA LEN      | post V OP NODE DV LOCAL REMOTE LEN NOTIFY
 *   poll V TIMEOUT_MS | stats | owner | alive NODE
 *   forge NODE V KIND (len, mcbit, bad, orphan, note)
 *   detach | exit
 */
#define _GNU_SOURCE
#include "../shmfab.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static shmfab_node *node;
static shmfab_ep *eps[256];
static char gdir[256], gfab[80];
static unsigned gnode;

static void reply(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#include <stdarg.h>
static void reply(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

static int unhex(const char *s, uint8_t *out, size_t max)
{
	if (!strcmp(s, "-"))
		return 0;
	size_t l = strlen(s);
	if (l % 2 || l / 2 > max)
		return -1;
	for (size_t i = 0; i < l / 2; i++) {
		unsigned v;
		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			return -1;
		out[i] = (uint8_t)v;
	}
	return (int)(l / 2);
}

static void hex(char *out, const uint8_t *b, size_t n)
{
	if (n == 0) {
		strcpy(out, "-");
		return;
	}
	for (size_t i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", b[i]);
}

static shmfab_ep *ep(unsigned v) { return v < 256 ? eps[v] : NULL; }

static int64_t mono(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static int recv_one(shmfab_ep *e, struct shmfab_msg *m, int timeout_ms)
{
	for (;;) {
		if (shmfab_recv(e, m, 1) == 1)
			return 0;
		int err = shmfab_wait(e, timeout_ms);
		if (err)
			return err;
	}
}

static int cmp64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

/* region buffers by NLA, for fill and dump */
static struct {
	uint64_t nla;
	size_t size;
	uint8_t *b;
} regs[64];

static uint8_t *region_at(uint64_t nla, size_t len)
{
	uint64_t base = nla >> SHMFAB_NLA_OFFSET_BITS << SHMFAB_NLA_OFFSET_BITS, off = nla - base;
	for (int i = 0; i < 64; i++)
		if (regs[i].b && regs[i].nla == base && off <= regs[i].size && len <= regs[i].size - off)
			return regs[i].b + off;
	return NULL;
}

/* forge writes a bad entry into VPID v's file on node id, the way a
 * producer with a bug could: "len" a published slot of length 127,
 * "mcbit" one with descriptor bit 39 set, "bad" a claimed position whose
 * status word has no legal state, "orphan" a claimed slot never
 * published (a producer that died mid-transfer), "note" a published
 * notification with reserved bits set. */
static int forge(unsigned id, unsigned v, const char *kind)
{
	char path[700];
	snprintf(path, sizeof path, "%s/exn-%s-n%u", gdir, gfab, id);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	uint64_t inc;
	if (pread(fd, &inc, 8, SHMFAB_N_OFF_INC) != 8) {
		close(fd);
		return -EIO;
	}
	close(fd);
	snprintf(path, sizeof path, "%s/exn-%s-n%u.%016llx-v%u", gdir, gfab, id, (unsigned long long)inc, v);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	uint32_t hdr[8];
	if (pread(fd, hdr, sizeof hdr, 0) != sizeof hdr) {
		close(fd);
		return -EIO;
	}
	uint32_t slots = hdr[SHMFAB_V_OFF_SLOTS / 4], depth = hdr[SHMFAB_V_OFF_DEPTH / 4];
	size_t size = SHMFAB_V_OFF_MAILBOX + (size_t)slots * SHMFAB_SLOT_SIZE + (size_t)depth * SHMFAB_NOTIFY_ENTRY;
	struct stat st;
	if (slots < 2 || slots > 65536 || depth < 4096 || depth > 262144 || fstat(fd, &st) || (size_t)st.st_size < size) {
		close(fd);
		return -EINVAL;
	}
	uint8_t *b = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (b == MAP_FAILED)
		return -errno;
	int err = 0;
	if (!strcmp(kind, "note")) {
		uint64_t *ntail = (uint64_t *)(b + SHMFAB_V_OFF_NTAIL);
		uint64_t pos = __atomic_fetch_add(ntail, 1, __ATOMIC_SEQ_CST);
		uint8_t *e = b + SHMFAB_V_OFF_MAILBOX + (size_t)slots * SHMFAB_SLOT_SIZE + (pos & (depth - 1)) * SHMFAB_NOTIFY_ENTRY;
		uint64_t w0 = 1 | 1 << 2 | 0xABull << 56, w1 = 0;
		__atomic_store_n((uint64_t *)(e + 24), (uint64_t)gnode + 1, __ATOMIC_SEQ_CST);
		memcpy(e + 8, &w0, 8);
		memcpy(e + 16, &w1, 8);
		__atomic_store_n((uint64_t *)e, pos + 1, __ATOMIC_SEQ_CST);
	} else {
		uint64_t *tail = (uint64_t *)(b + SHMFAB_V_OFF_TAIL);
		uint64_t pos = __atomic_fetch_add(tail, 1, __ATOMIC_SEQ_CST);
		uint64_t *sw = (uint64_t *)(b + SHMFAB_V_OFF_MAILBOX + (pos & (slots - 1)) * SHMFAB_SLOT_SIZE);
		uint64_t seq = (pos & SHMFAB_SEQ_MASK) << SHMFAB_SEQ_SHIFT, pub = ((pos + 1) & SHMFAB_SEQ_MASK) << SHMFAB_SEQ_SHIFT;
		uint64_t desc = gnode | 1ull << 16 | 7ull << 24;
		if (!strcmp(kind, "len"))
			__atomic_store_n(sw, pub | desc | 127ull << 32, __ATOMIC_SEQ_CST);
		else if (!strcmp(kind, "mcbit"))
			__atomic_store_n(sw, pub | desc | 1ull << 39, __ATOMIC_SEQ_CST);
		else if (!strcmp(kind, "bad"))
			__atomic_store_n(sw, seq | 0x1234ull << 20, __ATOMIC_SEQ_CST);
		else if (!strcmp(kind, "orphan"))
			__atomic_store_n(sw, seq | SHMFAB_CLAIM_MARK | gnode, __ATOMIC_SEQ_CST);
		else
			err = -EINVAL;
	}
	munmap(b, size);
	return err;
}

int main(void)
{
	char line[4096];
	setvbuf(stdout, NULL, _IOLBF, 0);
	while (fgets(line, sizeof line, stdin)) {
		char cmd[32] = "", a[6][300];
		unsigned long long u[8] = {0};
		line[strcspn(line, "\n")] = 0;
		if (sscanf(line, "%31s", cmd) != 1)
			continue;
		const char *args = line + strlen(cmd);
		int err = 0;
		if (!strcmp(cmd, "attach")) {
			if (sscanf(args, "%255s %79s %llu %llu %llu %299s", gdir, gfab, &u[0], &u[1], &u[2], a[0]) != 6) {
				reply("err -22");
				continue;
			}
			gnode = (unsigned)u[0];
			err = shmfab_attach(gdir, gfab, (uint16_t)u[0], a[0], (unsigned)u[1], (unsigned)u[2], &node);
		} else if (!node && strcmp(cmd, "exit")) {
			err = -ENOTCONN;
		} else if (!strcmp(cmd, "open")) {
			sscanf(args, "%llu %llu", &u[0], &u[1]);
			shmfab_ep *e;
			err = u[0] < 256 ? shmfab_open(node, (unsigned)u[0], (unsigned)u[1], &e) : -EINVAL;
			if (!err)
				eps[u[0]] = e;
		} else if (!strcmp(cmd, "close")) {
			sscanf(args, "%llu", &u[0]);
			if (ep((unsigned)u[0])) {
				shmfab_close(eps[u[0]]);
				eps[u[0]] = NULL;
			}
		} else if (!strcmp(cmd, "send")) {
			uint8_t p[200];
			long long to;
			if (sscanf(args, "%llu %llu %llu %llu %299s %lld", &u[0], &u[1], &u[2], &u[3], a[0], &to) != 6 ||
			    !ep((unsigned)u[0])) {
				reply("err -22");
				continue;
			}
			int l = unhex(a[0], p, sizeof p);
			err = l < 0 ? -EINVAL : shmfab_send(eps[u[0]], (uint16_t)u[1], (unsigned)u[2], (uint8_t)u[3], p, (size_t)l, (int)to);
		} else if (!strcmp(cmd, "recv")) {
			long long to;
			sscanf(args, "%llu %lld", &u[0], &to);
			struct shmfab_msg m;
			if (!ep((unsigned)u[0]) || (err = recv_one(eps[u[0]], &m, (int)to)) == 0) {
				if (!err && ep((unsigned)u[0])) {
					char h[260];
					hex(h, m.data, m.len);
					reply("msg %u %u %u %u %s", m.node, m.vpid, m.tag, m.mc, h);
					continue;
				}
				err = -EINVAL;
			}
		} else if (!strcmp(cmd, "echo")) {
			long long to;
			sscanf(args, "%llu %llu %lld", &u[0], &u[1], &to);
			struct shmfab_msg m;
			for (unsigned long long i = 0; i < u[1] && !err && ep((unsigned)u[0]); i++) {
				err = recv_one(eps[u[0]], &m, (int)to);
				if (!err)
					err = shmfab_send(eps[u[0]], m.node, m.vpid, m.tag, m.data, m.len, (int)to);
			}
		} else if (!strcmp(cmd, "ping")) {
			/* ping V NODE DV N: N timed 120-byte round trips to an echoer */
			sscanf(args, "%llu %llu %llu %llu", &u[0], &u[1], &u[2], &u[3]);
			if (!ep((unsigned)u[0]) || u[3] == 0 || u[3] > 10000000) {
				reply("err -22");
				continue;
			}
			int64_t *lat = calloc(u[3], sizeof *lat);
			uint8_t p[SHMFAB_MAX_PAYLOAD] = {0};
			struct shmfab_msg m;
			int64_t t0 = mono();
			for (unsigned long long i = 0; i < u[3] && !err; i++) {
				int64_t s = mono();
				err = shmfab_send(eps[u[0]], (uint16_t)u[1], (unsigned)u[2], 1, p, sizeof p, 5000);
				if (!err)
					err = recv_one(eps[u[0]], &m, 5000);
				lat[i] = mono() - s;
			}
			int64_t total = mono() - t0;
			if (!err) {
				qsort(lat, u[3], sizeof *lat, cmp64);
				reply("lat %lld %lld %lld", (long long)lat[u[3] / 2], (long long)lat[u[3] * 99 / 100],
				      (long long)(total / (int64_t)u[3]));
			}
			free(lat);
			if (!err)
				continue;
		} else if (!strcmp(cmd, "flood")) {
			long long to;
			sscanf(args, "%llu %llu %llu %llu %llu %lld", &u[0], &u[1], &u[2], &u[3], &u[4], &to);
			unsigned long long i = 0;
			int64_t t0 = mono();
			for (; i < u[4] && !err && ep((unsigned)u[0]); i++)
				err = shmfab_send(eps[u[0]], (uint16_t)u[1], (unsigned)u[2], (uint8_t)u[3], "x", 1, (int)to);
			reply("flood %llu %d %lld", err ? i - 1 : i, err, (long long)((mono() - t0) / 1000000));
			continue;
		} else if (!strcmp(cmd, "reg")) {
			sscanf(args, "%llu %llu", &u[0], &u[1]);
			uint64_t nla;
			void *b;
			err = ep((unsigned)u[0]) ? shmfab_register(eps[u[0]], (size_t)u[1], &nla, &b) : -EINVAL;
			if (!err) {
				for (int i = 0; i < 64; i++)
					if (!regs[i].b) {
						regs[i].nla = nla;
						regs[i].size = (size_t)u[1];
						regs[i].b = b;
						break;
					}
				reply("region %llu", (unsigned long long)nla);
				continue;
			}
		} else if (!strcmp(cmd, "fill")) {
			sscanf(args, "%llu %llu %llu", &u[0], &u[1], &u[2]);
			uint8_t *b = region_at(u[0], (size_t)u[1]);
			if (!b)
				err = -EINVAL;
			for (size_t i = 0; b && i < u[1]; i++)
				b[i] = (uint8_t)(i * 7 + u[2]);
		} else if (!strcmp(cmd, "dump")) {
			sscanf(args, "%llu %llu", &u[0], &u[1]);
			uint8_t *b = u[1] <= 1024 ? region_at(u[0], (size_t)u[1]) : NULL;
			if (b) {
				char h[2100];
				hex(h, b, (size_t)u[1]);
				reply("hex %s", h);
				continue;
			}
			err = -EINVAL;
		} else if (!strcmp(cmd, "post")) {
			sscanf(args, "%llu %llu %llu %llu %llu %llu %llu %llu", &u[0], &u[1], &u[2], &u[3], &u[4], &u[5], &u[6], &u[7]);
			struct shmfab_rma r = {.op = (uint8_t)u[1], .node = (uint16_t)u[2], .vpid = (uint8_t)u[3], .local = u[4],
			                       .remote = u[5], .len = (uint32_t)u[6], .notify = (uint8_t)u[7]};
			err = ep((unsigned)u[0]) ? shmfab_post(eps[u[0]], &r) : -EINVAL;
		} else if (!strcmp(cmd, "poll")) {
			long long to;
			sscanf(args, "%llu %lld", &u[0], &to);
			struct shmfab_note nt;
			shmfab_ep *e = ep((unsigned)u[0]);
			err = e ? 0 : -EINVAL;
			while (!err && shmfab_poll(e, &nt, 1) != 1)
				err = shmfab_wait(e, (int)to);
			if (!err) {
				reply("note %u %u %u %u %u %u %llu", nt.kind, nt.op, nt.err, nt.node, nt.vpid, nt.len,
				      (unsigned long long)nt.local);
				continue;
			}
		} else if (!strcmp(cmd, "stats")) {
			struct shmfab_stats s;
			shmfab_get_stats(node, &s);
			reply("stats sent=%llu recv=%llu blocked=%llu posted=%llu bytes=%llu faults=%llu notes=%llu corrupt=%llu "
			      "invalid=%llu peerdown=%llu bellsleeps=%llu futexsleeps=%llu rings=%llu ringfailed=%llu futexwakes=%llu",
			      (unsigned long long)s.velo_sent, (unsigned long long)s.velo_recv, (unsigned long long)s.send_blocked,
			      (unsigned long long)s.rma_posted, (unsigned long long)s.rma_bytes, (unsigned long long)s.rma_faults,
			      (unsigned long long)s.notes_recv, (unsigned long long)s.corrupt, (unsigned long long)s.invalid,
			      (unsigned long long)s.peer_down, (unsigned long long)s.bell_sleeps, (unsigned long long)s.futex_sleeps,
			      (unsigned long long)s.bell_rings, (unsigned long long)s.ring_failed, (unsigned long long)s.futex_wakes);
			continue;
		} else if (!strcmp(cmd, "owner")) {
			err = shmfab_owner_alive(node);
		} else if (!strcmp(cmd, "alive")) {
			sscanf(args, "%llu", &u[0]);
			err = shmfab_alive(node, (uint16_t)u[0]);
		} else if (!strcmp(cmd, "forge")) {
			sscanf(args, "%llu %llu %299s", &u[0], &u[1], a[0]);
			err = forge((unsigned)u[0], (unsigned)u[1], a[0]);
		} else if (!strcmp(cmd, "detach")) {
			shmfab_detach(node);
			node = NULL;
			memset(eps, 0, sizeof eps);
			memset(regs, 0, sizeof regs);
		} else if (!strcmp(cmd, "exit")) {
			if (node)
				shmfab_detach(node);
			reply("ok");
			return 0;
		} else {
			err = -EINVAL;
		}
		if (err)
			reply("err %d", err);
		else
			reply("ok");
	}
	if (node)
		shmfab_detach(node);
	return 0;
}

//go:build ofi && cgo

// cgo_data.c: the data path of cgo.go: posting receives, sends and
// injects, reading completions (exn_poll: one progress step in one cgo
// call), error entries, and parking on the CQ wait fd.

#include <string.h>
#include <poll.h>
#include "cgo.h"

ssize_t exn_recv(exn_ofi *o, void *buf, size_t len, void *desc, uint64_t ctx) {
	return fi_recv(o->ep, buf, len, desc, FI_ADDR_UNSPEC, (void *)(uintptr_t)ctx);
}

ssize_t exn_send(exn_ofi *o, void *buf, size_t len, void *desc, uint64_t dest, uint64_t ctx) {
	return fi_send(o->ep, buf, len, desc, (fi_addr_t)dest, (void *)(uintptr_t)ctx);
}

// exn_inject sends len bytes inline: the buffer is free on return and no
// completion is generated. len must be <= o->inject.
ssize_t exn_inject(exn_ofi *o, void *buf, size_t len, uint64_t dest) {
	return fi_inject(o->ep, buf, len, (fi_addr_t)dest);
}

// EXN_CTX_RECV is opctx ctxRecv (wire.go) in the top byte.
#define EXN_CTX_RECV 1
#define EXN_CTX_SHIFT 56

// exn_poll is one progress step in one cgo call: it reads up to n
// completions; every receive completion's packet is copied into
// stage[i*slot]. Its buffer is reposted at the start of the next call,
// not before this one returns: the repost (a provider call) is then off
// the path between a packet's arrival and its delivery, and the next call
// comes at once while anything is arriving (a spinning caller's next
// step, the background goroutine's next round). A repost that fails with
// -FI_EAGAIN is retried on the next call; one that fails otherwise too,
// and is counted in repost_errs. When the deferred list is full the
// buffer is reposted at once (result in rerr). It returns the count, 0
// for none, or a negative fi_errno (-FI_EAVAIL: an error entry is
// queued).
ssize_t exn_poll(exn_ofi *o, struct fi_cq_msg_entry *ents, uint64_t *srcs, exn_cqe *out, size_t n,
		char *stage, char *rx, size_t slot, void *rxdesc) {
	int keep = 0;
	for (int i = 0; i < o->npend; i++) {
		uint64_t c = o->pend[i];
		size_t idx = (size_t)(c & ((1ULL << EXN_CTX_SHIFT) - 1));
		ssize_t r = fi_recv(o->ep, rx + idx * slot, slot, rxdesc, FI_ADDR_UNSPEC, (void *)(uintptr_t)c);
		if (r != 0) {
			if (r != -FI_EAGAIN) o->repost_errs++;
			o->pend[keep++] = c;
		}
	}
	o->npend = keep;
	ssize_t ret = fi_cq_readfrom(o->cq, ents, n, (fi_addr_t *)srcs);
	if (ret == -FI_EAGAIN) return 0;
	if (ret <= 0) return ret;
	for (ssize_t i = 0; i < ret; i++) {
		uint64_t c = (uint64_t)(uintptr_t)ents[i].op_context;
		out[i].ctx = c;
		out[i].src = srcs[i];
		out[i].len = (uint32_t)(ents[i].len < slot ? ents[i].len : slot);
		out[i].rerr = 0;
		if ((c >> EXN_CTX_SHIFT) == EXN_CTX_RECV) {
			size_t idx = (size_t)(c & ((1ULL << EXN_CTX_SHIFT) - 1));
			memcpy(stage + i * slot, rx + idx * slot, out[i].len);
			if (o->npend < EXN_MAXPEND)
				o->pend[o->npend++] = c;
			else
				out[i].rerr = (int32_t)fi_recv(o->ep, rx + idx * slot, slot, rxdesc, FI_ADDR_UNSPEC, (void *)(uintptr_t)c);
		}
	}
	return ret;
}

// exn_trywait reports whether the caller may park on pollfd: nothing is
// pending in the CQ, the provider armed its wait object, and the wait fd
// is not readable already. fi_trywait promises only the first two: it
// leaves data unread in a socket (it checks the provider's own buffer,
// not the kernel's), which a level-triggered poll() would see at once.
// Go's netpoller is edge-triggered: a readiness it reported before this
// call (and the caller consumed) is not reported again, so parking on an
// fd that is already readable sleeps until the next, unrelated event.
// The poll(0) closes that gap: anything becoming ready after it is a new
// edge, which the netpoller (registered for the fd's whole life) sees.
int exn_trywait(exn_ofi *o) {
	struct fid *f = &o->cq->fid;
	if (fi_trywait(o->fabric, &f, 1) != FI_SUCCESS) return 0;
	struct pollfd p = { .fd = o->waitfd, .events = POLLIN };
	return poll(&p, 1, 0) == 0;
}

int exn_cq_readerr(exn_ofi *o, exn_err *out) {
	struct fi_cq_err_entry e;
	memset(&e, 0, sizeof(e));
	ssize_t ret = fi_cq_readerr(o->cq, &e, 0);
	if (ret < 0) return (int)ret;
	out->ctx = (uint64_t)(uintptr_t)e.op_context;
	out->flags = e.flags;
	out->len = e.len;
	out->err = e.err;
	out->prov_errno = e.prov_errno;
	const char *s = fi_cq_strerror(o->cq, e.prov_errno, e.err_data, NULL, 0);
	strncpy(out->msg, s ? s : "", sizeof(out->msg) - 1);
	out->msg[sizeof(out->msg) - 1] = 0;
	return 0;
}

int exn_cq_signal(exn_ofi *o) { return o->waitfd >= 0 ? fi_cq_signal(o->cq) : 0; }

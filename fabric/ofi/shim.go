//go:build ofi && cgo

package ofi

// shim.go is the only file of the package that uses cgo. libfabric's data
// calls (fi_send, fi_read, fi_cq_read, ...) are static inline functions
// that dispatch through ops tables, which cgo cannot call, so a thin C
// layer wraps each one. Rules kept here:
//
//   - No Go pointer is ever handed to C to keep: every buffer libfabric
//     sees (receive and send slots, RMA regions, CQ entry arrays) is C
//     memory from calloc or mmap.
//   - Operation contexts are integers (see opctx in wire.go) cast to
//     void* inside C, so no Go value hides in a pointer and the provider
//     is never asked to write into a context (we do not accept FI_CONTEXT).
//   - At most one cgo call per message and none that allocates: the
//     wrappers take plain scalars and C pointers; exn_poll reads a batch
//     of completions, stages received packets and reposts their buffers
//     in one call.

/*
#cgo LDFLAGS: -lfabric
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <unistd.h>
#include <poll.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

// EXN_MAXPEND bounds the receive buffers exn_poll leaves to repost on its
// next call: one batch of completions (cqBatchSize in nic.go).
#define EXN_MAXPEND 64

// EXN_MAXIOV is the most requests one exn_rma carries (rmaMerge in
// rma.go); a provider may allow fewer (exn_ofi.iov_limit).
#define EXN_MAXIOV 4

// exn_mr_modes is every memory-registration mode the Go side handles.
#define EXN_MR_MODES (FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT)

typedef struct {
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_av *av;
	struct fid_cq *cq;
	struct fid_ep *ep;
	int waitfd;        // the CQ's wait fd (FI_WAIT_FD), or -1: no wait object
	int pollfd;        // a non-blocking close-on-exec dup of waitfd for Go's netpoller, or -1
	int saw;           // FI_ORDER_SAW: a send after a write lands after the write's data
	size_t inject;     // tx_attr->inject_size: largest fi_inject
	size_t iov_limit;  // most pieces of one exn_rma: EXN_MAXIOV, tx_attr's iov_limit and rma_iov_limit
	uint64_t mr_mode;  // the domain's required FI_MR_* bits
	uint64_t addr_format;
	char prov[64];
	// Receive buffers whose packets the last exn_poll returned, reposted
	// by the next one (under the Go side's progress lock), and how many
	// such reposts have failed other than with -FI_EAGAIN.
	uint64_t pend[EXN_MAXPEND];
	int npend;
	uint64_t repost_errs;
} exn_ofi;

typedef struct {
	uint64_t ctx;
	uint64_t flags;
	uint64_t len;
	int err;
	int prov_errno;
	char msg[96];
} exn_err;

#include "unpark.h"
// exn_keep_unparkable turns the filter off (tests of the NIC's own
// guard against such a provider, progress.go unarmedFor).
static int exn_keep_unparkable;
static void exn_set_keep_unparkable(int on) { exn_keep_unparkable = on; }

// exn_getinfo asks for an RDM endpoint of provider prov (NULL: any) with
// the given capabilities. node/service, when non-NULL, are the local
// address to bind (FI_SOURCE). It returns 0 or a negative fi_errno.
static int exn_getinfo(const char *prov, const char *node, const char *service,
		uint64_t caps, int rdm, int order, struct fi_info **out) {
	struct fi_info *hints = fi_allocinfo();
	if (!hints) return -FI_ENOMEM;
	hints->caps = caps;
	hints->mode = 0;
	if (rdm) hints->ep_attr->type = FI_EP_RDM;
	hints->domain_attr->threading = FI_THREAD_SAFE;
	hints->domain_attr->mr_mode = EXN_MR_MODES;
	hints->domain_attr->av_type = FI_AV_TABLE;
	if (order) {
		// SAS: VELO order per pair. SAW (order == 2): a send after a write
		// lands after the write's data, so the completer notification can
		// follow a transmit-complete write.
		uint64_t o = FI_ORDER_SAS | (order == 2 ? FI_ORDER_SAW : 0);
		hints->tx_attr->msg_order = o;
		hints->rx_attr->msg_order = o;
	}
	if (prov) hints->fabric_attr->prov_name = strdup(prov);
	uint64_t flags = (node || service) ? FI_SOURCE : 0;
	int ret = fi_getinfo(FI_VERSION(1, 9), node, service, flags, hints, out);
	fi_freeinfo(hints);
	if (ret == 0 && rdm && !exn_keep_unparkable) ret = exn_drop_unparkable(out);
	return ret;
}

static const char *exn_info_prov(struct fi_info *i) { return i->fabric_attr->prov_name; }
static struct fi_info *exn_info_next(struct fi_info *i) { return i->next; }
static int exn_info_type(struct fi_info *i) { return (int)i->ep_attr->type; }
static uint64_t exn_info_caps(struct fi_info *i) { return i->caps; }

static void exn_close_all(exn_ofi *o) {
	if (o->pollfd >= 0) close(o->pollfd);
	if (o->ep) fi_close(&o->ep->fid);
	if (o->cq) fi_close(&o->cq->fid);
	if (o->av) fi_close(&o->av->fid);
	if (o->domain) fi_close(&o->domain->fid);
	if (o->fabric) fi_close(&o->fabric->fid);
	if (o->info) fi_freeinfo(o->info);
	free(o);
}

// exn_open builds fabric, domain, AV, CQ and an enabled endpoint from the
// first entry of info, which it takes over (freed by exn_close_all). On
// failure *stage names the step that failed.
static int exn_open(struct fi_info *info, size_t cq_size, size_t av_size, exn_ofi **out, const char **stage) {
	exn_ofi *o = calloc(1, sizeof(*o));
	if (!o) { fi_freeinfo(info); *stage = "calloc"; return -FI_ENOMEM; }
	o->waitfd = o->pollfd = -1;
	o->info = fi_dupinfo(info);
	fi_freeinfo(info);
	if (!o->info) { *stage = "fi_dupinfo"; exn_close_all(o); return -FI_ENOMEM; }
	o->mr_mode = o->info->domain_attr->mr_mode;
	o->saw = (o->info->tx_attr->msg_order & FI_ORDER_SAW) != 0;
	o->inject = o->info->tx_attr->inject_size;
	o->iov_limit = EXN_MAXIOV;
	if (o->info->tx_attr->iov_limit < o->iov_limit) o->iov_limit = o->info->tx_attr->iov_limit;
	if (o->info->tx_attr->rma_iov_limit < o->iov_limit) o->iov_limit = o->info->tx_attr->rma_iov_limit;
	if (o->iov_limit < 1) o->iov_limit = 1;
	o->addr_format = o->info->addr_format;
	strncpy(o->prov, o->info->fabric_attr->prov_name, sizeof(o->prov) - 1);
	int ret;
	*stage = "fi_fabric";
	if ((ret = fi_fabric(o->info->fabric_attr, &o->fabric, NULL))) goto fail;
	*stage = "fi_domain";
	if ((ret = fi_domain(o->fabric, o->info, &o->domain, NULL))) goto fail;
	struct fi_av_attr av = { .type = FI_AV_TABLE, .count = av_size };
	*stage = "fi_av_open";
	if ((ret = fi_av_open(o->domain, &av, &o->av, NULL))) goto fail;
	// A CQ with an fd wait object lets an idle node park in Go's
	// netpoller on a dup of that fd (after fi_trywait). Providers without
	// one get a CQ without a wait object (see docs/fabric-ofi.md).
	struct fi_cq_attr cq = { .size = cq_size, .format = FI_CQ_FORMAT_MSG, .wait_obj = FI_WAIT_FD };
	*stage = "fi_cq_open";
	if (fi_cq_open(o->domain, &cq, &o->cq, NULL) == 0) {
		int fd = -1;
		if (fi_control(&o->cq->fid, FI_GETWAIT, &fd) == 0 && fd >= 0) {
			o->waitfd = fd;
			o->pollfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
			if (o->pollfd >= 0) {
				int fl = fcntl(o->pollfd, F_GETFL);
				if (fl < 0 || fcntl(o->pollfd, F_SETFL, fl | O_NONBLOCK) < 0) { close(o->pollfd); o->pollfd = -1; }
			}
		}
		if (o->pollfd < 0) {
			// A wait object Go cannot park on is no use: reopen without.
			fi_close(&o->cq->fid);
			o->cq = NULL;
			o->waitfd = -1;
		}
	}
	if (!o->cq) {
		cq.wait_obj = FI_WAIT_NONE;
		if ((ret = fi_cq_open(o->domain, &cq, &o->cq, NULL))) goto fail;
	}
	*stage = "fi_endpoint";
	if ((ret = fi_endpoint(o->domain, o->info, &o->ep, NULL))) goto fail;
	*stage = "fi_ep_bind(av)";
	if ((ret = fi_ep_bind(o->ep, &o->av->fid, 0))) goto fail;
	*stage = "fi_ep_bind(cq)";
	if ((ret = fi_ep_bind(o->ep, &o->cq->fid, FI_TRANSMIT | FI_RECV))) goto fail;
	*stage = "fi_enable";
	if ((ret = fi_enable(o->ep))) goto fail;
	*out = o;
	return 0;
fail:
	exn_close_all(o);
	return ret;
}

static int exn_getname(exn_ofi *o, void *buf, size_t *len) { return fi_getname(&o->ep->fid, buf, len); }

static int exn_av_lookup(exn_ofi *o, uint64_t fa, void *buf, size_t *len) { return fi_av_lookup(o->av, fa, buf, len); }

static int exn_av_insert(exn_ofi *o, const void *addr, uint64_t *fa) {
	fi_addr_t a = FI_ADDR_NOTAVAIL;
	int ret = fi_av_insert(o->av, addr, 1, &a, 0, NULL);
	*fa = a;
	return ret == 1 ? 0 : (ret < 0 ? ret : -FI_EINVAL);
}

static int exn_av_insertsvc(exn_ofi *o, const char *node, const char *svc, uint64_t *fa) {
	fi_addr_t a = FI_ADDR_NOTAVAIL;
	int ret = fi_av_insertsvc(o->av, node, svc, &a, 0, NULL);
	*fa = a;
	return ret == 1 ? 0 : (ret < 0 ? ret : -FI_EINVAL);
}

// exn_mr_reg registers [buf, buf+len) for the given access. key is the
// requested key (ignored under FI_MR_PROV_KEY); the key to publish and the
// local descriptor come back in *outkey and *desc.
static int exn_mr_reg(exn_ofi *o, void *buf, size_t len, uint64_t access, uint64_t key,
		struct fid_mr **mr, uint64_t *outkey, void **desc) {
	int ret = fi_mr_reg(o->domain, buf, len, access, 0, key, 0, mr, NULL);
	if (ret) return ret;
	if (o->mr_mode & FI_MR_ENDPOINT) {
		if ((ret = fi_mr_bind(*mr, &o->ep->fid, 0)) || (ret = fi_mr_enable(*mr))) {
			fi_close(&(*mr)->fid);
			return ret;
		}
	}
	*outkey = fi_mr_key(*mr);
	*desc = fi_mr_desc(*mr);
	return 0;
}

static int exn_mr_close(struct fid_mr *mr) { return fi_close(&mr->fid); }

static ssize_t exn_recv(exn_ofi *o, void *buf, size_t len, void *desc, uint64_t ctx) {
	return fi_recv(o->ep, buf, len, desc, FI_ADDR_UNSPEC, (void *)(uintptr_t)ctx);
}

static ssize_t exn_send(exn_ofi *o, void *buf, size_t len, void *desc, uint64_t dest, uint64_t ctx) {
	return fi_send(o->ep, buf, len, desc, (fi_addr_t)dest, (void *)(uintptr_t)ctx);
}

// exn_inject sends len bytes inline: the buffer is free on return and no
// completion is generated. len must be <= o->inject.
static ssize_t exn_inject(exn_ofi *o, void *buf, size_t len, uint64_t dest) {
	return fi_inject(o->ep, buf, len, (fi_addr_t)dest);
}

// exn_rmav describes the pieces of one RMA operation, in C memory (one
// per operation slot): piece i moves len[i] bytes between the local
// address laddr[i] and the remote address raddr[i].
typedef struct {
	uint64_t laddr[EXN_MAXIOV];
	uint64_t raddr[EXN_MAXIOV];
	uint64_t len[EXN_MAXIOV];
} exn_rmav;

// exn_rma issues one fi_readmsg/fi_writemsg of n pieces (1..iov_limit),
// all local ones in the registration desc, all remote ones under key. dc
// asks a write for FI_DELIVERY_COMPLETE: the completion then means the
// data is visible in the target's memory. The Go side asks for it only
// when a completer notification follows and the provider has no
// FI_ORDER_SAW.
static ssize_t exn_rma(exn_ofi *o, int write, int dc, const exn_rmav *v, size_t n, void *desc,
		uint64_t dest, uint64_t key, uint64_t ctx) {
	struct iovec iov[EXN_MAXIOV];
	struct fi_rma_iov riov[EXN_MAXIOV];
	void *descs[EXN_MAXIOV];
	if (n < 1 || n > o->iov_limit) return -FI_EINVAL;
	for (size_t i = 0; i < n; i++) {
		iov[i].iov_base = (void *)(uintptr_t)v->laddr[i];
		iov[i].iov_len = v->len[i];
		riov[i].addr = v->raddr[i];
		riov[i].len = v->len[i];
		riov[i].key = key;
		descs[i] = desc;
	}
	struct fi_msg_rma msg = {
		.msg_iov = iov, .desc = descs, .iov_count = n, .addr = (fi_addr_t)dest,
		.rma_iov = riov, .rma_iov_count = n, .context = (void *)(uintptr_t)ctx,
	};
	if (write) return fi_writemsg(o->ep, &msg, FI_COMPLETION | (dc ? FI_DELIVERY_COMPLETE : 0));
	return fi_readmsg(o->ep, &msg, FI_COMPLETION);
}

// exn_cqe is one completion as the Go side reads it (plain fields, no
// calls). rerr is the repost result of a receive completion.
typedef struct {
	uint64_t ctx;
	uint64_t src;
	uint32_t len;
	int32_t rerr;
} exn_cqe;

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
static ssize_t exn_poll(exn_ofi *o, struct fi_cq_msg_entry *ents, uint64_t *srcs, exn_cqe *out, size_t n,
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
static int exn_trywait(exn_ofi *o) {
	struct fid *f = &o->cq->fid;
	if (fi_trywait(o->fabric, &f, 1) != FI_SUCCESS) return 0;
	struct pollfd p = { .fd = o->waitfd, .events = POLLIN };
	return poll(&p, 1, 0) == 0;
}

static int exn_cq_readerr(exn_ofi *o, exn_err *out) {
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

static int exn_cq_signal(exn_ofi *o) { return o->waitfd >= 0 ? fi_cq_signal(o->cq) : 0; }

static void *exn_mmap(size_t len) {
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}
static void exn_munmap(void *p, size_t len) { munmap(p, len); }
static uintptr_t exn_ptr(void *p) { return (uintptr_t)p; }
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// Capability and access bits the Go side passes to the shim.
const (
	capMsg    = C.FI_MSG
	capRMA    = C.FI_RMA
	capSource = C.FI_SOURCE
	// regionAccess lets remote peers read and write a region and this
	// endpoint use it as the local buffer of its own reads and writes.
	regionAccess = C.FI_READ | C.FI_WRITE | C.FI_REMOTE_READ | C.FI_REMOTE_WRITE
	// bufAccess is the access of the send/receive slot pools.
	bufAccess = C.FI_SEND | C.FI_RECV

	mrLocal    = C.FI_MR_LOCAL
	mrVirtAddr = C.FI_MR_VIRT_ADDR
	mrProvKey  = C.FI_MR_PROV_KEY

	fiEAGAIN = -C.FI_EAGAIN
	fiEAVAIL = -C.FI_EAVAIL

	flagRecv = C.FI_RECV

	// Error codes (positive, as in fi_cq_err_entry.err) that mean the
	// peer is unreachable.
	fiECONNREFUSED = C.FI_ECONNREFUSED
	fiECONNRESET   = C.FI_ECONNRESET
	fiECONNABORTED = C.FI_ECONNABORTED
	fiEHOSTUNREACH = C.FI_EHOSTUNREACH
	fiETIMEDOUT    = C.FI_ETIMEDOUT
	fiEIO          = C.FI_EIO
	fiENOTCONN     = C.FI_ENOTCONN
	fiESHUTDOWN    = C.FI_ESHUTDOWN
)

// The cgo-free capability constants of diagnose.go must be libfabric's.
var _ = [1]struct{}{}[(probeMsg^capMsg)|(probeRMA^capRMA)|(probeSource^capSource)]

// fiErr is a libfabric error code with the failing call.
type fiErr struct {
	op   string
	code int
}

func (e *fiErr) Error() string {
	return fmt.Sprintf("%s: %s (%d)", e.op, C.GoString(C.fi_strerror(C.int(-e.code))), e.code)
}

func fiError(op string, ret C.ssize_t) error {
	if ret >= 0 {
		return nil
	}
	return &fiErr{op: op, code: int(ret)}
}

func isAgain(err error) bool {
	var fe *fiErr
	return errors.As(err, &fe) && fe.code == fiEAGAIN
}

// info is a libfabric fi_info list returned by getinfo.
type info struct{ p *C.struct_fi_info }

// Ordering levels of getinfo.
const (
	orderNone = 0
	orderSAS  = 1 // send after send
	orderSAW  = 2 // send after send and send after write
)

func getinfo(prov, node, service string, caps uint64, rdm bool, order int) (info, error) {
	var cprov, cnode, csvc *C.char
	if prov != "" {
		cprov = C.CString(prov)
		defer C.free(unsafe.Pointer(cprov))
	}
	if node != "" {
		cnode = C.CString(node)
		defer C.free(unsafe.Pointer(cnode))
	}
	if service != "" {
		csvc = C.CString(service)
		defer C.free(unsafe.Pointer(csvc))
	}
	var out *C.struct_fi_info
	ret := C.exn_getinfo(cprov, cnode, csvc, C.uint64_t(caps), cbool(rdm), C.int(order), &out)
	if ret == C.EXN_UNPARKABLE {
		return info{}, fmt.Errorf("%w: ofi %s: every RDM endpoint it offers runs on libfabric's native TCP engine (xnet), whose fi_trywait does nothing before libfabric 1.19, so exn could never park on its completion queue; use libfabric 1.17's tcp (tcp;ofi_rxm) or libfabric 1.19 or later", errors.ErrUnsupported, prov)
	}
	if ret != 0 {
		return info{}, fiError("fi_getinfo", C.ssize_t(ret))
	}
	return info{out}, nil
}

// keepUnparkable turns exn_drop_unparkable off for the tests of the
// NIC's own guard; never set outside tests.
func keepUnparkable(on bool) { C.exn_set_keep_unparkable(cbool(on)) }

// libVersion is the running libfabric's version (fi_version), major and
// minor.
func libVersion() (major, minor int) {
	v := uint32(C.fi_version())
	return int(v >> 16), int(v & 0xffff)
}

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

func (i info) free() {
	if i.p != nil {
		C.fi_freeinfo(i.p)
	}
}

// entries lists (provider name, endpoint type, caps) of every entry.
type infoEntry struct {
	prov string
	rdm  bool
	caps uint64
}

func (i info) entries() []infoEntry {
	var out []infoEntry
	for p := i.p; p != nil; p = C.exn_info_next(p) {
		out = append(out, infoEntry{
			prov: C.GoString(C.exn_info_prov(p)),
			rdm:  C.exn_info_type(p) == C.FI_EP_RDM,
			caps: uint64(C.exn_info_caps(p)),
		})
	}
	return out
}

// fab is one opened libfabric stack: fabric, domain, AV, CQ, endpoint.
type fab struct {
	o *C.exn_ofi
}

// openFab opens the stack from the first entry of in, which it consumes.
func openFab(in info, cqSize, avSize int) (*fab, error) {
	var o *C.exn_ofi
	var stage *C.char
	ret := C.exn_open(in.p, C.size_t(cqSize), C.size_t(avSize), &o, &stage)
	if ret != 0 {
		return nil, fiError(C.GoString(stage), C.ssize_t(ret))
	}
	return &fab{o: o}, nil
}

func (f *fab) close() { C.exn_close_all(f.o) }

func (f *fab) provider() string   { return C.GoString(&f.o.prov[0]) }
func (f *fab) mrMode() uint64     { return uint64(f.o.mr_mode) }
func (f *fab) waitable() bool     { return f.o.waitfd >= 0 }
func (f *fab) saw() bool          { return f.o.saw != 0 }
func (f *fab) addrFormat() uint64 { return uint64(f.o.addr_format) }

// addrFormatStr is FI_ADDR_STR: addresses that are strings (shm).
const addrFormatStr = uint64(C.FI_ADDR_STR)

// name returns this endpoint's address (fi_getname).
func (f *fab) name() ([]byte, error) {
	const maxName = 512 // larger than any provider address (sockaddr, shm names, IB GIDs)
	buf := C.malloc(maxName)
	defer C.free(buf)
	n := C.size_t(maxName)
	if ret := C.exn_getname(f.o, buf, &n); ret != 0 {
		return nil, fiError("fi_getname", C.ssize_t(ret))
	}
	return C.GoBytes(buf, C.int(n)), nil
}

// avLookup returns the address inserted as fa (fi_av_lookup): for a
// peer added with its Name, the bytes of that Name.
func (f *fab) avLookup(fa uint64) ([]byte, error) {
	const maxName = 512
	buf := C.malloc(maxName)
	defer C.free(buf)
	n := C.size_t(maxName)
	if ret := C.exn_av_lookup(f.o, C.uint64_t(fa), buf, &n); ret != 0 {
		return nil, fiError("fi_av_lookup", C.ssize_t(ret))
	}
	if n > maxName {
		return nil, fmt.Errorf("fi_av_lookup: address of %d bytes", n)
	}
	return C.GoBytes(buf, C.int(n)), nil
}

func (f *fab) avInsert(addr []byte) (uint64, error) {
	if len(addr) == 0 {
		return 0, fmt.Errorf("fi_av_insert: empty address")
	}
	c := C.CBytes(addr)
	defer C.free(c)
	var fa C.uint64_t
	if ret := C.exn_av_insert(f.o, c, &fa); ret != 0 {
		return 0, fiError("fi_av_insert", C.ssize_t(ret))
	}
	return uint64(fa), nil
}

func (f *fab) avInsertSvc(node, svc string) (uint64, error) {
	cn, cs := C.CString(node), C.CString(svc)
	defer C.free(unsafe.Pointer(cn))
	defer C.free(unsafe.Pointer(cs))
	var fa C.uint64_t
	if ret := C.exn_av_insertsvc(f.o, cn, cs, &fa); ret != 0 {
		return 0, fiError("fi_av_insertsvc", C.ssize_t(ret))
	}
	return uint64(fa), nil
}

// cmem is C memory from mmap: page aligned, never moved by Go, and
// unmapped (so a stale access faults instead of corrupting) on free.
type cmem struct {
	p   unsafe.Pointer
	len int
}

func mmapMem(n int) (cmem, error) {
	p := C.exn_mmap(C.size_t(n))
	if p == nil {
		return cmem{}, fmt.Errorf("mmap %d bytes failed", n)
	}
	return cmem{p: p, len: n}, nil
}

func (m cmem) bytes() []byte { return unsafe.Slice((*byte)(m.p), m.len) }
func (m cmem) addr() uint64  { return uint64(C.exn_ptr(m.p)) }
func (m cmem) at(off int) unsafe.Pointer {
	return unsafe.Add(m.p, off)
}
func (m cmem) free() {
	if m.p != nil {
		C.exn_munmap(m.p, C.size_t(m.len))
	}
}

// mr is one memory registration.
type mr struct {
	p    *C.struct_fid_mr
	key  uint64
	desc unsafe.Pointer
}

func (f *fab) mrReg(m cmem, access, key uint64) (mr, error) {
	var r mr
	var k C.uint64_t
	ret := C.exn_mr_reg(f.o, m.p, C.size_t(m.len), C.uint64_t(access), C.uint64_t(key), &r.p, &k, &r.desc)
	if ret != 0 {
		return mr{}, fiError("fi_mr_reg", C.ssize_t(ret))
	}
	r.key = uint64(k)
	return r, nil
}

func (r mr) close() error {
	if r.p == nil {
		return nil
	}
	return fiError("fi_close(mr)", C.ssize_t(C.exn_mr_close(r.p)))
}

func (f *fab) postRecv(buf unsafe.Pointer, n int, desc unsafe.Pointer, ctx uint64) error {
	return fiError("fi_recv", C.exn_recv(f.o, buf, C.size_t(n), desc, C.uint64_t(ctx)))
}

func (f *fab) send(buf unsafe.Pointer, n int, desc unsafe.Pointer, dest, ctx uint64) error {
	return fiError("fi_send", C.exn_send(f.o, buf, C.size_t(n), desc, C.uint64_t(dest), C.uint64_t(ctx)))
}

// rmaVec is the C-side piece list of one operation slot (exn_rmav).
type rmaVec C.exn_rmav

// newRMAVecs allocates n piece lists in C memory (zeroed); freeRMAVecs
// releases them.
func newRMAVecs(n int) []rmaVec {
	return unsafe.Slice((*rmaVec)(C.calloc(C.size_t(n), C.sizeof_exn_rmav)), n)
}

func freeRMAVecs(v []rmaVec) {
	if len(v) > 0 {
		C.free(unsafe.Pointer(&v[0]))
	}
}

// set fills piece i: n bytes between local memory buf and remote address raddr.
func (v *rmaVec) set(i int, buf unsafe.Pointer, raddr uint64, n int) {
	v.laddr[i] = C.uint64_t(uintptr(buf))
	v.raddr[i] = C.uint64_t(raddr)
	v.len[i] = C.uint64_t(n)
}

// iovLimit is the most pieces one rma call may carry on this provider.
func (f *fab) iovLimit() int { return int(f.o.iov_limit) }

// rma issues one RMA operation of k pieces of v (C memory the caller
// owns until the completion), all in the local registration desc and the
// remote region key.
func (f *fab) rma(write, dc bool, v *rmaVec, k int, desc unsafe.Pointer, dest, key, ctx uint64) error {
	op := "fi_readmsg"
	if write {
		op = "fi_writemsg"
	}
	return fiError(op, C.exn_rma(f.o, cbool(write), cbool(dc), (*C.exn_rmav)(v), C.size_t(k), desc, C.uint64_t(dest), C.uint64_t(key), C.uint64_t(ctx)))
}

// cqBatch is a reusable C array of completion entries, source
// addresses, the entries as Go reads them, and a staging copy of each
// received packet (exn_poll reposts the receive buffer at once).
type cqBatch struct {
	ents  *C.struct_fi_cq_msg_entry
	srcs  *C.uint64_t
	out   []C.exn_cqe // views C memory
	stage cmem
	n     int
	err   *C.exn_err
}

func newCQBatch(n int) (*cqBatch, error) {
	stage, err := mmapMem(n * recvSize)
	if err != nil {
		return nil, err
	}
	out := (*C.exn_cqe)(C.calloc(C.size_t(n), C.sizeof_exn_cqe))
	return &cqBatch{
		ents:  (*C.struct_fi_cq_msg_entry)(C.calloc(C.size_t(n), C.sizeof_struct_fi_cq_msg_entry)),
		srcs:  (*C.uint64_t)(C.calloc(C.size_t(n), 8)),
		out:   unsafe.Slice(out, n),
		stage: stage,
		n:     n,
		err:   (*C.exn_err)(C.calloc(1, C.sizeof_exn_err)),
	}, nil
}

func (b *cqBatch) free() {
	C.free(unsafe.Pointer(b.ents))
	C.free(unsafe.Pointer(b.srcs))
	C.free(unsafe.Pointer(&b.out[0]))
	C.free(unsafe.Pointer(b.err))
	b.stage.free()
}

// poll is one progress step (one cgo call): it reads up to a batch of
// completions, copying received packets to the staging area and
// reposting their buffers. It returns the count, or errAvail when an
// error entry is queued.
func (f *fab) poll(b *cqBatch, rx cmem, rxDesc unsafe.Pointer) (int, error) {
	ret := C.exn_poll(f.o, b.ents, b.srcs, &b.out[0], C.size_t(b.n), (*C.char)(b.stage.p), (*C.char)(rx.p), recvSize, rxDesc)
	switch {
	case ret >= 0:
		return int(ret), nil
	case ret == fiEAVAIL:
		return 0, errAvail
	}
	return 0, fiError("fi_cq_read", ret)
}

// repostErrs is how many deferred receive reposts have failed other than
// with -FI_EAGAIN (each is retried on the next poll); progress lock held.
func (f *fab) repostErrs() uint64 { return uint64(f.o.repost_errs) }

// trywait reports whether nothing is pending and the wait fd is armed.
func (f *fab) trywait() bool { return C.exn_trywait(f.o) != 0 }

// pollFD is the non-blocking dup of the CQ wait fd for the netpoller, or
// -1. The NIC wraps it in an *os.File, which then owns it.
func (f *fab) pollFD() int {
	fd := int(f.o.pollfd)
	f.o.pollfd = -1 // owned by the caller from now on
	return fd
}

// injectSize is the largest packet fi_inject takes.
func (f *fab) injectSize() int { return int(f.o.inject) }

// inject sends a packet inline: buf is free on return, no completion.
func (f *fab) inject(buf unsafe.Pointer, n int, dest uint64) error {
	return fiError("fi_inject", C.exn_inject(f.o, buf, C.size_t(n), C.uint64_t(dest)))
}

var errAvail = errors.New("cq error entry available")

// entry returns completion i of the last poll: context, length (capped
// at recvSize), source address, and the repost result of a receive.
func (b *cqBatch) entry(i int) (c opctx, length int, src uint64, repost error) {
	e := &b.out[i]
	if e.rerr != 0 {
		repost = fiError("fi_recv", C.ssize_t(e.rerr))
	}
	return opctx(e.ctx), int(e.len), uint64(e.src), repost
}

// packet returns the staged copy of received completion i.
func (b *cqBatch) packet(i, length int) []byte {
	return unsafe.Slice((*byte)(b.stage.at(i*recvSize)), length)
}

// cqErr is one error completion.
type cqErr struct {
	ctx    uint64
	recv   bool
	code   int
	detail string
}

func (f *fab) cqReadErr(b *cqBatch) (cqErr, bool) {
	if C.exn_cq_readerr(f.o, b.err) != 0 {
		return cqErr{}, false
	}
	e := b.err
	return cqErr{
		ctx:    uint64(e.ctx),
		recv:   uint64(e.flags)&flagRecv != 0,
		code:   int(e.err),
		detail: fmt.Sprintf("%s (err %d, prov_errno %d)", C.GoString(&e.msg[0]), int(e.err), int(e.prov_errno)),
	}, true
}

// signal wakes a node parked on the wait fd (fi_cq_signal).
func (f *fab) signal() { C.exn_cq_signal(f.o) }

// fiAddrNotAvail is FI_ADDR_NOTAVAIL: a completion from a source not in
// the AV.
const fiAddrNotAvail = ^uint64(0)

// The layout of fi_cq_msg_entry stays C's business: Go reads only
// exn_cqe, which exn_poll fills.
var _ = unsafe.Sizeof(C.exn_cqe{})

// cgo.h: the C glue to libfabric as cgo.go's preamble sees it: the
// structures the Go side reads and the functions it calls, defined in
// cgo_open.c (getinfo, open, address vector), cgo_data.c (send, receive,
// completions, the wait fd) and cgo_rma.c (memory, registration, RMA).

#ifndef EXN_CGO_H
#define EXN_CGO_H

#include <stdlib.h>
#include <stdint.h>
#include <sys/types.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include "unpark.h"

// EXN_MAXPEND bounds the receive buffers exn_poll leaves to repost on its
// next call: one batch of completions (cqBatchSize in nic.go).
#define EXN_MAXPEND 64

// EXN_MAXIOV is the most requests one exn_rma carries (rmaMerge in
// rma.go); a provider may allow fewer (exn_ofi.iov_limit).
#define EXN_MAXIOV 4

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

// exn_rmav describes the pieces of one RMA operation, in C memory (one
// per operation slot): piece i moves len[i] bytes between the local
// address laddr[i] and the remote address raddr[i].
typedef struct {
	uint64_t laddr[EXN_MAXIOV];
	uint64_t raddr[EXN_MAXIOV];
	uint64_t len[EXN_MAXIOV];
} exn_rmav;

// exn_cqe is one completion as the Go side reads it (plain fields, no
// calls). rerr is the repost result of a receive completion.
typedef struct {
	uint64_t ctx;
	uint64_t src;
	uint32_t len;
	int32_t rerr;
} exn_cqe;

// cgo_open.c: getinfo, the opened stack, the address vector.
void exn_set_keep_unparkable(int on);
int exn_getinfo(const char *prov, const char *node, const char *service,
		uint64_t caps, int rdm, int order, struct fi_info **out);
const char *exn_info_prov(struct fi_info *i);
struct fi_info *exn_info_next(struct fi_info *i);
int exn_info_type(struct fi_info *i);
uint64_t exn_info_caps(struct fi_info *i);
int exn_open(struct fi_info *info, size_t cq_size, size_t av_size, exn_ofi **out, const char **stage);
void exn_close_all(exn_ofi *o);
int exn_getname(exn_ofi *o, void *buf, size_t *len);
int exn_av_lookup(exn_ofi *o, uint64_t fa, void *buf, size_t *len);
int exn_av_insert(exn_ofi *o, const void *addr, uint64_t *fa);
int exn_av_insertsvc(exn_ofi *o, const char *node, const char *svc, uint64_t *fa);

// cgo_data.c: messages, completions, the wait fd.
ssize_t exn_recv(exn_ofi *o, void *buf, size_t len, void *desc, uint64_t ctx);
ssize_t exn_send(exn_ofi *o, void *buf, size_t len, void *desc, uint64_t dest, uint64_t ctx);
ssize_t exn_inject(exn_ofi *o, void *buf, size_t len, uint64_t dest);
ssize_t exn_poll(exn_ofi *o, struct fi_cq_msg_entry *ents, uint64_t *srcs, exn_cqe *out, size_t n,
		char *stage, char *rx, size_t slot, void *rxdesc);
int exn_trywait(exn_ofi *o);
int exn_cq_readerr(exn_ofi *o, exn_err *out);
int exn_cq_signal(exn_ofi *o);

// cgo_rma.c: C memory, memory registration, RMA.
void *exn_mmap(size_t len);
void exn_munmap(void *p, size_t len);
uintptr_t exn_ptr(void *p);
int exn_mr_reg(exn_ofi *o, void *buf, size_t len, uint64_t access, uint64_t key,
		struct fid_mr **mr, uint64_t *outkey, void **desc);
int exn_mr_close(struct fid_mr *mr);
ssize_t exn_rma(exn_ofi *o, int write, int dc, const exn_rmav *v, size_t n, void *desc,
		uint64_t dest, uint64_t key, uint64_t ctx);

#endif

//go:build ofi && cgo

// cgo_rma.c: memory for cgo.go: mmap'd buffers and regions, their
// registration (fi_mr_reg), and RMA operations (fi_readmsg/fi_writemsg).

#include <sys/mman.h>
#include "cgo.h"

void *exn_mmap(size_t len) {
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}
void exn_munmap(void *p, size_t len) { munmap(p, len); }
uintptr_t exn_ptr(void *p) { return (uintptr_t)p; }

// exn_mr_reg registers [buf, buf+len) for the given access. key is the
// requested key (ignored under FI_MR_PROV_KEY); the key to publish and the
// local descriptor come back in *outkey and *desc.
int exn_mr_reg(exn_ofi *o, void *buf, size_t len, uint64_t access, uint64_t key,
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

int exn_mr_close(struct fid_mr *mr) { return fi_close(&mr->fid); }

// exn_rma issues one fi_readmsg/fi_writemsg of n pieces (1..iov_limit),
// all local ones in the registration desc, all remote ones under key. dc
// asks a write for FI_DELIVERY_COMPLETE: the completion then means the
// data is visible in the target's memory. The Go side asks for it only
// when a completer notification follows and the provider has no
// FI_ORDER_SAW.
ssize_t exn_rma(exn_ofi *o, int write, int dc, const exn_rmav *v, size_t n, void *desc,
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

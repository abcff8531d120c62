//go:build ofi && cgo

// cgo_open.c: finding and opening a libfabric endpoint (fi_getinfo, the
// fabric/domain/AV/CQ/endpoint stack and its close) and the address
// vector, for cgo.go.

#include <string.h>
#include <fcntl.h>
#include <unistd.h>
#include "cgo.h"

// EXN_MR_MODES is every memory-registration mode the Go side handles.
#define EXN_MR_MODES (FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT)

// exn_keep_unparkable turns the filter off (tests of the NIC's own
// guard against such a provider, progress.go unarmedFor).
static int exn_keep_unparkable;
void exn_set_keep_unparkable(int on) { exn_keep_unparkable = on; }

// exn_getinfo asks for an RDM endpoint of provider prov (NULL: any) with
// the given capabilities. node/service, when non-NULL, are the local
// address to bind (FI_SOURCE). It returns 0 or a negative fi_errno.
int exn_getinfo(const char *prov, const char *node, const char *service,
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

const char *exn_info_prov(struct fi_info *i) { return i->fabric_attr->prov_name; }
struct fi_info *exn_info_next(struct fi_info *i) { return i->next; }
int exn_info_type(struct fi_info *i) { return (int)i->ep_attr->type; }
uint64_t exn_info_caps(struct fi_info *i) { return i->caps; }

void exn_close_all(exn_ofi *o) {
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
int exn_open(struct fi_info *info, size_t cq_size, size_t av_size, exn_ofi **out, const char **stage) {
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

int exn_getname(exn_ofi *o, void *buf, size_t *len) { return fi_getname(&o->ep->fid, buf, len); }

int exn_av_lookup(exn_ofi *o, uint64_t fa, void *buf, size_t *len) { return fi_av_lookup(o->av, fa, buf, len); }

int exn_av_insert(exn_ofi *o, const void *addr, uint64_t *fa) {
	fi_addr_t a = FI_ADDR_NOTAVAIL;
	int ret = fi_av_insert(o->av, addr, 1, &a, 0, NULL);
	*fa = a;
	return ret == 1 ? 0 : (ret < 0 ? ret : -FI_EINVAL);
}

int exn_av_insertsvc(exn_ofi *o, const char *node, const char *svc, uint64_t *fa) {
	fi_addr_t a = FI_ADDR_NOTAVAIL;
	int ret = fi_av_insertsvc(o->av, node, svc, &a, 0, NULL);
	*fa = a;
	return ret == 1 ? 0 : (ret < 0 ? ret : -FI_EINVAL);
}

/*
 * ofi_rma_bw: libfabric's own RMA GET bandwidth between two processes,
 * with no exn around it: the ceiling of any gateway that moves bulk data
 * over the same provider (issue #16, perf/ofi-exn0.sh RAW=1). The client
 * keeps WINDOW fi_read of SIZE bytes in flight from the target's
 * registered buffer for SECS seconds; both sides park on the CQ's wait
 * fd (fi_trywait, poll) between completions, as exnd's ofi backend does,
 * so their CPU time is comparable with exnd's. The target reports its
 * own CPU time over the out-of-band socket at the end.
 *
 * usage: ofi_rma_bw -s ADDR [-p PROV] [-P PORT] [-S SPIN_US] (target, bound to ADDR)
 *        ofi_rma_bw -c HOST [-p PROV] [-P PORT] [-b SIZE] [-w WINDOW] [-t SECS] [-S SPIN_US]
 * The provider listens on PORT, the out-of-band TCP socket on PORT+1.
 * prints (client): one line of key=value: gbit, the CPU seconds of each
 * side and cpu_s_per_gb, both sides' CPU time per GB moved.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAXW 64

static struct fi_info *info;
static struct fid_fabric *fab;
static struct fid_domain *dom;
static struct fid_ep *ep;
static struct fid_av *av;
static struct fid_cq *cq;
static struct fid_mr *mr;
static int waitfd = -1;

struct advert {
	uint64_t addr, key, len;
};
struct report {
	double cpu_s;
};

#define CHECK(call)                                                                    \
	do {                                                                           \
		int _r = (call);                                                       \
		if (_r) {                                                              \
			fprintf(stderr, "ofi_rma_bw: %s: %s\n", #call, fi_strerror(-_r)); \
			exit(1);                                                       \
		}                                                                      \
	} while (0)

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static double cpu_s(void)
{
	struct rusage u;
	getrusage(RUSAGE_SELF, &u);
	return u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec / 1e6;
}

static void xfull(int fd, void *p, size_t n, int wr)
{
	char *c = p;
	while (n > 0) {
		ssize_t k = wr ? write(fd, c, n) : read(fd, c, n);
		if (k <= 0) {
			fprintf(stderr, "ofi_rma_bw: out-of-band %s: %s\n", wr ? "write" : "read", k ? strerror(errno) : "closed");
			exit(1);
		}
		c += k;
		n -= (size_t)k;
	}
}

static void open_fabric(const char *prov, const char *node, const char *port, uint64_t flags)
{
	struct fi_info *h = fi_allocinfo();
	h->caps = FI_MSG | FI_RMA | FI_READ | FI_REMOTE_READ;
	h->ep_attr->type = FI_EP_RDM;
	h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
	h->fabric_attr->prov_name = strdup(prov);
	CHECK(fi_getinfo(FI_VERSION(1, 9), node, port, flags, h, &info));
	fi_freeinfo(h);
	CHECK(fi_fabric(info->fabric_attr, &fab, NULL));
	CHECK(fi_domain(fab, info, &dom, NULL));
	struct fi_cq_attr ca = {.format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_FD, .size = 1024};
	CHECK(fi_cq_open(dom, &ca, &cq, NULL));
	CHECK(fi_control(&cq->fid, FI_GETWAIT, &waitfd));
	struct fi_av_attr aa = {.type = FI_AV_TABLE};
	CHECK(fi_av_open(dom, &aa, &av, NULL));
	CHECK(fi_endpoint(dom, info, &ep, NULL));
	CHECK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
	CHECK(fi_ep_bind(ep, &av->fid, 0));
	CHECK(fi_enable(ep));
}

static void reg(void *buf, size_t len, uint64_t access)
{
	CHECK(fi_mr_reg(dom, buf, len, access, 0, 0, 0, &mr, NULL));
	if (info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
		CHECK(fi_mr_bind(mr, &ep->fid, 0));
		CHECK(fi_mr_enable(mr));
	}
}

/* spin_s is how long a side polls the CQ before it parks (-S, in µs; the
 * default 50 µs is exnd's ofi backend's waitSpin, fabric/ofi/progress.go). */
static double spin_s = 50e-6;

/* park waits for the CQ's wait fd or, with oob >= 0, for the out-of-band
 * socket, after spin_s of progress steps; returns 1 when oob is readable,
 * and leaves up to n completions in e (*got). */
static int park(int oob, struct fi_cq_entry *e, size_t n, ssize_t *got)
{
	double end = now_s() + spin_s;
	do {
		*got = fi_cq_read(cq, e, n);
		if (*got != -FI_EAGAIN)
			return 0;
	} while (now_s() < end);
	struct fid *f = &cq->fid;
	if (fi_trywait(fab, &f, 1) != FI_SUCCESS)
		return 0;
	struct pollfd p[2] = {{waitfd, POLLIN, 0}, {oob, POLLIN, 0}};
	poll(p, oob >= 0 ? 2 : 1, -1);
	return oob >= 0 && (p[1].revents & (POLLIN | POLLHUP));
}

static int tcp_socket(const char *host, int port, int listen_)
{
	struct addrinfo hi = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM, .ai_flags = listen_ ? AI_PASSIVE : 0}, *ai;
	char ps[16];
	snprintf(ps, sizeof ps, "%d", port);
	if (getaddrinfo(host, ps, &hi, &ai)) {
		fprintf(stderr, "ofi_rma_bw: cannot resolve %s\n", host ? host : "*");
		exit(1);
	}
	int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (listen_) {
		if (bind(s, ai->ai_addr, ai->ai_addrlen) || listen(s, 1)) {
			perror("ofi_rma_bw: out-of-band listen");
			exit(1);
		}
		int c = accept(s, NULL, NULL);
		close(s);
		s = c;
	} else {
		int ok = 0;
		for (int i = 0; i < 100 && !ok; i++) { /* the target may still be starting: 10 s at most */
			ok = connect(s, ai->ai_addr, ai->ai_addrlen) == 0;
			if (!ok) {
				close(s);
				s = socket(AF_INET, SOCK_STREAM, 0);
				usleep(100000);
			}
		}
		if (!ok) {
			perror("ofi_rma_bw: out-of-band connect");
			exit(1);
		}
	}
	freeaddrinfo(ai);
	return s;
}

static void target(const char *prov, const char *addr, int port)
{
	char ps[16];
	snprintf(ps, sizeof ps, "%d", port);
	open_fabric(prov, addr, ps, FI_SOURCE);
	size_t len = 64 << 20; /* any client's SIZE up to 64 MiB */
	char *buf = aligned_alloc(4096, len);
	memset(buf, 0x5a, len); /* real pages, not the zero page */
	reg(buf, len, FI_REMOTE_READ);
	int oob = tcp_socket(addr, port + 1, 1);
	struct advert a = {(info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)buf : 0, fi_mr_key(mr), len};
	xfull(oob, &a, sizeof a, 1);
	double c0 = cpu_s();
	struct fi_cq_entry e[16];
	ssize_t got;
	while (!park(oob, e, 16, &got)) /* the target only drives progress until the client is done */
		;
	char done;
	xfull(oob, &done, 1, 0);
	struct report r = {cpu_s() - c0};
	xfull(oob, &r, sizeof r, 1);
	close(oob);
}

static void client(const char *prov, const char *host, int port, size_t size, int window, double secs)
{
	char ps[16];
	snprintf(ps, sizeof ps, "%d", port);
	int oob = tcp_socket(host, port + 1, 0);
	struct advert a;
	xfull(oob, &a, sizeof a, 0);
	if (size > a.len) {
		fprintf(stderr, "ofi_rma_bw: SIZE over the target's %llu bytes\n", (unsigned long long)a.len);
		exit(1);
	}
	open_fabric(prov, host, ps, 0);
	fi_addr_t peer;
	if (fi_av_insert(av, info->dest_addr, 1, &peer, 0, NULL) != 1) {
		fprintf(stderr, "ofi_rma_bw: fi_av_insert failed\n");
		exit(1);
	}
	char *buf = aligned_alloc(4096, size * window);
	memset(buf, 0, size * window);
	reg(buf, size * window, FI_READ);
	void *desc = fi_mr_desc(mr);
	/* Warm-up: one GET, polled without parking, brings rxm's connection up
	 * (rxm queues an operation posted while it connects, and a parked
	 * caller would never send it). */
	int wr;
	while ((wr = fi_read(ep, buf, size, desc, peer, a.addr, a.key, NULL)) == -FI_EAGAIN)
		fi_cq_read(cq, NULL, 0);
	CHECK(wr);
	struct fi_cq_entry w;
	double give_up = now_s() + 10;
	ssize_t wn;
	while ((wn = fi_cq_read(cq, &w, 1)) == -FI_EAGAIN && now_s() < give_up)
		;
	if (wn != 1) {
		fprintf(stderr, "ofi_rma_bw: the warm-up GET did not complete (%zd)\n", wn);
		exit(1);
	}
	double c0 = cpu_s(), t0 = now_s(), end = t0 + secs;
	uint64_t done = 0, inflight = 0, next = 0;
	int stop = 0;
	while (!stop || inflight > 0) {
		while (!stop && inflight < (uint64_t)window) {
			uint64_t slot = next % (uint64_t)window;
			int r = fi_read(ep, buf + slot * size, size, desc, peer, a.addr + (next % (a.len / size)) * size, a.key, (void *)(uintptr_t)slot);
			if (r == -FI_EAGAIN)
				break;
			CHECK(r);
			next++;
			inflight++;
		}
		struct fi_cq_entry e[MAXW];
		ssize_t n = fi_cq_read(cq, e, MAXW);
		if (n == -FI_EAGAIN)
			park(-1, e, MAXW, &n);
		if (n == -FI_EAGAIN && now_s() > end + 10) {
			fprintf(stderr, "ofi_rma_bw: no completion for 10 s past the run's end\n");
			exit(1);
		}
		if (n > 0) {
			done += (uint64_t)n;
			inflight -= (uint64_t)n;
			if (now_s() >= end)
				stop = 1;
		} else if (n != -FI_EAGAIN) {
			struct fi_cq_err_entry ee = {0};
			fi_cq_readerr(cq, &ee, 0);
			fprintf(stderr, "ofi_rma_bw: completion error: %s\n", fi_strerror(ee.err));
			exit(1);
		}
	}
	double t = now_s() - t0, cc = cpu_s() - c0;
	char d = 1;
	xfull(oob, &d, 1, 1);
	struct report r;
	xfull(oob, &r, sizeof r, 0);
	double gb = (double)done * size / 1e9;
	printf("prov=%s size=%zu window=%d secs=%.2f gbit=%.2f client_cpu_s=%.2f target_cpu_s=%.2f cpu_s_per_gb=%.3f\n",
	       prov, size, window, t, gb * 8 / t, cc, r.cpu_s, (cc + r.cpu_s) / gb);
}

int main(int argc, char **argv)
{
	const char *prov = "tcp", *host = NULL, *addr = NULL;
	int port = 7481, window = 8, c;
	size_t size = 65536;
	double secs = 3;
	while ((c = getopt(argc, argv, "s:c:p:P:b:w:t:S:")) != -1) {
		switch (c) {
		case 's': addr = optarg; break;
		case 'c': host = optarg; break;
		case 'p': prov = optarg; break;
		case 'P': port = atoi(optarg); break;
		case 'b': size = (size_t)atol(optarg); break;
		case 'w': window = atoi(optarg); break;
		case 't': secs = atof(optarg); break;
		case 'S': spin_s = atof(optarg) / 1e6; break;
		default: fprintf(stderr, "usage: ofi_rma_bw -s ADDR | -c HOST [-p PROV] [-P PORT] [-b SIZE] [-w WINDOW] [-t SECS] [-S SPIN_US]\n"); return 2;
		}
	}
	if (window < 1 || window > MAXW || size == 0 || !addr == !host) {
		fprintf(stderr, "ofi_rma_bw: need -s ADDR or -c HOST, 1 <= WINDOW <= %d, SIZE > 0\n", MAXW);
		return 2;
	}
	if (addr)
		target(prov, addr, port);
	else
		client(prov, host, port, size, window, secs);
	return 0;
}

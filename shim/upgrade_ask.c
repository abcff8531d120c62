/*
 * upgrade_ask.c: stages 1 and 2 of the mid-stream upgrade (upgrade.c
 * has the stages and the locks): a connection is marked at connect or
 * accept, asks exnd once it is UPG_AGE_NS old without waiting for the
 * answer, and attaches the buffer when a later call finds the answer
 * there; or it stays TCP for good, counted by exnd with its reason.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "ctl.h"
#include "direct.h"
#include "shim.h"
#include "upgrade.h"

int g_upg_att;
int g_upg_asked;

void upg_mark(int fd, int side)
{
	lock();
	struct fdent *e = ent(fd);
	if (e && (e->flags & F_TRACKED)) {
		e->flags |= F_UPG;
		e->ust = U_YOUNG;
		e->uside = (uint8_t)side;
		e->utries = 0;
		e->uwsh = 0;
		e->ucl = -1;
		e->uat = (uint64_t)mono_ns() + UPG_AGE_NS;
	}
	unlock();
}

/* fd stays TCP for good: forget it (and its epoll records). */
static void upg_final(int fd, const char *why)
{
	lock();
	struct fdent *e = ent(fd);
	if (e && (e->flags & F_UPG)) {
		e->flags &= ~F_UPG;
		e->ust = 0;
	}
	unlock();
	settle(fd);
	dbg("fd %d: stays TCP (%s)", fd, why);
}

/* Take the entry from state from to U_BUSY; 0 if it is not in it. */
int upg_take(int fd, int from)
{
	lock();
	struct fdent *e = ent(fd);
	int ok = e && (e->flags & F_UPG) && e->ust == from;
	if (ok)
		e->ust = U_BUSY;
	unlock();
	return ok;
}

/* Stage 1: ask exnd, without waiting for the answer. */
static void upg_ask(int fd)
{
	if (!upg_take(fd, U_YOUNG))
		return;
	struct fdent *e = ent(fd);
	int side = e->uside;
	enum ctl_op op = side ? CTL_OP_ACCEPT : CTL_OP_CONNECT;
	char buf[256];
	if (e->flags & F_EPOVF) {
		upg_final(fd, "too many epoll registrations");
		return;
	}
	/* A switch's peak, and the control connection kept while asked. */
	if (!direct_room(fd, 1)) {
		struct ctl_resp r;
		int ufd[CTL_MAXFD];
		ctl_call(op, CTL_SW_FDLIMIT, fd, -1, buf, sizeof buf, &r, ufd); /* counted by exnd */
		close_fds(ufd);
		upg_final(fd, "fd_limit");
		return;
	}
	int s = ctl_start(op, CTL_SW_UPGRADE, fd, -1, buf, sizeof buf);
	int h = s >= 0 ? hide_fd(s, 0) : -1;
	if (h < 0) {
		if (s >= 0)
			real.close(s);
		upg_final(fd, s == CTL_NOCONN ? "no exnd" : "control connection failed");
		return;
	}
	lock();
	if (e->flags & F_UPG) {
		e->ucl = h;
		e->utries++;
		e->ust = U_ASKED;
		__atomic_add_fetch(&g_upg_asked, 1, __ATOMIC_RELAXED);
		h = -1;
	}
	unlock();
	if (h >= 0)
		real.close(h); /* dup'd meanwhile: stays TCP */
	else
		dbg("fd %d: upgrade asked", fd);
}

/* Stage 2: exnd's answer is there (or the connection broke): attach it. */
static void upg_pickup(int fd)
{
	if (!upg_take(fd, U_ASKED))
		return;
	struct fdent *e = ent(fd);
	int s = e->ucl;
	e->ucl = -1;
	__atomic_sub_fetch(&g_upg_asked, 1, __ATOMIC_RELAXED);
	char buf[4096];
	struct ctl_resp r;
	int ufd[CTL_MAXFD];
	int c = ctl_finish(s, buf, sizeof buf, &r, ufd);
	if (c != CTL_OK || r.mode != CTL_MODE_DIRECT || r.side != e->uside) {
		close_fds(ufd);
		if (c == CTL_OK && r.mode == CTL_MODE_TCP && !strcmp(r.reason, "no_claim") && e->utries < UPG_TRIES) {
			/* The peer did not ask in time (it was idle): again later. */
			lock();
			if (e->flags & F_UPG) {
				e->uat = (uint64_t)mono_ns() + (UPG_RETRY_NS << (e->utries - 1));
				e->ust = U_YOUNG;
			}
			unlock();
			dbg("fd %d: upgrade not agreed (%s), asking again later", fd, buf);
			return;
		}
		upg_final(fd, c == CTL_OK ? buf : "control connection broke");
		return;
	}
	int slot = direct_attach(&r, ufd, ufd[0]);
	if (slot < 0) {
		upg_final(fd, "cannot attach the buffer");
		return;
	}
	struct dconn *dc = &g_dc[slot];
	uint32_t *w = dring_upg(&dc->d);
	int wsh;
	lock();
	int keep = (e->flags & F_UPG) != 0;
	if (keep) {
		dc->id = r.id;
		dc->refs = 1;
		dc->vhidden = 1;
		g_ndc++;
		__atomic_add_fetch(&g_upg_att, 1, __ATOMIC_RELAXED);
		e->dc = slot + 1;
		e->ust = U_ATT;
	}
	wsh = e->uwsh;
	unlock();
	if (!keep) { /* dup'd meanwhile: stays TCP */
		real.close(ufd[0]);
		direct_unattach(slot);
		return;
	}
	/* A program that shut its write side before: that direction ends
	 * on TCP. Then this side attaches. */
	if (wsh)
		dring_fin(&dc->d); /* ended on TCP: in the buffer too (upg_shutdown) */
	uint32_t o = __atomic_fetch_or(w, (wsh ? UPG_WSH(e->uside) : 0) | UPG_ATT(e->uside), __ATOMIC_ACQ_REL);
	if (o & UPG_XHOST)
		dring_kick(&dc->d); /* the engine tells the peer's copy */
	dbg("fd %d: upgrade attached, id %llu", fd, (unsigned long long)r.id);
}

/* Stages 1 and 2, as far as they go now. */
void upg_tick(int fd)
{
	struct fdent *e = ent(fd);
	int st = __atomic_load_n(&e->ust, __ATOMIC_RELAXED);
	if (st == U_YOUNG && (uint64_t)mono_ns() >= e->uat) {
		upg_ask(fd);
	} else if (st == U_ASKED) {
		struct pollfd p = {e->ucl, POLLIN, 0};
		if (real.poll(&p, 1, 0) > 0)
			upg_pickup(fd);
	}
}

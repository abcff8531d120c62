/*
 * upgrade.h: the mid-stream upgrade of libextds.so (upgrade.c;
 * docs/shim.md, "Upgrade"): a connection starts as the program's own TCP
 * connection and moves onto a direct one once it has lived long enough,
 * at a byte boundary each direction marks with its TCP FIN.
 */
#ifndef EXN_SHIM_UPGRADE_H
#define EXN_SHIM_UPGRADE_H

#include <poll.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "shim.h"

#pragma GCC visibility push(hidden)

/*
 * How old a connection is before the shim asks exnd to upgrade it: 2 ms.
 * An upgrade costs both exnds about 1.4 ms of work (docs/shim.md, "Short
 * connections"), and a TCP_CRR connection over exn0 lives 160-300 µs
 * here from connect to close: ten times that and more is a connection
 * whose next bytes are worth moving. A connection asks at its first data
 * call after it (the shim has no timer).
 */
#define UPG_AGE_NS 2000000ull

/* A connection whose peer did not ask in time (no_claim: idle on one
 * side) asks again after UPG_RETRY_NS, doubling, UPG_TRIES times in all. */
#define UPG_RETRY_NS 100000000ull
#define UPG_TRIES 4

/* fdent.ust */
enum {
	U_YOUNG = 1, /* not asked yet: at or after fdent.uat */
	U_ASKED,     /* the request is with exnd; fdent.ucl will carry the answer */
	U_ATT,       /* the answer is attached (fdent.dc, V and bell hidden); streams on TCP until they move */
	U_BUSY,      /* a thread is changing the state */
};

/*
 * The upgrade word (dring_upg, header +80; docs/direct.md), one CAS at a
 * time, side s:
 *   UPG_ATT(s)  s attached the buffer: it will read it after the TCP EOF
 *               that follows the peer's UPG_MOV;
 *   UPG_MOV(s)  s writes into the buffer from now on; its TCP write side
 *               is shut right after (the FIN marks the boundary);
 *   UPG_WSH(s)  s's program shut its TCP write side itself: s never moves
 *               (on conversion its direction is fin in the buffer);
 *   UPG_DET(s)  s left before anything moved (exec): no side moves.
 * A side moves only when both attached and neither left.
 *
 * Across hosts each node has its own copy of the word, and exnd's engine
 * carries each side's bits to the other's in its cursor messages
 * (extds/rdirect/wire.go; docs/direct.md, "The upgrade word across
 * hosts"). A side there never sets its UPG_MOV itself:
 *   UPG_REQ(s)  s asks to move: the peer's engine grants it by setting
 *               UPG_MOV(s) in the peer's copy (unless UPG_DET of the
 *               peer's side is there: one CAS word decides, as on one
 *               host), and s's engine sets UPG_MOV(s) in s's copy when
 *               the grant comes back. So the peer's copy holds UPG_MOV(s)
 *               before s shuts TCP's write side: the FIN never arrives
 *               ahead of the move it marks.
 *   UPG_XHOST   exnd set it before the program got the buffer: the
 *               buffer is one node's copy (the engine is the peer side).
 *   UPG_GONE    the engine reset the connection: a wait for a grant ends
 *               (the connection stays TCP).
 */
#define UPG_ATT(s) (1u << (s))
#define UPG_MOV(s) (4u << (s))
#define UPG_WSH(s) (16u << (s))
#define UPG_DET(s) (64u << (s))
#define UPG_REQ(s) (256u << (s))
#define UPG_XHOST (1u << 10)
#define UPG_GONE (1u << 11)

/* connect (side 0) or accept (side 1) made fd, a TCP connection of the
 * program: it may move later. */
void upg_mark(int fd, int side);

/* d_io for an F_UPG descriptor that is not direct (yet): the call on TCP
 * or, once moved, on the buffer; NOT_DIRECT when the caller should make
 * the real call itself. Converts fd to direct at the boundary. */
ssize_t upg_io(int fd, const struct iovec *iov, int cnt, int mflags, int send);

/* A real call on the F_UPG descriptor fd (splice) found TCP at EOF:
 * 1 if that was the boundary and fd is direct now (call again), else 0. */
int upg_eof(int fd);

/* shutdown on an F_UPG descriptor: 1 handled (*ret set), 0 not. */
int upg_shutdown(int fd, int how, int *ret);

/* The F_UPG descriptor fd whose writes have moved onto its buffer: that
 * connection (sendfile and splice use the bounce path), else NULL. */
struct dconn *upg_moved(int fd);

/* Around a write-like call the shim makes on an F_UPG descriptor's TCP
 * socket itself (sendfile, splice): upg_wbegin counts it in, as
 * upg_io's writes are (a move then waits for it before it shuts TCP's
 * write side), and says whether the side has moved already (then the
 * caller uses the buffer); upg_wend counts it out (errno kept). */
int upg_wbegin(int fd);
void upg_wend(int fd);

/* Entries attached and not converted (U_ATT), in this process: when 0,
 * the readiness calls skip upg_poll_filter and upg_epoll_filter. */
extern int g_upg_att;

/* Entries asked and not answered yet (U_ASKED), in this process: each
 * holds its hidden control connection, which direct_room counts. */
extern int g_upg_asked;

/*
 * Readiness at the boundary: the FIN that marks where the peer's stream
 * went on in the buffer is neither data nor the peer's end. On an
 * attached descriptor whose peer moved, a readiness call that finds it
 * with TCP holding nothing but that FIN converts it there and reports
 * the buffer's readiness (possibly none: the entry or event is dropped);
 * with bytes still before the FIN it takes POLLRDHUP / EPOLLRDHUP and
 * POLLHUP / EPOLLHUP off (POLLIN stays: the read converts it).
 * upg_poll_filter works on poll's result fds[0..n) with ret ready and
 * returns the new count; upg_epoll_filter on epoll_wait's evs[0..n) of
 * epfd (the events are found by their data among the set's recorded
 * registrations), compacts them and returns their new count. A caller
 * whose count fell to 0 waits again (direct_poll.c, direct_epoll.c).
 */
int upg_poll_filter(struct pollfd *fds, nfds_t n, int ret);
int upg_epoll_filter(int epfd, struct epoll_event *evs, int n);

/* Whether fd is attached and not converted yet (select takes such a set
 * through poll, for the boundary above). */
int upg_attached(int fd);

/* With the lock held: fd's F_UPG entry is cleared (close, reuse). */
void upg_drop_locked(int fd, struct fdent *e);

/* With the lock held: newfd's entry n was copied from oldfd's o (dup). */
void upg_dup_locked(struct fdent *o, struct fdent *n);

/* Before exec: attached connections that nothing moved yet are left
 * (UPG_DET), so the new program's TCP stays whole. */
void upg_exec(void);

#pragma GCC visibility pop

#endif

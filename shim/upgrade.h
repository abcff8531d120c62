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

/* A real call on the F_UPG descriptor fd (splice) found TCP at EOF: the
 * connection whose buffer the stream goes on in if that was the
 * boundary (fd is direct now, or another thread converted it meanwhile:
 * call again; or its conversion waits for a write on TCP: read the
 * buffer through d_io), else NULL (the peer's real end). */
struct dconn *upg_eof(int fd);

/* shutdown on an F_UPG descriptor: 1 handled (*ret set), 0 not: fd is
 * not upgrading, or it is direct now (the caller looks at dcof again:
 * a conversion may have ended between its look and this call's). */
int upg_shutdown(int fd, int how, int *ret);

/*
 * Around a call the shim makes on an upgrading descriptor's TCP socket
 * itself (sendfile, splice; upg_io's own reads and writes use them
 * too). A conversion replaces the TCP socket under the descriptor's
 * number with V (dup3), so a real call must never look at the state
 * and then call on the number unless it is counted in between: the
 * conversion drains the counts before its dup3, and a call that counted
 * itself in finds the state as it will be for the whole call. fdflags
 * changes F_UPG to F_DIRECT in one store, so a caller that loaded the
 * flags once and found neither needs neither.
 *
 * upg_wbegin (a write on fd) returns:
 *   UPG_W_TCP     counted in: make the real call, then upg_wend(fd);
 *   UPG_W_RING    fd's writes moved onto its buffer, *c (not counted);
 *                 the call goes through the buffer (d_io on fd, or *c);
 *   UPG_W_DIRECT  fd is direct now (not counted): the direct path.
 * A write of an attached side that has not moved asks for the move
 * first, as a write(2) does. upg_rbegin (a read on fd) returns the same:
 * UPG_W_TCP counted in (until the conversion, reads are on TCP; then
 * upg_rend), UPG_W_RING while another thread converts fd, UPG_W_DIRECT.
 * upg_wend and upg_rend keep errno.
 */
enum { UPG_W_TCP, UPG_W_RING, UPG_W_DIRECT };
int upg_wbegin(int fd, struct dconn **c);
void upg_wend(int fd);
int upg_rbegin(int fd, struct dconn **c);
void upg_rend(int fd);

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

/* Between upgrade_ask.c and upgrade.c. upg_take: the entry from state
 * from to U_BUSY; 0 if it is not in it. upg_tick: stages 1 and 2, as
 * far as they go now (at each data call on an F_UPG descriptor). */
int upg_take(int fd, int from);
void upg_tick(int fd);

/* Between upgrade.c and upgrade_ready.c. upg_conn: the attached
 * connection of an F_UPG entry (U_ATT, or U_BUSY while it converts), or
 * NULL. tcp_at_eof: whether fd's TCP socket is at EOF now (a peek that
 * does not wait). upg_convert: stage 4 (upgrade.c): 0, or -1 with errno. */
struct dconn *upg_conn(int fd);
int tcp_at_eof(int fd);
int upg_convert(int fd);

/* With the lock held: fd's F_UPG entry is cleared (close, reuse). */
void upg_drop_locked(int fd, struct fdent *e);

/* With the lock held: newfd's entry n was copied from oldfd's o (dup). */
void upg_dup_locked(struct fdent *o, struct fdent *n);

/* Before exec: attached connections that nothing moved yet are left
 * (UPG_DET), so the new program's TCP stays whole. */
void upg_exec(void);

#pragma GCC visibility pop

#endif

/*
 * fdroom.h: the shim's own descriptors, above the program's soft limit
 * when the hard limit leaves room (fdroom.c; docs/direct.md,
 * "Descriptors"). Private to libextds.so.
 */
#ifndef EXN_SHIM_FDROOM_H
#define EXN_SHIM_FDROOM_H

#include <sys/resource.h>

#pragma GCC visibility push(hidden)

/* The least room above the soft limit worth using: one direct
 * connection's descriptors and a margin. Less, and the shim shares the
 * program's space. */
#define FDROOM_ABOVE_MIN 64

/* Without room above, the shim's descriptors share the program's space:
 * all of them together stay within 1/FDROOM_SHARE_DIV of the soft limit
 * (64 of 1024: about 9 direct connections; 4096 of 65536). Each one
 * takes a number the program may need, and a program that uses more
 * than the rest of its limit sees EMFILE earlier than with plain TCP:
 * the share bounds how much earlier. */
#define FDROOM_SHARE_DIV 16

/* What a direct connection keeps (its bell; V is the program's own
 * socket) and what an epoll registration adds (nothing, unless one set
 * holds two descriptors of one connection: then a dup of the bell; the
 * fan-out's kicks, two per thread and one per family, are counted once,
 * in FDROOM_SWITCH_NEED), docs/direct.md. */
#define FDROOM_CONN_KEEP 1
#define FDROOM_EPOLL_KEEP 0

/* What one direct switch takes at once: exnd's control socket and the
 * three descriptors of the answer, then the kept one, a dup of the bell
 * for an epoll registration, and the fan-out's kicks (this thread's two,
 * the family's). */
#define FDROOM_SWITCH_NEED (4 + FDROOM_CONN_KEEP + 1 + 3)

/* A window in which the shim places its descriptors: fdroom_begin takes
 * g_rlim_mu and raises the soft limit to the hard one if there is room
 * (raised), fdroom_end puts it back and unlocks. Keep it to a few system
 * calls: another thread of the program that opens a descriptor while it
 * is open may get a number above its soft limit instead of EMFILE. */
struct fdroom {
	rlim_t soft, hard;
	int raised;
};
void fdroom_begin(struct fdroom *r);
void fdroom_end(struct fdroom *r);

/* Inside a window: fd moved (keep 0) or dup'd (keep 1) to a CLOEXEC
 * number at or above the soft limit if raised, else to a high number
 * below it. The new descriptor, or -1 with errno (fd untouched). */
int fdroom_place(const struct fdroom *r, int fd, int keep);

/* fdroom_place in a window of its own. */
int hide_fd(int fd, int keep);

/* Whether a switch of fd (any open descriptor) that takes need more
 * descriptors has room while the shim keeps kept (see fdroom.c). errno
 * is preserved. */
int fdroom_may_switch(int fd, int need, int kept);

/* pthread_atfork: fork waits for an open window to close. */
void fdroom_atfork_prepare(void);
void fdroom_atfork_release(void);

#pragma GCC visibility pop

#endif

/*
 * real.h: the one list of the libc calls libextds.so interposes and then
 * calls through (SHIM_CALLS), and the one table of their real versions
 * it generates (struct shim_real real, libextds.c). shim_init resolves
 * the whole table at once, dlsym(RTLD_NEXT), under the table lock, before
 * it sets g_ready; every exported entry point runs INIT() first, so
 * nothing calls through the table before then. A call the shim makes on
 * its own behalf that must not come back into the shim goes through
 * real.name(...) too.
 *
 * Exported entry points without an entry here forward to one that has
 * one: __read_chk, __recv_chk, __poll_chk, __recvfrom_chk, epoll_wait
 * and epoll_pwait (to epoll_pwait2), execl, execlp, execle (to the v
 * forms). The exported set is libextds.map.
 *
 * To interpose one more call: add it here, export it (EXPORT, shim.h) in
 * the unit that owns it, and list it in libextds.map.
 */
#ifndef EXN_SHIM_REAL_H
#define EXN_SHIM_REAL_H

#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

/* X(return type, name, parameter types) */
#define SHIM_CALLS(X)                                                                                        \
	/* descriptors, addresses, options, messages (calls.c, sockcalls.c) */                                 \
	X(int, socket, (int, int, int))                                                                      \
	X(int, connect, (int, const struct sockaddr *, socklen_t))                                            \
	X(int, listen, (int, int))                                                                            \
	X(int, accept, (int, struct sockaddr *, socklen_t *))                                                 \
	X(int, accept4, (int, struct sockaddr *, socklen_t *, int))                                           \
	X(int, close, (int))                                                                                  \
	X(int, dup, (int))                                                                                    \
	X(int, dup2, (int, int))                                                                              \
	X(int, dup3, (int, int, int))                                                                         \
	X(int, fcntl, (int, int, ...))                                                                        \
	X(int, fcntl64, (int, int, ...)) /* fcntl where libc has no fcntl64 */                               \
	X(int, epoll_ctl, (int, int, int, struct epoll_event *))                                              \
	X(int, getsockname, (int, struct sockaddr *, socklen_t *))                                            \
	X(int, getpeername, (int, struct sockaddr *, socklen_t *))                                            \
	X(int, getsockopt, (int, int, int, void *, socklen_t *))                                              \
	X(int, setsockopt, (int, int, int, const void *, socklen_t))                                          \
	X(ssize_t, sendto, (int, const void *, size_t, int, const struct sockaddr *, socklen_t))              \
	X(ssize_t, sendmsg, (int, const struct msghdr *, int))                                                \
	X(ssize_t, recvfrom, (int, void *, size_t, int, struct sockaddr *, socklen_t *))                      \
	X(ssize_t, recvmsg, (int, struct msghdr *, int))                                                      \
	/* the data path of direct descriptors (direct.c) */                                                  \
	X(ssize_t, read, (int, void *, size_t))                                                               \
	X(ssize_t, write, (int, const void *, size_t))                                                        \
	X(ssize_t, readv, (int, const struct iovec *, int))                                                   \
	X(ssize_t, writev, (int, const struct iovec *, int))                                                  \
	X(ssize_t, recv, (int, void *, size_t, int))                                                          \
	X(ssize_t, send, (int, const void *, size_t, int))                                                    \
	X(ssize_t, sendfile, (int, int, off_t *, size_t))                                                     \
	X(ssize_t, splice, (int, loff_t *, int, loff_t *, size_t, unsigned int))                              \
	X(int, ioctl, (int, unsigned long, ...))                                                              \
	X(int, shutdown, (int, int))                                                                          \
	/* readiness (direct_poll.c, direct_epoll.c) */                                                                       \
	X(int, poll, (struct pollfd *, nfds_t, int))                                                          \
	X(int, ppoll, (struct pollfd *, nfds_t, const struct timespec *, const sigset_t *))                   \
	X(int, select, (int, fd_set *, fd_set *, fd_set *, struct timeval *))                                 \
	X(int, pselect, (int, fd_set *, fd_set *, fd_set *, const struct timespec *, const sigset_t *))       \
	X(int, epoll_pwait2, (int, struct epoll_event *, int, const struct timespec *, const sigset_t *))     \
	/* the exec family (direct_exec.c) */                                                                 \
	X(int, execve, (const char *, char *const[], char *const[]))                                          \
	X(int, execv, (const char *, char *const[]))                                                          \
	X(int, execvp, (const char *, char *const[]))                                                         \
	X(int, execvpe, (const char *, char *const[], char *const[]))                                         \
	X(int, fexecve, (int, char *const[], char *const[]))

#pragma GCC visibility push(hidden)

struct shim_real {
#define SHIM_REAL_FIELD(ret, name, params) ret(*name) params;
	SHIM_CALLS(SHIM_REAL_FIELD)
#undef SHIM_REAL_FIELD
};

/* The real functions: defined and filled (once, by shim_init) in libextds.c. */
extern struct shim_real real;

#pragma GCC visibility pop

#endif

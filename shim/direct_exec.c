/*
 * direct_exec.c: owns the exec family (execve, execv, execvp, execvpe,
 * fexecve, execl, execlp, execle): before the exec, every direct
 * descriptor that survives it is handed to exnd to relay (shim-relay,
 * docs/direct.md). Uses direct.c's records (direct.h) and the control
 * client (ctl.h); no state of its own.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <unistd.h>

#include "ctl.h"
#include "direct.h"
#include "shim.h"
#include "upgrade.h"

/* ---- exec: hand inherited direct descriptors to exnd (shim-relay) ---- */

static void before_exec(void)
{
	if (!g_ndc || !g_tab)
		return;
	int saved = errno;
	upg_exec();
	for (int fd = 0; fd < g_ntab; fd++) {
		struct dconn *c = dcof(fd);
		if (!c || c->relay_asked)
			continue;
		int fl = real.fcntl(fd, F_GETFD);
		if (fl < 0 || (fl & FD_CLOEXEC))
			continue;
		char buf[512];
		struct ctl_resp resp;
		int ufd[CTL_MAXFD];
		int r = ctl_call(CTL_OP_RELAY, 0, fd, c->d.bell, buf, sizeof buf, &resp, ufd);
		close_fds(ufd);
		c->relay_asked = 1;
		if (r == CTL_OK) {
			/* other processes of the family parked on the bell
			 * look again: relay[S] sends them to V */
			direct_kick_family();
			dbg("exec: fd %d (id %llu) relayed by exnd from now on", fd, (unsigned long long)c->id);
		}
		else
			dbg("exec: fd %d (id %llu): exnd did not take the relay (%s); the new program cannot use it", fd,
			    (unsigned long long)c->id, r == CTL_NOCONN ? "no exnd" : buf);
	}
	errno = saved;
}

EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	INIT();
	before_exec();
	return real.execve(path, argv, envp);
}

EXPORT int execv(const char *path, char *const argv[])
{
	INIT();
	before_exec();
	return real.execv(path, argv);
}

EXPORT int execvp(const char *file, char *const argv[])
{
	INIT();
	before_exec();
	return real.execvp(file, argv);
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	INIT();
	before_exec();
	return real.execvpe(file, argv, envp);
}

EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	INIT();
	before_exec();
	return real.fexecve(fd, argv, envp);
}

#define EXECL_MAX 4096

/* The execl family: argv from the variadic list ap (for execle, envp
 * after its NULL), then the v form: execv (kind 'l'), execvp ('p') or
 * execve ('e'). -1 with E2BIG for more than EXECL_MAX arguments. */
static int execl_va(const char *file, const char *arg, va_list ap, char kind)
{
	char *argv[EXECL_MAX];
	int n;
	argv[0] = (char *)arg;
	for (n = 1; argv[n - 1] && n < EXECL_MAX; n++)
		argv[n] = va_arg(ap, char *);
	if (argv[n - 1]) {
		errno = E2BIG;
		return -1;
	}
	if (kind == 'e')
		return execve(file, argv, va_arg(ap, char *const *));
	if (kind == 'p')
		return execvp(file, argv);
	return execv(file, argv);
}

/* execl, execlp and execle differ only in kind; C cannot pass a variadic
 * list on, so each hands execl_va a va_list. */
#define EXECL_WRAPPER(name, kind)                                                                                      \
	EXPORT int name(const char *file, const char *arg, ...)                                                        \
	{                                                                                                              \
		va_list ap;                                                                                            \
		va_start(ap, arg);                                                                                     \
		int r = execl_va(file, arg, ap, kind);                                                                 \
		va_end(ap);                                                                                            \
		return r;                                                                                              \
	}

EXECL_WRAPPER(execl, 'l')
EXECL_WRAPPER(execlp, 'p')
EXECL_WRAPPER(execle, 'e')

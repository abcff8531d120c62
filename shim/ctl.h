/*
 * ctl.h: the shim's side of exnd's control protocol (docs/shim.md,
 * "Control protocol"): the encoding of requests and the strict decoding
 * of responses (ctlparse.c, also built alone into the test harness
 * shim/check/testdata/ctlharness.c), and the client that asks exnd one
 * question per connection (ctl.c).
 */
#ifndef EXN_SHIM_CTL_H
#define EXN_SHIM_CTL_H

#include <stddef.h>
#include <stdint.h>

#pragma GCC visibility push(hidden)

/* ---- encoding and decoding (ctlparse.c) ---- */

/* Shim protocol version: 2 names no PID (exnd asks the kernel,
 * SO_PEERCRED), shim-listen carries the listening socket, and accepts
 * are claimed out of band before a client writes. */
#define SHIM_VERSION "5" /* 5: the buffer's layout version 4, idle rings given back (docs/direct.md) */
#define SHIM_VERSION_NUM 5

enum { CTL_MODE_NONE = 0, CTL_MODE_TCP = 1, CTL_MODE_EXTDS = 2, CTL_MODE_OTHER = 3, CTL_MODE_DIRECT = 4 };

struct ctl_resp {
	int ok;                /* "ok":true */
	int mode;              /* data.mode: CTL_MODE_* */
	uint64_t version;      /* data.version, 0 if absent */
	uint64_t port;         /* data.port */
	uint64_t id;           /* data.id */
	uint64_t side;         /* data.side (mode "direct": 0 connecting, 1 accepting) */
	uint64_t ring;         /* data.ring (mode "direct": bytes per direction) */
	uint64_t hold_ms;      /* data.hold_ms (mode "tcp", reason "short_lived": skip asking this long) */
	uint64_t hold_end;     /* data.hold_end: the same hold's end, CLOCK_MONOTONIC ns (0: not given) */
	int reason_plain;      /* reason holds data.reason exactly (no escape, ASCII, fits) */
	char reason[32];       /* data.reason, "" if absent */
};

/* Requests (docs/shim.md, "Control protocol"). */
enum ctl_op { CTL_OP_HELLO, CTL_OP_LISTEN, CTL_OP_UNLISTEN, CTL_OP_CONNECT, CTL_OP_ACCEPT, CTL_OP_RELAY };

/* Decode the response line s[0..n) into r. 0, or -1 if it is not one this decoder accepts. */
int ctl_parse(const char *s, size_t n, struct ctl_resp *r);

/* shim-connect's and shim-accept's argument: relay, a direct connection
 * if exnd can make one, or "no room for the descriptors" (fdroom.c: exnd
 * counts fallback fd_limit and answers "tcp"), or the mid-stream upgrade
 * of an established connection (upgrade.c: answered "direct" or "tcp"). */
enum { CTL_SW_RELAY = 0, CTL_SW_DIRECT = 1, CTL_SW_FDLIMIT = 2, CTL_SW_UPGRADE = 3 };

/* Encode request op (arg: the port of shim-unlisten; for shim-connect and
 * shim-accept, a CTL_SW_*) into buf: its length, or -1. */
int ctl_req(char *buf, size_t size, enum ctl_op op, unsigned arg);

/* ---- the client (ctl.c) ---- */

#define CTL_MAXFD 8 /* control.MaxFDs; a direct answer has 3 (docs/direct.md) */

enum { CTL_NOCONN = -2, CTL_BROKEN = -1, CTL_OK = 0, CTL_REFUSED = 1 };

/* Close the descriptors of fds[0..CTL_MAXFD) that are >= 0 and set them to -1. */
void close_fds(int *fds);

/*
 * One request op (arg: as ctl_req's) with the optional descriptors fd and
 * fd2 (-1: none; shim-relay sends V and the bell), on
 * a fresh connection to exnd. Returns CTL_OK (ok:true, *r decoded, buf
 * holds the line, rfd the descriptors that came with it), CTL_REFUSED
 * (ok:false), CTL_NOCONN (nothing was sent) or CTL_BROKEN (no answer
 * ctl_parse accepts came). Details in ctl.c.
 */
int ctl_call(enum ctl_op op, unsigned arg, int fd, int fd2, char *buf, size_t size, struct ctl_resp *r, int *rfd);

/* ctl_call in two halves, for a request whose answer is read later
 * (upgrade.c): ctl_start sends it and returns the connection (>= 0, a
 * CLOEXEC socket) or CTL_NOCONN / CTL_BROKEN; ctl_finish reads and
 * decodes the answer and closes the connection. */
int ctl_start(enum ctl_op op, unsigned arg, int fd, int fd2, char *buf, size_t size);
int ctl_finish(int s, char *buf, size_t size, struct ctl_resp *r, int *rfd);

#pragma GCC visibility pop

#endif

/*
 * ctlparse.c: the shim's side of the control protocol's encoding
 * (docs/shim.md, "Control protocol"): owns ctl_req and ctl_parse,
 * declared in ctl.h. A unit of libextds.so that depends on nothing else
 * of the shim, so that the test harness shim/check/testdata/ctlharness.c
 * #includes it alone, to fuzz it and check it against the Go encoder and
 * decoder in isolation (shim/check/ctlparse_test.go).
 *
 * ctl_req encodes a request line. ctl_parse decodes one response line
 * (without its '\n'): a strict JSON reader for the one shape exnd writes,
 * {"ok":BOOL[,"data":{...}][,"error":STRING]}. It accepts only what Go's
 * encoding/json would decode the same way into control.Response and the
 * shim's result types (extds/shimsrv), and rejects the rest:
 *
 *   - the whole line must be valid JSON (every value is checked, also the
 *     ones skipped), with nothing after the object, nesting at most 32;
 *   - a key that matches a known key only case-insensitively (Go would
 *     take it), or that has an escape or a non-ASCII byte, is rejected;
 *     other unknown keys are skipped;
 *   - types: ok true/false/null; error string/null; data object/null;
 *     version, port, id, side, ring, hold_ms, hold_end non-negative integers that fit 64 bits (no
 *     fraction or exponent) or null; mode, reason strings or null; mode
 *     with an escape is rejected (Go would unescape it);
 *   - a repeated key: the last one counts (null leaves the value), a
 *     repeated "data" replaces the whole object, as in Go.
 *
 * No allocation; reads exactly n bytes (embedded NULs are bytes).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ctl.h"

#define CTL_MAX_DEPTH 32

struct jp {
	const unsigned char *p, *e;
};

static void jp_ws(struct jp *j)
{
	while (j->p < j->e && (*j->p == ' ' || *j->p == '\t' || *j->p == '\r' || *j->p == '\n'))
		j->p++;
}

static int jp_lit(struct jp *j, const char *w)
{
	size_t n = strlen(w);
	if ((size_t)(j->e - j->p) < n || memcmp(j->p, w, n) != 0)
		return -1;
	j->p += n;
	return 0;
}

static int is_hex(unsigned char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/*
 * A string. out (if not NULL, size outn > 0) receives its bytes as they
 * are, NUL-terminated; *plain says whether they are exactly the string's
 * value: no escape, only printable ASCII, not cut short.
 */
static int jp_str(struct jp *j, char *out, size_t outn, int *plain)
{
	size_t k = 0;
	int pl = 1;
	if (j->p >= j->e || *j->p != '"')
		return -1;
	j->p++;
	while (j->p < j->e) {
		unsigned char c = *j->p++;
		if (c == '"') {
			if (out)
				out[k] = 0;
			if (plain)
				*plain = pl;
			return 0;
		}
		if (c < 0x20)
			return -1;
		if (c == '\\') {
			if (j->p >= j->e)
				return -1;
			c = *j->p++;
			pl = 0;
			if (c == 'u') {
				if (j->e - j->p < 4)
					return -1;
				for (int i = 0; i < 4; i++)
					if (!is_hex(j->p[i]))
						return -1;
				j->p += 4;
			} else if (c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' && c != 'n' && c != 'r' &&
				   c != 't') {
				return -1;
			}
			continue;
		}
		if (c >= 0x7f)
			pl = 0;
		if (out) {
			if (k + 1 < outn)
				out[k++] = (char)c;
			else
				pl = 0;
		}
	}
	return -1;
}

/* A number; *u gets its value and *isint whether it is a u64 (no sign, fraction, exponent, overflow). */
static int jp_num(struct jp *j, uint64_t *u, int *isint)
{
	int in = 1;
	uint64_t v = 0;
	if (j->p < j->e && *j->p == '-') {
		in = 0;
		j->p++;
	}
	if (j->p >= j->e || *j->p < '0' || *j->p > '9')
		return -1;
	if (*j->p == '0') {
		j->p++;
	} else {
		while (j->p < j->e && *j->p >= '0' && *j->p <= '9') {
			unsigned d = *j->p++ - '0';
			if (v > (UINT64_MAX - d) / 10)
				in = 0;
			else
				v = v * 10 + d;
		}
	}
	if (j->p < j->e && *j->p == '.') {
		in = 0;
		j->p++;
		if (j->p >= j->e || *j->p < '0' || *j->p > '9')
			return -1;
		while (j->p < j->e && *j->p >= '0' && *j->p <= '9')
			j->p++;
	}
	if (j->p < j->e && (*j->p == 'e' || *j->p == 'E')) {
		in = 0;
		j->p++;
		if (j->p < j->e && (*j->p == '+' || *j->p == '-'))
			j->p++;
		if (j->p >= j->e || *j->p < '0' || *j->p > '9')
			return -1;
		while (j->p < j->e && *j->p >= '0' && *j->p <= '9')
			j->p++;
	}
	*u = in ? v : 0;
	*isint = in;
	return 0;
}

/* Any value, checked and skipped. */
static int jp_skip(struct jp *j, int depth)
{
	uint64_t u;
	int in;
	if (depth > CTL_MAX_DEPTH)
		return -1;
	jp_ws(j);
	if (j->p >= j->e)
		return -1;
	switch (*j->p) {
	case '"':
		return jp_str(j, NULL, 0, NULL);
	case 't':
		return jp_lit(j, "true");
	case 'f':
		return jp_lit(j, "false");
	case 'n':
		return jp_lit(j, "null");
	case '[':
	case '{': {
		int obj = *j->p == '{';
		unsigned char close = obj ? '}' : ']';
		j->p++;
		jp_ws(j);
		if (j->p < j->e && *j->p == close) {
			j->p++;
			return 0;
		}
		for (;;) {
			if (obj) {
				jp_ws(j);
				if (jp_str(j, NULL, 0, NULL) < 0)
					return -1;
				jp_ws(j);
				if (jp_lit(j, ":") < 0)
					return -1;
			}
			if (jp_skip(j, depth + 1) < 0)
				return -1;
			jp_ws(j);
			if (j->p >= j->e)
				return -1;
			if (*j->p == ',') {
				j->p++;
				continue;
			}
			if (*j->p != close)
				return -1;
			j->p++;
			return 0;
		}
	}
	}
	return jp_num(j, &u, &in);
}

/* An object key: 0 and key in buf (which it fits), or -1 (invalid, escaped, non-ASCII). */
static int jp_key(struct jp *j, char *buf, size_t n)
{
	int plain;
	jp_ws(j);
	if (jp_str(j, buf, n, &plain) < 0 || !plain)
		return -1;
	jp_ws(j);
	return jp_lit(j, ":");
}

static int ascii_casecmp(const char *a, const char *b)
{
	for (;; a++, b++) {
		char x = *a, y = *b;
		if (x >= 'A' && x <= 'Z')
			x += 'a' - 'A';
		if (y >= 'A' && y <= 'Z')
			y += 'a' - 'A';
		if (x != y)
			return 1;
		if (!x)
			return 0;
	}
}

/* Which of keys[] k is: its index, -1 for an unknown key, -2 for a case variant of a known one. */
static int key_index(const char *k, const char *const *keys, int n)
{
	for (int i = 0; i < n; i++) {
		if (strcmp(k, keys[i]) == 0)
			return i;
		if (ascii_casecmp(k, keys[i]) == 0)
			return -2;
	}
	return -1;
}

static int jp_is_null(struct jp *j)
{
	jp_ws(j);
	return jp_lit(j, "null") == 0;
}

/* An object's members: fn(j, index of the key or -1) reads each value. */
static int jp_obj(struct jp *j, const char *const *keys, int nkeys, int (*fn)(struct jp *, int, struct ctl_resp *),
		  struct ctl_resp *r)
{
	char key[32];
	jp_ws(j);
	if (jp_lit(j, "{") < 0)
		return -1;
	jp_ws(j);
	if (jp_lit(j, "}") == 0)
		return 0;
	for (;;) {
		if (jp_key(j, key, sizeof key) < 0)
			return -1;
		int i = key_index(key, keys, nkeys);
		if (i == -2)
			return -1;
		if (i == -1 ? jp_skip(j, 1) < 0 : fn(j, i, r) < 0)
			return -1;
		jp_ws(j);
		if (jp_lit(j, ",") == 0)
			continue;
		return jp_lit(j, "}");
	}
}

static const char *const data_keys[] = {"version", "port", "id", "mode", "reason", "side", "ring", "hold_ms", "hold_end"};

static int data_member(struct jp *j, int i, struct ctl_resp *r)
{
	if (jp_is_null(j))
		return 0;
	if (i <= 2 || i >= 5) {
		uint64_t v;
		int in;
		jp_ws(j);
		if (jp_num(j, &v, &in) < 0 || !in)
			return -1;
		uint64_t *dst[] = {&r->version, &r->port, &r->id, NULL, NULL, &r->side, &r->ring, &r->hold_ms, &r->hold_end};
		*dst[i] = v;
		return 0;
	}
	if (i == 3) {
		char m[8];
		int plain;
		const unsigned char *s = j->p;
		if (jp_str(j, m, sizeof m, &plain) < 0)
			return -1;
		for (const unsigned char *q = s; q < j->p; q++)
			if (*q == '\\')
				return -1; /* Go would unescape it */
		if (!plain)
			r->mode = CTL_MODE_OTHER;
		else if (m[0] == 0)
			r->mode = CTL_MODE_NONE; /* "": as absent, in Go too */
		else if (strcmp(m, "extds") == 0)
			r->mode = CTL_MODE_EXTDS;
		else if (strcmp(m, "tcp") == 0)
			r->mode = CTL_MODE_TCP;
		else if (strcmp(m, "direct") == 0)
			r->mode = CTL_MODE_DIRECT;
		else
			r->mode = CTL_MODE_OTHER;
		return 0;
	}
	return jp_str(j, r->reason, sizeof r->reason, &r->reason_plain);
}

static const char *const top_keys[] = {"ok", "data", "error"};

static int top_member(struct jp *j, int i, struct ctl_resp *r)
{
	if (i == 0) {
		if (jp_is_null(j))
			return 0;
		if (jp_lit(j, "true") == 0) {
			r->ok = 1;
			return 0;
		}
		if (jp_lit(j, "false") == 0) {
			r->ok = 0;
			return 0;
		}
		return -1;
	}
	if (i == 2)
		return jp_is_null(j) ? 0 : jp_str(j, NULL, 0, NULL);
	/* data: a new one replaces the old entirely */
	r->mode = CTL_MODE_NONE;
	r->version = r->port = r->id = r->side = r->ring = r->hold_ms = r->hold_end = 0;
	r->reason[0] = 0;
	r->reason_plain = 1;
	if (jp_is_null(j))
		return 0;
	return jp_obj(j, data_keys, (int)(sizeof data_keys / sizeof data_keys[0]), data_member, r);
}

/* Decode the response line s[0..n) into r. 0, or -1 if it is not one this decoder accepts. */
int ctl_parse(const char *s, size_t n, struct ctl_resp *r)
{
	struct jp j = {(const unsigned char *)s, (const unsigned char *)s + n};
	memset(r, 0, sizeof *r);
	r->reason_plain = 1;
	if (jp_obj(&j, top_keys, 3, top_member, r) < 0)
		return -1;
	jp_ws(&j);
	return j.p == j.e ? 0 : -1;
}

/* Requests (docs/shim.md, "Control protocol"; enum ctl_op in ctl.h). */

/* Encode request op (arg: the port of shim-unlisten; for shim-connect and
 * shim-accept, nonzero asks for a direct connection) into buf: its
 * length, or -1. */
int ctl_req(char *buf, size_t size, enum ctl_op op, unsigned arg)
{
	int n;
	switch (op) {
	case CTL_OP_HELLO:
		n = snprintf(buf, size, "shim-hello " SHIM_VERSION "\n");
		break;
	case CTL_OP_LISTEN:
		n = snprintf(buf, size, "shim-listen\n");
		break;
	case CTL_OP_UNLISTEN:
		if (arg == 0 || arg > 65535)
			return -1;
		n = snprintf(buf, size, "shim-unlisten %u\n", arg);
		break;
	case CTL_OP_CONNECT:
	case CTL_OP_ACCEPT: {
		static const char *const how[] = {[CTL_SW_RELAY] = "", [CTL_SW_DIRECT] = " direct", [CTL_SW_FDLIMIT] = " fd_limit",
						   [CTL_SW_UPGRADE] = " upgrade"};
		if (arg > CTL_SW_UPGRADE)
			return -1;
		n = snprintf(buf, size, "%s%s\n", op == CTL_OP_CONNECT ? "shim-connect" : "shim-accept", how[arg]);
		break;
	}
	case CTL_OP_RELAY: /* carries V (docs/direct.md, "exec") */
		n = snprintf(buf, size, "shim-relay\n");
		break;
	default:
		return -1;
	}
	return n < 0 || (size_t)n >= size ? -1 : n;
}

/*
 * ctlharness: drives the shim's control encoding (shim/ctlparse.c, a unit
 * of libextds.so that needs nothing else of it; #included here alone)
 * for shim/check/ctlparse_test.go.
 *
 *   ctlharness parse   stdin: records (u32 little-endian length, bytes);
 *                      stdout: one line per record, "ERR" or
 *                      "OK ok=%d mode=%d version=%llu port=%llu id=%llu side=%llu ring=%llu hold=%llu plain=%d reason=%s"
 *   ctlharness req     stdout: every request ctl_req encodes, one per line,
 *                      as "OP ARG <encoded line>" ("ERR" where it refuses)
 */
#include "ctlparse.c"

#include <stdlib.h>

static int parse_loop(void)
{
	static char buf[1 << 20];
	for (;;) {
		unsigned char h[4];
		if (fread(h, 1, 4, stdin) != 4)
			return 0;
		size_t n = (size_t)h[0] | (size_t)h[1] << 8 | (size_t)h[2] << 16 | (size_t)h[3] << 24;
		if (n > sizeof buf)
			return 2;
		/* an exact-size heap copy, so that a read past the end is caught
		 * (-fsanitize=address) */
		char *in = malloc(n ? n : 1);
		if (!in || fread(in, 1, n, stdin) != n)
			return 2;
		struct ctl_resp r;
		if (ctl_parse(in, n, &r) < 0)
			printf("ERR\n");
		else
			printf("OK ok=%d mode=%d version=%llu port=%llu id=%llu side=%llu ring=%llu hold=%llu end=%llu plain=%d reason=%s\n",
			       r.ok, r.mode, (unsigned long long)r.version, (unsigned long long)r.port,
			       (unsigned long long)r.id, (unsigned long long)r.side, (unsigned long long)r.ring,
			       (unsigned long long)r.hold_ms, (unsigned long long)r.hold_end,
			       r.reason_plain, r.reason_plain ? r.reason : "");
		free(in);
		fflush(stdout);
	}
}

int main(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "parse") == 0)
		return parse_loop();
	if (argc == 2 && strcmp(argv[1], "req") == 0) {
		static const struct {
			enum ctl_op op;
			unsigned arg;
		} reqs[] = {{CTL_OP_HELLO, 0},	   {CTL_OP_LISTEN, 0},	      {CTL_OP_UNLISTEN, 1},    {CTL_OP_UNLISTEN, 8080},
			    {CTL_OP_UNLISTEN, 65535}, {CTL_OP_UNLISTEN, 0},	      {CTL_OP_UNLISTEN, 65536}, {CTL_OP_CONNECT, 0},
			    {CTL_OP_ACCEPT, 0},	   {CTL_OP_CONNECT, 1},	      {CTL_OP_ACCEPT, 1},	 {CTL_OP_CONNECT, 2}, {CTL_OP_ACCEPT, 2}, {CTL_OP_CONNECT, 3}, {CTL_OP_ACCEPT, 3}, {CTL_OP_CONNECT, 4}, {CTL_OP_RELAY, 0},	      {(enum ctl_op)99, 0}};
		for (size_t i = 0; i < sizeof reqs / sizeof reqs[0]; i++) {
			char line[64];
			int n = ctl_req(line, sizeof line, reqs[i].op, reqs[i].arg);
			printf("%d %u %s", (int)reqs[i].op, reqs[i].arg, n < 0 ? "ERR\n" : line);
		}
		return 0;
	}
	fprintf(stderr, "usage: ctlharness parse|req\n");
	return 2;
}

/*
 * dring_test_ends.c: the dring_test cases about how waits end without
 * data (#included by dring_test.c, one compilation unit: it uses that
 * file's struct conn, side_fork, pair, reap and hooks): a SIGKILLed
 * peer with exnd's fin or rst, exnd's death and its own reset, a peer
 * whose bell is gone, shutdown waking its own process's parked threads
 * through the fan-out, and the relay flag.
 */

/* ---- death ---- */

/* Side 0 writes forever (blocks on the full ring); side 1 reads a little
 * and is SIGKILLed. The main process, as exnd, sees E1 hang up and stores
 * rst (arg 1) or fin + rd_closed (arg 0): the writer is not left hanging. */
static void endless_writer(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	int how = *(int *)arg;
	static char buf[1 << 16];
	ssize_t r;
	while ((r = dring_write(d, buf, sizeof buf, 0)) > 0)
		;
	CHECK(r == (how ? -ECONNRESET : -EPIPE), "writer got %zd", r);
}

static void killed_reader(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	(void)arg;
	char buf[1000];
	for (int i = 0; i < 10; i++)
		CHECK(dring_read(d, buf, sizeof buf, 0) > 0);
	raise(SIGKILL);
}

static void test_death(int how)
{
	struct conn c;
	conn_make(&c, 1 << 16);
	pid_t pa = side_fork(&c, 0, endless_writer, &how), pb = side_fork(&c, 1, killed_reader, NULL);
	close(c.v[1]); /* only side 1's process holds V1 now */
	c.v[1] = -1;
	int st;
	CHECK(waitpid(pb, &st, 0) == pb && WIFSIGNALED(st));
	struct pollfd p = {c.e[1], POLLIN, 0};
	CHECK(poll(&p, 1, 5000) == 1 && (p.revents & POLLHUP), "E hangs up at the last close");
	if (how) {
		__atomic_store_n(&ctl(&c, 0)->rst, 1, __ATOMIC_SEQ_CST);
		__atomic_store_n(&ctl(&c, 1)->rst, 1, __ATOMIC_SEQ_CST);
		char b = 1; /* exnd of side 1 rings side 0 with its copy of bell 1 */
		CHECK(write(c.bell[1], &b, 1) == 1);
	} else {
		__atomic_store_n(&ctl(&c, 1)->fin, 1, __ATOMIC_SEQ_CST);
		__atomic_store_n(&ctl(&c, 0)->rd_closed, 1, __ATOMIC_SEQ_CST);
		if (__atomic_load_n(&ctl(&c, 0)->prod_wait, __ATOMIC_SEQ_CST)) {
			char b = 1;
			CHECK(write(c.bell[1], &b, 1) == 1);
		}
	}
	reap(pa, "writer");
	conn_free(&c);
}

/* exnd dies: V hangs up, a parked reader fails with ECONNRESET. */
static void orphan_reader(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	(void)arg;
	char b;
	CHECK(dring_read(d, &b, 1, 0) == -ECONNRESET, "V hung up");
	CHECK(__atomic_load_n(&d->out->rst, __ATOMIC_ACQUIRE), "rst set for the peer");
}

/* A reader of side 0 parks on an empty ring; then end (exnd's part) ends its wait. */
static void parked_reader_ended(void (*reader)(struct conn *, struct dring *, void *), void (*end)(struct conn *))
{
	struct conn c;
	conn_make(&c, 4096);
	pid_t pa = side_fork(&c, 0, reader, NULL);
	usleep(50000);
	end(&c);
	reap(pa, "reader");
	conn_free(&c);
}

static void exnd_dies(struct conn *c)
{
	close(c->e[0]);
	c->e[0] = -1;
}

static void test_exnd_death(void) { parked_reader_ended(orphan_reader, exnd_dies); }

/* exnd resets its own program's connection: it cannot ring its own
 * side's bell, so it stores rst and shuts E for writing (V readable). */
static void exnd_resets(struct conn *c)
{
	__atomic_store_n(&ctl(c, 0)->rst, 1, __ATOMIC_SEQ_CST);
	__atomic_store_n(&ctl(c, 1)->rst, 1, __ATOMIC_SEQ_CST);
	CHECK(shutdown(c->e[0], SHUT_WR) == 0);
}

static void test_exnd_reset(void) { parked_reader_ended(orphan_reader, exnd_resets); }

/* The peer side closes every copy of its bell without a fin: the parked
 * reader's bell reads EOF, and the connection is reset. */
static void quitter(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	(void)d;
	(void)arg;
	usleep(50000);
}

static void test_peer_gone(void)
{
	struct conn c;
	conn_make(&c, 4096);
	pid_t pa = side_fork(&c, 0, orphan_reader, NULL), pb = side_fork(&c, 1, quitter, NULL);
	close(c.bell[1]); /* exnd's copy of side 1's bell */
	c.bell[1] = -1;
	reap(pb, "quitter");
	reap(pa, "reader");
	conn_free(&c);
}

/* ---- one process, several threads on the one bell ---- */

struct selfwake {
	struct dring *d;
	ssize_t got;
	int write;
};

static void *blocked_call(void *arg)
{
	struct selfwake *w = arg;
	static char big[1 << 14];
	char b;
	w->got = w->write ? dring_write(w->d, big, sizeof big, 0) : dring_read(w->d, &b, 1, 0);
	if (w->write && w->got > 0) /* the first call filled the ring; this one parks */
		w->got = dring_write(w->d, big, sizeof big, 0);
	return NULL;
}

/* A writer parked on a full ring and a reader parked on an empty one, in
 * two threads; a third thread's shutdown(SHUT_WR) must end the write
 * (EPIPE) and its shutdown(SHUT_RD) the read (0) at once, though nobody
 * can ring their own bell: the fan-out kicks them. */
static void selfwake_a(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	(void)arg;
	struct selfwake w = {d, 1, 1}, r = {d, 1, 0};
	pthread_t tw, tr;
	CHECK(pthread_create(&tw, NULL, blocked_call, &w) == 0);
	CHECK(pthread_create(&tr, NULL, blocked_call, &r) == 0);
	usleep(100000);
	int k0 = __atomic_load_n(&g_fanouts, __ATOMIC_RELAXED);
	long t0 = ms_now();
	dring_fin(d);
	CHECK(pthread_join(tw, NULL) == 0);
	CHECK(w.got == -EPIPE, "parked writer after SHUT_WR: %zd", w.got);
	dring_shut_rd(d);
	CHECK(pthread_join(tr, NULL) == 0);
	CHECK(r.got == 0, "parked reader after SHUT_RD: %zd", r.got);
	CHECK(ms_now() - t0 < 1000, "took %ld ms", ms_now() - t0);
	CHECK(__atomic_load_n(&g_fanouts, __ATOMIC_RELAXED) > k0, "no fan-out kicked them");
}

static void selfwake_b(struct conn *c, struct dring *d, void *arg)
{
	(void)arg;
	/* never reads until side 0's fin is there: its writer stays parked */
	while (!__atomic_load_n(&d->in->fin, __ATOMIC_ACQUIRE))
		usleep(1000);
	static char buf[1 << 14];
	ssize_t n, total = 0;
	while ((n = dring_read(d, buf, sizeof buf, 0)) > 0)
		total += n;
	CHECK(n == 0 && total == (ssize_t)c->ring, "read %zd then %zd", total, n);
	dring_fin(d);
}

/* ---- relay after exec ---- */

static void relayed_reader(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	(void)arg;
	char b;
	CHECK(dring_read(d, &b, 1, 0) == -DRING_RELAYED, "relay[S] ends a parked read");
	CHECK(dring_write(d, &b, 1, 0) == -DRING_RELAYED);
	CHECK(read(d->v, &b, 1) == 1 && b == 'r', "V carries the stream now");
}

/* exnd sets relay[0] and sends the first relayed byte over V. */
static void exnd_relays(struct conn *c)
{
	__atomic_store_n((uint32_t *)(c->map + 64), 1, __ATOMIC_SEQ_CST);
	CHECK(write(c->e[0], "r", 1) == 1);
}

static void test_relay(void) { parked_reader_ended(relayed_reader, exnd_relays); }


/* ---- waits on the upgrade word (dring_wait_upg) ---- */

/* Side 0 waits for bit 4 of the upgrade word (a grant), and a second
 * time for a bit that never comes: side 1 (the engine's part across
 * hosts) sets the first and rings, then resets. */
static void upg_waiter(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	(void)arg;
	long t0 = ms_now();
	CHECK(dring_wait_upg(d, 4) == 0, "the grant ends the wait");
	CHECK(ms_now() - t0 >= 50, "waited for it");
	CHECK(__atomic_load_n(dring_upg(d), __ATOMIC_ACQUIRE) & 4);
	CHECK(dring_wait_upg(d, 4) == 0, "a bit already set: at once");
	CHECK(dring_wait_upg(d, 1u << 20) == -ECONNRESET, "a reset ends the wait");
}

static void upg_granter(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	(void)arg;
	usleep(100000);
	__atomic_fetch_or(dring_upg(d), 4, __ATOMIC_SEQ_CST);
	dring_kick(d);
	usleep(100000);
	dring_rst(d);
}

/* exnd dies while side 0 waits for a grant: V hangs up. */
static void upg_orphan(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	(void)arg;
	CHECK(dring_wait_upg(d, 4) == -ECONNRESET, "V hung up");
}

static void test_upg_wait(void)
{
	pair(4096, upg_waiter, upg_granter, NULL);
	parked_reader_ended(upg_orphan, exnd_dies);
}

/* ---- waits for room (dring_wait_space) ---- */

/* Side 0 fills its ring, waits for room (side 1 reads after 100 ms),
 * finds it at once while there is some, and after side 1's reset gets
 * -ECONNRESET; a non-blocking wait on a full ring says -EAGAIN. */
static void space_waiter(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	(void)arg;
	static char buf[4096];
	CHECK(dring_wait_space(d, 0) == 4096, "an empty ring: all its room");
	CHECK(dring_write(d, buf, sizeof buf, 0) == 4096);
	CHECK(dring_wait_space(d, DRING_NONBLOCK) == -EAGAIN, "full, non-blocking");
	long t0 = ms_now();
	long sp = dring_wait_space(d, 0);
	CHECK(sp > 0 && sp <= 4096, "the reader's read ends the wait (%ld)", sp);
	CHECK(ms_now() - t0 >= 50, "waited for it");
	CHECK(dring_write(d, buf, (size_t)sp, 0) == sp);
	CHECK(dring_wait_space(d, 0) == -ECONNRESET, "a reset ends the wait");
}

static void space_reader(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	(void)arg;
	static char buf[4096];
	usleep(100000);
	CHECK(dring_read(d, buf, 1000, 0) == 1000);
	usleep(100000);
	dring_rst(d);
}

/* After the peer's SHUT_RD (rd_closed) the wait says -EPIPE. */
static void space_closed(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	(void)arg;
	usleep(50000);
	CHECK(dring_wait_space(d, 0) == -EPIPE, "the reader is gone");
}

static void space_closer(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	(void)arg;
	dring_rd_closed(d);
	usleep(100000);
}

static void test_space_wait(void)
{
	pair(4096, space_waiter, space_reader, NULL);
	pair(4096, space_closed, space_closer, NULL);
}


/* ---- exnd's reclaim holds the producer lock (EXDD_LOCK_RECLAIM) ---- */

/* hold_lock sets side 0's producer lock to v, and a child lets it go
 * after 50 ms as exnd's reclaim does (0, then wake every waiter). */
static pid_t hold_lock(uint32_t *l, uint32_t v)
{
	__atomic_store_n(l, v, __ATOMIC_SEQ_CST);
	pid_t p = fork();
	CHECK(p >= 0);
	if (p == 0) {
		usleep(50000);
		__atomic_store_n(l, 0, __ATOMIC_SEQ_CST);
		syscall(SYS_futex, l, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
		_exit(0);
	}
	return p;
}

/* A writer's hold makes a non-blocking write fail with EAGAIN; a
 * reclaim's is waited out, by a non-blocking write too (an empty ring
 * never says EAGAIN), and by a blocking one. */
static void reclaim_writer(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	(void)arg;
	uint32_t *l = &d->out->prod_lock;
	__atomic_store_n(l, 1, __ATOMIC_SEQ_CST);
	CHECK(dring_write(d, "x", 1, DRING_NONBLOCK) == -EAGAIN, "a writer holds the lock");
	__atomic_store_n(l, 0, __ATOMIC_SEQ_CST);
	for (int flags = DRING_NONBLOCK; flags >= 0; flags -= DRING_NONBLOCK) {
		pid_t p = hold_lock(l, EXDD_LOCK_RECLAIM);
		long t0 = ms_now();
		ssize_t r = dring_write(d, "abc", 3, flags);
		CHECK(r == 3, "flags %d: a reclaim's hold is waited out (%zd)", flags, r);
		CHECK(ms_now() - t0 >= 40, "flags %d: waited for it", flags);
		CHECK(__atomic_load_n(l, __ATOMIC_SEQ_CST) == 0, "flags %d: let go", flags);
		reap(p, "releaser");
	}
	dring_fin(d);
}

static void reclaim_reader(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	(void)arg;
	char buf[8] = {0};
	CHECK(dring_read(d, buf, 6, DRING_WAITALL) == 6);
	CHECK(memcmp(buf, "abcabc", 6) == 0, "read %.6s", buf);
	CHECK(dring_read(d, buf, 1, 0) == 0, "then EOF");
}

static void test_reclaim_lock(void) { pair(4096, reclaim_writer, reclaim_reader, NULL); }

/* exnd dies while its reclaim holds side 0's producer lock: the writer
 * that waits for it looks at V and fails with ECONNRESET, not for ever. */
static void stuck_writer(struct conn *c, struct dring *d, void *arg)
{
	(void)c;
	(void)arg;
	long t0 = ms_now();
	CHECK(dring_write(d, "x", 1, DRING_NONBLOCK) == -ECONNRESET, "V hung up while the reclaim held the lock");
	CHECK(ms_now() - t0 < 5000, "bounded");
}

static void test_reclaim_dead(void)
{
	struct conn c;
	conn_make(&c, 4096);
	__atomic_store_n(&ctl(&c, 0)->prod_lock, EXDD_LOCK_RECLAIM, __ATOMIC_SEQ_CST);
	pid_t pa = side_fork(&c, 0, stuck_writer, NULL);
	usleep(80000);
	exnd_dies(&c);
	reap(pa, "writer");
	conn_free(&c);
}

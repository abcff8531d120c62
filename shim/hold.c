/*
 * hold.c: holds for short-lived connections in the shim (docs/shim.md,
 * "Short connections"): owns g_held; shares held_peer, hold_peer,
 * held_listener and hold_listener via hold.h (calls.c uses them).
 *
 * exnd answers a shim-connect or shim-accept "tcp", reason short_lived,
 * with hold_ms and hold_end when the server's listener port is on hold:
 * its connections close too soon after they are set up to gain from
 * EXT-DS. For hold_ms, and never past hold_end (the same end on the
 * host's CLOCK_MONOTONIC, so that the time the answer took to reach us
 * is not added), the shim then makes such connections plain TCP without
 * asking exnd at all:
 *
 *   - connect: g_held, the servers (address, port) on hold; a connect to
 *     one of them is the real connect and nothing else. EXTDS_MODE=force
 *     never skips (exnd refuses the connection, as any other fallback);
 *   - accept: fdent.hold_until of the listening descriptor; an accept on
 *     it is the real accept and nothing else.
 *
 * exnd ends every hold it tells a shim HoldMargin (10 ms) before the
 * server's exnd stops declining (extds/hold.go), so a skipping side never
 * meets a side that asks and waits for it.
 *
 * State: plain memory under the table lock, per process (a forked child
 * inherits a copy and learns on its own); never held across a call.
 */
#define _GNU_SOURCE
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "hold.h"
#include "shim.h"

#define HELD_MAX 64 /* servers on hold remembered; a full table replaces the entry that ends first */

struct held {
	uint64_t until; /* CLOCK_MONOTONIC ns; 0: free */
	uint16_t family, port;
	uint8_t addr[16];
};

static struct held g_held[HELD_MAX];

/* The key of an AF_INET/AF_INET6 address: 0, or -1 for another family. */
static int held_key(const struct sockaddr *sa, uint16_t *family, uint16_t *port, uint8_t addr[16])
{
	memset(addr, 0, 16);
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const void *)sa;
		memcpy(addr, &in->sin_addr, 4);
		*port = in->sin_port;
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const void *)sa;
		memcpy(addr, &in6->sin6_addr, 16);
		*port = in6->sin6_port;
	} else {
		return -1;
	}
	*family = sa->sa_family;
	return 0;
}

/* The entry of a server in g_held (lock held), or NULL. */
static struct held *held_find_locked(uint16_t family, uint16_t port, const uint8_t addr[16])
{
	for (int i = 0; i < HELD_MAX; i++) {
		struct held *h = &g_held[i];
		if (h->until && h->family == family && h->port == port && memcmp(h->addr, addr, 16) == 0)
			return h;
	}
	return NULL;
}

/* Whether connections to sa are on hold now (the caller checked its
 * length covers its family). */
int held_peer(const struct sockaddr *sa)
{
	uint16_t family, port;
	uint8_t addr[16];
	if (held_key(sa, &family, &port, addr) < 0)
		return 0;
	uint64_t now = (uint64_t)mono_ns();
	int r = 0;
	lock();
	struct held *h = held_find_locked(family, port, addr);
	if (h && now < h->until)
		r = 1;
	else if (h)
		h->until = 0;
	unlock();
	return r;
}

/* The end of a hold of ms milliseconds that exnd said ends at end
 * (CLOCK_MONOTONIC ns, 0: not said): the earlier of the two, or 0 if it
 * has ended already. */
static uint64_t hold_until(uint64_t ms, uint64_t end)
{
	if (ms > 60000)
		ms = 60000; /* exnd says at most 2 s (extds.MaxHold); a bound for a forged answer */
	uint64_t now = (uint64_t)mono_ns(), until = now + ms * 1000000ull;
	if (end && end < until)
		until = end;
	return until > now ? until : 0;
}

/* Remember that connections to sa stay plain TCP for ms milliseconds,
 * until end at the latest. */
void hold_peer(const struct sockaddr *sa, uint64_t ms, uint64_t end)
{
	uint16_t family, port;
	uint8_t addr[16];
	if (!ms || held_key(sa, &family, &port, addr) < 0)
		return;
	uint64_t until = hold_until(ms, end);
	if (!until)
		return;
	lock();
	struct held *slot = held_find_locked(family, port, addr);
	if (!slot) { /* not known: a free entry (until 0) or the one that ends first */
		slot = &g_held[0];
		for (int i = 1; i < HELD_MAX; i++)
			if (g_held[i].until < slot->until)
				slot = &g_held[i];
	}
	slot->until = until;
	slot->family = family;
	slot->port = port;
	memcpy(slot->addr, addr, 16);
	unlock();
}

/* Whether accepts on listener lfd are on hold now. */
int held_listener(int lfd)
{
	int r = 0;
	lock();
	struct fdent *e = ent(lfd);
	if (e && (e->flags & F_LISTEN) && e->hold_until) {
		if ((uint64_t)mono_ns() < e->hold_until)
			r = 1;
		else
			e->hold_until = 0;
	}
	unlock();
	return r;
}

/* Keep accepts on listener lfd plain TCP for ms milliseconds, until end
 * at the latest. */
void hold_listener(int lfd, uint64_t ms, uint64_t end)
{
	uint64_t until = ms ? hold_until(ms, end) : 0;
	if (!until)
		return;
	lock();
	struct fdent *e = ent(lfd);
	if (e && (e->flags & F_LISTEN))
		e->hold_until = until;
	unlock();
}

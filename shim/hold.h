/*
 * hold.h: holds for short-lived connections (hold.c; docs/shim.md,
 * "Short connections"), as calls.c asks and records them.
 */
#ifndef EXN_SHIM_HOLD_H
#define EXN_SHIM_HOLD_H

#include <stdint.h>
#include <sys/socket.h>

#pragma GCC visibility push(hidden)

/* Whether connections to sa are on hold now (the caller checked its
 * length covers its family). */
int held_peer(const struct sockaddr *sa);

/* Remember that connections to sa stay plain TCP for ms milliseconds,
 * until end (CLOCK_MONOTONIC ns, 0: not said) at the latest. */
void hold_peer(const struct sockaddr *sa, uint64_t ms, uint64_t end);

/* Whether accepts on listener lfd are on hold now. */
int held_listener(int lfd);

/* Keep accepts on listener lfd plain TCP for ms milliseconds, until end
 * at the latest. */
void hold_listener(int lfd, uint64_t ms, uint64_t end);

#pragma GCC visibility pop

#endif

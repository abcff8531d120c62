/*
 * shmfab: the data plane of the shm fabric (fabric/shm) in C, for a
 * process attached to a node another process owns (shm.Attach in Go).
 * The memory layout and the protocols are the versioned ABI written down
 * in docs/shm-abi.md; fabric/shm/layout.go is its source of truth and
 * fabric/shm/cabi_test.go checks this library against the Go
 * implementation in both directions.
 *
 * Properties: no threads, no global state, no constructors; every
 * descriptor is O_CLOEXEC; every word read from shared memory is
 * validated before it is used as a size, an offset or a state, and a bad
 * one is counted (stats.corrupt) and survived. Functions return 0 or a
 * count on success and a negative errno on failure:
 *
 *   -EINVAL      bad argument (fabric.ErrInvalid)
 *   -EHOSTDOWN   the node or the owner is down (fabric.ErrPeerDown)
 *   -ENOENT      no such node, or the VPID is not open (fabric.ErrUnknownNode)
 *   -EADDRINUSE  VPID or grant already in use (fabric.ErrInUse)
 *   -EPROTO      a file of the wrong magic or layout version
 *   -ETIMEDOUT   a bounded wait ran out
 *   -ENOSPC      a fixed-size table of this library is full
 *   other        the failing system call's errno
 *
 * Concurrency: one thread at a time per shmfab_node (the caller
 * serialises); the rings themselves are lock-free across processes.
 * After fork, parent and child must not both use one node.
 */
#ifndef EXN_SHMFAB_H
#define EXN_SHMFAB_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- ABI constants (docs/shm-abi.md, fabric/shm/layout.go) ---------- */

#define SHMFAB_LAYOUT_VERSION 4u
#define SHMFAB_PAGE 4096u
#define SHMFAB_NODE_MAGIC 0x314e4d4853584e45ull   /* "ENXSHMN1" */
#define SHMFAB_VPID_MAGIC 0x31564d4853584e45ull   /* "ENXSHMV1" */
#define SHMFAB_FABRIC_MAGIC 0x31464d4853584e45ull /* "ENXSHMF1" */

/* Node file. */
#define SHMFAB_N_OFF_MAGIC 0
#define SHMFAB_N_OFF_VERSION 8
#define SHMFAB_N_OFF_NODE 12
#define SHMFAB_N_OFF_PID 16
#define SHMFAB_N_OFF_STATE 20
#define SHMFAB_N_OFF_INC 24
#define SHMFAB_N_OFF_GROUPS 32
#define SHMFAB_N_OFF_LEASES 1024
#define SHMFAB_N_OFF_REGIONS 4096
#define SHMFAB_MAX_NODE_REGIONS 4096u
#define SHMFAB_MAX_LEASES 16
#define SHMFAB_LEASE_SIZE 64
#define SHMFAB_LEASE_REGIONS 256u
#define SHMFAB_MAX_TABLE_REGIONS (SHMFAB_MAX_NODE_REGIONS + SHMFAB_MAX_LEASES * SHMFAB_LEASE_REGIONS)
#define SHMFAB_REGION_ENTRY 16
#define SHMFAB_NODE_FILE_SIZE (SHMFAB_N_OFF_REGIONS + SHMFAB_MAX_TABLE_REGIONS * SHMFAB_REGION_ENTRY)
#define SHMFAB_NODE_ALIVE 1u
#define SHMFAB_NODE_CLOSED 2u
#define SHMFAB_NODE_RECLAIMING 3u

/* Lease entry. */
#define SHMFAB_L_OFF_STATE 0
#define SHMFAB_L_OFF_HOLD 4
#define SHMFAB_L_OFF_BASE 8
#define SHMFAB_L_OFF_COUNT 12
#define SHMFAB_L_OFF_PID 16
#define SHMFAB_L_OFF_HOLDER 20
#define SHMFAB_L_OFF_SECRET 32
#define SHMFAB_LEASE_FREE 0u
#define SHMFAB_LEASE_GRANTED 1u
#define SHMFAB_LEASE_REVOKED 2u
#define SHMFAB_HOLD_NONE 0u
#define SHMFAB_HOLD_ATTACHED 1u
#define SHMFAB_HOLD_DETACHED 2u

/* Region table entry word 0: gen<<32 | valid<<8 | owner VPID; word 1: size. */
#define SHMFAB_REGION_VALID (1ull << 8)
#define SHMFAB_REGION_RESERVED 0xFFFFFE00ull
#define SHMFAB_MAX_REGION_BYTES (1ull << 30)

/* VPID file. */
#define SHMFAB_V_OFF_MAGIC 0
#define SHMFAB_V_OFF_VERSION 8
#define SHMFAB_V_OFF_NODE 12
#define SHMFAB_V_OFF_VPID 16
#define SHMFAB_V_OFF_SLOTS 20
#define SHMFAB_V_OFF_DEPTH 24
#define SHMFAB_V_OFF_STATE 28
#define SHMFAB_V_OFF_STATS 32
#define SHMFAB_V_OFF_TAIL 128
#define SHMFAB_V_OFF_DOORBELL 192
#define SHMFAB_V_OFF_SLEEPERS 196
#define SHMFAB_V_OFF_WAITMODE 200
#define SHMFAB_V_OFF_RUNG 204
#define SHMFAB_V_OFF_BELLW 208
#define SHMFAB_V_OFF_SPACE 256
#define SHMFAB_V_OFF_SPACEW 260
#define SHMFAB_V_OFF_SPACERUNG 264 /* u32: 1 once the consumer rang the space bell since a sender cleared it */
#define SHMFAB_V_OFF_NTAIL 320
#define SHMFAB_V_OFF_MAILBOX 4096
#define SHMFAB_VPID_OPEN 1u
#define SHMFAB_VPID_CLOSED 2u
#define SHMFAB_WAIT_FUTEX 0u
#define SHMFAB_WAIT_BELL 1u
#define SHMFAB_VSTAT_OVERFLOW 0
#define SHMFAB_VSTAT_KIND 1 /* + kind - 1 */
#define SHMFAB_VSTAT_ERR 4  /* + err - 1 */
#define SHMFAB_MIN_SLOTS 2u
#define SHMFAB_MAX_SLOTS 65536u
#define SHMFAB_DEFAULT_SLOTS 1024u
#define SHMFAB_MIN_DEPTH 4096u
#define SHMFAB_MAX_DEPTH 262144u

/* Mailbox slot: 8-byte status word, then up to 120 payload bytes. */
#define SHMFAB_SLOT_SIZE 128u
#define SHMFAB_MAX_PAYLOAD 120u
#define SHMFAB_SEQ_SHIFT 41
#define SHMFAB_SEQ_MASK ((1ull << 23) - 1)
#define SHMFAB_MC_FLAG (1ull << 40)
#define SHMFAB_DESC_MASK ((1ull << 40) - 1)
#define SHMFAB_LOW_MASK ((1ull << 41) - 1)
#define SHMFAB_CLAIM_MARK (0xFFull << 32)

/* Notification entry: status u64, 16-byte body, claimer u64 (node + 1). */
#define SHMFAB_NOTIFY_ENTRY 32u
#define SHMFAB_NOTIFY_RESERVED (0xFFull << 56)

/* RMA. */
#define SHMFAB_OP_PUT 1
#define SHMFAB_OP_GET 2
#define SHMFAB_NOTIFY_REQUESTER 1
#define SHMFAB_NOTIFY_COMPLETER 2
#define SHMFAB_NOTIFY_RESPONDER 4
#define SHMFAB_KIND_REQUESTER 1
#define SHMFAB_KIND_COMPLETER 2
#define SHMFAB_KIND_RESPONDER 3
#define SHMFAB_NERR_NONE 0
#define SHMFAB_NERR_ACCESS 1
#define SHMFAB_NERR_BOUNDS 2
#define SHMFAB_NERR_PEERDOWN 3
#define SHMFAB_RMA_MTU 496u
#define SHMFAB_MAX_RMA_LEN (8u << 20)
#define SHMFAB_NLA_OFFSET_BITS 40

/* ---- Wake-up budgets (docs/shm-abi.md "Wake-up protocol") ----------- */

/* SHMFAB_SPIN_NS: how long shmfab_wait (and a sender facing a full
 * mailbox) polls, without yielding, before it parks: the Go side's
 * spinBudget (fabric/shm/endpoint.go), about what a park and a doorbell
 * wake-up cost (docs/wakeup.md). */
#define SHMFAB_SPIN_NS 5000
/* A sender blocked on a full mailbox: SHMFAB_SPIN_NS of polling, then
 * futex sleeps of SHMFAB_SEND_SLICE_NS on the target's space word, with
 * the target's liveness (a flock probe) and the deadline checked between
 * slices: a SIGKILLed target is reported within one slice. */
#define SHMFAB_SEND_SLICE_NS 2000000
/* A claimed slot never published is skipped after this long unless its
 * claimer is probed dead first (fabric/shm/ring.go orphanTimeout). */
#define SHMFAB_ORPHAN_NS 1000000000ll

/* ---- API -------------------------------------------------------------- */

typedef struct shmfab_node shmfab_node;
typedef struct shmfab_ep shmfab_ep;

struct shmfab_msg {
	uint16_t node; /* source (recv) or target (send) */
	uint8_t vpid;
	uint8_t tag;
	uint8_t len; /* 0..120 */
	uint8_t mc;  /* arrived by multicast */
	uint8_t data[SHMFAB_MAX_PAYLOAD];
};

struct shmfab_note {
	uint8_t kind, op, err;
	uint16_t node; /* the other endpoint */
	uint8_t vpid;
	uint32_t len;
	uint64_t local; /* LastFrame(...) on this endpoint, Table 3.1 */
};

struct shmfab_rma {
	uint8_t op;     /* SHMFAB_OP_PUT / SHMFAB_OP_GET */
	uint8_t notify; /* SHMFAB_NOTIFY_* */
	uint16_t node;  /* peer */
	uint8_t vpid;
	uint32_t len; /* 1..8 MiB */
	uint64_t local, remote;
};

/* Counters of this process (not shared). */
struct shmfab_stats {
	uint64_t velo_sent, velo_recv, send_blocked;
	uint64_t rma_posted, rma_bytes, rma_faults; /* faults: error notifications */
	uint64_t notes_recv;
	uint64_t corrupt;     /* bad words found in shared memory: dropped, repaired or skipped */
	uint64_t invalid;     /* calls refused with -EINVAL */
	uint64_t peer_down;   /* calls that ended with -EHOSTDOWN */
	uint64_t bell_sleeps; /* waits parked in poll() on the doorbell FIFO */
	uint64_t futex_sleeps;
	uint64_t bell_rings; /* bytes written to consumers' FIFOs */
	uint64_t ring_failed;
	uint64_t futex_wakes;
};

/* shmfab_attach attaches this process to node `node` of fabric `fabric`
 * (files in dir, NULL: /dev/shm) with a grant from the node's owner:
 * token "s<slot>.<inc>.<secret>", VPIDs base..base+count-1. It checks the
 * node file's magic and layout version (-EPROTO on a mismatch), that the
 * owner holds its node-file lock and says alive (-EHOSTDOWN), that the
 * lease is granted with the token's secret, base and count to this PID
 * (-EINVAL), and takes the lease's attach file (-EADDRINUSE if another
 * process holds it). */
int shmfab_attach(const char *dir, const char *fabric, uint16_t node, const char *token,
                  unsigned base, unsigned count, shmfab_node **out);
/* shmfab_detach closes every endpoint and region of the attachment,
 * marks the lease detached and drops the attach file. */
void shmfab_detach(shmfab_node *n);
/* shmfab_owner_alive: 0 while the owner holds its lock, says alive and
 * the lease still carries our secret; -EHOSTDOWN otherwise. */
int shmfab_owner_alive(shmfab_node *n);
/* shmfab_alive: 0 if node id is up (flock probe of its node file). */
int shmfab_alive(shmfab_node *n, uint16_t id);
void shmfab_get_stats(shmfab_node *n, struct shmfab_stats *s);

/* shmfab_open creates VPID v of the grant (VPID file and doorbell FIFO;
 * slots 0: SHMFAB_DEFAULT_SLOTS). */
int shmfab_open(shmfab_node *n, unsigned v, unsigned slots, shmfab_ep **out);
/* shmfab_close marks the VPID closed (blocked senders stop), releases
 * its regions and unlinks its files. */
void shmfab_close(shmfab_ep *e);
unsigned shmfab_ep_vpid(const shmfab_ep *e);
/* shmfab_bell_fd is the descriptor a caller may poll() for POLLIN
 * between announcing sleep and parking (see shmfab_wait); -1 in futex
 * mode. */
int shmfab_bell_fd(const shmfab_ep *e);

/* shmfab_send sends one message; a full mailbox blocks it for up to
 * timeout_ms (<0: no limit), returning -ETIMEDOUT, -EHOSTDOWN if the
 * target node dies or closes, -ENOENT if the target VPID closes. */
int shmfab_send(shmfab_ep *e, uint16_t node, unsigned vpid, uint8_t tag, const void *p, size_t len,
                int timeout_ms);
/* shmfab_recv takes up to n messages; returns how many (0: none). */
int shmfab_recv(shmfab_ep *e, struct shmfab_msg *msgs, int n);
/* shmfab_poll takes up to n notifications; returns how many. */
int shmfab_poll(shmfab_ep *e, struct shmfab_note *ns, int n);
/* shmfab_wait returns 0 once a message or notification is ready,
 * -ETIMEDOUT after timeout_ms (<0: no limit). It spins SHMFAB_SPIN_NS,
 * then parks in poll() on the doorbell FIFO. */
int shmfab_wait(shmfab_ep *e, int timeout_ms);
/* shmfab_ready: nonzero if recv or poll would return something. */
int shmfab_ready(shmfab_ep *e);

/* shmfab_register registers size bytes (1..1 GiB) to e: a region file
 * of the lease's block, published in the owner's region table. */
int shmfab_register(shmfab_ep *e, size_t size, uint64_t *nla, void **buf);
int shmfab_deregister(shmfab_ep *e, uint64_t nla);
/* shmfab_post runs one RMA request to completion (single copy by this
 * process). Local faults are -EINVAL and nothing happens; remote faults
 * (access, bounds, peer down) are a requester error notification. */
int shmfab_post(shmfab_ep *e, const struct shmfab_rma *r);

/* Pure helpers, exported for tests. */
uint64_t shmfab_last_frame(uint64_t start, uint32_t len);
int shmfab_decode_note(const uint8_t body[16], struct shmfab_note *out);
void shmfab_encode_note(const struct shmfab_note *nt, uint8_t body[16]);

#ifdef __cplusplus
}
#endif
#endif

//go:build ofi && cgo

// unpark.c: which fi_getinfo entries exn can park on (cgo_open.c's
// exn_getinfo calls it for RDM endpoints).

#include <string.h>
#include "unpark.h"

// exn_drop_unparkable drops the entries of *list that exn could never
// park on: those built on libfabric's native TCP engine (xnet: the "net"
// provider of 1.17, alone or under rxm; "tcp" in 1.18, which made xnet
// its tcp provider) before 1.19. Its fi_trywait is a no-op there, so the
// completion queue's wait signal is never reset, the wait fd stays
// readable, and the background goroutine would spin: two idle ofi:net
// NICs woke 1.3 million times a second here (docs/fabric-ofi.md,
// "Providers exn cannot park on"). Returns 0, or EXN_UNPARKABLE when no
// entry is left.
static int exn_xnet(const struct fi_info *i, uint32_t v) {
	const char *p = i->fabric_attr ? i->fabric_attr->prov_name : NULL;
	const char *core = v < FI_VERSION(1, 18) ? "net" : "tcp";
	size_t n = strlen(core);
	if (i->ep_attr && i->ep_attr->protocol == FI_PROTO_XNET) return 1;
	return p && strncmp(p, core, n) == 0 && (p[n] == 0 || p[n] == ';');
}
int exn_drop_unparkable(struct fi_info **list) {
	uint32_t v = fi_version();
	if (v >= FI_VERSION(1, 19)) return 0;
	struct fi_info **at = list;
	int kept = 0;
	while (*at) {
		struct fi_info *i = *at;
		if (!exn_xnet(i, v)) {
			kept++;
			at = &i->next;
			continue;
		}
		*at = i->next;
		i->next = NULL;
		fi_freeinfo(i);
	}
	return kept ? 0 : EXN_UNPARKABLE;
}

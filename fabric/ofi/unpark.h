// unpark.h: the ABI between unpark.c and the rest of the C glue (cgo.h
// includes it; cgo.go reads EXN_UNPARKABLE).

#ifndef EXN_UNPARK_H
#define EXN_UNPARK_H

#include <rdma/fabric.h>

// EXN_UNPARKABLE is exn_drop_unparkable's answer when no entry is left.
#define EXN_UNPARKABLE (-100001)

// exn_drop_unparkable drops the entries of *list that exn could never
// park on (unpark.c); 0 or EXN_UNPARKABLE.
int exn_drop_unparkable(struct fi_info **list);

#endif

package extds

import (
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
)

// TestDeclineClaim: an acceptor that cannot take EXT-DS (the shim short
// of descriptors, docs/direct.md "Descriptors") settles its connection
// as plain TCP with DeclineClaim, whether the client's CLAIM came before
// or comes after: the client is declined at once, not after the claim
// timeout, falls back "declined", and nothing precedes its bytes.
func TestDeclineClaim(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	for _, claimFirst := range []bool{true, false} {
		t.Run(map[bool]string{true: "claim before the decline", false: "decline before the claim"}[claimFirst], func(t *testing.T) {
			p, _, cl, sv := claimConn(t)
			start := time.Now()
			c := settleClaim(t, p, cl, claimFirst, func() { p.devB.DeclineClaim(tupleOf(sv)) })
			defer c.Close()
			if took := time.Since(start); took >= DefaultClaimTimeout {
				t.Fatalf("the decline took %v: the CLAIM waited out the claim timeout", took)
			}
			wantFallback(t, c, sv, FallbackDeclined)
		})
	}
}

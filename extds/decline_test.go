package extds

import (
	"io"
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
			p := newPair(t)
			ln, _ := claimListener(t, p)
			cl, sv := shadowPair(t, ln)
			defer sv.Close()
			type result struct {
				c   *Conn
				err error
			}
			done := make(chan result, 1)
			start := time.Now()
			upgrade := func() {
				c, err := p.dialer.Upgrade(t.Context(), cl)
				done <- result{c, err}
			}
			if claimFirst {
				served := p.devB.Stats().ProbesServed
				go upgrade()
				for end := time.Now().Add(10 * time.Second); p.devB.Stats().ProbesServed == served; {
					if time.Now().After(end) {
						t.Fatal("the client's CLAIM never reached the server's exnd")
					}
					time.Sleep(time.Millisecond)
				}
				p.devB.DeclineClaim(tupleOf(sv))
			} else {
				p.devB.DeclineClaim(tupleOf(sv))
				go upgrade()
			}
			r := <-done
			if r.err != nil {
				t.Fatal(r.err)
			}
			defer r.c.Close()
			if took := time.Since(start); took >= DefaultClaimTimeout {
				t.Fatalf("the decline took %v: the CLAIM waited out the claim timeout", took)
			}
			if why, ok := r.c.FallbackReason(); r.c.Mode() != ModeTCP || !ok || why != FallbackDeclined {
				t.Fatalf("client: mode %v, reason %v (%v); want TCP, declined", r.c.Mode(), why, ok)
			}
			if _, err := io.WriteString(r.c, "app bytes"); err != nil {
				t.Fatal(err)
			}
			if _, peeked := peekFirst(t, sv, HelloPrefixLen); string(peeked) != "app " {
				t.Fatalf("server saw %q first: something was written before the app", peeked)
			}
		})
	}
}

package extds

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
)

// TestOfferDirectUpgrade drives the upgrade's agreement (OfferDirect on
// the client's side, ClaimDirect and AgreeUpgrade on the acceptor's, as
// extds/shimsrv/upgrade.go does) for an established connection that is
// in use meanwhile: both orders of arrival, and a client that asks again
// after its first CLAIM went unanswered (the later CLAIM replaces it: the
// acceptor answers that one, not the stale one). Every case agrees the
// same buffer on both sides and leaves the application's bytes, written
// before and after, alone in the stream.
func TestOfferDirectUpgrade(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	made := DirectInfo{Node: nodeB, Token: 0x2235, ID: 1 << 41, Ring: 1 << 16}
	tests := []struct {
		name        string
		claimAfter  time.Duration // the acceptor claims this long after the client's first offer
		firstOffers int           // offers before the one that is answered (each times out)
	}{
		{name: "client-first", claimAfter: 200 * time.Millisecond},
		{name: "acceptor-first", claimAfter: -200 * time.Millisecond},
		{name: "client-asks-again", claimAfter: UpgradeClaimTimeout + 300*time.Millisecond, firstOffers: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t)
			ln := testenv.ListenTCP(t)
			unreg, err := p.devB.RegisterClaimPort(uint16(ln.Addr().(*net.TCPAddr).Port))
			if err != nil {
				t.Fatal(err)
			}
			defer unreg()
			cli, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			srv, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			if _, err := cli.Write([]byte("before|")); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()

			type res struct {
				di  *DirectInfo
				why FallbackReason
				err error
			}
			acc := make(chan res, 1)
			claim := func() {
				cl, woke := claimWoke(p.devB, tupleOf(srv))
				defer cl.Close()
				if !cl.DirectPending() {
					select {
					case <-woke:
					case <-time.After(2 * UpgradeClaimTimeout):
						acc <- res{why: FallbackNoClaim}
						return
					}
				}
				di, aborted, err := cl.AgreeUpgrade(ctx, func() (DirectInfo, error) { return made, nil }, nil)
				r := res{di: di, err: err}
				if aborted {
					r.why = FallbackDirectAbort
				}
				acc <- r
			}
			la := cli.LocalAddr().(*net.TCPAddr).AddrPort()
			ra := cli.RemoteAddr().(*net.TCPAddr).AddrPort()
			open := func(*DirectInfo) error { return nil }
			start := time.Now()
			if tc.claimAfter < 0 {
				go claim()
				time.Sleep(-tc.claimAfter)
			} else {
				time.AfterFunc(tc.claimAfter, claim)
			}
			for i := 0; i < tc.firstOffers; i++ {
				di, why, err := p.devA.OfferDirect(ctx, la, ra, open)
				if err != nil || di != nil || why != FallbackNoClaim {
					t.Fatalf("offer %d: %+v, %v, %v; want no_claim", i+1, di, why, err)
				}
			}
			di, why, err := p.devA.OfferDirect(ctx, la, ra, open)
			sr := <-acc
			t.Logf("agreed after %v", time.Since(start).Round(time.Millisecond))
			if err != nil || sr.err != nil || di == nil || sr.di == nil || *di != made || *sr.di != made {
				t.Fatalf("client %+v %v %v, acceptor %+v; want both %+v", di, why, err, sr, made)
			}
			if _, err := cli.Write([]byte("after")); err != nil {
				t.Fatal(err)
			}
			cli.(*net.TCPConn).CloseWrite()
			got, err := io.ReadAll(srv)
			if err != nil || string(got) != "before|after" {
				t.Fatalf("stream %q, %v; want the application's bytes alone", got, err)
			}
		})
	}
}

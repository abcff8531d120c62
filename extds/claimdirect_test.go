package extds

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/exn-project/exn/extds/internal/agree"
	"github.com/exn-project/exn/extds/internal/wire"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/sys"
	"github.com/exn-project/exn/internal/testenv"
)

// claimDirectResult is what the emulated acceptor got.
type claimDirectResult struct {
	c   *Conn
	di  *DirectInfo
	err error
	tcp net.Conn // the accepted socket
}

// acceptClaimDirect accepts one connection on ln and decides it the way
// exnd's shim server does for a shimmed acceptor that makes direct
// connections (extds/shimsrv/switch.go): ClaimDirect, wait for the
// CLAIM, AgreeDirect; when create failed, the client's hello follows on
// the stream and AcceptShadowDirect answers it.
func acceptClaimDirect(t testing.TB, dev *Device, ln net.Listener, create func() (DirectInfo, error)) <-chan claimDirectResult {
	ch := make(chan claimDirectResult, 1)
	go func() {
		r := claimDirectResult{}
		defer func() { ch <- r }()
		if r.tcp, r.err = ln.Accept(); r.err != nil {
			return
		}
		cl, woke := claimWoke(dev, tupleOf(r.tcp))
		defer cl.Close()
		if !cl.DirectPending() {
			select {
			case <-woke:
			case <-time.After(10 * time.Second):
				r.err = errors.New("no direct CLAIM came")
				return
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r.c, r.di, r.err = cl.AgreeDirect(ctx, r.tcp, create, nil)
		if r.c == nil && r.di == nil && r.err == nil {
			r.c, r.di, r.err = dev.AcceptShadowDirect(ctx, r.tcp, []byte(wire.MagicHello), create)
		}
	}()
	return ch
}

// claimWoke is dev.ClaimDirect(key) with a wake that signals the
// channel it returns.
func claimWoke(dev *Device, key TupleKey) (*Claim, <-chan struct{}) {
	woke := make(chan struct{}, 1)
	return dev.ClaimDirect(key, func() {
		select {
		case woke <- struct{}{}:
		default:
		}
	}), woke
}

// TestClaimDirect drives the direct agreement over the fabric
// (internal/agree/claimdirect.go) through each of its outcomes, and
// checks that nothing was ever written into the TCP connection unless
// the ordinary handshake ran, and that the application's bytes pass
// intact when the outcome is plain TCP.
func TestClaimDirect(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	errCreate := errors.New("no space")
	errOpen := errors.New("cannot open")
	made := DirectInfo{Node: nodeB, Token: 0x1235, ID: 1 << 40, Ring: 1 << 16}
	// Across hosts (CLAIM_RDIRECT, COMMIT_R): the acceptor names its
	// engine connection and buffer, the client's open its own.
	remote := made
	remote.Remote, remote.NLA = true, fabric.MakeNLA(3, 0x100)
	client := remote
	client.ClientID, client.ClientNLA = 1<<41|7, fabric.MakeNLA(5, 0x200)
	accepted := client // the acceptor also learns the client's node
	accepted.ClientNode = nodeA
	tests := []struct {
		name      string
		fill      *DirectInfo // the client's open fills in ClientID and ClientNLA from it
		want      *DirectInfo // wantDI: what both sides get (nil: made)
		claimTO   time.Duration
		create    func() (DirectInfo, error)
		openErr   error
		openWait  time.Duration // the client's open takes this long
		noCommit  bool          // the acceptor gives up waiting for COMMIT
		wantDI    bool          // both sides direct
		wantModes Mode          // otherwise: both sides' Conn mode
		wantWhy   string        // client's fallback reason (ModeTCP)
		wantBytes bool          // the ordinary handshake wrote into the stream
	}{
		{name: "commit", create: func() (DirectInfo, error) { return made, nil }, wantDI: true},
		{name: "open-fails", create: func() (DirectInfo, error) { return made, nil }, openErr: errOpen, wantModes: ModeTCP, wantWhy: "direct_abort"},
		{name: "late-answer", claimTO: 50 * time.Millisecond, create: func() (DirectInfo, error) {
			time.Sleep(300 * time.Millisecond) // the client gave up long ago
			return made, nil
		}, wantModes: ModeTCP, wantWhy: "no_claim"},
		// The client's exnd stalls past the handshake timeout: the
		// acceptor fails the connection (shimsrv then resets the buffer
		// the client has opened: TestDirectNoCommitResets there).
		{name: "no-commit", create: func() (DirectInfo, error) { return made, nil }, openWait: 400 * time.Millisecond, noCommit: true},
		{name: "create-fails", create: func() (DirectInfo, error) { return DirectInfo{}, errCreate }, wantModes: ModeEXTDS, wantBytes: true},
		{name: "remote-commit", create: func() (DirectInfo, error) { return remote, nil }, fill: &client, want: &client, wantDI: true},
		// A client whose open names no engine connection cannot join a
		// cross-host one: it aborts, and both stay TCP.
		{name: "remote-open-names-nothing", create: func() (DirectInfo, error) { return remote, nil }, wantModes: ModeTCP, wantWhy: "direct_abort"},
		{name: "remote-open-fails", create: func() (DirectInfo, error) { return remote, nil }, fill: &client, openErr: errOpen, wantModes: ModeTCP, wantWhy: "direct_abort"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var opts []Option
			if tc.claimTO != 0 {
				opts = append(opts, WithClaimTimeout(tc.claimTO))
			}
			if tc.noCommit {
				opts = append(opts, WithHandshakeTimeout(100*time.Millisecond))
			}
			p := newPair(t, opts...)
			ln := testenv.ListenTCP(t)
			unreg, err := p.devB.RegisterClaimPort(uint16(ln.Addr().(*net.TCPAddr).Port))
			if err != nil {
				t.Fatal(err)
			}
			defer unreg()
			srvc := acceptClaimDirect(t, p.devB, ln, tc.create)
			tc0, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer tc0.Close()
			var opened *DirectInfo
			open := func(di *DirectInfo) error {
				if tc.fill != nil {
					di.ClientID, di.ClientNLA = tc.fill.ClientID, tc.fill.ClientNLA
				}
				cp := *di
				opened = &cp
				time.Sleep(tc.openWait)
				return tc.openErr
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			cc, cdi, cerr := p.dialer.UpgradeDirect(ctx, tc0, open)
			sr := <-srvc
			if sr.tcp != nil {
				defer sr.tcp.Close()
			}
			if tc.noCommit {
				if cerr != nil || cdi == nil || !errors.Is(sr.err, agree.ErrNoCommit) {
					t.Fatalf("client %+v, %v; server %v; want direct, and agree.ErrNoCommit", cdi, cerr, sr.err)
				}
				return
			}
			if cerr != nil || sr.err != nil {
				t.Fatalf("client %v, server %v", cerr, sr.err)
			}
			if cc != nil {
				defer cc.Close()
			}
			if sr.c != nil {
				defer sr.c.Close()
			}
			if tc.wantDI {
				want := made
				if tc.want != nil {
					want = *tc.want
				}
				wantSrv := want
				if tc.want == &client {
					wantSrv = accepted
				}
				if cdi == nil || sr.di == nil || *cdi != want || *sr.di != wantSrv || opened == nil {
					t.Fatalf("direct: client %+v, server %+v, opened %+v; want %+v and %+v", cdi, sr.di, opened, want, wantSrv)
				}
				if n := p.devB.Stats().DirectAgreed; n != 1 {
					t.Errorf("DirectAgreed %d, want 1", n)
				}
			} else {
				if cdi != nil || sr.di != nil || cc == nil || sr.c == nil {
					t.Fatalf("client %v %+v, server %v %+v; want connections", cc, cdi, sr.c, sr.di)
				}
				if cc.Mode() != tc.wantModes || sr.c.Mode() != tc.wantModes {
					t.Fatalf("modes %v/%v, want %v", cc.Mode(), sr.c.Mode(), tc.wantModes)
				}
				if why, _ := cc.FallbackReason(); tc.wantModes == ModeTCP && why.String() != tc.wantWhy {
					t.Errorf("client fallback %v, want %s", why, tc.wantWhy)
				}
				if tc.wantWhy == "direct_abort" {
					testenv.Eventually(t, "the server to count the abort", 5*time.Second, func() bool {
						return p.devB.Stats().Fallbacks["direct_abort"] == 1
					})
				}
			}
			// Bytes the TCP connection carried so far: none unless the
			// ordinary handshake ran.
			out, in, err := sys.TCPBytes(tc0.(*net.TCPConn))
			if err != nil {
				t.Fatal(err)
			}
			if moved := out > 0 || in > 0; moved != tc.wantBytes {
				t.Fatalf("TCP carried %d bytes out, %d in; want bytes: %v", out, in, tc.wantBytes)
			}
			if tc.wantDI {
				return
			}
			// The application's stream, whatever the mode.
			if err := testenv.Carry(cc, sr.c, []byte("the application's own first bytes")); err != nil {
				t.Fatal(err)
			}
		})
	}
}

package extds

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"golang.org/x/net/nettest"

	"github.com/exn-project/exn/internal/testenv"
)

func TestNetConn(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		p := newPair(t)
		c, s := p.conns(t)
		return c, s, func() {
			c.Close()
			s.Close()
		}, nil
	})
}

func TestHTTPOverListener(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t)
	body := strings.Repeat("extds-", 20000) // 120 KB: ring path
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Got", http.StatusText(200))
		io.WriteString(w, body[:len(body)-len(b)]+string(b))
	})}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(p.ln) }()
	tr := &http.Transport{DialContext: p.dialer.Dial}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr}
	for i := 0; i < 5; i++ {
		resp, err := cl.Post("http://"+p.ln.Addr().String()+"/x", "text/plain", strings.NewReader("hello"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != len(body) || !strings.HasSuffix(string(b), "hello") {
			t.Fatalf("response %d bytes, want %d", len(b), len(body))
		}
	}
	tr.CloseIdleConnections()
	srv.Close()
	<-done
	if st := p.devA.Stats(); st.ConnsEXTDS == 0 || st.ConnsTCP != 0 {
		t.Fatalf("client conns extds %d tcp %d", st.ConnsEXTDS, st.ConnsTCP)
	}
}

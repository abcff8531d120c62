package extds

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/extds/internal/wire"
	"github.com/exn-project/exn/internal/testenv"
)

// chunkReader returns data in reads of the sizes given, cycling.
type chunkReader struct {
	data  []byte
	sizes []int
	i     int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(r.data), r.sizes[r.i%len(r.sizes)])
	r.i++
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

// readerOnly hides a WriterTo (bytes.Reader has one) so io.Copy uses the
// destination's ReadFrom.
type readerOnly struct{ io.Reader }

func copySizes() (total int) {
	if testenv.Small() {
		return 3<<20 + 17
	}
	return 12<<20 + 17
}

// TestReadFromWriteToContent: io.Copy into a Conn (its ReadFrom, from a
// source with small, threshold-sized and large reads) and out of one (its
// WriteTo) carries the bytes in order, checked by sha256, in both
// directions; ReadFrom used both VELO (small reads) and the ring.
func TestReadFromWriteToContent(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	for _, ring := range []int{DefaultRingSize, wire.MinRingSize} {
		t.Run(map[int]string{DefaultRingSize: "default-ring", wire.MinRingSize: "min-ring"}[ring], func(t *testing.T) {
			p := newPair(t, WithRingSize(ring))
			c, s := p.openConns(t)
			for dir, ends := range [][2]*Conn{{c, s}, {s, c}} {
				w, r := ends[0], ends[1]
				data := randBytes(copySizes(), uint64(dir+1))
				src := &chunkReader{data: data, sizes: []int{1, 480, 481, 5000, 70000, 300 << 10, 100, 2 << 20}}
				errc := make(chan error, 1)
				go func() {
					n, err := io.Copy(w, readerOnly{src})
					if err == nil && n != int64(len(data)) {
						err = errors.New("short copy")
					}
					if err == nil {
						err = w.CloseWrite()
					}
					errc <- err
				}()
				h := sha256.New()
				n, err := io.Copy(h, r) // r.WriteTo: returns nil at EOF
				if err != nil || n != int64(len(data)) {
					t.Fatalf("dir %d: WriteTo %d of %d bytes: %v", dir, n, len(data), err)
				}
				if err := <-errc; err != nil {
					t.Fatalf("dir %d: ReadFrom: %v", dir, err)
				}
				want := sha256.Sum256(data)
				if !bytes.Equal(h.Sum(nil), want[:]) {
					t.Fatalf("dir %d: sha256 mismatch", dir)
				}
			}
			st := p.devA.Stats()
			if st.TxVELOBytes == 0 || st.TxRMABytes == 0 {
				t.Errorf("ReadFrom paths: velo %d rma %d bytes; want both", st.TxVELOBytes, st.TxRMABytes)
			}
		})
	}
}

// TestReadFromWriteToMixed: ReadFrom between Writes, Read before WriteTo,
// and a ZCopy WriteBuffer taken by WriteTo keep the stream in order.
func TestReadFromWriteToMixed(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t, WithZCopy(ZCopyRead, 4096))
	c, s := p.openConns(t)
	zsize := zcChunk + 4567
	buf, err := c.RegisteredBuffer(zsize)
	if err != nil {
		t.Fatal(err)
	}
	data := randBytes(3*zsize, 99)
	copy(buf.Bytes(), data[zsize:2*zsize])
	errc := make(chan error, 1)
	go func() {
		errc <- func() error {
			if _, err := c.Write(data[:100]); err != nil {
				return err
			}
			if _, err := c.ReadFrom(&chunkReader{data: data[100:zsize], sizes: []int{7, 9000}}); err != nil {
				return err
			}
			if _, err := c.WriteBuffer(buf, 0, zsize); err != nil { // ZCopy: blocks until read
				return err
			}
			if _, err := c.ReadFrom(bytes.NewReader(data[2*zsize : 3*zsize])); err != nil {
				return err
			}
			return c.CloseWrite()
		}()
	}()
	head := make([]byte, 1000)
	if _, err := io.ReadFull(s, head); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	got.Write(head)
	if _, err := s.WriteTo(&got); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("stream differs (%d of %d bytes)", got.Len(), len(data))
	}
	if st := p.devA.Stats(); st.TxZCopyBytes != uint64(zsize) {
		t.Fatalf("zcopy bytes %d, want %d", st.TxZCopyBytes, zsize)
	}
}

// TestReadFromWriteToTCP: both methods on connections that fell back to
// TCP (client side: no listener; server side: a plain client) move the
// same bytes.
func TestReadFromWriteToTCP(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t)
	// A plain server: sha256 of everything until EOF, then the hex sum.
	addr := testenv.ServeTCP(t, func(c net.Conn) {
		h := sha256.New()
		if _, err := io.Copy(h, c); err != nil {
			return
		}
		io.WriteString(c, hex.EncodeToString(h.Sum(nil)))
	})
	c, err := p.dialer.DialConn(t.Context(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Mode() != ModeTCP {
		t.Fatalf("mode %v, want tcp", c.Mode())
	}
	data := randBytes(copySizes(), 5)
	if n, err := c.ReadFrom(&chunkReader{data: data, sizes: []int{1, 70000}}); err != nil || n != int64(len(data)) {
		t.Fatalf("ReadFrom %d, %v", n, err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	if _, err := c.WriteTo(&got); err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(data)
	if got.String() != hex.EncodeToString(want[:]) {
		t.Fatalf("server's sha256 %q, want %x", got.String(), want)
	}

	// Server side: a plain client's bytes through WriteTo, an answer
	// through ReadFrom.
	pc, err := net.Dial("tcp", p.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	sc, err := p.ln.AcceptConn()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if sc.Mode() != ModeTCP {
		t.Fatalf("server mode %v, want tcp", sc.Mode())
	}
	go func() {
		pc.Write(data[:100000])
		pc.(*net.TCPConn).CloseWrite()
	}()
	var in bytes.Buffer
	if n, err := sc.WriteTo(&in); err != nil || !bytes.Equal(in.Bytes(), data[:100000]) {
		t.Fatalf("server WriteTo %d, %v, equal %v", n, err, bytes.Equal(in.Bytes(), data[:100000]))
	}
	go func() {
		sc.ReadFrom(bytes.NewReader(data[:5000]))
		sc.CloseWrite()
	}()
	back, err := io.ReadAll(pc)
	if err != nil || !bytes.Equal(back, data[:5000]) {
		t.Fatalf("plain client read %d bytes, %v", len(back), err)
	}
}

// endless is an io.Reader of zeros that never ends.
type endless struct{}

func (endless) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// TestReadFromWriteToDeadlines: a ReadFrom whose peer does not read stops
// at the write deadline after filling the peer's buffers; a WriteTo with
// nothing to read stops at the read deadline. Both leave the connection
// usable.
func TestReadFromWriteToDeadlines(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t)
	c, s := p.openConns(t)
	c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	start := time.Now()
	n, err := c.ReadFrom(endless{})
	if !errors.Is(err, os.ErrDeadlineExceeded) || n < int64(DefaultRingSize) {
		t.Fatalf("ReadFrom = %d, %v; want >= ring size, deadline exceeded", n, err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("ReadFrom took %v", el)
	}
	s.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	got, err := io.Copy(io.Discard, io.LimitReader(s, n)) // drain with Read
	if err != nil || got != n {
		t.Fatalf("drained %d of %d: %v", got, n, err)
	}
	s.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := s.WriteTo(io.Discard); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("WriteTo with nothing to read: %v, want deadline exceeded", err)
	}
	// Still usable.
	c.SetWriteDeadline(time.Time{})
	s.SetReadDeadline(time.Time{})
	if _, err := c.ReadFrom(bytes.NewReader([]byte("after"))); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 5)
	if _, err := io.ReadFull(s, b); err != nil || string(b) != "after" {
		t.Fatalf("after deadlines: %q, %v", b, err)
	}
}

// blockWriter blocks in Write until released.
type blockWriter struct {
	in      chan struct{}
	release chan struct{}
}

func (w *blockWriter) Write(p []byte) (int, error) {
	select {
	case w.in <- struct{}{}:
	default:
	}
	<-w.release
	return len(p), nil
}

// TestReadFromWriteToClose: Close unblocks ReadFrom and WriteTo waiting
// for credits or data with net.ErrClosed, does not wait for a ReadFrom in
// its source's Read or a WriteTo in its destination's Write (they return
// net.ErrClosed when those return), and a peer's reset reaches both.
func TestReadFromWriteToClose(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	waitErr := func(t *testing.T, errc chan error, want error) {
		t.Helper()
		if err := testenv.Within(t, "the call after Close", errc, 5*time.Second); !errors.Is(err, want) {
			t.Fatalf("got %v, want %v", err, want)
		}
	}
	// inSourceRead leaves the client's ReadFrom inside its source's Read
	// (a pipe, which has given it "first" already); the server end and
	// the pipe are closed at the end of the test.
	inSourceRead := func(t *testing.T) (*pair, *Conn, *io.PipeWriter, chan error) {
		t.Helper()
		p := newPair(t)
		c, s := p.conns(t)
		t.Cleanup(func() { s.Close() })
		pr, pw := io.Pipe()
		t.Cleanup(func() { pw.Close() })
		errc := make(chan error, 1)
		go func() { _, err := c.ReadFrom(pr); errc <- err }()
		pw.Write([]byte("first")) // ReadFrom is reading from the pipe
		time.Sleep(20 * time.Millisecond)
		return p, c, pw, errc
	}
	t.Run("readfrom-waiting-for-credits", func(t *testing.T) {
		p := newPair(t)
		c, s := p.conns(t)
		defer s.Close()
		errc := make(chan error, 1)
		go func() { _, err := c.ReadFrom(endless{}); errc <- err }()
		time.Sleep(50 * time.Millisecond)
		c.Close()
		waitErr(t, errc, net.ErrClosed)
	})
	t.Run("readfrom-in-source-read", func(t *testing.T) {
		_, c, pw, errc := inSourceRead(t)
		closed := make(chan struct{})
		go func() { c.Close(); close(closed) }()
		testenv.Within(t, "Close with ReadFrom in its source", closed, 5*time.Second)
		go pw.Write(make([]byte, 10000)) // the source returns now
		waitErr(t, errc, net.ErrClosed)
	})
	t.Run("device-close-waits-for-source", func(t *testing.T) {
		// Device.Close closes the endpoints, which on shm unmaps the
		// rings: it waits (bounded) for a ReadFrom in its source's Read.
		p, _, pw, errc := inSourceRead(t)
		closed := make(chan time.Time, 1)
		start := time.Now()
		go func() { p.devA.Close(); closed <- time.Now() }()
		const hold = 200 * time.Millisecond
		time.Sleep(hold)
		select {
		case <-closed:
			t.Fatal("Device.Close did not wait for the source Read")
		default:
		}
		go pw.Write(make([]byte, 10000))
		waitErr(t, errc, net.ErrClosed)
		at := testenv.Within(t, "Device.Close", closed, 5*time.Second)
		if el := at.Sub(start); el < hold || el > closePinWait+time.Second {
			t.Fatalf("Device.Close took %v", el)
		}
	})
	t.Run("writeto-waiting-for-data", func(t *testing.T) {
		p := newPair(t)
		c, s := p.conns(t)
		defer c.Close()
		errc := make(chan error, 1)
		go func() { _, err := s.WriteTo(io.Discard); errc <- err }()
		time.Sleep(50 * time.Millisecond)
		s.Close()
		waitErr(t, errc, net.ErrClosed)
	})
	t.Run("writeto-in-destination-write", func(t *testing.T) {
		p := newPair(t)
		c, s := p.conns(t)
		defer c.Close()
		w := &blockWriter{in: make(chan struct{}, 1), release: make(chan struct{})}
		errc := make(chan error, 1)
		go func() { _, err := s.WriteTo(w); errc <- err }()
		if _, err := c.Write(randBytes(100<<10, 3)); err != nil { // a ring chunk
			t.Fatal(err)
		}
		<-w.in
		closed := make(chan struct{})
		go func() { s.Close(); close(closed) }()
		testenv.Within(t, "Close with WriteTo in its destination", closed, 5*time.Second)
		close(w.release)
		waitErr(t, errc, net.ErrClosed)
		// Unread data at Close: the peer is reset.
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("peer read after reset: %v", err)
		}
	})
	t.Run("peer-reset", func(t *testing.T) {
		p := newPair(t)
		c, s := p.openConns(t)
		rf := make(chan error, 1)
		go func() { _, err := c.ReadFrom(endless{}); rf <- err }()
		wt := make(chan error, 1)
		go func() { _, err := c.WriteTo(io.Discard); wt <- err }()
		time.Sleep(50 * time.Millisecond)
		s.SetLinger(0)
		s.Close()
		waitErr(t, rf, syscall.ECONNRESET)
		waitErr(t, wt, syscall.ECONNRESET)
	})
}

package shimsrv

// The accepting side of a direct connection agreed over the fabric
// (extds/claimdirect.go), without waiting for the client's COMMIT: once
// CLAIM_DIRECT is sent, the program gets its end of the connection at
// once (issue #15: the COMMIT's trip and the client's opening of the
// buffer leave the accepting program's path), and exnd settles the
// client's answer in the background:
//
//	COMMIT {1}   the connection is direct: exnd drops the shadow TCP
//	             socket and its spare copy of the buffer's files.
//	COMMIT {0}   the client is plain TCP (it could not open the buffer,
//	             or it had given up): exnd attaches the buffer as the
//	             client's side itself and pumps it to and from the shadow
//	             TCP socket (pumpTCP), so the program, which sees a direct
//	             connection, exchanges exactly TCP's bytes with the client.
//	nothing      within the handshake timeout: the client may be direct on
//	             a connection exnd cannot vouch for: reset (both programs
//	             read ECONNRESET), as before.
//
// Goroutines: awaitCommit, one per offered connection, owned by the
// Server (s.wg); it runs pumpTCP's two copy loops when the client
// aborted and returns once both ended. s.ctx's end (Close) closes the
// shadow socket and the pump's endpoint, which ends them. Locks: none of
// the Server's; the endpoints lock themselves (extds/dring).

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"

	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/extds/dring"
)

// switchOffered hands the program its end of a connection offered over
// the fabric and starts awaitCommit. It takes fs, its names (name) and
// shadow over: the names stay until the client has answered (it opens
// the files by name).
func (s *Server) switchOffered(fs *dring.Files, name string, di *extds.DirectInfo, cm *extds.Commit, shadow *net.TCPConn, who control.Peer, side string, restore func()) (any, []*os.File, error) {
	spare, err := dupFiles(fs) // the client's side, should it abort
	if err != nil {
		cm.Drop()
		s.removeBuf(name)
		if ep, aerr := dring.Attach(fs, 1); aerr == nil {
			ep.Reset() // the client may commit
			ep.Close()
		}
		shadow.Close()
		restore()
		return nil, nil, err
	}
	prep, err := s.prepareDirect(fs, di, shadow, who, side) // resets on failure
	if err == nil {
		var res any
		var out []*os.File
		if res, out, err = s.enterDirect(prep); err == nil {
			s.wg.Add(1)
			go s.awaitCommit(prep.dc, cm, name, shadow, spare)
			return res, out, nil
		}
	}
	cm.Drop()
	s.removeBuf(name)
	spare.Close()
	shadow.Close()
	restore()
	return nil, nil, err
}

// removeBuf removes a buffer's names from the directory.
func (s *Server) removeBuf(name string) {
	if err := dring.Remove(s.directCfg.Dir, name); err != nil {
		s.logConn(slog.LevelWarn, "extds shim: remove direct files", "err", err)
	}
}

// dupFiles duplicates a buffer's five files.
func dupFiles(fs *dring.Files) (*dring.Files, error) {
	d := &dring.Files{}
	src := []*os.File{fs.Buf, fs.Data[0], fs.Data[1], fs.Space[0], fs.Space[1]}
	dst := []**os.File{&d.Buf, &d.Data[0], &d.Data[1], &d.Space[0], &d.Space[1]}
	for i, f := range src {
		nf, err := dupFile(f)
		if err != nil {
			d.Close()
			return nil, err
		}
		*dst[i] = nf
	}
	return d, nil
}

// awaitCommit settles an offered connection (the file comment).
func (s *Server) awaitCommit(dc *dconn, cm *extds.Commit, name string, shadow *net.TCPConn, spare *dring.Files) {
	defer s.wg.Done()
	err := cm.Wait(s.ctx)
	s.removeBuf(name) // the client has opened the files, or never will
	switch {
	case err == nil:
		shadow.Close()
		spare.Close()
	case errors.Is(err, extds.ErrDirectAborted):
		s.fallback(extds.FallbackDirectAbort.String())
		s.logConn(slog.LevelDebug, "extds shim: the client went TCP; exnd serves the direct end", "id", dc.id, "remote", dc.remote)
		s.pumpTCP(dc, spare, shadow)
	default:
		s.logConn(slog.LevelWarn, "extds shim: no COMMIT for a direct connection, reset", "id", dc.id, "remote", dc.remote, "err", err)
		s.resets.Add(1)
		dc.ep.Reset()
		shadow.Close()
		spare.Close()
	}
}

// pumpBuf is a pump's copy buffer: a 64 KiB read from either side is one
// system call, and the pump runs only for connections whose client
// aborted, so its buffers are not pooled.
const pumpBuf = 64 << 10

// pumpTCP plays the client's side of dc's buffer (side 0, from spare)
// and copies it to and from the shadow TCP socket until both directions
// have ended: the program's writes to the client, the client's bytes to
// the program; an EOF either way is passed on as a half-close, an error
// as a reset.
func (s *Server) pumpTCP(dc *dconn, spare *dring.Files, shadow *net.TCPConn) {
	ep, err := dring.Attach(spare, 0)
	if err != nil {
		s.logConn(slog.LevelWarn, "extds shim: cannot serve an aborted direct connection, reset", "id", dc.id, "err", err)
		dc.ep.Reset()
		shadow.Close()
		return
	}
	stop := context.AfterFunc(s.ctx, func() {
		ep.Reset()
		ep.Close()
		shadow.Close()
	})
	defer stop()
	done := make(chan struct{})
	go func() { // the program → the client
		defer close(done)
		_, rerr := io.CopyBuffer(shadow, onlyReader{ep}, make([]byte, pumpBuf))
		if rerr == nil {
			_ = shadow.CloseWrite() // the program's EOF
			return
		}
		_ = shadow.SetLinger(0) // reset, as TCP does after an error
		_ = shadow.CloseRead()
	}()
	// the client → the program
	if _, werr := io.CopyBuffer(onlyWriter{ep}, shadow, make([]byte, pumpBuf)); werr == nil {
		ep.CloseWrite() // the client's EOF
	} else {
		ep.Reset()
	}
	<-done
	ep.Close()
	shadow.Close()
}

// onlyReader and onlyWriter hide the endpoint's other methods from
// io.CopyBuffer (no WriterTo/ReaderFrom detours).
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

type onlyWriter struct{ w io.Writer }

func (o onlyWriter) Write(p []byte) (int, error) { return o.w.Write(p) }

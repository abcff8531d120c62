package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/exn-project/exn/internal/sys"
)

// MaxLine bounds a request line, so a client cannot make the server buffer
// without limit.
const MaxLine = 4096

// DefaultPath is exnd's control socket unless --control says otherwise.
const DefaultPath = "/run/exn/exnd.sock"

// MaxFDs is the most file descriptors one request may carry.
const MaxFDs = 8

// Server limits, with why.
const (
	// DefaultMaxConns bounds open control connections: each costs a
	// goroutine and 4 KiB of line buffer, so a flood of clients that
	// connect and wait cannot exhaust exnd. Well above what a host's
	// shimmed programs hold at once (one connection per intercepted call,
	// closed before the call returns, plus one per attached process).
	DefaultMaxConns = 4096
	// DefaultLineTimeout bounds how long a started line (or a new
	// connection's first line) may take: a client that connects and never
	// speaks, or stops mid-line, is dropped. Idle time between complete
	// requests is not bounded (attached processes keep their connection).
	DefaultLineTimeout = 5 * time.Second
)

// Request is one request with the file descriptors that came with it
// (SCM_RIGHTS on the request line). The server closes every file left in
// Files after the handler returns; a handler keeps one by setting its
// slot to nil.
type Request struct {
	Op    string
	Args  []string
	Files []*os.File
}

// FDHandlerFunc answers a request that may carry file descriptors and may
// return up to MaxFDs of them (out, in order), which are sent with the
// response and then closed.
type FDHandlerFunc func(ctx context.Context, req *Request) (v any, out []*os.File, err error)

// HandlerFunc answers one request. args excludes the operation name. The
// returned value is encoded as JSON in the response's data field.
type HandlerFunc func(ctx context.Context, args []string) (any, error)

// Response is one response line.
type Response struct {
	OK    bool            `json:"ok"`
	Data  json.RawMessage `json:"data,omitempty"`
	Error string          `json:"error,omitempty"`
}

// Server serves the control protocol on a unix socket. It owns one
// accept goroutine and one goroutine per connection, all stopped and
// joined by Close.
//
// Every connection is identified by the kernel (SO_PEERCRED) when it is
// accepted, checked against the Policy, and its handlers see the caller
// through PeerFrom(ctx).
//
// Locking: mu guards handlers and conns.
type Server struct {
	log *slog.Logger
	ln  net.Listener

	policy      Policy
	maxConns    int64
	lineTimeout time.Duration
	ctr         counters

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu         sync.Mutex
	handlers   map[string]HandlerFunc
	fdHandlers map[string]FDHandlerFunc
	conns      map[net.Conn]struct{}
}

// NewServer returns a server with no handlers; register them with Handle
// before Serve.
func NewServer(log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{log: log, ctx: ctx, cancel: cancel, handlers: make(map[string]HandlerFunc), fdHandlers: make(map[string]FDHandlerFunc),
		conns: make(map[net.Conn]struct{}), maxConns: DefaultMaxConns, lineTimeout: DefaultLineTimeout}
}

// SetPolicy sets who may connect (default AccessAll); call it before
// Listen, which sets the socket file's mode and group from it.
func (s *Server) SetPolicy(p Policy) { s.policy = p }

// SetLimits sets the most open connections and the line timeout (zero
// values keep the defaults); call it before Listen.
func (s *Server) SetLimits(maxConns int, lineTimeout time.Duration) {
	if maxConns > 0 {
		s.maxConns = int64(maxConns)
	}
	if lineTimeout > 0 {
		s.lineTimeout = lineTimeout
	}
}

// Stats returns the server's counters.
func (s *Server) Stats() ServerStats { return s.ctr.snapshot() }

// Handle registers h for op (case-insensitive).
func (s *Server) Handle(op string, h HandlerFunc) {
	s.mu.Lock()
	s.handlers[strings.ToLower(op)] = h
	s.mu.Unlock()
}

// HandleFD registers an fd-passing handler for op (case-insensitive).
func (s *Server) HandleFD(op string, h FDHandlerFunc) {
	s.mu.Lock()
	s.fdHandlers[strings.ToLower(op)] = h
	s.mu.Unlock()
}

// Listen creates the socket at path (mode from the Policy: 0666, 0660 with
// the policy's group, or 0600; parent directory created with 0755) and
// starts serving. A stale socket file left by a dead exnd
// is replaced; a live one is an error.
func (s *Server) Listen(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("control socket %s: %w", path, err)
	}
	if c, err := net.DialTimeout("unix", path, 100*time.Millisecond); err == nil {
		c.Close()
		return fmt.Errorf("control socket %s: another exnd is serving it", path)
	}
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	if s.policy.Access == AccessGroup {
		if err := os.Chown(path, -1, s.policy.GID); err != nil {
			ln.Close()
			return fmt.Errorf("control socket %s: group %d: %w", path, s.policy.GID, err)
		}
	}
	if err := os.Chmod(path, s.policy.mode()); err != nil {
		ln.Close()
		return fmt.Errorf("control socket %s: %w", path, err)
	}
	s.ln = ln
	s.wg.Add(1)
	go s.accept()
	return nil
}

// Close stops accepting, closes every connection, waits for the
// goroutines, and removes the socket file.
func (s *Server) Close() error {
	s.cancel()
	var err error
	if s.ln != nil {
		err = s.ln.Close() // a unix listener unlinks its socket file
	}
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Warn("control accept", "err", err)
			}
			return
		}
		s.ctr.accepted.Add(1)
		if s.ctr.active.Add(1) > s.maxConns {
			s.ctr.active.Add(-1)
			s.ctr.refuse(ReasonTooMany)
			// Say why without waiting on the client: a non-blocking-ish
			// short write bounded by a deadline.
			_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			_, _ = c.Write([]byte(`{"ok":false,"error":"control: too many connections"}` + "\n"))
			c.Close()
			continue
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

// ServeConn serves one connection the caller accepted (tests, fuzzing)
// and returns when it ends; ctx carries the caller (WithPeer) when c is
// not a unix socket.
func (s *Server) ServeConn(ctx context.Context, c net.Conn) {
	s.ctr.accepted.Add(1)
	s.ctr.active.Add(1)
	s.mu.Lock()
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	s.wg.Add(1)
	s.serveCtx(ctx, c)
}

func (s *Server) serve(c net.Conn) { s.serveCtx(s.ctx, c) }

// identify returns ctx carrying the caller of c as the kernel says, or
// the reason the caller is refused.
func (s *Server) identify(ctx context.Context, uc *net.UnixConn) (context.Context, string) {
	if uc == nil {
		return ctx, "" // not a unix socket (ServeConn over a pipe): ctx says
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return ctx, ReasonNoCred
	}
	var cred sys.Cred
	var cerr error
	if err := rc.Control(func(fd uintptr) { cred, cerr = sys.PeerCred(int(fd)) }); err != nil || cerr != nil {
		return ctx, ReasonNoCred
	}
	if !s.policy.allows(cred) {
		s.log.Warn("control: caller refused by policy", "pid", cred.PID, "uid", cred.UID, "gid", cred.GID, "access", s.policy.String())
		return ctx, ReasonUnauthorized
	}
	return WithPeer(ctx, cred), ""
}

func (s *Server) serveCtx(ctx context.Context, c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
		s.ctr.active.Add(-1)
	}()
	uc, _ := c.(*net.UnixConn)
	ctx, why := s.identify(ctx, uc)
	if why != "" {
		s.ctr.refuse(why)
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		s.reply(uc, c, Response{Error: "control: " + strings.ReplaceAll(why, "_", " ") + ": this user may not use exnd (see exnd --control-access)"}, nil)
		return
	}
	var (
		buf     = make([]byte, MaxLine)
		oob     = make([]byte, syscall.CmsgSpace(MaxFDs*4))
		pending []byte
		files   []*os.File
		first   = true // no complete line yet
	)
	defer func() { closeFiles(files) }()
	for {
		var n, oobn, flags int
		var err error
		// A new connection's first line, and any line once started, must
		// complete within lineTimeout; between lines a client may idle.
		if first || len(pending) > 0 {
			_ = c.SetReadDeadline(time.Now().Add(s.lineTimeout))
		} else {
			_ = c.SetReadDeadline(time.Time{})
		}
		if uc != nil {
			n, oobn, flags, _, err = uc.ReadMsgUnix(buf, oob)
		} else {
			n, err = c.Read(buf)
		}
		n, oobn = max(n, 0), max(oobn, 0) // a failed read may report -1
		if oobn > 0 || flags&syscall.MSG_CTRUNC != 0 {
			got, perr := parseRights(oob[:oobn])
			files = append(files, got...)
			if perr != nil || len(files) > MaxFDs || flags&syscall.MSG_CTRUNC != 0 {
				s.ctr.refuse(ReasonTooManyFDs)
				s.reply(uc, c, Response{Error: fmt.Sprintf("request: at most %d file descriptors", MaxFDs)}, nil)
				return
			}
		}
		pending = append(pending, buf[:n]...)
		for {
			i := bytes.IndexByte(pending, '\n')
			if i < 0 {
				break
			}
			line := string(pending[:i])
			pending = pending[i+1:]
			req := &Request{Files: files}
			files = nil
			s.ctr.requests.Add(1)
			first = false
			resp, out := s.dispatch(ctx, line, req)
			closeFiles(req.Files)
			werr := s.reply(uc, c, resp, out)
			closeFiles(out)
			if werr != nil {
				return
			}
		}
		if len(pending) >= MaxLine {
			// An over-long line: say so, then drop the connection, since
			// the stream can no longer be framed.
			s.ctr.refuse(ReasonOversized)
			s.reply(uc, c, Response{Error: fmt.Sprintf("request: line longer than %d bytes", MaxLine)}, nil)
			return
		}
		if err != nil {
			switch {
			case errors.Is(err, os.ErrDeadlineExceeded):
				s.ctr.refuse(ReasonIdle)
				_ = c.SetWriteDeadline(time.Now().Add(time.Second))
				s.reply(uc, c, Response{Error: fmt.Sprintf("request: no complete line within %v", s.lineTimeout)}, nil)
			case len(pending) > 0 || len(files) > 0:
				s.ctr.refuse(ReasonTruncated) // EOF or an error mid-line
			}
			return
		}
	}
}

// reply writes one response line, with out attached as SCM_RIGHTS. The
// descriptors are read through SyscallConn, never Fd(), which would make
// a shared non-blocking descriptor blocking for its other holders.
func (s *Server) reply(uc *net.UnixConn, c net.Conn, resp Response, out []*os.File) error {
	b, err := json.Marshal(resp)
	if err != nil {
		b = []byte(`{"ok":false,"error":"encode response"}`)
	}
	b = append(b, '\n')
	if len(out) == 0 || uc == nil {
		_, err = c.Write(b)
		return err
	}
	fds := make([]int, 0, len(out))
	for _, f := range out {
		fd, err := rawFD(f)
		if err != nil {
			return err
		}
		fds = append(fds, fd)
	}
	_, _, err = uc.WriteMsgUnix(b, syscall.UnixRights(fds...), nil)
	return err
}

// rawFD is f's descriptor without changing its mode (valid while f is
// open).
func rawFD(f *os.File) (int, error) { return sys.FileFD(f) }

func parseRights(oob []byte) ([]*os.File, error) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var files []*os.File
	for _, m := range msgs {
		fds, err := syscall.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			syscall.CloseOnExec(fd)
			files = append(files, os.NewFile(uintptr(fd), "control-fd"))
		}
	}
	return files, nil
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		if f != nil {
			f.Close()
		}
	}
}

func (s *Server) dispatch(ctx context.Context, line string, req *Request) (Response, []*os.File) {
	fields := strings.Fields(line)
	if len(fields) == 0 {
		s.ctr.refuse(ReasonBadRequest)
		return Response{Error: "request: empty line"}, nil
	}
	req.Op, req.Args = strings.ToLower(fields[0]), fields[1:]
	s.mu.Lock()
	h, fh := s.handlers[req.Op], s.fdHandlers[req.Op]
	s.mu.Unlock()
	var (
		v   any
		out []*os.File
		err error
	)
	switch {
	case fh != nil:
		v, out, err = fh(ctx, req)
	case h != nil:
		v, err = h(ctx, req.Args)
	default:
		s.ctr.refuse(ReasonBadRequest)
		return Response{Error: fmt.Sprintf("request: unknown operation %q", fields[0])}, nil
	}
	if err == nil && len(out) > MaxFDs {
		err = fmt.Errorf("%s: %d descriptors to return, at most %d", req.Op, len(out), MaxFDs)
	}
	if err != nil {
		s.ctr.refuse(ReasonFailed)
		closeFiles(out)
		return Response{Error: err.Error()}, nil
	}
	data, err := json.Marshal(v)
	if err != nil {
		closeFiles(out)
		return Response{Error: fmt.Sprintf("encode response: %v", err)}, nil
	}
	return Response{OK: true, Data: data}, out
}

// Client is a control-socket client. It is safe for concurrent use; calls
// are serialised.
type Client struct {
	mu  sync.Mutex
	c   *net.UnixConn
	buf []byte // read but not yet returned
}

// Dial connects to exnd's control socket.
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("control: %w", err)
	}
	return &Client{c: c.(*net.UnixConn)}, nil
}

// Call sends one request and decodes the response's data into out (if
// non-nil). A response with ok=false becomes an error carrying the
// server's message.
func (c *Client) Call(ctx context.Context, out any, op string, args ...string) error {
	f, err := c.CallFD(ctx, out, nil, op, args...)
	if f != nil {
		f.Close()
	}
	return err
}

// CallFD is Call with file descriptors: files go with the request line
// (SCM_RIGHTS; the caller keeps its copies), and the first descriptor the
// server returns comes back as a file the caller owns (others are
// closed; CallFDs returns them all).
func (c *Client) CallFD(ctx context.Context, out any, files []*os.File, op string, args ...string) (*os.File, error) {
	got, err := c.CallFDs(ctx, out, files, op, args...)
	if len(got) == 0 {
		return nil, err
	}
	closeFiles(got[1:])
	return got[0], err
}

// CallFDs is CallFD returning every descriptor of the response, in order.
func (c *Client) CallFDs(ctx context.Context, out any, files []*os.File, op string, args ...string) ([]*os.File, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if dl, ok := ctx.Deadline(); ok {
		c.c.SetDeadline(dl)
		defer c.c.SetDeadline(time.Time{})
	}
	line := strings.Join(append([]string{op}, args...), " ")
	if strings.ContainsAny(line, "\n\r") || len(line) >= MaxLine || len(files) > MaxFDs {
		return nil, fmt.Errorf("control %s: bad request", op)
	}
	var rights []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		rights = syscall.UnixRights(fds...)
	}
	if _, _, err := c.c.WriteMsgUnix([]byte(line+"\n"), rights, nil); err != nil {
		return nil, fmt.Errorf("control %s: %w", op, err)
	}
	raw, f, err := c.readLine()
	if err != nil {
		return nil, fmt.Errorf("control %s: %w", op, err)
	}
	var resp Response
	if err := json.Unmarshal(raw, &resp); err != nil {
		closeFiles(f)
		return nil, fmt.Errorf("control %s: bad response: %w", op, err)
	}
	if !resp.OK {
		closeFiles(f)
		return nil, fmt.Errorf("control %s: %s", op, resp.Error)
	}
	if out != nil && len(resp.Data) > 0 {
		if err := json.Unmarshal(resp.Data, out); err != nil {
			closeFiles(f)
			return nil, fmt.Errorf("control %s: bad data: %w", op, err)
		}
	}
	return f, nil
}

// readLine reads one response line and the descriptors sent with it (at
// most MaxFDs; more are closed).
func (c *Client) readLine() ([]byte, []*os.File, error) {
	var f []*os.File
	oob := make([]byte, syscall.CmsgSpace(MaxFDs*4))
	for {
		if i := bytes.IndexByte(c.buf, '\n'); i >= 0 {
			line := c.buf[:i]
			c.buf = c.buf[i+1:]
			return line, f, nil
		}
		tmp := make([]byte, MaxLine)
		n, oobn, _, _, err := c.c.ReadMsgUnix(tmp, oob)
		if oobn > 0 {
			got, _ := parseRights(oob[:oobn])
			for _, g := range got {
				if len(f) < MaxFDs {
					f = append(f, g)
				} else {
					g.Close()
				}
			}
		}
		c.buf = append(c.buf, tmp[:max(n, 0)]...)
		if err != nil {
			closeFiles(f)
			return nil, nil, err
		}
		if len(c.buf) > 1<<20 {
			closeFiles(f)
			return nil, nil, errors.New("response too long")
		}
	}
}

// Close closes the connection.
func (c *Client) Close() error { return c.c.Close() }

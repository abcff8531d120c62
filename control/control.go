package control

import (
	"bufio"
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
	"time"
)

// MaxLine bounds a request line, so a client cannot make the server buffer
// without limit.
const MaxLine = 4096

// DefaultPath is exnd's control socket unless --control says otherwise.
const DefaultPath = "/run/exn/exnd.sock"

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
// Locking: mu guards handlers and conns.
type Server struct {
	log *slog.Logger
	ln  net.Listener

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	handlers map[string]HandlerFunc
	conns    map[net.Conn]struct{}
}

// NewServer returns a server with no handlers; register them with Handle
// before Serve.
func NewServer(log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{log: log, ctx: ctx, cancel: cancel, handlers: make(map[string]HandlerFunc), conns: make(map[net.Conn]struct{})}
}

// Handle registers h for op (case-insensitive).
func (s *Server) Handle(op string, h HandlerFunc) {
	s.mu.Lock()
	s.handlers[strings.ToLower(op)] = h
	s.mu.Unlock()
}

// Listen creates the socket at path (mode 0660, parent directory created
// with 0755) and starts serving. A stale socket file left by a dead exnd
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
	if err := os.Chmod(path, 0o660); err != nil {
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
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, 0, 256), MaxLine)
	enc := json.NewEncoder(c)
	for sc.Scan() {
		if err := enc.Encode(s.dispatch(sc.Text())); err != nil {
			return
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, net.ErrClosed) {
		// An over-long line: say so, then drop the connection, since the
		// stream can no longer be framed.
		_ = enc.Encode(Response{Error: fmt.Sprintf("request: %v", err)})
	}
}

func (s *Server) dispatch(line string) Response {
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return Response{Error: "request: empty line"}
	}
	s.mu.Lock()
	h := s.handlers[strings.ToLower(fields[0])]
	s.mu.Unlock()
	if h == nil {
		return Response{Error: fmt.Sprintf("request: unknown operation %q", fields[0])}
	}
	v, err := h(s.ctx, fields[1:])
	if err != nil {
		return Response{Error: err.Error()}
	}
	data, err := json.Marshal(v)
	if err != nil {
		return Response{Error: fmt.Sprintf("encode response: %v", err)}
	}
	return Response{OK: true, Data: data}
}

// Client is a control-socket client. It is safe for concurrent use; calls
// are serialised.
type Client struct {
	mu sync.Mutex
	c  net.Conn
	r  *bufio.Reader
}

// Dial connects to exnd's control socket.
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("control: %w", err)
	}
	return &Client{c: c, r: bufio.NewReader(c)}, nil
}

// Call sends one request and decodes the response's data into out (if
// non-nil). A response with ok=false becomes an error carrying the
// server's message.
func (c *Client) Call(ctx context.Context, out any, op string, args ...string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if dl, ok := ctx.Deadline(); ok {
		c.c.SetDeadline(dl)
		defer c.c.SetDeadline(time.Time{})
	}
	line := strings.Join(append([]string{op}, args...), " ")
	if strings.ContainsAny(line, "\n\r") || len(line) >= MaxLine {
		return fmt.Errorf("control %s: bad request", op)
	}
	if _, err := c.c.Write([]byte(line + "\n")); err != nil {
		return fmt.Errorf("control %s: %w", op, err)
	}
	raw, err := c.r.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("control %s: %w", op, err)
	}
	var resp Response
	if err := json.Unmarshal(raw, &resp); err != nil {
		return fmt.Errorf("control %s: bad response: %w", op, err)
	}
	if !resp.OK {
		return fmt.Errorf("control %s: %s", op, resp.Error)
	}
	if out != nil && len(resp.Data) > 0 {
		if err := json.Unmarshal(resp.Data, out); err != nil {
			return fmt.Errorf("control %s: bad data: %w", op, err)
		}
	}
	return nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.c.Close() }

package sinktest

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// EventIDHeader is the request header ByEventID keys on.
const EventIDHeader = "X-Event-Id"

// Request is one request as the sink received it.
type Request struct {
	N      int // 1-based arrival number across the sink's life
	Method string
	Path   string
	Header http.Header
	Body   []byte
	At     time.Time // arrival time (after the body was read)
}

// Response tells the sink how to answer one request. The zero value answers
// 200 with an empty body.
type Response struct {
	Status int         // 0 means 200
	Header http.Header // e.g. Retry-After
	Body   string
	// Delay waits before answering (or before CloseConn). It ends early,
	// without an answer, if the client gives up or the sink closes.
	Delay time.Duration
	// Hang never answers: the handler returns when the client gives up
	// (request context done) or drops the connection when the sink closes.
	Hang bool
	// CloseConn hijacks the connection and closes it without writing any
	// response.
	CloseConn bool
}

// Script decides the Response for each request. The sink calls it once per
// request, one call at a time, in arrival order (r.N ascending), so a
// stateful script needs no locking of its own. A script may call the Sink's
// methods. It should return quickly: use Response.Delay or Hang to stall.
type Script func(r Request) Response

// Sink is a programmable HTTP destination on 127.0.0.1. It records every
// request on arrival and answers it according to its Script.
type Sink struct {
	srv       *httptest.Server
	conns     atomic.Int64
	closing   chan struct{} // closed by Close to release Hang and Delay
	closeOnce sync.Once

	scriptMu sync.Mutex // serialises numbering + script calls

	mu      sync.Mutex
	script  Script
	reqs    []Request
	changed chan struct{} // closed and replaced on every arrival
}

// New starts a sink answering with script (nil answers 200) and closes it in
// t.Cleanup.
func New(t testing.TB, script Script) *Sink {
	t.Helper()
	s := &Sink{
		script:  script,
		closing: make(chan struct{}),
		changed: make(chan struct{}),
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("sinktest: listen: %v", err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(s.serveHTTP))
	srv.Listener.Close()
	srv.Listener = l
	// httptest keeps this hook and calls it from its own.
	srv.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		if state == http.StateNew {
			s.conns.Add(1)
		}
	}
	srv.Start()
	s.srv = srv
	t.Cleanup(s.Close)
	return s
}

// URL is the sink's base URL, "http://127.0.0.1:PORT".
func (s *Sink) URL() string { return s.srv.URL }

// SetScript replaces the script for requests that arrive from now on.
func (s *Sink) SetScript(script Script) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script = script
}

// Requests returns a copy of all requests received so far, in arrival order.
func (s *Sink) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Request, len(s.reqs))
	for i, r := range s.reqs {
		out[i] = r.clone()
	}
	return out
}

// Count is the number of requests received so far.
func (s *Sink) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reqs)
}

// WaitCount blocks until at least n requests have arrived and fails the
// test if that takes longer than timeout.
func (s *Sink) WaitCount(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		s.mu.Lock()
		got, changed := len(s.reqs), s.changed
		s.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-changed:
		case <-timer.C:
			t.Fatalf("sinktest: %d requests arrived within %s, want at least %d", s.Count(), timeout, n)
		}
	}
}

// Connections is the number of TCP connections the sink has accepted.
func (s *Sink) Connections() int { return int(s.conns.Load()) }

// Close releases every Hang and Delay (their connections are dropped
// without an answer) and shuts the server down. Later requests are refused.
// It is called in t.Cleanup and is safe to call more than once, e.g. to
// take the destination down in the middle of a test.
func (s *Sink) Close() {
	s.closeOnce.Do(func() {
		close(s.closing)
		s.srv.Close()
	})
}

// serveHTTP records the request and answers it as the script says.
func (s *Sink) serveHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body) // a body cut short is recorded as far as it came

	s.scriptMu.Lock()
	s.mu.Lock()
	req := Request{
		N:      len(s.reqs) + 1,
		Method: r.Method,
		Path:   r.URL.Path,
		Header: r.Header.Clone(),
		Body:   body,
		At:     time.Now(),
	}
	s.reqs = append(s.reqs, req)
	close(s.changed)
	s.changed = make(chan struct{})
	script := s.script
	s.mu.Unlock()
	var resp Response
	if script != nil {
		resp = script(req.clone())
	}
	s.scriptMu.Unlock()

	s.respond(w, r, resp)
}

func (s *Sink) respond(w http.ResponseWriter, r *http.Request, resp Response) {
	if resp.Hang {
		select {
		case <-r.Context().Done():
			return
		case <-s.closing:
			dropConn(w)
			return
		}
	}
	if resp.Delay > 0 {
		timer := time.NewTimer(resp.Delay)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-r.Context().Done():
			return
		case <-s.closing:
			dropConn(w)
			return
		}
	}
	if resp.CloseConn {
		dropConn(w)
		return
	}
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	status := resp.Status
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	_, _ = io.WriteString(w, resp.Body)
}

// dropConn closes the connection without writing a response.
func dropConn(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			_ = conn.Close()
			return
		}
	}
	// Not hijackable (or already hijacked): make net/http drop the
	// connection without a response and without logging.
	panic(http.ErrAbortHandler)
}

func (r Request) clone() Request {
	r.Header = r.Header.Clone()
	r.Body = slices.Clone(r.Body)
	return r
}

// Always answers every request with status.
func Always(status int) Script {
	return func(Request) Response { return Response{Status: status} }
}

// Sequence answers the i-th request this script sees with statuses[i-1];
// the last status repeats. With no statuses it answers 200. Each call to
// Sequence starts its own count, so a script swapped in with SetScript
// starts at the first status.
func Sequence(statuses ...int) Script {
	statuses = slices.Clone(statuses)
	var mu sync.Mutex
	seen := 0
	return func(Request) Response {
		if len(statuses) == 0 {
			return Response{}
		}
		mu.Lock()
		i := min(seen, len(statuses)-1)
		seen++
		mu.Unlock()
		return Response{Status: statuses[i]}
	}
}

// ByEventID answers by the request's X-Event-Id header (EventIDHeader).
// attempt is how many requests with that id this script has seen, this one
// included (1-based). Requests without the header share the id "".
func ByEventID(f func(eventID string, attempt int) Response) Script {
	var mu sync.Mutex
	attempts := make(map[string]int)
	return func(r Request) Response {
		id := r.Header.Get(EventIDHeader)
		mu.Lock()
		attempts[id]++
		n := attempts[id]
		mu.Unlock()
		return f(id, n)
	}
}

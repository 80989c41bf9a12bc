package sinktest_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/sinktest"
)

const wait = 5 * time.Second

// newClient returns a client with its own transport (no shared pool, no
// redirects); keepAlive false gives every request a fresh connection.
func newClient(t *testing.T, timeout time.Duration, keepAlive bool) *http.Client {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: !keepAlive}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{
		Transport:     tr,
		Timeout:       timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

type result struct {
	status int
	header http.Header
	body   string
	err    error
}

func post(c *http.Client, url, eventID, body string) result {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return result{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if eventID != "" {
		req.Header.Set(sinktest.EventIDHeader, eventID)
	}
	resp, err := c.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}
}

func TestSequenceAndRecording(t *testing.T) {
	// Given a sink that fails twice, then succeeds
	s := sinktest.New(t, sinktest.Sequence(500, 503, 204))
	c := newClient(t, wait, true)

	// When four requests arrive
	var got []int
	for i := 1; i <= 4; i++ {
		r := post(c, s.URL()+"/hook", fmt.Sprintf("evt-%d", i), fmt.Sprintf(`{"i":%d}`, i))
		if r.err != nil {
			t.Fatalf("request %d: %v", i, r.err)
		}
		got = append(got, r.status)
	}

	// Then the statuses follow the sequence, the last one repeating
	want := []int{500, 503, 204, 204}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("statuses = %v, want %v", got, want)
	}
	// And every request is recorded in order
	reqs := s.Requests()
	if len(reqs) != 4 || s.Count() != 4 {
		t.Fatalf("recorded %d (Count %d), want 4", len(reqs), s.Count())
	}
	for i, r := range reqs {
		if r.N != i+1 || r.Method != http.MethodPost || r.Path != "/hook" ||
			string(r.Body) != fmt.Sprintf(`{"i":%d}`, i+1) ||
			r.Header.Get(sinktest.EventIDHeader) != fmt.Sprintf("evt-%d", i+1) || r.At.IsZero() {
			t.Fatalf("request %d recorded as %+v", i+1, r)
		}
	}
	// And Requests returns copies
	reqs[0].Body[0] = 'X'
	reqs[0].Header.Set("Content-Type", "changed")
	if r := s.Requests()[0]; r.Body[0] != '{' || r.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("Requests shares memory with the sink: %+v", r)
	}
	// And the keep-alive client used one connection
	if n := s.Connections(); n != 1 {
		t.Fatalf("Connections = %d, want 1", n)
	}
}

func TestResponseHeaderAndBody(t *testing.T) {
	s := sinktest.New(t, func(sinktest.Request) sinktest.Response {
		return sinktest.Response{Status: 429, Header: http.Header{"Retry-After": {"3"}}, Body: "slow down"}
	})
	r := post(newClient(t, wait, true), s.URL(), "", "{}")
	if r.err != nil || r.status != 429 || r.header.Get("Retry-After") != "3" || r.body != "slow down" {
		t.Fatalf("got %d %v %q err %v; want 429, Retry-After 3, body", r.status, r.header, r.body, r.err)
	}
}

func TestDefaultsAndAlways(t *testing.T) {
	s := sinktest.New(t, nil)
	c := newClient(t, wait, true)
	if r := post(c, s.URL(), "", ""); r.err != nil || r.status != 200 {
		t.Fatalf("nil script: %d, %v; want 200", r.status, r.err)
	}
	s.SetScript(sinktest.Always(http.StatusBadGateway))
	for range 2 {
		if r := post(c, s.URL(), "", ""); r.err != nil || r.status != 502 {
			t.Fatalf("Always(502): %d, %v", r.status, r.err)
		}
	}
	// A Sequence swapped in starts from its first status.
	s.SetScript(sinktest.Sequence(201, 202))
	if r := post(c, s.URL(), "", ""); r.status != 201 {
		t.Fatalf("swapped Sequence: first status %d, want 201", r.status)
	}
	if r := post(c, s.URL(), "", ""); r.status != 202 {
		t.Fatalf("swapped Sequence: second status %d, want 202", r.status)
	}
}

func TestByEventID(t *testing.T) {
	// Given a sink where each event fails on its first attempt only
	s := sinktest.New(t, sinktest.ByEventID(func(id string, attempt int) sinktest.Response {
		if attempt == 1 {
			return sinktest.Response{Status: 503, Body: id}
		}
		return sinktest.Response{Status: 200, Body: fmt.Sprintf("%s#%d", id, attempt)}
	}))
	c := newClient(t, wait, true)
	steps := []struct {
		id, want string
		status   int
	}{
		{"a", "a", 503}, {"b", "b", 503}, {"a", "a#2", 200}, {"a", "a#3", 200}, {"b", "b#2", 200},
	}
	for i, st := range steps {
		r := post(c, s.URL(), st.id, "")
		if r.err != nil || r.status != st.status || r.body != st.want {
			t.Fatalf("step %d (%s): %d %q err %v; want %d %q", i, st.id, r.status, r.body, r.err, st.status, st.want)
		}
	}
}

func TestDelay(t *testing.T) {
	const delay = 50 * time.Millisecond
	s := sinktest.New(t, func(sinktest.Request) sinktest.Response {
		return sinktest.Response{Status: 202, Delay: delay}
	})
	start := time.Now()
	r := post(newClient(t, wait, true), s.URL(), "", "")
	if r.err != nil || r.status != 202 {
		t.Fatalf("got %d, %v; want 202", r.status, r.err)
	}
	if el := time.Since(start); el < delay {
		t.Fatalf("answered after %s, want at least %s", el, delay)
	}
}

func TestHangWithClientTimeout(t *testing.T) {
	// Given a sink that never answers
	s := sinktest.New(t, func(sinktest.Request) sinktest.Response { return sinktest.Response{Hang: true} })

	// When a client with a 100 ms timeout calls it
	r := post(newClient(t, 100*time.Millisecond, true), s.URL(), "", "{}")

	// Then the client times out, and the request was recorded
	var ne net.Error
	if !errors.As(r.err, &ne) || !ne.Timeout() {
		t.Fatalf("err = %v (status %d), want a client timeout", r.err, r.status)
	}
	if s.Count() != 1 {
		t.Fatalf("Count = %d, want 1", s.Count())
	}
}

func TestHangReleasedByClose(t *testing.T) {
	// Given a request hanging in a sink and a client without a timeout
	s := sinktest.New(t, func(sinktest.Request) sinktest.Response { return sinktest.Response{Hang: true} })
	done := make(chan result, 1)
	c := newClient(t, 0, true)
	go func() { done <- post(c, s.URL(), "", "{}") }()
	s.WaitCount(t, 1, wait)

	// When the sink closes
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		s.Close()
	}()

	// Then Close returns and the client gets an error, not a status
	select {
	case <-closed:
	case <-time.After(wait):
		t.Fatal("Close blocked on a hanging request")
	}
	select {
	case r := <-done:
		if r.err == nil {
			t.Fatalf("client got status %d, want a transport error", r.status)
		}
	case <-time.After(wait):
		t.Fatal("client still waiting after Close")
	}
	s.Close() // idempotent
}

func TestLongDelayDoesNotBlockClientOrCleanup(t *testing.T) {
	// A client timeout ends the call, and cleanup is not held by the Delay.
	s := sinktest.New(t, func(sinktest.Request) sinktest.Response {
		return sinktest.Response{Delay: time.Hour}
	})
	r := post(newClient(t, 50*time.Millisecond, true), s.URL(), "", "")
	if r.err == nil {
		t.Fatalf("got status %d, want a client timeout", r.status)
	}
}

func TestCloseConn(t *testing.T) {
	// Given a sink that drops the connection without answering
	s := sinktest.New(t, func(sinktest.Request) sinktest.Response { return sinktest.Response{CloseConn: true} })
	c := newClient(t, wait, true)

	// When requests are sent
	for i := range 3 {
		r := post(c, s.URL(), "", "{}")
		// Then each one is a transport error, with no hidden retry
		if r.err == nil {
			t.Fatalf("request %d: got status %d, want a transport error", i, r.status)
		}
		var ne net.Error
		if errors.As(r.err, &ne) && ne.Timeout() {
			t.Fatalf("request %d: got timeout %v, want a closed connection", i, r.err)
		}
	}
	if s.Count() != 3 || s.Connections() != 3 {
		t.Fatalf("Count = %d, Connections = %d; want 3 and 3", s.Count(), s.Connections())
	}
}

func TestWaitCountConcurrent(t *testing.T) {
	const n = 20
	s := sinktest.New(t, sinktest.Always(200))
	c := newClient(t, wait, false)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			if r := post(c, s.URL(), fmt.Sprintf("evt-%d", i), ""); r.err != nil {
				errs <- r.err
			}
		})
	}
	s.WaitCount(t, n, wait)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("request: %v", err)
	}
	if s.Count() != n || s.Connections() != n {
		t.Fatalf("Count = %d, Connections = %d; want %d each (no keep-alive)", s.Count(), s.Connections(), n)
	}
	seen := map[int]bool{}
	for _, r := range s.Requests() {
		seen[r.N] = true
	}
	if len(seen) != n {
		t.Fatalf("arrival numbers not unique: %v", seen)
	}
}

// fatalTB records Fatalf and ends the calling goroutine like testing does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestWaitCountTimeout(t *testing.T) {
	s := sinktest.New(t, nil)
	ftb := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.WaitCount(ftb, 1, 20*time.Millisecond)
	}()
	<-done
	if !strings.Contains(ftb.msg, "0 requests") {
		t.Fatalf("WaitCount timeout message = %q", ftb.msg)
	}
}

func TestCloser(t *testing.T) {
	for _, readFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("readFirst=%v", readFirst), func(t *testing.T) {
			// Given a closer
			cl := sinktest.NewCloser(t, readFirst)
			if !strings.HasPrefix(cl.URL(), "http://127.0.0.1:") || !strings.HasSuffix(cl.URL(), "/") {
				t.Fatalf("URL = %q", cl.URL())
			}
			c := newClient(t, wait, true)

			// When 5 requests are sent
			for i := range 5 {
				r := post(c, cl.URL(), "", `{"x":1}`)
				// Then each fails at the transport level
				if r.err == nil {
					t.Fatalf("request %d: got status %d, want a transport error", i, r.status)
				}
			}
			// And exactly one connection per request was accepted
			cl.WaitAccepted(t, 5, wait)
			if n := cl.Accepted(); n != 5 {
				t.Fatalf("Accepted = %d, want 5", n)
			}
		})
	}
}

func TestCloserIdleConnectionReleasedOnCleanup(t *testing.T) {
	// A connection that never sends a request head must not block cleanup.
	cl := sinktest.NewCloser(t, true)
	d := net.Dialer{}
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	conn, err := d.DialContext(ctx, "tcp", strings.TrimSuffix(strings.TrimPrefix(cl.URL(), "http://"), "/"))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	cl.WaitAccepted(t, 1, wait)
}

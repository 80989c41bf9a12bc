package bridge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/retrypolicy"
	"github.com/failsafe-go/failsafe-go/timeout"

	"github.com/sotercare/jetbridge/internal/natstest"
)

// A destination whose response body is slow or endless: the status it sent
// decides the try, never the body. The per-try timeout (100 ms) covers the
// request until the headers arrive; the body is drained only when its
// length is known and small, within drainTimeout, outside the timeout.
func TestSlowOrLargeResponseBodyKeepsItsStatus(t *testing.T) {
	tests := []struct {
		name   string
		status int
		// body writes the response after its header line.
		body        func(w http.ResponseWriter, r *http.Request)
		wantOutcome Outcome
	}{
		{
			name: "2xx, Content-Length 1000, 10 bytes then silence", status: 200, wantOutcome: OutcomeDelivered,
			body: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", "1000")
				w.WriteHeader(200)
				_, _ = w.Write([]byte("0123456789"))
				w.(http.Flusher).Flush()
				<-r.Context().Done() // until the bridge gives up on the body
			},
		},
		{
			name: "2xx, endless chunked body", status: 200, wantOutcome: OutcomeDelivered,
			body: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(202)
				chunk := []byte(strings.Repeat("x", 1024))
				for r.Context().Err() == nil {
					if _, err := w.Write(chunk); err != nil {
						return
					}
					w.(http.Flusher).Flush()
				}
			},
		},
		{
			name: "503, Content-Length 1000, 10 bytes then silence", status: 503, wantOutcome: OutcomeRedeliveryScheduled,
			body: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", "1000")
				w.WriteHeader(503)
				_, _ = w.Write([]byte("0123456789"))
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var requests atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				requests.Add(1)
				tt.body(w, r)
			}))
			t.Cleanup(srv.Close)
			cfg := testConfig(t, `
destinations:
  d:
    url: %s
    timeout: 100ms
    transport_retry: {count: 2, interval: 10ms, max_interval: 10ms}
    circuit_breaker: {enabled: false}
routes:
  - {name: r, subjects: ["events.>"], destination: d, max_deliver: 2, backoff: [10s]}
`, srv.URL)
			h := startBridge(t, cfg, faults{})
			h.publish("events.info.x", "e1", []byte(`{"n":1}`), nil)
			out := h.waitOutcomes(1, settleWait, nil)
			if len(out) != 1 {
				t.Fatalf("settlements %+v, want 1", h.outcomes())
			}
			if out[0].Outcome != tt.wantOutcome || out[0].Tries != 1 || statusOf(out[0].Err) != statusWhenFailed(tt.status) {
				t.Fatalf("settled %s after %d tries (failure %v), want %s after 1 try with status %d",
					out[0].Outcome, out[0].Tries, out[0].Err, tt.wantOutcome, tt.status)
			}
			if n := requests.Load(); n != 1 {
				t.Fatalf("destination received %d requests, want exactly 1 (a status is never retried as a transport error)", n)
			}
		})
	}
}

// A response body that arrives after its headers is read to its end after
// the try has returned (the per-try timeout's context is kept until then),
// so the connection serves the next request: five events sent one at a
// time to a destination that answers 200 and sends its short body 5 ms
// after the headers use one connection.
func TestLateResponseBodyKeepsTheConnection(t *testing.T) {
	check := func(t testing.TB, f faults) error {
		var conns atomic.Int32
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			body := []byte(`{"ok":true}`)
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			late := time.NewTimer(5 * time.Millisecond) // the destination's pace, not a wait of the test
			defer late.Stop()
			select {
			case <-r.Context().Done():
				return
			case <-late.C:
			}
			_, _ = w.Write(body)
		}))
		srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Add(1)
			}
		}
		srv.Start()
		t.Cleanup(srv.Close)
		h := startBridge(t, testConfig(t, inFlightRoute, srv.URL, 1), f)
		for i := range 5 {
			h.publish("events.info.x", fmt.Sprintf("e%d", i), []byte(`{}`), nil)
		}
		if out := h.waitOutcomes(5, settleWait, outcomeIs(OutcomeDelivered)); len(out) != 5 {
			t.Fatalf("outcomes %+v, want five deliveries", h.outcomes())
		}
		if n := conns.Load(); n != 1 {
			return fmt.Errorf("%d connections for five requests sent one at a time, want 1", n)
		}
		return nil
	}
	if err := check(t, faults{}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "the try's context ends as the try returns", func(t testing.TB) error { return check(t, faults{bodyEndsWithTry: true}) })
}

func statusWhenFailed(status int) int {
	if status/100 == 2 {
		return 0
	}
	return status
}

// A try's request context outlives the try once the response headers are
// in, and ends when its response is released, however often and late a
// release comes (finish's drain timer may call it a second time, behind
// the next try). The check runs failsafe-go's own retry policy: a 503 is
// retried, the second try answers 200, and the first response is released
// once more both during the second try and after the attempt. A per-try
// timeout that fires before the headers ends the request context.
func TestKeptContextEndsOnceReleased(t *testing.T) {
	type keeper func(exec failsafe.Execution[*response]) (context.Context, func() bool, context.CancelFunc)
	check := func(keep keeper) error {
		var ctxs []context.Context
		var releases []context.CancelFunc
		retry := retrypolicy.NewBuilder[*response]().
			HandleIf(func(r *response, _ error) bool { return r != nil && r.status == 503 }).
			WithMaxRetries(1).
			Build()
		_, err := failsafe.With[*response](retry, timeout.New[*response](time.Minute)).
			WithContext(context.Background()).
			GetWithExecution(func(exec failsafe.Execution[*response]) (*response, error) {
				if n := len(releases); n > 0 {
					releases[n-1]() // the next try finishes the last response first (attemptState.try)
				}
				ctx, headersIn, release := keep(exec)
				if !headersIn() {
					t.Fatal("the per-try timeout fired before the headers")
				}
				ctxs = append(ctxs, ctx)
				releases = append(releases, release)
				if len(ctxs) == 1 {
					return &response{status: 503}, nil
				}
				releases[0]() // a late drain timer of the first response
				return &response{status: 200}, nil
			})
		if err != nil || len(ctxs) != 2 {
			t.Fatalf("pipeline: %v after %d tries, want 2 tries", err, len(ctxs))
		}
		if ctxs[0].Err() == nil {
			return errors.New("the first try's context is live after its release")
		}
		if ctxs[1].Err() != nil {
			return errors.New("the second try's context ended before its response was released")
		}
		releases[0]() // later still
		releases[1]()
		if ctxs[1].Err() == nil {
			return errors.New("the second try's context is live after its release: it stays registered in its parent for good")
		}
		return nil
	}
	if err := check(func(failsafe.Execution[*response]) (context.Context, func() bool, context.CancelFunc) {
		deadline := new(cancelTimer) // a timer of its own per try, as each attempt has
		ctx, release := tryContext(context.Background(), time.Minute, deadline)
		return ctx, deadline.stop, release
	}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "the request runs on failsafe-go's per-try context (a timeout policy's, which ends as the try returns)", func(testing.TB) error {
		return check(func(exec failsafe.Execution[*response]) (context.Context, func() bool, context.CancelFunc) {
			return exec.Context(), func() bool { return true }, func() {}
		})
	})

	var headersIn cancelTimer
	ctx, release := tryContext(context.Background(), time.Millisecond, &headersIn)
	defer release()
	<-ctx.Done()
	if headersIn.stop() {
		t.Fatal("headers in after the per-try timeout fired")
	}
}

// A retried response's body is drained before the retry's delay, never in
// the next try's timeout: a 503 whose body never comes (the drain gives
// up after drainTimeout, 100 ms) followed by a 200, with a per-try timeout
// shorter than that drain, is delivered by its second try, with two
// requests; drained inside the second try, it would time that try out
// before it sent anything (three tries).
func TestRetriedResponseIsDrainedOutsideTheNextTry(t *testing.T) {
	check := func(t testing.TB, f faults) error {
		var requests atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if requests.Add(1) > 1 {
				w.WriteHeader(200)
				return
			}
			w.Header().Set("Content-Length", "10")
			w.WriteHeader(503)
			w.(http.Flusher).Flush()
			<-r.Context().Done() // the body never comes
		}))
		t.Cleanup(srv.Close)
		cfg := testConfig(t, `
destinations:
  d:
    url: %s
    timeout: 90ms
    status_retry: {codes: [503], count: 1, interval: 5ms, max_interval: 5ms}
    transport_retry: {count: 2, interval: 5ms, max_interval: 5ms}
    circuit_breaker: {enabled: false}
routes:
  - {name: r, subjects: ["events.>"], destination: d, max_deliver: 2, backoff: [10s]}
`, srv.URL)
		h := startBridge(t, cfg, f)
		h.publish("events.info.x", "e1", []byte(`{"n":1}`), nil)
		out := h.waitOutcomes(1, settleWait, nil)
		if len(out) != 1 || out[0].Outcome != OutcomeDelivered {
			t.Fatalf("settlements %+v, want one delivery", h.outcomes())
		}
		if n := requests.Load(); n != 2 {
			t.Fatalf("destination received %d requests, want 2", n)
		}
		if out[0].Tries != 2 {
			return fmt.Errorf("delivered after %d tries for 2 requests, want 2 tries", out[0].Tries)
		}
		return nil
	}
	if err := check(t, faults{}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "the next try drains the retried response", func(t testing.TB) error { return check(t, faults{drainInNextTry: true}) })
}

// Every try's context ends once its message is settled, whatever the try
// got: a 503 with a body (retried in process), then a 200 with a body, on
// a destination with and without a rate limit. A context kept for a body and never
// released would stay registered in the bridge's work context for good.
func TestEveryTryContextEnds(t *testing.T) {
	check := func(t testing.TB, flow string, f faults) error {
		var requests atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			status := 503
			if requests.Add(1) > 1 {
				status = 200
			}
			w.Header().Set("Content-Length", "11")
			w.WriteHeader(status)
			_, _ = w.Write([]byte(`{"ok":true}`))
		}))
		t.Cleanup(srv.Close)
		cfg := testConfig(t, `
destinations:
  d:
    url: %s
    status_retry: {codes: [503], count: 1, interval: 5ms, max_interval: 5ms}
    circuit_breaker: {enabled: false}
    %s
routes:
  - {name: r, subjects: ["events.>"], destination: d, max_deliver: 2, backoff: [10s]}
`, srv.URL, flow)
		var mu sync.Mutex
		var ctxs []context.Context
		h := startHarness(t, natstest.Start(t), cfg, f, func(b *Bridge) {
			onRequest(b.dests["d"], func(req *http.Request) {
				mu.Lock()
				ctxs = append(ctxs, req.Context())
				mu.Unlock()
			})
		})
		h.publish("events.info.x", "e1", []byte(`{"n":1}`), nil)
		out := h.waitOutcomes(1, settleWait, nil)
		if len(out) != 1 || out[0].Outcome != OutcomeDelivered || out[0].Tries != 2 {
			t.Fatalf("settlements %+v, want one delivery after 2 tries", h.outcomes())
		}
		live := func() (n int) {
			mu.Lock()
			defer mu.Unlock()
			if len(ctxs) != 2 {
				t.Fatalf("%d tries built a request, want 2", len(ctxs))
			}
			for _, c := range ctxs {
				if c.Err() == nil {
					n++
				}
			}
			return n
		}
		var n int
		if !waitUntil(2*time.Second, func() bool { n = live(); return n == 0 }) {
			return fmt.Errorf("%d of the 2 tries' contexts still live after the delivery was settled", n)
		}
		return nil
	}
	for _, tc := range []struct{ name, flow string }{
		{"no rate limit", ""},
		{"rate limit", "rate_limit: {requests: 1000, per: 1s, burst: 10}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := check(t, tc.flow, faults{}); err != nil {
				t.Fatal(err)
			}
			expectBroken(t, "a kept context never released", func(t testing.TB) error { return check(t, tc.flow, faults{keptForever: true}) })
		})
	}
}

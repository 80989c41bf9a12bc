package bridge

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
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
		wantOutcome string
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

func statusWhenFailed(status int) int {
	if status/100 == 2 {
		return 0
	}
	return status
}

var _ = fmt.Sprintf

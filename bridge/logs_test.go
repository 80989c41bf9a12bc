package bridge

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The redelivery line of a transport failure names its cause, and the
// delay with its unit, for each cause an operator meets first: nothing
// listening, a certificate the bridge does not trust, no answer in time.
// The URL (with its query secret) never appears.
func TestTransportFailureLogNamesTheCause(t *testing.T) {
	refused := func(t *testing.T) string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close() // nothing listens there now
		return "http://" + addr
	}
	untrusted := func(t *testing.T) string {
		srv := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	hangs := func(t *testing.T) string {
		done := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-done:
			}
		}))
		t.Cleanup(func() { close(done); srv.Close() })
		return srv.URL
	}
	for _, tt := range []struct {
		name  string
		url   func(*testing.T) string
		cause string
	}{
		{"nothing listening", refused, kindRefused},
		{"untrusted certificate", untrusted, kindTLSUntrusted},
		{"no answer in time", hangs, kindTimeout},
	} {
		t.Run(tt.name, func(t *testing.T) {
			url := tt.url(t) + "/hook?api_key=query-secret"
			cfg := testConfig(t, `
destinations:
  d:
    url: %s
    timeout: 200ms
    transport_retry: {count: 0}
    circuit_breaker: {enabled: false}
routes:
  - {name: r, subjects: ["events.>"], destination: d, max_deliver: 3, backoff: [1s]}
`, url)
			h := startBridge(t, cfg, faults{})
			h.publish("events.info.x", "e1", []byte(`{}`), nil)
			if out := h.waitOutcomes(1, settleWait, nil); len(out) != 1 || out[0].Outcome != OutcomeRedeliveryScheduled {
				t.Fatalf("settlements %+v, want one redelivery", h.outcomes())
			}
			logs := h.logs.String()
			want := fmt.Sprintf(`"failure":"transport","cause":%q`, tt.cause)
			if n := logLines(logs, `"message":"redelivery scheduled"`, want, `"delay":"1s"`); n != 1 {
				t.Fatalf("%d redelivery lines with %s and \"delay\":\"1s\", want 1:\n%s", n, want, logs)
			}
			if strings.Contains(logs, "query-secret") {
				t.Fatalf("the destination URL's query leaked into the log:\n%s", logs)
			}
		})
	}
}

// The dead-letter line carries what `bridge dlq show` needs: the event id
// and the dead letter's sequence, besides the reason and the status.
func TestDeadLetterLogNamesTheDeadLetter(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(400) }))
	t.Cleanup(srv.Close)
	cfg := testConfig(t, `
destinations:
  d: {url: %s, circuit_breaker: {enabled: false}}
routes:
  - {name: r, subjects: ["events.>"], destination: d}
`, srv.URL)
	h := startBridge(t, cfg, faults{})
	h.publish("events.info.x", "e1", []byte(`{}`), nil)
	if out := h.waitOutcomes(1, settleWait, nil); len(out) != 1 || out[0].Outcome != OutcomeDeadLettered {
		t.Fatalf("settlements %+v, want one dead letter", h.outcomes())
	}
	if n := logLines(h.logs.String(), `"message":"dead-lettered"`, `"event_id":"e1"`, `"dlq_seq":1`, `"reason":"rejected"`, `"status":400`); n != 1 {
		t.Fatalf("%d dead-letter lines with the event id, dlq_seq, reason and status, want 1:\n%s", n, h.logs.String())
	}
}

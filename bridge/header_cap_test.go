package bridge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/subjects"
)

// headerSink answers 200 with about size bytes of response headers (lines
// of 1,000 bytes), over HTTP/1.1, or HTTP/2 over TLS when h2 is set.
func headerSink(t testing.TB, size int, h2 bool) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var handled atomic.Int64
	filler := strings.Repeat("x", 1000)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		handled.Add(1)
		for i := range size / 1000 {
			w.Header().Set(fmt.Sprintf("X-Filler-%05d", i), filler)
		}
		w.WriteHeader(http.StatusOK)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	if h2 {
		srv.EnableHTTP2 = true
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return srv, &handled
}

// headerCapAttempt makes one attempt of destination d (built as the bridge
// builds it, then passed to adjust when not nil) against a destination
// answering 200 with size bytes of headers, and returns the failure and
// the tries counted per class.
func headerCapAttempt(t testing.TB, size int, h2 bool, adjust func(*destination)) (failure error, transport, ok2xx float64) {
	t.Helper()
	srv, handled := headerSink(t, size, h2)
	cfg := testConfig(t, `
destinations:
  d:
    url: %s/hook
    timeout: 10s
    transport_retry: {count: 0}
    circuit_breaker: {enabled: false}
    tls: {insecure_skip_verify: true}
routes:
  - {name: r, subjects: ["events.>"], destination: d}
`, srv.URL)
	m, err := newMetrics(prometheus.NewRegistry(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	d, err := newDestination(cfg.Destinations["d"], zerolog.Nop(), nil, m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.close)
	if adjust != nil {
		adjust(d)
	}
	p, err := buildPayload(&event{
		ID: "e1", Type: "x", Severity: subjects.Info, Subject: "events.info.x",
		Payload: []byte(`{}`), ContentType: "application/json", Delivered: 1, PublishedAt: time.Now(),
	}, d)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, failure = d.attempt(ctx, p, admission{hold: ctx, severity: subjects.Info})
	if handled.Load() != 1 {
		t.Fatalf("the destination handled %d requests, want 1", handled.Load())
	}
	return failure, testutil.ToFloat64(m.requests.WithLabelValues("d", classTransport)),
		testutil.ToFloat64(m.requests.WithLabelValues("d", "2xx"))
}

// headersRefused checks that a 200 with a header section over the cap is
// a transport error, counted in class transport, and not a delivery. Its
// kind is "response headers too large" over HTTP/1.1; HTTP/2 aborts a
// header list far over the cap as a connection PROTOCOL_ERROR.
func headersRefused(t testing.TB, size int, h2 bool, adjust func(*destination)) error {
	kind := kindHeadersTooLarge
	if h2 {
		kind = kindHTTP2Protocol
	}
	failure, transport, ok2xx := headerCapAttempt(t, size, h2, adjust)
	var te *TransportError
	switch {
	case failure == nil:
		return fmt.Errorf("a 200 with %d bytes of headers was delivered", size)
	case !errors.As(failure, &te) || te.Kind != kind:
		return fmt.Errorf("failure %v (cause %v), want a TransportError of kind %q", failure, errors.Unwrap(failure), kind)
	case transport != 1 || ok2xx != 0:
		return fmt.Errorf("tries counted: transport %v, 2xx %v; want 1 and 0", transport, ok2xx)
	}
	return nil
}

// A destination answering 200 with megabytes of headers gets nothing
// delivered: net/http stops reading at maxResponseHeaderBytes and the try
// is a transport error, over HTTP/1.1 and HTTP/2. Headers under the cap
// are read as usual. The negative control builds the transport with the
// cap at 0 (net/http's 10 MiB default), as it was: the 2 MB answer is then
// a delivery.
func TestResponseHeaderCap(t *testing.T) {
	const bomb = 2 << 20
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("http2=%t", h2), func(t *testing.T) {
			if err := headersRefused(t, bomb, h2, nil); err != nil {
				t.Fatal(err)
			}
			under := maxResponseHeaderBytes - 8<<10
			if failure, _, ok2xx := headerCapAttempt(t, under, h2, nil); failure != nil || ok2xx != 1 {
				t.Fatalf("%d bytes of headers: failure %v, 2xx tries %v; want delivered", under, failure, ok2xx)
			}
			expectBroken(t, "transport built without the cap", func(t testing.TB) error {
				return headersRefused(t, bomb, h2, func(d *destination) {
					p := *d.pipe.Load()
					p.transport = destinationTransport(p.transport.(*http.Transport).TLSClientConfig, 0)
					d.replace(p.build())
				})
			})
		})
	}
}

// Through the whole bridge: the header bomb is redelivered, never acked.
func TestResponseHeaderBombRedelivered(t *testing.T) {
	srv, handled := headerSink(t, 2<<20, false)
	h := startBridge(t, testConfig(t, `
destinations:
  d:
    url: %s/hook
    transport_retry: {count: 0}
    circuit_breaker: {enabled: false}
`+routeYAML, srv.URL, 2, "10ms"), faults{})
	h.publish("events.info.bomb", "e1", []byte(`{}`), nil)
	out := h.waitOutcomes(2, settleWait, nil)
	if len(out) != 2 {
		t.Fatalf("%d settlements, want 2", len(out))
	}
	var te *TransportError
	if out[0].Outcome != OutcomeRedeliveryScheduled || !errors.As(out[0].Err, &te) || te.Kind != kindHeadersTooLarge {
		t.Fatalf("first delivery: %s (%v), want redelivery_scheduled after %q", out[0].Outcome, out[0].Err, kindHeadersTooLarge)
	}
	if out[1].Outcome != OutcomeDeadLettered || out[1].Reason != deadletter.ReasonMaxDeliveries {
		t.Fatalf("second delivery: %s/%s, want dead_lettered/max-deliveries", out[1].Outcome, out[1].Reason)
	}
	if n := handled.Load(); n != 2 {
		t.Fatalf("the destination handled %d requests, want 2", n)
	}
	dl := h.deadLetters()
	if len(dl) != 1 || dl[0].Header.Get(deadletter.HeaderFailure) != string(deadletter.FailureTransport) || dl[0].Header.Get(deadletter.HeaderStatus) != "" {
		t.Fatalf("dead letters: %d, want 1 with failure transport and no status", len(dl))
	}
}

package bridge

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
)

// bagCanary is the value of a producer's W3C baggage entry: internal
// key-values that must not reach a destination unless it opted in.
const bagCanary = "bag-canary-Zk4P"

// carriesCanary reports where a request carries the baggage canary: a
// header (any name, any case) or the body; "" when nowhere.
func carriesCanary(r sinktest.Request) string {
	for k, vs := range r.Header {
		for _, v := range vs {
			if strings.Contains(v, bagCanary) {
				return "header " + k
			}
		}
	}
	if strings.Contains(string(r.Body), bagCanary) {
		return "body"
	}
	return ""
}

// checkBaggage publishes one traced event with a baggage canary (flags
// "01" sampled, "00" not) to a destination configured with extra (e.g.
// "forward_baggage: true") and checks what reached it: the producer's
// trace in traceparent always, the canary only when forward is true.
func checkBaggage(t testing.TB, extra string, sampled, forward bool) error {
	sink := sinktest.New(t, nil)
	rec, tp := recorder()
	cfg := testConfig(t, `
destinations:
  d:
    url: %s
    circuit_breaker: {enabled: false}
    %s
routes:
  - {name: r, subjects: ["events.>"], destination: d}
`, sink.URL(), extra)
	h := startHarness(t, natstest.Start(t), cfg, faults{}, withTracing(tp, false))
	flags := "00"
	if sampled {
		flags = "01"
	}
	h.publish("events.info.order.created", "o-1", []byte(`{"order":1}`), map[string]string{
		"traceparent": "00-" + prodTraceID + "-" + prodSpanID + "-" + flags,
		"tracestate":  "vendor=abc",
		"baggage":     "tenant.secret=" + bagCanary + ",user=42",
	})
	if got := h.waitOutcomes(1, 10*time.Second, outcomeIs(OutcomeDelivered)); len(got) != 1 {
		return fmt.Errorf("not delivered: %+v", h.outcomes())
	}
	reqs := sink.Requests()
	if len(reqs) != 1 {
		return fmt.Errorf("the destination got %d requests, want 1", len(reqs))
	}
	r := reqs[0]
	if parts := strings.Split(r.Header.Get("Traceparent"), "-"); len(parts) != 4 || parts[1] != prodTraceID || parts[3] != flags {
		return fmt.Errorf("traceparent %q: want the producer's trace with flags %s", r.Header.Get("Traceparent"), flags)
	}
	if got := r.Header.Get("Tracestate"); got != "vendor=abc" {
		return fmt.Errorf("tracestate %q, want the producer's", got)
	}
	if n := len(rec.Ended()); sampled != (n > 0) {
		return fmt.Errorf("%d spans recorded, sampled %t", n, sampled)
	}
	where := carriesCanary(r)
	switch {
	case forward && r.Header.Get("Baggage") == "":
		return fmt.Errorf("no baggage header at a destination with forward_baggage: true")
	case forward && where != "header Baggage":
		return fmt.Errorf("the canary is in %q, want the Baggage header", where)
	case !forward && where != "":
		return fmt.Errorf("the producer's baggage reached the destination (%s)", where)
	case !forward && r.Header.Get("Baggage") != "":
		return fmt.Errorf("a baggage header reached the destination")
	}
	return nil
}

// A producer's W3C baggage (internal key-values) never reaches a
// destination by default, whether the trace is sampled or not, while
// traceparent and tracestate flow as before; a destination with
// forward_baggage: true receives it. Control: the canary check, run
// against a destination that forwards baggage, catches the forwarding.
func TestBaggageNotForwardedByDefault(t *testing.T) {
	for _, sampled := range []bool{true, false} {
		t.Run(fmt.Sprintf("sampled=%t", sampled), func(t *testing.T) {
			if err := checkBaggage(t, "", sampled, false); err != nil {
				t.Fatal(err)
			}
			if err := checkBaggage(t, "forward_baggage: false", sampled, false); err != nil {
				t.Fatal(err)
			}
			if err := checkBaggage(t, "forward_baggage: true", sampled, true); err != nil {
				t.Fatal(err)
			}
			expectBroken(t, "baggage forwarded", func(t testing.TB) error {
				return checkBaggage(t, "forward_baggage: true", sampled, false)
			})
		})
	}
}

package bridge

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/sinktest"
	"github.com/sotercare/jetbridge/producer"
)

const settleWait = 15 * time.Second

// routeYAML is a route "r" on events.> to destination "d".
const routeYAML = `
routes:
  - name: r
    subjects: ["events.>"]
    destination: d
    max_deliver: %d
    backoff: [%s]
`

func TestTransportRetryNeverRepeatsA500(t *testing.T) {
	check := func(t testing.TB, f faults) error {
		sink := sinktest.New(t, sinktest.Always(500))
		cfg := testConfig(t, `
destinations:
  d:
    url: %s
    transport_retry: {count: 3, interval: 1ms, max_interval: 1ms}
    circuit_breaker: {enabled: false}
`+routeYAML, sink.URL(), 1, "10ms")
		h := startBridge(t, cfg, f)
		h.publish("events.info.order.created", "e1", []byte(`{"n":1}`), nil)
		out := h.waitOutcomes(1, settleWait, nil)
		if len(out) != 1 {
			return fmt.Errorf("%d settlements, want 1", len(out))
		}
		if n := sink.Count(); n != 1 {
			return fmt.Errorf("destination received %d requests, want exactly 1", n)
		}
		var de *DownstreamError
		if !errors.As(out[0].Err, &de) || de.Status != 500 {
			return fmt.Errorf("failure %v, want a DownstreamError with status 500", out[0].Err)
		}
		if out[0].Outcome != OutcomeDeadLettered || out[0].Reason != deadletter.ReasonMaxDeliveries {
			return fmt.Errorf("outcome %s/%s, want dead_lettered/max-deliveries", out[0].Outcome, out[0].Reason)
		}
		dl := h.deadLetters()
		if len(dl) != 1 || dl[0].Header.Get(deadletter.HeaderReason) != string(deadletter.ReasonMaxDeliveries) || dl[0].Header.Get(deadletter.HeaderStatus) != "500" {
			return fmt.Errorf("dead letters %d, want 1 with reason max-deliveries and status 500", len(dl))
		}
		return nil
	}
	if err := check(t, faults{}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "transport retry also retries statuses", func(t testing.TB) error {
		return check(t, faults{transportRetryStatuses: true})
	})
}

func TestTransportRetryCountsConnections(t *testing.T) {
	check := func(t testing.TB, f faults, count, wantConns int, readFirst bool) error {
		closer := sinktest.NewCloser(t, readFirst)
		cfg := testConfig(t, `
destinations:
  d:
    url: %s
    transport_retry: {count: %d, interval: 1ms, max_interval: 2ms}
    circuit_breaker: {enabled: false}
`+routeYAML, closer.URL(), count, 1, "10ms")
		h := startBridge(t, cfg, f)
		h.publish("events.info.x", "e1", []byte(`{}`), nil)
		out := h.waitOutcomes(1, settleWait, nil)
		if len(out) != 1 {
			return fmt.Errorf("%d settlements, want 1", len(out))
		}
		if n := closer.Accepted(); n != wantConns {
			return fmt.Errorf("listener accepted %d connections, want exactly %d", n, wantConns)
		}
		var te *TransportError
		if !errors.As(out[0].Err, &te) {
			return fmt.Errorf("failure %v, want a TransportError", out[0].Err)
		}
		if out[0].Tries != wantConns {
			return fmt.Errorf("bridge counted %d tries, want %d", out[0].Tries, wantConns)
		}
		return nil
	}
	for _, readFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("read request first %t", readFirst), func(t *testing.T) {
			if err := check(t, faults{}, 2, 3, readFirst); err != nil {
				t.Fatal(err)
			}
			if err := check(t, faults{}, 0, 1, readFirst); err != nil {
				t.Fatal(err)
			}
		})
	}
	expectBroken(t, "transport retry predicate that only looks at statuses", func(t testing.TB) error {
		return check(t, faults{transportRetryOnlyOn5xx: true}, 2, 3, true)
	})
}

func TestStatusRetry(t *testing.T) {
	run := func(t testing.TB, f faults, codes string, count int, script sinktest.Script) (*harness, *sinktest.Sink, []Settled) {
		sink := sinktest.New(t, script)
		cfg := testConfig(t, `
destinations:
  d:
    url: %s
    transport_retry: {count: 0}
    status_retry: {codes: [%s], count: %d, interval: 1ms, max_interval: 5ms, max_elapsed: 5s}
    circuit_breaker: {enabled: false}
`+routeYAML, sink.URL(), codes, count, 1, "10ms")
		h := startBridge(t, cfg, f)
		h.publish("events.info.x", "e1", []byte(`{}`), nil)
		return h, sink, h.waitOutcomes(1, settleWait, nil)
	}
	unlisted := func(t testing.TB, f faults) error {
		_, sink, out := run(t, f, "503", 2, sinktest.Always(500))
		if len(out) != 1 || sink.Count() != 1 {
			return fmt.Errorf("codes [503] against 500: %d requests (%d settlements), want exactly 1", sink.Count(), len(out))
		}
		return nil
	}
	t.Run("unlisted status is not retried", func(t *testing.T) {
		if err := unlisted(t, faults{}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("listed status retried count times", func(t *testing.T) {
		_, sink, out := run(t, faults{}, "500", 2, sinktest.Always(500))
		if len(out) != 1 || sink.Count() != 3 {
			t.Fatalf("codes [500] count 2 against 500: %d requests, want exactly 3", sink.Count())
		}
		if out[0].Tries != 3 {
			t.Fatalf("bridge counted %d tries, want 3", out[0].Tries)
		}
	})
	t.Run("503 503 202 is delivered on the third request", func(t *testing.T) {
		h, sink, out := run(t, faults{}, "503", 2, sinktest.Sequence(503, 503, 202))
		if len(out) != 1 || out[0].Outcome != OutcomeDelivered || out[0].Err != nil {
			t.Fatalf("outcomes %+v, want one delivered", out)
		}
		if sink.Count() != 3 {
			t.Fatalf("%d requests, want exactly 3", sink.Count())
		}
		h.quiet("r")
	})
	expectBroken(t, "status retry ignoring its codes", func(t testing.TB) error {
		return unlisted(t, faults{statusRetryAnyCode: true})
	})
}

func TestRejectedStatusesAreDeadLetteredOnce(t *testing.T) {
	statuses := map[string]int{"e400": 400, "e404": 404, "e422": 422}
	sink := sinktest.New(t, sinktest.ByEventID(func(id string, _ int) sinktest.Response {
		return sinktest.Response{Status: statuses[id]}
	}))
	cfg := testConfig(t, `
destinations:
  d:
    url: %s
`+routeYAML, sink.URL(), 5, "10ms")
	h := startBridge(t, cfg, faults{})
	payload := []byte("{ \"odd\" :  [1, 2 ],\n \"spacing\": true }") // byte-identical, not re-encoded
	seqs := map[string]uint64{}
	for id := range statuses {
		seqs[id] = h.publish("events.warning.order.failed", id, payload, map[string]string{
			"Event-Meta-Tenant": "acme", "X-Custom": "kept",
		})
	}
	out := h.waitOutcomes(3, settleWait, nil)
	if len(out) != 3 || sink.Count() != 3 {
		t.Fatalf("%d settlements and %d requests, want 3 and 3", len(out), sink.Count())
	}
	h.quiet("r")
	dl := h.deadLetters()
	if len(dl) != 3 {
		t.Fatalf("%d dead letters, want 3", len(dl))
	}
	for _, m := range dl {
		id := m.Header.Get(producer.HeaderEventID)
		want := map[string]string{
			deadletter.HeaderReason:           string(deadletter.ReasonRejected),
			deadletter.HeaderFailure:          string(deadletter.FailureDownstream),
			deadletter.HeaderStatus:           strconv.Itoa(statuses[id]),
			deadletter.HeaderRoute:            "r",
			deadletter.HeaderDestination:      "d",
			deadletter.HeaderDeliveries:       "1",
			deadletter.HeaderOriginalSubject:  "events.warning.order.failed",
			deadletter.HeaderOriginalStream:   "EVENTS",
			deadletter.HeaderOriginalSequence: strconv.FormatUint(seqs[id], 10),
			"Nats-Msg-Id":                     "dlq:r:EVENTS:" + strconv.FormatUint(seqs[id], 10),
			"Event-Meta-Tenant":               "acme",
			"X-Custom":                        "kept",
		}
		for k, v := range want {
			if got := m.Header.Get(k); got != v {
				t.Errorf("dead letter %s: %s = %q, want %q", id, k, got, v)
			}
		}
		if _, ok := statuses[id]; !ok {
			t.Errorf("dead letter with unexpected Event-Id %q", id)
		}
		if e := m.Header.Get(deadletter.HeaderError); e == "" || containsAny(e, sink.URL(), "127.0.0.1") {
			t.Errorf("Bridge-Error %q: want a short description without the URL", e)
		}
		if _, err := time.Parse(time.RFC3339, m.Header.Get(deadletter.HeaderFailedAt)); err != nil {
			t.Errorf("Bridge-Failed-At: %v", err)
		}
		if m.Subject != "dlq.r.events.warning.order.failed" {
			t.Errorf("dead-letter subject %q", m.Subject)
		}
		if string(m.Data) != string(payload) {
			t.Errorf("payload changed: %q", m.Data)
		}
	}
}

func TestRetryAfterIsHonouredAndCapped(t *testing.T) {
	check := func(t testing.TB, f faults, retryAfter func() string, maxRetryAfter string, minGap time.Duration) error {
		sink := sinktest.New(t, sinktest.ByEventID(func(_ string, attempt int) sinktest.Response {
			if attempt == 1 {
				return sinktest.Response{Status: 503, Header: http.Header{"Retry-After": {retryAfter()}}}
			}
			return sinktest.Response{Status: 200}
		}))
		cfg := testConfig(t, `
destinations:
  d:
    url: %s
    circuit_breaker: {enabled: false}
routes:
  - name: r
    subjects: ["events.>"]
    destination: d
    backoff: [10ms]
    max_retry_after: %s
`, sink.URL(), maxRetryAfter)
		h := startBridge(t, cfg, f)
		h.publish("events.info.x", "e1", []byte(`{}`), nil)
		out := h.waitOutcomes(2, settleWait, nil)
		if len(out) != 2 || out[1].Outcome != OutcomeDelivered {
			return fmt.Errorf("outcomes %+v, want a redelivery then a delivery", out)
		}
		reqs := sink.Requests()
		if gap := reqs[1].At.Sub(reqs[0].At); gap < minGap {
			return fmt.Errorf("second delivery came %s after the first, want no sooner than %s", gap, minGap)
		}
		return nil
	}
	seconds := func() string { return "1" }
	t.Run("seconds", func(t *testing.T) {
		if err := check(t, faults{}, seconds, "5m", time.Second); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("HTTP-date", func(t *testing.T) {
		date := func() string { return time.Now().Add(2 * time.Second).UTC().Format(http.TimeFormat) }
		if err := check(t, faults{}, date, "5m", time.Second); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("capped by max_retry_after", func(t *testing.T) {
		day := func() string { return "86400" }
		if err := check(t, faults{}, day, "300ms", 300*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	})
	expectBroken(t, "Retry-After ignored", func(t testing.TB) error {
		return check(t, faults{retryAfterIgnored: true}, seconds, "5m", time.Second)
	})
}

func TestMaxDeliverThenOneDeadLetter(t *testing.T) {
	check := func(t testing.TB, f faults) error {
		sink := sinktest.New(t, sinktest.Always(503))
		cfg := testConfig(t, `
destinations:
  d:
    url: %s
    circuit_breaker: {enabled: false}
`+routeYAML, sink.URL(), 3, "10ms")
		h := startBridge(t, cfg, f)
		h.publish("events.info.x", "e1", []byte(`{}`), nil)
		out := h.waitOutcomes(1, settleWait, outcomeIs(OutcomeDeadLettered))
		if len(out) != 1 {
			return fmt.Errorf("no dead letter")
		}
		h.quiet("r")
		if n := sink.Count(); n != 3 {
			return fmt.Errorf("destination received %d requests, want exactly 3", n)
		}
		all := h.outcomes()
		if len(all) != 3 || all[0].Outcome != OutcomeRedeliveryScheduled || all[1].Outcome != OutcomeRedeliveryScheduled {
			return fmt.Errorf("outcomes %+v, want 2 redeliveries then a dead letter", all)
		}
		dl := h.deadLetters()
		if len(dl) != 1 || dl[0].Header.Get(deadletter.HeaderReason) != string(deadletter.ReasonMaxDeliveries) || dl[0].Header.Get(deadletter.HeaderDeliveries) != "3" {
			return fmt.Errorf("%d dead letters, want exactly 1 (max-deliveries, 3 deliveries)", len(dl))
		}
		return nil
	}
	if err := check(t, faults{}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "max_deliver off by one", func(t testing.TB) error { return check(t, faults{maxDeliverOffByOne: true}) })
}

func TestInvalidEnvelopePayloadSendsNothing(t *testing.T) {
	sink := sinktest.New(t, sinktest.Always(200))
	cfg := testConfig(t, `
destinations:
  d:
    url: %s
`+routeYAML, sink.URL(), 5, "10ms")
	h := startBridge(t, cfg, faults{})
	h.publish("events.info.x", "bad", []byte("not json {"), nil)
	out := h.waitOutcomes(1, settleWait, nil)
	if len(out) != 1 || out[0].Outcome != OutcomeDeadLettered || out[0].Reason != deadletter.ReasonInvalidEvent {
		t.Fatalf("outcomes %+v, want one dead letter invalid-event", out)
	}
	h.quiet("r")
	if n := sink.Count(); n != 0 {
		t.Fatalf("destination received %d requests, want 0", n)
	}
	dl := h.deadLetters()
	if len(dl) != 1 || dl[0].Header.Get(deadletter.HeaderFailure) != string(deadletter.FailureInvalid) || dl[0].Header.Get(deadletter.HeaderStatus) != "" {
		t.Fatalf("dead letters %d, want one with failure invalid-event and no status", len(dl))
	}
}

// Go's http.Transport re-sends a POST carrying Idempotency-Key by itself
// when a reused keep-alive connection breaks. The bridge turns that off, so
// the destination sees exactly the requests the bridge counted.
func TestNoHiddenTransportRetries(t *testing.T) {
	check := func(t testing.TB, f faults) error {
		sink := sinktest.New(t, func(r sinktest.Request) sinktest.Response {
			if r.N == 2 { // the second request arrives on the reused connection
				return sinktest.Response{CloseConn: true}
			}
			return sinktest.Response{Status: 200}
		})
		cfg := testConfig(t, `
destinations:
  d:
    url: %s
    transport_retry: {count: 0}
    circuit_breaker: {enabled: false}
routes:
  - name: r
    subjects: ["events.>"]
    destination: d
    backoff: [10ms]
    max_in_flight: 1
`, sink.URL())
		h := startBridge(t, cfg, f)
		h.publish("events.info.x", "e1", []byte(`{}`), nil)
		h.waitOutcomes(1, settleWait, outcomeIs(OutcomeDelivered))
		h.publish("events.info.x", "e2", []byte(`{}`), nil)
		h.waitOutcomes(2, settleWait, outcomeIs(OutcomeDelivered))
		h.quiet("r")
		tries := 0
		for _, s := range h.outcomes() {
			tries += s.Tries
		}
		if sink.Count() != tries {
			return fmt.Errorf("destination received %d requests, the bridge counted %d", sink.Count(), tries)
		}
		if tries != 3 {
			return fmt.Errorf("bridge counted %d requests, want 3 (e1, e2 broken, e2 redelivered)", tries)
		}
		return nil
	}
	if err := check(t, faults{}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "net/http allowed to replay the POST", func(t testing.TB) error {
		return check(t, faults{keepGetBody: true})
	})
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if sub != "" && strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// The default pipeline builds only the policies it needs: the gate, the
// transport retry and the breaker, no status retry (opt-in) and no rate
// limit; a status_retry block adds the status retry, outermost of the
// two retries.
func TestDefaultPipelineBuildsNoPolicyItDoesNotNeed(t *testing.T) {
	pipe := func(t *testing.T, extra string) *pipeline {
		cfg := testConfig(t, `
destinations:
  d: {url: "http://127.0.0.1:1/hook"%s}
routes:
  - {name: r, subjects: ["events.>"], destination: d}
`, extra)
		m, err := newMetrics(prometheus.NewRegistry(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		d, err := newDestination(cfg.Destinations["d"], zerolog.Nop(), nil, m)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(d.close)
		return d.pipe.Load()
	}
	p := pipe(t, "")
	if got := p.policies(); len(got) != 3 || p.statusRetry != nil || p.transportRetry == nil || p.breaker == nil || p.rate != nil {
		t.Fatalf("default pipeline: %d policies (status retry %v, transport retry %v, breaker %v, rate %v), want the gate, the transport retry and the breaker",
			len(got), p.statusRetry != nil, p.transportRetry != nil, p.breaker != nil, p.rate != nil)
	}
	p = pipe(t, ", status_retry: {codes: [503]}")
	if got := p.policies(); len(got) != 4 || p.statusRetry == nil || got[1] != p.statusRetry {
		t.Fatalf("with status_retry: %d policies, status retry second: %v", len(got), p.statusRetry != nil && got[1] == p.statusRetry)
	}
}

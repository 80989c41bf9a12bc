package bridge

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"

	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
	"github.com/sotercare/jetbridge/producer"
)

// The producer's span that the tests' messages carry.
const (
	prodTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	prodSpanID  = "00f067aa0ba902b7"
	prodParent  = "00-" + prodTraceID + "-" + prodSpanID + "-01"
)

// withTracing turns tracing on in a bridge built by startHarness (as
// Options.TracerProvider does in New).
func withTracing(tp trace.TracerProvider, eventID bool) func(*Bridge) {
	return func(b *Bridge) {
		b.tr = newTracer(tp, eventID, b.cfg.Log.URLPaths)
		for _, d := range b.dests {
			d.trace = b.tr.forDestination(d)
		}
	}
}

func recorder() (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	rec := tracetest.NewSpanRecorder()
	return rec, sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
}

const traceYAML = `
destinations:
  d:
    url: %s
    circuit_breaker: {enabled: false}
routes:
  - {name: r, subjects: ["events.>"], destination: d, max_deliver: 5, backoff: [5ms, 10ms]}
`

func attrOf(s sdktrace.ReadOnlySpan, k attribute.Key) attribute.Value {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func eventAttr(e sdktrace.Event, k attribute.Key) attribute.Value {
	for _, kv := range e.Attributes {
		if kv.Key == k {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// checkRetriedTrace is the expected trace of a delivery that succeeded on
// the third JetStream delivery after two 503s: three consumer spans, each
// a child of the producer's span, each with one client span under it, all
// in the producer's trace; the first two in error with a redelivery
// settlement, the last one ok with an ack.
func checkRetriedTrace(spans []sdktrace.ReadOnlySpan) error {
	var deliveries, tries []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.SpanContext().TraceID().String() != prodTraceID {
			return fmt.Errorf("span %q is in trace %s, not the producer's", s.Name(), s.SpanContext().TraceID())
		}
		switch s.SpanKind() {
		case trace.SpanKindConsumer:
			deliveries = append(deliveries, s)
		case trace.SpanKindClient:
			tries = append(tries, s)
		}
	}
	if len(deliveries) != 3 || len(tries) != 3 || len(spans) != 6 {
		return fmt.Errorf("got %d spans (%d deliveries, %d tries), want 6 (3, 3)", len(spans), len(deliveries), len(tries))
	}
	slices.SortFunc(deliveries, func(a, b sdktrace.ReadOnlySpan) int {
		return int(attrOf(a, attrDelivery).AsInt64() - attrOf(b, attrDelivery).AsInt64())
	})
	for i, d := range deliveries {
		n := i + 1
		if d.Name() != "process events.info.order.created" {
			return fmt.Errorf("delivery %d: name %q", n, d.Name())
		}
		if d.Parent().SpanID().String() != prodSpanID || !d.Parent().IsRemote() {
			return fmt.Errorf("delivery %d: parent %s, want the producer's span %s", n, d.Parent().SpanID(), prodSpanID)
		}
		for k, want := range map[attribute.Key]any{
			"messaging.system": "nats", "messaging.destination.name": "events.info.order.created",
			"messaging.operation.type": "process", "messaging.consumer.group.name": "r",
			attrRoute: "r", attrDestination: "d", attrStream: "EVENTS", attrSequence: int64(1), attrDelivery: int64(n),
		} {
			if got := attrOf(d, k).AsInterface(); got != want {
				return fmt.Errorf("delivery %d: %s = %v, want %v", n, k, got, want)
			}
		}
		if v := attrOf(d, "messaging.message.id"); v.Type() != attribute.INVALID {
			return fmt.Errorf("delivery %d: event id recorded though tracing.event_id is off", n)
		}
		var try sdktrace.ReadOnlySpan
		for _, t := range tries {
			if t.Parent().SpanID() == d.SpanContext().SpanID() {
				if try != nil {
					return fmt.Errorf("delivery %d has two try spans", n)
				}
				try = t
			}
		}
		if try == nil {
			return fmt.Errorf("delivery %d has no try span", n)
		}
		wantStatus, wantCode, wantSettle := int64(503), codes.Error, "redelivery"
		if n == 3 {
			wantStatus, wantCode, wantSettle = 200, codes.Unset, "ack"
		}
		if got := attrOf(try, "http.response.status_code").AsInt64(); got != wantStatus {
			return fmt.Errorf("try of delivery %d: status %d, want %d", n, got, wantStatus)
		}
		if try.Status().Code != wantCode || d.Status().Code != wantCode {
			return fmt.Errorf("delivery %d: statuses try %v, delivery %v, want %v", n, try.Status().Code, d.Status().Code, wantCode)
		}
		if try.Name() != "POST" || attrOf(try, "http.request.method").AsString() != "POST" ||
			!strings.HasPrefix(attrOf(try, "url.full").AsString(), "http://127.0.0.1:") {
			return fmt.Errorf("try of delivery %d: name %q, attributes %v", n, try.Name(), try.Attributes())
		}
		evs := d.Events()
		if len(evs) != 1 || evs[0].Name != eventSettlement || eventAttr(evs[0], attrSettlement).AsString() != wantSettle {
			return fmt.Errorf("delivery %d: events %v, want one %s settlement", n, evs, wantSettle)
		}
		if n < 3 && eventAttr(evs[0], attrDelay).AsInt64() != int64(5*n) {
			return fmt.Errorf("delivery %d: redelivery delay %v ms, want %d", n, eventAttr(evs[0], attrDelay), 5*n)
		}
	}
	return nil
}

// A delivery that succeeds on the third JetStream delivery, after two
// 503s, is one trace: the producer's. The destination receives the try
// span's own traceparent each time.
func TestTraceRetriedDelivery(t *testing.T) {
	sink := sinktest.New(t, sinktest.Sequence(503, 503, 200))
	rec, tp := recorder()
	cfg := testConfig(t, traceYAML, sink.URL())
	h := startHarness(t, natstest.Start(t), cfg, faults{}, withTracing(tp, false))
	// Lowercase, as a non-Go producer writes it: NATS keeps the case.
	h.publish("events.info.order.created", "o-1", []byte(`{"order":1}`), map[string]string{"traceparent": prodParent})
	if got := h.waitOutcomes(1, 10*time.Second, outcomeIs(OutcomeDelivered)); len(got) != 1 {
		t.Fatalf("not delivered: %+v", h.outcomes())
	}
	spans := rec.Ended()
	if err := checkRetriedTrace(spans); err != nil {
		t.Fatal(err)
	}
	reqs := sink.Requests()
	if len(reqs) != 3 {
		t.Fatalf("destination got %d requests, want 3", len(reqs))
	}
	for i, r := range reqs {
		tp := r.Header.Get("Traceparent")
		parts := strings.Split(tp, "-")
		if len(parts) != 4 || parts[1] != prodTraceID || parts[2] == prodSpanID {
			t.Fatalf("request %d: traceparent %q: want the producer's trace with the try span's id", i+1, tp)
		}
		found := false
		for _, s := range spans {
			found = found || (s.SpanKind() == trace.SpanKindClient && s.SpanContext().SpanID().String() == parts[2])
		}
		if !found {
			t.Fatalf("request %d: traceparent span id %s is no try span", i+1, parts[2])
		}
	}
	t.Logf("span tree:\n%s", spanTree(spans))
	// Every delivery log line names the trace.
	for _, line := range strings.Split(strings.TrimSpace(h.logs.String()), "\n") {
		if strings.Contains(line, `"stream_seq"`) && !strings.Contains(line, `"trace_id":"`+prodTraceID+`"`) {
			t.Fatalf("delivery log line without the trace id: %s", line)
		}
	}
}

// Negative control: a tracer that ignores the message's traceparent
// (every delivery a new root) fails checkRetriedTrace.
func TestTraceRetriedDeliveryNegativeControl(t *testing.T) {
	sink := sinktest.New(t, sinktest.Sequence(503, 503, 200))
	rec, tp := recorder()
	cfg := testConfig(t, traceYAML, sink.URL())
	h := startHarness(t, natstest.Start(t), cfg, faults{}, withTracing(newRootProvider{tp}, false))
	h.publish("events.info.order.created", "o-1", []byte(`{"order":1}`), map[string]string{"traceparent": prodParent})
	if got := h.waitOutcomes(1, 10*time.Second, outcomeIs(OutcomeDelivered)); len(got) != 1 {
		t.Fatalf("not delivered: %+v", h.outcomes())
	}
	if err := checkRetriedTrace(rec.Ended()); err == nil {
		t.Fatal("checkRetriedTrace accepted deliveries that ignored the producer's trace")
	}
}

// newRootProvider is a broken tracer provider: every consumer span starts
// a new trace.
type newRootProvider struct{ trace.TracerProvider }

func (p newRootProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return newRootTracer{inner: p.TracerProvider.Tracer(name, opts...)}
}

type newRootTracer struct {
	embedded.Tracer
	inner trace.Tracer
}

func (t newRootTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if cfg := trace.NewSpanStartConfig(opts...); cfg.SpanKind() == trace.SpanKindConsumer {
		opts = append(opts, trace.WithNewRoot())
	}
	return t.inner.Start(ctx, name, opts...)
}

// A dead-lettered event's span says why; the dead letter keeps the
// producer's traceparent, and its replay continues the producer's trace
// (its delivery span is another child of the producer's span).
func TestTraceDeadLetterAndReplay(t *testing.T) {
	sink := sinktest.New(t, sinktest.Always(400))
	rec, tp := recorder()
	cfg := testConfig(t, traceYAML, sink.URL())
	h := startHarness(t, natstest.Start(t), cfg, faults{}, withTracing(tp, true))
	h.publish("events.info.order.created", "o-2", []byte(`{"order":2}`), map[string]string{
		"Traceparent": prodParent, "Tracestate": "vendor=abc", producer.HeaderEventID: "o-2"})
	if got := h.waitOutcomes(1, 10*time.Second, outcomeIs(OutcomeDeadLettered)); len(got) != 1 {
		t.Fatalf("not dead-lettered: %+v", h.outcomes())
	}
	var d sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindConsumer {
			d = s
		}
	}
	if d == nil || d.Status().Code != codes.Error || !strings.HasPrefix(d.Status().Description, "rejected: ") ||
		!strings.Contains(d.Status().Description, "400") {
		t.Fatalf("dead-letter span status: %+v", d)
	}
	if attrOf(d, attrReason).AsString() != string(deadletter.ReasonRejected) || attrOf(d, "error.type").AsString() != "downstream-status" ||
		attrOf(d, "messaging.message.id").AsString() != "o-2" {
		t.Fatalf("dead-letter span attributes: %v", d.Attributes())
	}
	ev := d.Events()[0]
	if eventAttr(ev, attrSettlement).AsString() != "dead_letter" || eventAttr(ev, attrReason).AsString() != string(deadletter.ReasonRejected) ||
		eventAttr(ev, attrDLQSeq).AsInt64() != 1 {
		t.Fatalf("settlement event: %+v", ev)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	q := deadletter.Open(h.js, h.cfg)
	dl, err := q.Get(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if dl.Header.Get("Traceparent") != prodParent || dl.Header.Get("Tracestate") != "vendor=abc" {
		t.Fatalf("dead letter lost the trace headers: %v", dl.Header)
	}
	sink.SetScript(sinktest.Always(200))
	if _, err := q.Replay(ctx, 1, false); err != nil {
		t.Fatal(err)
	}
	if got := h.waitOutcomes(1, 10*time.Second, outcomeIs(OutcomeDelivered)); len(got) != 1 {
		t.Fatalf("replay not delivered: %+v", h.outcomes())
	}
	var replayed sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindConsumer && attrOf(s, attrReplayedFrom).AsInt64() == 1 {
			replayed = s
		}
	}
	if replayed == nil || replayed.SpanContext().TraceID().String() != prodTraceID ||
		replayed.Parent().SpanID().String() != prodSpanID || replayed.Status().Code != codes.Unset {
		t.Fatalf("replay's delivery span does not continue the producer's trace: %+v", replayed)
	}
	if got := sink.Requests()[1].Header.Get("Tracestate"); got != "vendor=abc" {
		t.Fatalf("tracestate of the replay's request: %q", got)
	}
}

// A planted traceparent or tracestate (malformed, or with CR/LF) is never
// forwarded as is: the delivery starts a trace of its own and the request
// carries only values the propagator rendered.
func TestTraceHeaderInjectionIgnored(t *testing.T) {
	sink := sinktest.New(t, sinktest.Always(200))
	rec, tp := recorder()
	cfg := testConfig(t, traceYAML, sink.URL())
	h := startHarness(t, natstest.Start(t), cfg, faults{}, withTracing(tp, false))
	planted := []map[string]string{
		{"traceparent": prodParent + "\r\nX-Injected: 1"},
		{"traceparent": "00-" + strings.ToUpper(prodTraceID) + "-" + prodSpanID + "-01"},
		{"traceparent": "00-" + prodTraceID + "-" + prodSpanID},
		{"traceparent": "ff-" + prodTraceID + "-" + prodSpanID + "-01"},
		{"traceparent": "00-00000000000000000000000000000000-" + prodSpanID + "-01"},
		{"traceparent": prodParent, "tracestate": "a=b\r\nX-Injected: 1,c=\x1b[2J"},
		{"traceparent": "01-" + prodTraceID + "-" + prodSpanID + "-01-\nX-Injected: 1"},
	}
	for i, hdr := range planted {
		h.publish("events.info.order.created", fmt.Sprint("inj-", i), []byte(`{}`), hdr)
	}
	h.waitOutcomes(len(planted), 10*time.Second, nil)
	reqs := sink.Requests()
	if len(reqs) != len(planted) {
		t.Fatalf("got %d requests, want %d", len(reqs), len(planted))
	}
	for _, r := range reqs {
		if err := checkForwarded(r.Header.Get("Traceparent"), r.Header.Get("Tracestate"), r.Header); err != nil {
			t.Fatalf("request %s: %v", r.Header.Get("X-Event-Id"), err)
		}
	}
	// The well-formed traceparents with a bad tracestate or a future
	// version keep their trace; the others start new ones.
	kept := 0
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindConsumer && s.SpanContext().TraceID().String() == prodTraceID {
			kept++
		}
	}
	if kept != 2 {
		t.Fatalf("%d deliveries kept the planted trace, want 2 (valid traceparent with a bad tracestate, version 01)", kept)
	}
	// Negative control: the same check catches a bridge that forwards
	// what the message carried.
	if checkForwarded(planted[1]["traceparent"], "", nil) == nil || checkForwarded(prodParent, "a=b,c=\x1b[2J", nil) == nil {
		t.Fatal("checkForwarded accepts planted values")
	}
}

// checkForwarded accepts a request's trace headers only in the form the
// W3C propagator renders: version 00, lowercase hex, no other field, a
// tracestate that is a valid W3C list as rendered (so without control
// characters), and no injected header. (nats.go turns CR and LF in a
// header value into spaces, so what arrives of "a=b\r\nX-Injected: 1"
// is the valid list member a="b  X-Injected: 1": harmless text.)
func checkForwarded(tp, ts string, h map[string][]string) error {
	p := strings.Split(tp, "-")
	if len(p) != 4 || p[0] != "00" || len(p[1]) != 32 || len(p[2]) != 16 || len(p[3]) != 2 || strings.ToLower(tp) != tp ||
		p[1] == strings.Repeat("0", 32) || strings.ContainsAny(tp, "\r\n ") {
		return fmt.Errorf("traceparent %q is not propagator-rendered", tp)
	}
	if parsed, err := trace.ParseTraceState(ts); err != nil || parsed.String() != ts {
		return fmt.Errorf("tracestate %q forwarded as planted", ts)
	}
	if _, ok := h["X-Injected"]; ok {
		return fmt.Errorf("an injected header arrived")
	}
	return nil
}

// spanTree renders spans as an indented tree with offsets and durations
// from the first span's start (the example trace in
// docs/tracing.md#a-retried-delivery-from-a-real-run).
func spanTree(spans []sdktrace.ReadOnlySpan) string {
	if len(spans) == 0 {
		return ""
	}
	t0 := spans[0].StartTime()
	for _, s := range spans {
		if s.StartTime().Before(t0) {
			t0 = s.StartTime()
		}
	}
	slices.SortFunc(spans, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
	var b strings.Builder
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }
	for _, s := range spans {
		indent := "  "
		if s.SpanKind() == trace.SpanKindClient {
			indent = "    "
		}
		fmt.Fprintf(&b, "%s%-40s +%-8s %-8s %s", indent, s.Name(), ms(s.StartTime().Sub(t0)), ms(s.EndTime().Sub(s.StartTime())), s.Status().Code)
		if v := attrOf(s, "http.response.status_code"); v.Type() != attribute.INVALID {
			fmt.Fprintf(&b, " status=%d", v.AsInt64())
		}
		if v := attrOf(s, attrDelivery); v.Type() != attribute.INVALID {
			fmt.Fprintf(&b, " delivery=%d outcome=%s", v.AsInt64(), attrOf(s, attrOutcome).AsString())
		}
		for _, e := range s.Events() {
			if e.Name == eventHold {
				fmt.Fprintf(&b, " [held by the open breaker at +%s for %dms]", ms(e.Time.Sub(t0)), eventAttr(e, attrWait).AsInt64())
			}
			if e.Name == eventSettlement {
				fmt.Fprintf(&b, " settlement=%s", eventAttr(e, attrSettlement).AsString())
				if v := eventAttr(e, attrDelay); v.Type() != attribute.INVALID {
					fmt.Fprintf(&b, " delay=%dms", v.AsInt64())
				}
			}
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// Time held by the open breaker is an event on the delivery span that
// waited: one per hold (as many as "held" log lines), with its duration.
// The two 503s of the first try and its status retry open the breaker, so
// the second retry is refused and the message is held until the probe.
func TestTraceHoldEvent(t *testing.T) {
	sink := sinktest.New(t, sinktest.Sequence(503, 503, 200))
	rec, tp := recorder()
	cfg := testConfig(t, `
destinations:
  d:
    url: %s
    transport_retry: {count: 0}
    status_retry: {codes: [503], count: 2, interval: 5ms, max_interval: 5ms}
    circuit_breaker: {failure_rate: 0.5, min_requests: 2, window: 30s, delay: 100ms, statuses: [503]}
routes:
  - {name: r, subjects: ["events.>"], destination: d, max_in_flight: 1, max_deliver: 10, backoff: [5ms]}
`, sink.URL())
	h := startHarness(t, natstest.Start(t), cfg, faults{}, withTracing(tp, false))
	h.publish("events.info.order.created", "o-3", []byte(`{}`), map[string]string{"traceparent": prodParent})
	if got := h.waitOutcomes(1, 10*time.Second, outcomeIs(OutcomeDelivered)); len(got) != 1 {
		t.Fatalf("not delivered: %+v", h.outcomes())
	}
	holds, heldSpans := 0, 0
	for _, s := range rec.Ended() {
		n := 0
		for _, e := range s.Events() {
			if e.Name == eventHold {
				n++
				if eventAttr(e, attrWait).Type() != attribute.INT64 {
					t.Fatalf("hold event without its duration: %+v", e)
				}
			}
		}
		if n > 0 {
			heldSpans++
			if attrOf(s, attrOutcome).AsString() != string(OutcomeDelivered) {
				t.Fatalf("the held delivery %v was not the delivered one", s.Attributes())
			}
		}
		holds += n
	}
	logged := strings.Count(h.logs.String(), `"message":"held: circuit breaker open"`)
	if holds == 0 || holds != logged || heldSpans != 1 {
		t.Fatalf("%d hold events on %d spans, %d held log lines; want at least one, on one span, one per log line", holds, heldSpans, logged)
	}
	t.Logf("span tree:\n%s", spanTree(rec.Ended()))
}

// Even a dead letter reduced to its minimal form keeps the trace headers
// (in the case the producer used), so that its replay continues the trace.
func TestMinimalDeadLetterKeepsTrace(t *testing.T) {
	full := &nats.Msg{Subject: "dlq.r.events.x", Header: nats.Header{
		"traceparent": {prodParent}, "Tracestate": {"v=1"}, "X-Other": {"dropped"}, deadletter.HeaderReason: {"rejected"},
	}, Data: []byte(`{}`)}
	min := shrinkDeadLetter(full, dlMinimal)
	if min.Header.Get("traceparent") != prodParent || min.Header.Get("Tracestate") != "v=1" || min.Header.Get("X-Other") != "" {
		t.Fatalf("minimal dead letter headers: %v", min.Header)
	}
	// Negative control: the header list without the trace headers drops them.
	saved := keptHeaders
	keptHeaders = keptHeaders[:4]
	defer func() { keptHeaders = saved }()
	if shrinkDeadLetter(full, dlMinimal).Header.Get("traceparent") != "" {
		t.Fatal("the check cannot tell a list without the trace headers")
	}
}

// A producer's unsampled trace (flags 00) is carried on, not recorded: the
// request's traceparent has the producer's trace id and flags 00, and no
// span is exported.
func TestTraceUnsampledCarriedOn(t *testing.T) {
	sink := sinktest.New(t, sinktest.Always(200))
	rec, tp := recorder()
	h := startHarness(t, natstest.Start(t), testConfig(t, traceYAML, sink.URL()), faults{}, withTracing(tp, false))
	h.publish("events.info.order.created", "u-1", []byte(`{}`), map[string]string{
		"traceparent": "00-" + prodTraceID + "-" + prodSpanID + "-00"})
	if got := h.waitOutcomes(1, 10*time.Second, outcomeIs(OutcomeDelivered)); len(got) != 1 {
		t.Fatalf("not delivered: %+v", h.outcomes())
	}
	got := sink.Requests()[0].Header.Get("Traceparent")
	if p := strings.Split(got, "-"); len(p) != 4 || p[1] != prodTraceID || p[2] == prodSpanID || p[3] != "00" {
		t.Fatalf("traceparent %q: want the producer's trace, another span, flags 00", got)
	}
	if n := len(rec.Ended()); n != 0 {
		t.Fatalf("%d spans recorded for an unsampled trace", n)
	}
}

package export_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/otlptest"
	"github.com/sotercare/jetbridge/internal/sinktest"
	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/tracing"
	"github.com/sotercare/jetbridge/tracing/export"
)

const knownTrace = "0af7651916cd43dd8448eb211c80319c"

// producerCtx is a context carrying the producer's (sampled) span.
func producerCtx(t testing.TB, i int) context.Context {
	t.Helper()
	tid, _ := trace.TraceIDFromHex(knownTrace)
	sid, _ := trace.SpanIDFromHex(fmt.Sprintf("%016x", i+1))
	return trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true,
	}))
}

// running is an in-process bridge exporting its spans through Setup.
type running struct {
	sink *sinktest.Sink
	pub  *producer.Publisher
	p    *export.Provider
	reg  *prometheus.Registry
}

// runBridge sets the OTEL_* variables, builds the provider with Setup and
// runs a bridge (embedded JetStream, a real HTTP destination answering
// 503 to each event's first request when flaky) until the test ends.
func runBridge(t *testing.T, env map[string]string, flaky bool) *running {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "20") // ms: export promptly
	reg := prometheus.NewRegistry()
	p, err := export.Setup(context.Background(), export.Settings{Registerer: reg, OnError: func(error) {}})
	if err != nil || p == nil {
		t.Fatalf("Setup: %v, %v", p, err)
	}
	t.Cleanup(func() { _ = p.Shutdown(200 * time.Millisecond) })
	sink := sinktest.New(t, sinktest.ByEventID(func(_ string, attempt int) sinktest.Response {
		if flaky && attempt == 1 {
			return sinktest.Response{Status: 503}
		}
		return sinktest.Response{Status: 200}
	}))
	cfg, err := config.Load([]byte(fmt.Sprintf(`
destinations:
  d: {url: %s, circuit_breaker: {enabled: false}}
routes:
  - {name: r, subjects: ["events.>"], destination: d, max_in_flight: 32, backoff: [5ms]}
`, sink.URL())), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL())
	b, err := bridge.New(cfg, js, bridge.Options{TracerProvider: p.TracerProvider()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-b.Ready():
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	_, pjs := natstest.Connect(t, srv.URL())
	return &running{sink: sink, pub: producer.NewPublisher(pjs, "events", producer.WithHeaders(tracing.Inject)), p: p, reg: reg}
}

func (r *running) publish(t testing.TB, n int) {
	t.Helper()
	for i := range n {
		ctx, cancel := context.WithTimeout(producerCtx(t, i), 5*time.Second)
		_, err := r.pub.Publish(ctx, producer.Event{ID: fmt.Sprint("e-", i), Type: "order.created", Payload: []byte(`{}`)})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
}

func waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-time.After(5 * time.Millisecond)
	}
	return true
}

// End to end: an event published in a known trace reaches the destination
// with a traceparent of that trace, and a real OTLP/HTTP endpoint receives
// the bridge's spans of that trace: both deliveries (the first answered
// 503) and their HTTP try spans, under service.name jetbridge.
func TestEndToEndOTLP(t *testing.T) {
	recv := otlptest.New(t, false)
	r := runBridge(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": recv.URL()}, true)
	r.publish(t, 1)
	r.sink.WaitCount(t, 2, 10*time.Second)
	for _, req := range r.sink.Requests() {
		if tp := req.Header.Get("Traceparent"); !strings.HasPrefix(tp, "00-"+knownTrace+"-") {
			t.Fatalf("destination got traceparent %q, want trace %s", tp, knownTrace)
		}
	}
	var deliveries, tries []otlptest.Span
	ok := waitFor(10*time.Second, func() bool {
		deliveries, tries = nil, nil
		for _, s := range recv.Spans() {
			switch {
			case s.TraceID != knownTrace:
			case s.Kind == tracepb.Span_SPAN_KIND_CONSUMER:
				deliveries = append(deliveries, s)
			case s.Kind == tracepb.Span_SPAN_KIND_CLIENT:
				tries = append(tries, s)
			}
		}
		return len(deliveries) == 2 && len(tries) == 2
	})
	if !ok {
		t.Fatalf("receiver got %d deliveries and %d tries of trace %s, want 2 and 2 (all spans: %+v)", len(deliveries), len(tries), knownTrace, recv.Spans())
	}
	for _, d := range deliveries {
		if d.ParentID != "0000000000000001" || d.Service != "jetbridge" || d.Attributes["messaging.system"] != "nats" {
			t.Fatalf("delivery span: %+v", d)
		}
	}
	for _, try := range tries {
		parentOK := try.ParentID == deliveries[0].SpanID || try.ParentID == deliveries[1].SpanID
		if !parentOK || try.Name != "POST" {
			t.Fatalf("try span %+v is not under a delivery span", try)
		}
		found := false
		for _, req := range r.sink.Requests() {
			found = found || strings.Contains(req.Header.Get("Traceparent"), "-"+try.SpanID+"-")
		}
		if !found {
			t.Fatalf("no request carried try span %s", try.SpanID)
		}
	}
}

// A dead collector (nothing listening, or a receiver that never answers)
// loses no event: every one is delivered exactly once. Spans that find
// the export queue full are dropped and counted. Throughput is logged,
// not asserted (BenchmarkHotPathTracing measures it).
func TestDeadCollectorLosesNoEvent(t *testing.T) {
	refused := func(t *testing.T) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		return "http://" + addr
	}
	for _, tc := range []struct {
		name     string
		endpoint func(t *testing.T) string
		hangs    bool
	}{
		{"connection refused", refused, false},
		{"receiver hangs", func(t *testing.T) string { return otlptest.New(t, true).URL() }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 300
			r := runBridge(t, map[string]string{
				"OTEL_EXPORTER_OTLP_ENDPOINT": tc.endpoint(t),
				"OTEL_BSP_MAX_QUEUE_SIZE":     "16",
				"OTEL_EXPORTER_OTLP_TIMEOUT":  "60000",
			}, false)
			start := time.Now()
			r.publish(t, n)
			r.sink.WaitCount(t, n, 30*time.Second)
			took := time.Since(start)
			ids := map[string]int{}
			for _, req := range r.sink.Requests() {
				ids[req.Header.Get("X-Event-Id")]++
			}
			if len(ids) != n || r.sink.Count() != n {
				t.Fatalf("%d requests for %d distinct events, want %d and %d", r.sink.Count(), len(ids), n, n)
			}
			// The last spans end just after the last request arrived.
			var dropped float64
			waitFor(5*time.Second, func() bool {
				dropped = droppedMetric(t, r.reg)
				return uint64(dropped) == r.p.Dropped()
			})
			t.Logf("%s: %d events delivered in %s (%.0f/s incl. publishing), %v spans dropped", tc.name, n, took.Round(time.Millisecond), n/took.Seconds(), dropped)
			// A hanging export holds its batch: the queue of 16 fills and
			// the rest of the 600 spans are dropped, counted.
			if tc.hangs && (dropped == 0 || uint64(dropped) != r.p.Dropped()) {
				t.Fatalf("dropped %v (metric) / %d, want > 0 and equal", dropped, r.p.Dropped())
			}
			// Shutdown is bounded even with the collector stuck.
			done := make(chan error, 1)
			go func() { done <- r.p.Shutdown(100 * time.Millisecond) }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("Shutdown did not return")
			}
		})
	}
}

// droppedMetric reads bridge_trace_spans_dropped_total from reg.
func droppedMetric(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "bridge_trace_spans_dropped_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("bridge_trace_spans_dropped_total not registered")
	return 0
}

package tracing_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/tracing"
)

const (
	traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	spanID  = "00f067aa0ba902b7"
	parent  = "00-" + traceID + "-" + spanID + "-01"
)

// receive publishes a core NATS message with header h over a real server
// and returns the header as a subscriber receives it.
func receive(t *testing.T, h nats.Header) nats.Header {
	t.Helper()
	srv := natstest.Start(t)
	nc, _ := natstest.Connect(t, srv.URL())
	sub, err := nc.SubscribeSync("t")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishMsg(&nats.Msg{Subject: "t", Header: h}); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return m.Header
}

// A lowercase traceparent, as non-Go producers write it, keeps its case
// over NATS. Carrier finds it; http.Header's carrier (the negative
// control) does not.
func TestCarrierCaseInsensitiveOverNATS(t *testing.T) {
	got := receive(t, nats.Header{"traceparent": {parent}, "tracestate": {"v=1"}})
	sc := trace.SpanContextFromContext(tracing.Extract(context.Background(), got))
	if sc.TraceID().String() != traceID || sc.SpanID().String() != spanID || !sc.IsRemote() || sc.TraceState().Get("v") != "1" {
		t.Fatalf("Carrier: got %v", sc)
	}
	naive := propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(http.Header(got)))
	if trace.SpanContextFromContext(naive).IsValid() {
		t.Fatal("negative control: http.Header's carrier found a lowercase traceparent; the test cannot tell the carriers apart")
	}
}

// Malformed traceparents, and any with CR or LF (as a raw client could
// send, bypassing nats.go), give no span context; a malformed tracestate
// is dropped while its valid traceparent is kept.
func TestExtractRejectsMalformed(t *testing.T) {
	for _, v := range []string{
		parent + "\r\nX-Injected: 1",
		"\r\n" + parent,
		parent[:len(parent)-1] + "\n",
		"00-" + traceID + "-" + spanID,
		"00-" + traceID + "-" + spanID + "-01-extra",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-" + spanID + "-01",
		"ff-" + traceID + "-" + spanID + "-01",
		"00-00000000000000000000000000000000-" + spanID + "-01",
		"00-" + traceID + "-0000000000000000-01",
	} {
		sc := trace.SpanContextFromContext(tracing.Extract(context.Background(), nats.Header{"Traceparent": {v}}))
		if sc.IsValid() {
			t.Errorf("traceparent %q accepted", v)
		}
	}
	sc := trace.SpanContextFromContext(tracing.Extract(context.Background(),
		nats.Header{"Traceparent": {parent}, "Tracestate": {"a=b\r\nX-Injected: 1"}}))
	if !sc.IsValid() || sc.TraceState().Len() != 0 {
		t.Fatalf("bad tracestate: span context %v, tracestate %q", sc.IsValid(), sc.TraceState().String())
	}
}

// Inject writes the W3C headers of the context's span, but never over a
// traceparent the producer set itself (in any case).
func TestInjectKeepsProducersOwn(t *testing.T) {
	ctx := tracing.Extract(context.Background(), nats.Header{"Traceparent": {parent}})
	h := nats.Header{}
	tracing.Inject(ctx, h)
	if h.Get("traceparent") != parent {
		t.Fatalf("injected %v", h)
	}
	own := "00-11111111111111111111111111111111-2222222222222222-01"
	h = nats.Header{"TraceParent": {own}}
	tracing.Inject(ctx, h)
	if len(h) != 1 || h["TraceParent"][0] != own {
		t.Fatalf("producer's own traceparent replaced: %v", h)
	}
	h = nats.Header{}
	tracing.Inject(context.Background(), h)
	if len(h) != 0 {
		t.Fatalf("injected without a span: %v", h)
	}
}

// TRACEPARENT in the environment puts a command's events in that trace;
// a malformed one is ignored.
func TestInjectEnvironment(t *testing.T) {
	t.Setenv("TRACEPARENT", parent)
	h := nats.Header{}
	tracing.InjectEnvironment(context.Background(), h)
	if h.Get("traceparent") != parent {
		t.Fatalf("got %v", h)
	}
	t.Setenv("TRACEPARENT", parent+"\r\nX: 1")
	h = nats.Header{}
	tracing.InjectEnvironment(context.Background(), h)
	if len(h) != 0 {
		t.Fatalf("malformed TRACEPARENT injected: %v", h)
	}
}

// The producer's header hook puts the caller's trace on the stored event,
// and can never replace the producer's own headers.
func TestPublisherHook(t *testing.T) {
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}})
	if err != nil {
		t.Fatal(err)
	}
	hook := func(ctx context.Context, h nats.Header) {
		tracing.Inject(ctx, h)
		h.Set("Event-Id", "forged") // must not win
	}
	p := producer.NewPublisher(js, "events", producer.WithHeaders(hook))
	res, err := p.Publish(tracing.Extract(ctx, nats.Header{"traceparent": {parent}}),
		producer.Event{ID: "e-1", Type: "order.created", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(ctx, res.Seq)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get("traceparent") != parent || m.Header.Get("Event-Id") != "e-1" {
		t.Fatalf("stored headers: %v", m.Header)
	}
	bad := producer.NewPublisher(js, "events", producer.WithHeaders(func(_ context.Context, h nats.Header) {
		h.Set("X-Bad", "a\x01b")
	}))
	if _, err := bad.Publish(ctx, producer.Event{Type: "order.created", Payload: []byte(`{}`)}); err == nil {
		t.Fatal("a hook value with a control character was published")
	}
}

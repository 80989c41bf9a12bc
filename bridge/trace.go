package bridge

// This file is the bridge's OpenTelemetry tracing (docs/tracing.md): one
// consumer span per JetStream delivery of a message on a route, child of
// the producer's span found in the message's traceparent; one client span
// per HTTP try under it, whose context is injected into the request; span
// events for the time held by an open breaker or waiting for an
// idempotency reservation, and for the settlement. With no TracerProvider
// in Options every entry point returns at its first line: no span, no
// allocation.

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/tracing"
)

// instrumentationName names the bridge's tracer.
const instrumentationName = "github.com/sotercare/jetbridge/bridge"

// Span attributes of the bridge's own (no semantic convention has them).
const (
	attrRoute        = attribute.Key("jetbridge.route")
	attrDestination  = attribute.Key("jetbridge.destination")
	attrStream       = attribute.Key("jetbridge.stream")
	attrSequence     = attribute.Key("jetbridge.stream.sequence")
	attrDelivery     = attribute.Key("jetbridge.delivery_count")
	attrReplayedFrom = attribute.Key("jetbridge.replayed_from")
	attrOutcome      = attribute.Key("jetbridge.outcome")
	attrReason       = attribute.Key("jetbridge.reason")
	attrTries        = attribute.Key("jetbridge.tries")
	attrSettlement   = attribute.Key("jetbridge.settlement")
	attrDelay        = attribute.Key("jetbridge.redelivery.delay_ms")
	attrDLQSeq       = attribute.Key("jetbridge.dlq.sequence")
	attrWait         = attribute.Key("jetbridge.wait_ms")
)

// Span event names.
const (
	eventHold        = "held: circuit breaker open"
	eventReservation = "waited: idempotency reservation held by another delivery"
	eventSettlement  = "settlement"
)

// tracer makes the bridge's spans; nil when tracing is off.
type tracer struct {
	t        trace.Tracer
	eventID  bool // messaging.message.id on delivery spans (tracing.event_id)
	urlPaths bool // url.full with the destination's path (log.url_paths)
}

func newTracer(tp trace.TracerProvider, eventID, urlPaths bool) *tracer {
	if tp == nil {
		return nil
	}
	return &tracer{t: tp.Tracer(instrumentationName), eventID: eventID, urlPaths: urlPaths}
}

// startDelivery starts the delivery span of a message, as a child of the
// span context in its headers (validated by the W3C propagator: a
// malformed traceparent starts a new trace), stores it in ev and returns
// ctx carrying it, for the HTTP tries.
func (t *tracer) startDelivery(ctx context.Context, r *route, m jetstream.Msg, ev *event) context.Context {
	if t == nil {
		return ctx
	}
	h := m.Headers()
	parent := tracing.Extract(ctx, h)
	if !r.forwardsBaggage() {
		// The producer's baggage (internal key-values) stays inside: the
		// tries inject what this context holds, sampled or not.
		parent = baggage.ContextWithoutBaggage(parent)
	}
	ctx, ev.span = t.t.Start(parent, "process "+ev.Subject, trace.WithSpanKind(trace.SpanKindConsumer))
	if !ev.span.IsRecording() {
		// Not sampled: the span only carries the trace on. Its attributes
		// are set after the sampling decision so that the unsampled
		// majority (ratio 0.01) does not build them.
		return ctx
	}
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemKey.String("nats"),
		semconv.MessagingOperationName("process"),
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingDestinationName(ev.Subject),
		semconv.MessagingConsumerGroupName(r.cfg.Name),
		semconv.MessagingMessageBodySize(len(ev.Payload)),
		attrRoute.String(r.cfg.Name),
		attrDestination.String(r.dest.name),
		attrStream.String(ev.Stream),
		attrSequence.Int64(int64(ev.Seq)),
		attrDelivery.Int64(int64(ev.Delivered)),
	}
	if t.eventID {
		attrs = append(attrs, semconv.MessagingMessageID(ev.ID))
	}
	if v := tracing.Carrier(h).Get(deadletter.HeaderReplayedFrom); v != "" {
		if seq, err := strconv.ParseUint(v, 10, 64); err == nil {
			attrs = append(attrs, attrReplayedFrom.Int64(int64(seq)))
		}
	}
	ev.span.SetAttributes(attrs...)
	return ctx
}

// forwardsBaggage reports whether the route's destination enables
// forward_baggage: only then does a message's W3C baggage reach it.
func (r *route) forwardsBaggage() bool {
	return r.dest.cfg.ForwardBaggage
}

// traceWait records time spent waiting (held by the open breaker, or for
// a reservation) as an event at the start of the wait.
func traceWait(ev *event, name string, since time.Time) {
	if ev.span == nil || !ev.span.IsRecording() {
		return
	}
	ev.span.AddEvent(name, trace.WithTimestamp(since),
		trace.WithAttributes(attrWait.Int64(time.Since(since).Milliseconds())))
}

// endDelivery records the settlement and ends the delivery span, with an
// error status exactly when the delivery failed (a redelivery or a dead
// letter; a duplicate is not a failure). It runs before the settlement is
// reported (OnSettle), so the span has ended by then.
func endDelivery(ev *event, out Settled, dlq uint64) {
	sp := ev.span
	if sp == nil {
		return
	}
	if !sp.IsRecording() {
		sp.End()
		return
	}
	attrs := []attribute.KeyValue{attrOutcome.String(string(out.Outcome)), attrTries.Int(out.Tries)}
	ea := make([]attribute.KeyValue, 0, 3)
	switch out.Outcome {
	case OutcomeDelivered, OutcomeDuplicateSkipped:
		ea = append(ea, attrSettlement.String("ack"))
	case OutcomeDeadLettered:
		ea = append(ea, attrSettlement.String("dead_letter"), attrReason.String(string(out.Reason)))
		attrs = append(attrs, attrReason.String(string(out.Reason)))
		if dlq != 0 {
			ea = append(ea, attrDLQSeq.Int64(int64(dlq)))
		}
	default:
		ea = append(ea, attrSettlement.String("redelivery"), attrDelay.Int64(out.Delay.Milliseconds()))
	}
	if kind := FailureKind(out.Err); kind != "" {
		attrs = append(attrs, semconv.ErrorTypeKey.String(string(kind)))
	}
	sp.AddEvent(eventSettlement, trace.WithAttributes(ea...))
	sp.SetAttributes(attrs...)
	if out.Outcome == OutcomeRedeliveryScheduled || out.Outcome == OutcomeDeadLettered {
		why := describe(out.Err) // never a URL, header value or body
		if out.Outcome == OutcomeDeadLettered {
			why = string(out.Reason) + ": " + why
		}
		sp.SetStatus(codes.Error, why)
	}
	sp.End()
}

// traceLog adds the delivery span's trace_id and span_id to a log event
// (msgLog does it for every delivery line).
func traceLog(e *zerolog.Event, ev *event) *zerolog.Event {
	if e == nil || ev.span == nil {
		return e
	}
	sc := ev.span.SpanContext()
	return e.Str("trace_id", sc.TraceID().String()).Str("span_id", sc.SpanID().String())
}

// destTrace makes a destination's HTTP try spans; nil when tracing is off.
type destTrace struct {
	t     trace.Tracer
	attrs []attribute.KeyValue // method, URL without user info or query, server
}

// forDestination returns d's try tracer (nil when tracing is off).
func (t *tracer) forDestination(d *destination) *destTrace {
	if t == nil {
		return nil
	}
	attrs := []attribute.KeyValue{semconv.HTTPRequestMethodPost, attrDestination.String(d.name)}
	if u := d.reqTemplate.URL; u != nil {
		// The path only with log.url_paths: a webhook URL often carries
		// its secret there (config.Secret.ShownURL).
		full := config.Secret(u.String()).ShownURL(t.urlPaths)
		attrs = append(attrs, semconv.URLFull(full), semconv.ServerAddress(u.Hostname()))
		port := u.Port()
		if port == "" {
			port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
		}
		if n, err := strconv.Atoi(port); err == nil {
			attrs = append(attrs, semconv.ServerPort(n))
		}
	}
	return &destTrace{t: t.t, attrs: attrs}
}

// startTry starts the client span of one HTTP try under the delivery span
// in ctx. Under a delivery span that is not sampled it starts none (nil):
// with the standard samplers (parent-based, or by trace id ratio, which
// decides alike for every span of a trace) the try would not be sampled
// either, and the request then carries the delivery span's context.
func (dt *destTrace) startTry(ctx context.Context) (context.Context, trace.Span) {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, nil
	}
	return dt.t.Start(ctx, http.MethodPost, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(dt.attrs...))
}

// inject returns a copy of the request headers carrying the try span's
// traceparent (and tracestate, and baggage when the destination forwards
// it: startDelivery leaves none in ctx otherwise) rendered by the
// propagator; any trace header already there (configured headers) is
// replaced. The message's own trace headers are never copied.
func (dt *destTrace) inject(ctx context.Context, h http.Header) http.Header {
	// A shallow copy: the shared values are never written, only replaced
	// (Set) or removed, in the copy.
	h = maps.Clone(h)
	if h == nil {
		h = make(http.Header, 3)
	}
	for _, k := range []string{"Traceparent", "Tracestate", "Baggage"} {
		delete(h, k)
	}
	tracing.Propagator().Inject(ctx, propagation.HeaderCarrier(h))
	return h
}

// endTry ends a try span with its status code or transport failure. As
// the HTTP client convention says, a 4xx or 5xx answer or no answer is an
// error.
func (dt *destTrace) endTry(sp trace.Span, res *response, err error) {
	switch {
	case !sp.IsRecording():
	case err != nil:
		kind := "transport"
		var te *TransportError
		if errors.As(err, &te) {
			kind = te.Kind
		}
		sp.SetAttributes(semconv.ErrorTypeKey.String(kind))
		sp.SetStatus(codes.Error, kind)
	case res != nil:
		sp.SetAttributes(semconv.HTTPResponseStatusCode(res.status))
		if res.status >= 400 {
			sp.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(res.status)))
			sp.SetStatus(codes.Error, "")
		}
	}
	sp.End()
}

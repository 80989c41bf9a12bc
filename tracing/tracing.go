// Package tracing carries W3C Trace Context (traceparent, tracestate) and
// Baggage through NATS message headers (docs/tracing.md). It is the
// OpenTelemetry glue of jetbridge's producers and of the bridge; the
// tracer provider itself is built by package tracing/export.
//
// Invariant: a trace header read from a message is only ever parsed, never
// copied: Extract returns a span context the W3C propagator validated (a
// malformed value, or one with CR or LF, yields none), and Inject writes
// values rendered from a span context, so nothing a producer planted
// travels on as it came.
package tracing

import (
	"context"
	"net/http"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// The W3C Trace Context header names, as Inject writes them.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// propagator is W3C Trace Context plus W3C Baggage. It is never the global
// propagator, which is a no-op until someone sets it.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Propagator is the W3C Trace Context and Baggage propagator used for NATS
// headers and HTTP requests alike.
func Propagator() propagation.TextMapPropagator { return propagator }

// Carrier adapts nats.Header to the propagators. NATS headers keep the
// case a producer used: nats.Header.Get finds only the exact (or the
// canonical) key, so a lowercase traceparent from a non-Go producer would
// be missed, and propagation.HeaderCarrier (http.Header) misses it for the
// same reason. Get therefore falls back to a case-insensitive match.
type Carrier nats.Header

// Get returns the first value of key in any case.
func (c Carrier) Get(key string) string {
	if vs := c[key]; len(vs) > 0 {
		return vs[0]
	}
	for k, vs := range c {
		if len(vs) > 0 && strings.EqualFold(k, key) {
			return vs[0]
		}
	}
	return ""
}

// Set replaces every value of key, in any case, by value under key as
// given (the propagators pass lowercase names, the W3C spelling).
func (c Carrier) Set(key, value string) {
	for k := range c {
		if strings.EqualFold(k, key) {
			delete(c, k)
		}
	}
	c[key] = []string{value}
}

// Keys lists the header names.
func (c Carrier) Keys() []string {
	ks := make([]string, 0, len(c))
	for k := range c {
		ks = append(ks, k)
	}
	return ks
}

// has reports whether the header has key in any case.
func (c Carrier) has(key string) bool {
	for k := range c {
		if strings.EqualFold(k, key) {
			return true
		}
	}
	return false
}

// Extract returns ctx with the remote span context and baggage found in h.
// A missing or malformed traceparent gives no span context; a malformed
// tracestate is dropped (the traceparent is kept).
func Extract(ctx context.Context, h nats.Header) context.Context {
	if len(h) == 0 {
		return ctx
	}
	return propagator.Extract(ctx, Carrier(h))
}

// Inject writes the span context (and baggage) of ctx into h, unless h
// already has a traceparent in any case: a producer that set its own keeps
// it. It writes nothing when ctx has no valid span context. Its signature
// is the producer package's header hook (producer.WithHeaders).
func Inject(ctx context.Context, h nats.Header) {
	if h == nil || Carrier(h).has(HeaderTraceparent) {
		return
	}
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	propagator.Inject(ctx, Carrier(h))
}

// FromEnvironment returns ctx with the span context of the TRACEPARENT and
// TRACESTATE environment variables (the OpenTelemetry convention for
// passing a trace to a command), so that a shell script can make a CLI
// publish inside its trace. Malformed values give none.
func FromEnvironment(ctx context.Context) context.Context {
	tp := os.Getenv("TRACEPARENT")
	if tp == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{
		HeaderTraceparent: tp,
		HeaderTracestate:  os.Getenv("TRACESTATE"),
	})
}

// InjectEnvironment is Inject with the span context of the TRACEPARENT
// and TRACESTATE environment variables when ctx has none: the header hook
// of a command-line producer.
func InjectEnvironment(ctx context.Context, h nats.Header) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = FromEnvironment(ctx)
	}
	Inject(ctx, h)
}

// ExtractHTTP returns ctx with the span context and baggage of an
// incoming HTTP request's headers (validated as in Extract), so that a
// producer behind an HTTP API publishes inside its caller's trace.
func ExtractHTTP(ctx context.Context, h http.Header) context.Context {
	return propagator.Extract(ctx, propagation.HeaderCarrier(h))
}

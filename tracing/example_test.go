package tracing_test

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/sotercare/jetbridge/tracing"
)

// A producer injects its span's context into the message headers; the
// bridge extracts it as the parent of its delivery span. A malformed
// traceparent yields no span context.
func ExampleInject() {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	})
	h := nats.Header{}
	tracing.Inject(trace.ContextWithSpanContext(context.Background(), sc), h)
	fmt.Println(h.Get(tracing.HeaderTraceparent))

	got := trace.SpanContextFromContext(tracing.Extract(context.Background(), h))
	fmt.Println(got.TraceID(), got.IsRemote())

	bad := nats.Header{tracing.HeaderTraceparent: {"00-not-a-trace"}}
	fmt.Println(trace.SpanContextFromContext(tracing.Extract(context.Background(), bad)).IsValid())
	// Output:
	// 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
	// 4bf92f3577b34da6a3ce929d0e0e4736 true
	// false
}

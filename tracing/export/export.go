// Package export builds jetbridge's OpenTelemetry tracer provider from the
// standard OTEL_* environment variables (docs/tracing.md): OTLP over
// HTTP/protobuf or gRPC (or the console exporter), the sampler of
// OTEL_TRACES_SAMPLER, the resource of OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES (service name jetbridge by default).
//
// Invariant: a collector that is slow, hangs or is down never slows the
// code that ends spans. Spans wait in a bounded queue
// (OTEL_BSP_MAX_QUEUE_SIZE, 2048 by default); a span that finds it full is
// dropped and counted (bridge_trace_spans_dropped_total), never waited
// for.
//
// Invariant: no OTEL_* value is ever logged or quoted in an error
// (exporter headers and endpoint user info are secrets). CheckEnv checks
// the variables' form and names a malformed one without its value;
// InstallHandlers replaces OpenTelemetry's default logger and error
// handler, which print values in full, and Setup calls both before it
// builds anything.
package export

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sotercare/jetbridge/tracing"
)

// DefaultServiceName is service.name unless OTEL_SERVICE_NAME or
// OTEL_RESOURCE_ATTRIBUTES says otherwise.
const DefaultServiceName = "jetbridge"

// DefaultShutdownTimeout bounds Provider.Shutdown: the final export of the
// queued spans.
const DefaultShutdownTimeout = 5 * time.Second

// defaultQueueSize is the BatchSpanProcessor's default queue.
const defaultQueueSize = 2048

// Settings are what the caller adds to the environment.
type Settings struct {
	// Endpoint is the OTLP endpoint from the configuration file
	// (tracing.endpoint), used only when neither
	// OTEL_EXPORTER_OTLP_ENDPOINT nor OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
	// is set. A URL without a path gets /v1/traces (HTTP), as the
	// variables do. Empty: tracing is on only when a variable sets one.
	Endpoint string
	// Registerer, if set, receives bridge_trace_spans_dropped_total.
	Registerer prometheus.Registerer
	// OnError, if set, receives export errors and the SDK's other errors
	// (otherwise the standard logger prints them). They carry no header
	// values; a *url.Error is reduced to its cause, so no query string
	// leaks.
	OnError func(error)
	// OnLog, if set, receives a summary of each error and warning the
	// OpenTelemetry SDK logs: its message and the names of its keys, never
	// their values (InstallHandlers). Unset: they are dropped.
	OnLog func(summary string)
}

// Provider is a running tracer provider. The zero *Provider (tracing off)
// is valid: TracerProvider returns nil and Shutdown does nothing.
type Provider struct {
	exporter string
	tp       *sdktrace.TracerProvider
	gate     *gate
	dropped  prometheus.Counter
}

// The exporters Exporter names.
const (
	ExporterNone    = "none"    // tracing off
	ExporterOTLP    = "otlp"    // OTLP over HTTP/protobuf or gRPC
	ExporterConsole = "console" // one JSON object per span on standard output
)

// Exporter names the exporter Setup would build: none when
// OTEL_SDK_DISABLED is true or OTEL_TRACES_EXPORTER is none; console or
// otlp when OTEL_TRACES_EXPORTER names one (console needs no endpoint;
// otlp alone uses the OTLP default, http://localhost:4318); otherwise otlp
// when an endpoint is set (by a variable or s.Endpoint), else none. A
// value of OTEL_TRACES_EXPORTER that is none of these is ignored here
// (CheckEnv reports it).
func Exporter(s Settings) string {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return ExporterNone
	}
	switch v := os.Getenv("OTEL_TRACES_EXPORTER"); v {
	case ExporterNone, ExporterOTLP, ExporterConsole:
		return v
	}
	if envEndpoint() || s.Endpoint != "" {
		return ExporterOTLP
	}
	return ExporterNone
}

// Enabled reports whether Setup would build a provider: Exporter is not
// none.
func Enabled(s Settings) bool { return Exporter(s) != ExporterNone }

func envEndpoint() bool {
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup builds the tracer provider, or returns nil (tracing off) when
// Enabled says so. It first makes OpenTelemetry's error handler and
// internal logger the caller's (InstallHandlers: nothing the SDK reports
// is printed with its values), then checks the OTEL_* variables
// (CheckEnv) and returns the first malformed one, naming the variable and
// never quoting its value, before any exporter or provider is built. It
// also sets the global propagator to W3C Trace Context and Baggage (the
// default one is a no-op). It does not dial: a collector that is down is
// found out at the first export.
func Setup(ctx context.Context, s Settings) (*Provider, error) {
	InstallHandlers(s.OnError, s.OnLog)
	if !Enabled(s) {
		return nil, nil
	}
	if problems := CheckEnv(); len(problems) > 0 {
		return nil, problems[0]
	}
	queue := defaultQueueSize
	if n, err := strconv.Atoi(os.Getenv("OTEL_BSP_MAX_QUEUE_SIZE")); err == nil { // checked: > 0
		queue = n
	}
	name := Exporter(s)
	exp, err := newExporter(ctx, name, s.Endpoint)
	if err != nil {
		return nil, err
	}
	res, err := resource.New(ctx,
		resource.WithSchemaURL(semconv.SchemaURL),
		resource.WithAttributes(semconv.ServiceName(DefaultServiceName)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES override the default
	)
	if err != nil { // CheckEnv has seen the variables' form; the error may quote them
		return nil, errors.New("OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME: the resource could not be built")
	}
	p := &Provider{exporter: name, dropped: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "bridge_trace_spans_dropped_total",
		Help: "Spans dropped because the export queue was full (collector slow or down).",
	})}
	if s.Registerer != nil {
		if err := s.Registerer.Register(p.dropped); err != nil {
			return nil, fmt.Errorf("tracing: metrics: %w", err)
		}
	}
	g := &gate{limit: int64(queue), dropped: p.dropped}
	g.next = sdktrace.NewBatchSpanProcessor(countingExporter{SpanExporter: exp, g: g}, sdktrace.WithMaxQueueSize(queue))
	p.gate = g
	// The sampler comes from OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG
	// (default parentbased_always_on).
	p.tp = sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithSpanProcessor(g))
	otel.SetTextMapPropagator(tracing.Propagator())
	return p, nil
}

// newExporter is the exporter name (Exporter: console or otlp). OTLP goes
// to the endpoint of the variables, else to the configured endpoint, else
// to the OTLP default (http://localhost:4318, or localhost:4317 for gRPC),
// over the protocol of OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL; the exporters
// read their other OTEL_EXPORTER_OTLP_* variables themselves. The console
// exporter writes one JSON object per span on standard output. (contrib's
// autoexport does the same choice but links the metric and log exporters
// too: 2 MB of binary and 1.4 MB of resident memory in every bridge
// process.)
func newExporter(ctx context.Context, name, endpoint string) (sdktrace.SpanExporter, error) {
	if name == ExporterConsole {
		return stdouttrace.New()
	}
	// CheckEnv has accepted the variables: PROTOCOL is http/protobuf or
	// grpc.
	proto := strings.TrimSpace(os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
	if proto == "" {
		proto = strings.TrimSpace(os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL"))
	}
	if envEndpoint() || endpoint == "" {
		if proto == "grpc" {
			return otlptracegrpc.New(ctx)
		}
		return otlptracehttp.New(ctx)
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("tracing.endpoint: want an http:// or https:// URL")
	}
	if proto == "grpc" {
		return otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(endpoint))
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/traces"
	}
	return otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(u.String()))
}

// Exporter names the exporter in use: console or otlp, or none for the
// nil *Provider (tracing off).
func (p *Provider) Exporter() string {
	if p == nil {
		return ExporterNone
	}
	return p.exporter
}

// TracerProvider is the provider to trace with; nil when tracing is off.
func (p *Provider) TracerProvider() trace.TracerProvider {
	if p == nil {
		return nil
	}
	return p.tp
}

// Dropped is the number of spans dropped so far because the queue was
// full.
func (p *Provider) Dropped() uint64 {
	if p == nil {
		return 0
	}
	return uint64(p.gate.droppedN.Load())
}

// Shutdown exports what is queued and stops, within timeout
// (DefaultShutdownTimeout when 0): a dead collector delays a shutdown by
// at most that much.
func (p *Provider) Shutdown(timeout time.Duration) error {
	if p == nil {
		return nil
	}
	if timeout <= 0 {
		timeout = DefaultShutdownTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return p.tp.Shutdown(ctx)
}

// gate sits in front of the BatchSpanProcessor and counts the sampled
// spans handed to it that have not reached the exporter yet. At limit
// (the processor's queue size) it drops the span itself and counts it:
// the processor's own queue therefore never overflows, and the processor
// would drop silently.
type gate struct {
	next     sdktrace.SpanProcessor
	limit    int64
	pending  atomic.Int64
	droppedN atomic.Int64
	dropped  prometheus.Counter
}

func (g *gate) OnStart(parent context.Context, s sdktrace.ReadWriteSpan) { g.next.OnStart(parent, s) }

func (g *gate) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return // the processor ignores these too
	}
	if g.pending.Add(1) > g.limit {
		g.pending.Add(-1)
		g.droppedN.Add(1)
		g.dropped.Inc()
		return
	}
	g.next.OnEnd(s)
}

func (g *gate) Shutdown(ctx context.Context) error   { return g.next.Shutdown(ctx) }
func (g *gate) ForceFlush(ctx context.Context) error { return g.next.ForceFlush(ctx) }

// countingExporter tells the gate which spans left the queue.
type countingExporter struct {
	sdktrace.SpanExporter
	g *gate
}

func (e countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.g.pending.Add(-int64(len(spans)))
	return e.SpanExporter.ExportSpans(ctx, spans)
}

// statusRE finds the HTTP status in otlptracehttp's "failed to send to
// URL: STATUS (body: ...)".
var statusRE = regexp.MustCompile(`failed to send to \S+: ([1-5][0-9][0-9])\b`)

// safeError is what may be logged of an export error: the operation and
// network cause of a *url.Error (whose own text carries the URL, query
// included), a timeout, or the collector's HTTP status. Nothing else of
// the text is kept: otlptracehttp quotes the URL and the collector's
// response body.
func safeError(err error) error {
	var ue *url.Error
	switch {
	case errors.As(err, &ue):
		return fmt.Errorf("trace export: %s: %w", ue.Op, ue.Err)
	case errors.Is(err, context.DeadlineExceeded):
		return errors.New("trace export: timed out")
	}
	if m := statusRE.FindStringSubmatch(err.Error()); m != nil {
		return errors.New("trace export: the collector answered " + m[1])
	}
	return errors.New("trace export failed")
}

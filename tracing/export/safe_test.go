package export

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Export errors as logged never quote the collector's response body or
// the endpoint URL; the raw errors (the negative control) do.
func TestSafeError(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "BODY-CANARY", http.StatusBadRequest)
	}))
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + ln.Addr().String()
	ln.Close()
	spans := tracetest.SpanStubs{{Name: "s"}}.Snapshots()
	for _, tc := range []struct{ endpoint, want, canary string }{
		{srv.URL + "/v1/traces", "the collector answered 400", "BODY-CANARY"},
		{refused + "/v1/traces", "connection refused", `Post "http`}, // *url.Error quotes the URL
	} {
		exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(tc.endpoint), otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false}))
		if err != nil {
			t.Fatal(err)
		}
		raw := exp.ExportSpans(context.Background(), []sdktrace.ReadOnlySpan(spans))
		if raw == nil || !strings.Contains(raw.Error(), tc.canary) {
			t.Fatalf("negative control: the raw error %v quotes no canary; the test proves nothing", raw)
		}
		got := safeError(raw).Error()
		if strings.Contains(got, tc.canary) || !strings.Contains(got, tc.want) {
			t.Fatalf("safeError(%q) = %q, want %q and no %q", raw, got, tc.want, tc.canary)
		}
	}
}

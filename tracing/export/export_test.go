package export_test

import (
	"context"
	"strings"
	"testing"

	"github.com/sotercare/jetbridge/tracing/export"
)

// Tracing is off unless an endpoint is set, and bad variables are errors
// that name them.
func TestSetupSettings(t *testing.T) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER"} {
		t.Setenv(k, "")
	}
	p, err := export.Setup(context.Background(), export.Settings{})
	if p != nil || err != nil || p.TracerProvider() != nil || p.Shutdown(0) != nil {
		t.Fatalf("off: %v %v", p, err)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	if export.Enabled(export.Settings{}) {
		t.Fatal("OTEL_TRACES_EXPORTER=none is on")
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	for k, v := range map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "-3", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/xml"} {
		t.Run(k, func(t *testing.T) {
			t.Setenv(k, v)
			if _, err := export.Setup(context.Background(), export.Settings{}); err == nil || !strings.Contains(err.Error(), k[:len("OTEL_")+3]) {
				t.Fatalf("%s=%s: %v", k, v, err)
			}
		})
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	if _, err := export.Setup(context.Background(), export.Settings{Endpoint: "ftp://x"}); err == nil || !strings.Contains(err.Error(), "tracing.endpoint") {
		t.Fatalf("bad tracing.endpoint: %v", err)
	}
	p, err = export.Setup(context.Background(), export.Settings{Endpoint: "http://127.0.0.1:1"})
	if err != nil || p == nil {
		t.Fatalf("tracing.endpoint: %v %v", p, err)
	}
	_ = p.Shutdown(0)
}

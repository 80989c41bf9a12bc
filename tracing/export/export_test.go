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

// The exporter follows OTEL_TRACES_EXPORTER first, then whether an
// endpoint is set: console and otlp need no endpoint.
func TestExporterChoice(t *testing.T) {
	for _, tt := range []struct {
		env      map[string]string
		endpoint string
		want     string
	}{
		{nil, "", "none"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console"}, "", "console"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console"}, "http://127.0.0.1:1", "console"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, "", "console"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, "", "otlp"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, "", "otlp"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1"}, "", "otlp"},
		{nil, "http://127.0.0.1:1", "otlp"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, "", "none"},
		{map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"}, "", "none"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, "", "none"}, // malformed: CheckEnv's
	} {
		for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER"} {
			t.Setenv(k, tt.env[k])
		}
		s := export.Settings{Endpoint: tt.endpoint}
		if got := export.Exporter(s); got != tt.want || export.Enabled(s) != (tt.want != "none") {
			t.Errorf("%v endpoint %q: Exporter %q Enabled %v, want %q", tt.env, tt.endpoint, got, export.Enabled(s), tt.want)
		}
		if tt.want == "zipkin" || tt.env["OTEL_TRACES_EXPORTER"] == "zipkin" {
			continue
		}
		p, err := export.Setup(context.Background(), s)
		if err != nil || p.Exporter() != tt.want || (p == nil) != (tt.want == "none") {
			t.Errorf("%v endpoint %q: Setup: %v, exporter %q, want %q", tt.env, tt.endpoint, err, p.Exporter(), tt.want)
		}
		_ = p.Shutdown(0)
	}
}

package test

import (
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/jetbridgetest"
	"github.com/sotercare/jetbridge/producer"
)

// Issue 27's papercuts that need the real binary.

// bridge receive --listen PORT listens on 127.0.0.1:PORT and says so.
func TestReceiveBarePort(t *testing.T) {
	addr := freeAddr(t)
	_, port, _ := strings.Cut(addr, ":")
	c := startBridge(t, bridgeBinary(t), []string{"receive", "--listen", port})
	want := "receiving on http://" + addr + "/ (answering 202, failing 0% with 503); Ctrl-C to stop\n"
	natstest.Eventually(t, readyTimeout, func() error {
		c.failIfExited(t)
		resp, err := http.Post("http://"+addr+"/events", "application/json", strings.NewReader(`{}`))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("status %d, want 202", resp.StatusCode)
		}
		return nil
	})
	if got, _, _ := strings.Cut(c.stdout.String(), "\n"); got+"\n" != want {
		t.Errorf("first line %q, want %q", got, want)
	}
}

// OTEL_TRACES_EXPORTER=console alone, no endpoint anywhere, turns tracing
// on: the start-up line names the console exporter and the delivery's
// span is printed on standard output. Control: without the variable the
// line says none and nothing is printed.
func TestTracingConsoleExporterAlone(t *testing.T) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER"} {
		t.Setenv(k, "")
	}
	for _, tt := range []struct {
		exporter, field, msg string
	}{
		{"console", `"exporter":"console"`, `"message":"tracing on: spans printed on standard output, one JSON object each (OTEL_TRACES_EXPORTER=console; docs/tracing.md)"`},
		{"", `"exporter":"none"`, `"message":"tracing off (docs/tracing.md)"`},
	} {
		t.Run("exporter="+tt.exporter, func(t *testing.T) {
			srv := jetbridgetest.NewServer(t)
			rec := jetbridgetest.NewReceiver(t)
			cfg := scenario{natsURL: srv.URL(), sinkURL: rec.URL(), maxInFlight: 1, ackWait: 30 * time.Second, shutdownTimeout: 5 * time.Second}.file(t)
			p := &proc{admin: freeAddr(t)}
			p.child = startBridge(t, bridgeBinary(t), []string{"run", "--config", cfg}, "JETBRIDGE_ADMIN_LISTEN="+p.admin,
				"OTEL_TRACES_EXPORTER="+tt.exporter, "OTEL_BSP_SCHEDULE_DELAY=50", "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
			p.waitReadyz(t, http.StatusOK, readyTimeout)
			srv.Publish(t, producer.Event{ID: "span-1", Type: "order.created", Payload: []byte(`{}`)})
			rec.WaitEvent(t, "span-1")
			p.term(t)
			if code := p.wait(t, 30*time.Second); code != 0 {
				t.Fatalf("exit %d", code)
			}
			// The log (JSON lines on stdout) and the spans share stdout.
			out := p.stdout.String()
			var tracingLines []string
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, `"message":"tracing `) {
					tracingLines = append(tracingLines, l)
				}
			}
			if len(tracingLines) != 1 || !strings.Contains(tracingLines[0], tt.field) || !strings.Contains(tracingLines[0], tt.msg) {
				t.Errorf("want one tracing line with %s and %s, got %q", tt.field, tt.msg, tracingLines)
			}
			spans := map[string]string{} // name: trace id
			for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
				var line struct {
					Message     string `json:"message"`
					Name        string
					SpanContext struct{ TraceID string }
				}
				if err := json.Unmarshal([]byte(l), &line); err != nil {
					t.Errorf("stdout line is neither a log line nor a span: %q (%v)", l, err)
					continue
				}
				if line.Message != "" {
					continue // a log line
				}
				spans[line.Name] = line.SpanContext.TraceID
			}
			want := 0
			if tt.exporter == "console" { // the delivery's span and its HTTP request's, one trace
				want = 2
				if tid := spans["process events.info.order.created"]; len(tid) != 32 || spans["POST"] != tid {
					t.Errorf("spans %v: want process events.info.order.created and POST in one trace", spans)
				}
			}
			if len(spans) != want {
				t.Errorf("%d spans on stdout, want %d: %v", len(spans), want, spans)
			}
		})
	}
}

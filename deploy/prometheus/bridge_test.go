package monitoring

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// destination is a webhook receiver on 127.0.0.1 that answers 200, or 503
// while it is down.
type destination struct {
	*httptest.Server
	down atomic.Bool
	ok   atomic.Int64 // requests answered 200
	bad  atomic.Int64 // requests answered 503
}

func startDestination(t *testing.T) *destination {
	t.Helper()
	d := &destination{}
	d.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if d.down.Load() {
			d.bad.Add(1)
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		d.ok.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(d.Close)
	return d
}

// startCollector is an OTLP/HTTP trace receiver on 127.0.0.1 that accepts
// every export: with it the bridge runs with tracing on, and so exports
// bridge_trace_spans_dropped_total.
func startCollector(t *testing.T) string {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK) // an empty ExportTraceServiceResponse
	}))
	t.Cleanup(s.Close)
	return s.URL
}

// runningBridge is a bridge child process with its embedded JetStream.
type runningBridge struct {
	*child
	bin   string // the directory of bridge and publish
	admin string // host:port of admin.listen
	nats  string // nats://host:port of the embedded server
}

// startBridge writes a configuration with one route (e2e, subjects
// events.>) to destination hook at destURL, with a small circuit breaker
// (2 requests in 5 s, half of them failing, open 500 ms), starts
// `bridge run` and waits for /readyz.
func startBridge(t *testing.T, destURL, collectorURL string) *runningBridge {
	t.Helper()
	bin := bridgeBinaries(t)
	dir := t.TempDir()
	b := &runningBridge{
		bin:   bin,
		admin: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		nats:  fmt.Sprintf("127.0.0.1:%d", freePort(t)),
	}
	cfg := fmt.Sprintf(`nats:
  url: ""
  embedded:
    listen: %s
    store_dir: %s
admin:
  listen: %s
log:
  level: info
  format: json
shutdown_timeout: 2s
destinations:
  hook:
    url: %s/events
    timeout: 1s
    transport_retry: {count: 0}
    circuit_breaker:
      failure_rate: 0.5
      min_requests: 2
      window: 5s
      delay: 500ms
      success_threshold: 1
routes:
  - name: e2e
    subjects: ["events.>"]
    destination: hook
    max_deliver: 1000
    backoff: [200ms]
    ack_wait: 5s
`, b.nats, filepath.Join(dir, "jetstream"), b.admin, destURL)
	path := filepath.Join(dir, "bridge.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	env := childEnv("OTEL_EXPORTER_OTLP_ENDPOINT="+collectorURL, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf")
	b.child = startChild(t, "bridge", dir, env, filepath.Join(bin, "bridge"), "run", "--config", path)
	b.nats = "nats://" + b.nats
	waitFor(t, "the bridge's /readyz", 60*time.Second, []*child{b.child}, func() (bool, string) {
		code, body, err := httpGet("http://" + b.admin + "/readyz")
		return err == nil && code == http.StatusOK, fmt.Sprintf("%d %s %v", code, body, err)
	})
	return b
}

// publish publishes one event to events.x with the built publish command.
func (b *runningBridge) publish(t *testing.T) {
	t.Helper()
	out, err := runTool(t, ".", 30*time.Second, filepath.Join(b.bin, "publish"), "-s", b.nats, "--subject", "events.x", `{"a":1}`)
	if err != nil || !strings.HasPrefix(out, "stored events.x ") {
		t.Fatalf("publish: %v\n%s", err, out)
	}
}

// metrics scrapes the bridge's /metrics.
func (b *runningBridge) metrics(t *testing.T) []byte {
	t.Helper()
	code, body, err := httpGet("http://" + b.admin + "/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", code, err)
	}
	return body
}

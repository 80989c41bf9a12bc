package bridge

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sotercare/jetbridge/internal/sinktest"
)

// After a scripted run (deliveries, a redelivery, a dead letter, a breaker
// opening), the Prometheus series have exactly the expected values, and
// /readyz and /status say what happened.
func TestMetricsAndAdminEndpoints(t *testing.T) {
	ok := sinktest.New(t, sinktest.Always(200))
	flaky := sinktest.New(t, sinktest.Sequence(503, 200))
	bad := sinktest.New(t, sinktest.Always(400))
	down := sinktest.New(t, sinktest.Always(503))
	cfg := testConfig(t, `
destinations:
  ok: {url: %s}
  flaky: {url: %s, circuit_breaker: {enabled: false}}
  bad: {url: %s}
  down:
    url: %s
    transport_retry: {count: 0}
    circuit_breaker: {failure_rate: 0.5, min_requests: 2, window: 1m, delay: 1m}
routes:
  - {name: ok, subjects: ["events.*.ok.>"], destination: ok}
  - {name: flaky, subjects: ["events.*.flaky.>"], destination: flaky, backoff: [10ms]}
  - {name: bad, subjects: ["events.*.bad.>"], destination: bad}
  - {name: down, subjects: ["events.*.down.>"], destination: down, backoff: [10ms], max_in_flight: 1}
`, ok.URL(), flaky.URL(), bad.URL(), down.URL())
	h := startBridge(t, cfg, faults{})
	admin := httptest.NewServer(h.b.AdminHandler(h.reg))
	t.Cleanup(admin.Close)

	for i := range 3 {
		h.publish("events.info.ok.x", fmt.Sprintf("ok%d", i), []byte(`{}`), nil)
	}
	h.publish("events.info.flaky.x", "f1", []byte(`{}`), nil)
	h.publish("events.info.bad.x", "b1", []byte(`{}`), nil)
	h.publish("events.info.down.x", "d1", []byte(`{}`), nil)
	h.publish("events.info.down.x", "d2", []byte(`{}`), nil)
	h.waitOutcomes(7, settleWait, nil)
	waitUntil(settleWait, func() bool { return h.b.dests["down"].state() == BreakerOpen })
	for _, r := range []string{"ok", "flaky", "bad"} {
		h.quiet(r)
	}

	want := map[string]float64{
		`bridge_messages_total{outcome="delivered",route="ok"}`:               3,
		`bridge_messages_total{outcome="redelivery_scheduled",route="flaky"}`: 1,
		`bridge_messages_total{outcome="delivered",route="flaky"}`:            1,
		`bridge_messages_total{outcome="dead_lettered",route="bad"}`:          1,
		`bridge_messages_total{outcome="redelivery_scheduled",route="down"}`:  2,
		`bridge_messages_total{outcome="delivered",route="down"}`:             0,
		`bridge_messages_total{outcome="duplicate_skipped",route="ok"}`:       0,
		`bridge_dead_letters_total{reason="rejected",route="bad"}`:            1,
		`bridge_dead_letters_total{reason="max-deliveries",route="bad"}`:      0,
		`bridge_http_requests_total{class="2xx",destination="ok"}`:            3,
		`bridge_http_requests_total{class="5xx",destination="flaky"}`:         1,
		`bridge_http_requests_total{class="2xx",destination="flaky"}`:         1,
		`bridge_http_requests_total{class="4xx",destination="bad"}`:           1,
		`bridge_http_requests_total{class="5xx",destination="down"}`:          2,
		`bridge_http_requests_total{class="transport",destination="ok"}`:      0,
		`bridge_delivery_duration_seconds_count{destination="ok"}`:            3,
		`bridge_delivery_duration_seconds_count{destination="down"}`:          2,
		`bridge_circuit_state{destination="down"}`:                            2,
		`bridge_circuit_state{destination="ok"}`:                              0,
		`bridge_in_flight{route="ok"}`:                                        0,
		`bridge_in_flight{route="down"}`:                                      0,
	}
	got := scrape(t, admin.URL+"/metrics")
	for series, v := range want {
		if g, ok := got[series]; !ok || g != v {
			t.Errorf("%s = %v (present %t), want %v", series, g, ok, v)
		}
	}
	if n, err := testutil.GatherAndCount(h.reg, "bridge_messages_total"); err != nil || n != 16 {
		t.Errorf("bridge_messages_total has %d series (%v), want 16 (4 routes x 4 outcomes)", n, err)
	}
	for series := range got {
		for _, leak := range []string{"ok0", "f1", "b1", "d1", "events.info"} {
			if strings.Contains(series, leak) {
				t.Errorf("series %s carries an event id or subject", series)
			}
		}
	}

	if code, body := get(t, admin.URL+"/readyz"); code != 200 {
		t.Errorf("/readyz = %d %s, want 200", code, body)
	}
	if code, _ := get(t, admin.URL+"/healthz"); code != 200 {
		t.Errorf("/healthz = %d", code)
	}
	_, body := get(t, admin.URL+"/status")
	var status struct {
		Routes []routeStatus `json:"routes"`
	}
	if err := json.Unmarshal([]byte(body), &status); err != nil {
		t.Fatalf("/status: %v: %s", err, body)
	}
	byRoute := map[string]routeStatus{}
	for _, r := range status.Routes {
		byRoute[r.Route] = r
	}
	if r := byRoute["down"]; r.Breaker != "open" || r.AckPending+int(r.Pending) != 2 || r.InFlight != 0 {
		t.Errorf("/status down = %+v, want breaker open, 2 messages waiting, none in flight", r)
	}
	if r := byRoute["ok"]; r.Breaker != "closed" || r.Pending != 0 || r.AckPending != 0 {
		t.Errorf("/status ok = %+v", r)
	}

	// Not ready while disconnected from NATS.
	h.srv.Shutdown()
	waitUntil(5*time.Second, func() bool { code, _ := get(t, admin.URL+"/readyz"); return code == 503 })
	if code, body := get(t, admin.URL+"/readyz"); code != 503 || !strings.Contains(body, "cannot reach NATS at") {
		t.Errorf("/readyz with the server down = %d %s, want 503 with a reason", code, body)
	}
	h.srv.Restart(t)
	waitUntil(10*time.Second, func() bool { code, _ := get(t, admin.URL+"/readyz"); return code == 200 })
	if code, body := get(t, admin.URL+"/readyz"); code != 200 {
		t.Errorf("/readyz after the restart = %d %s, want 200", code, body)
	}
}

func get(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// scrape reads a Prometheus text exposition into series -> value.
func scrape(t testing.TB, url string) map[string]float64 {
	t.Helper()
	_, body := get(t, url)
	out := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		var v float64
		if _, err := fmt.Sscan(line[i+1:], &v); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

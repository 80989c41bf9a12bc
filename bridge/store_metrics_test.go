package bridge

import (
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/sinktest"
)

// The gauges of stream and store state follow the readiness checks'
// lookups: with one attempt hanging (max_in_flight 1) and four more
// published, bridge_consumer_pending is 4; two rejected events make
// bridge_dead_letters_stored 2.
func TestStoreGauges(t *testing.T) {
	hang := sinktest.New(t, func(sinktest.Request) sinktest.Response { return sinktest.Response{Hang: true} })
	bad := sinktest.New(t, sinktest.Always(400))
	cfg := testConfig(t, `
shutdown_timeout: 1s
destinations:
  hang: {url: %s, timeout: 1m, circuit_breaker: {enabled: false}}
  bad: {url: %s}
routes:
  - {name: hold, subjects: ["events.*.hold.>"], destination: hang, max_in_flight: 1, ack_wait: 2m}
  - {name: bad, subjects: ["events.*.bad.>"], destination: bad}
`, hang.URL(), bad.URL())
	h := startBridge(t, cfg, faults{})
	admin := httptest.NewServer(h.b.AdminHandler(h.reg))
	t.Cleanup(admin.Close)
	series := func(name string) float64 { return scrape(t, admin.URL+"/metrics")[name] }
	waitSeries := func(name string, want float64) {
		t.Helper()
		if !waitUntil(15*time.Second, func() bool { return series(name) == want }) {
			t.Errorf("%s = %v, want %v", name, series(name), want)
		}
	}

	for i := range 5 {
		h.publish("events.info.hold.x", fmt.Sprintf("h%d", i), []byte(`{}`), nil)
	}
	hang.WaitCount(t, 1, settleWait)
	waitSeries(`bridge_consumer_pending{route="hold"}`, 4)

	h.publish("events.info.bad.x", "b1", []byte(`{}`), nil)
	h.publish("events.info.bad.x", "b2", []byte(`{}`), nil)
	h.waitOutcomes(2, settleWait, outcomeIs(OutcomeDeadLettered))
	waitSeries(`bridge_dead_letters_stored`, 2)
}

package test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/jetbridgetest"
)

// A destination's rate limit of 50/s holds for three bridge processes
// together (docs/delivery.md#across-replicas), and when one of them is
// killed (SIGKILL) the two others take its share at once: over 1,000
// requests (20 s), no span of one second at the destination sees more than
// 55 (1.1 × the rate), the mean is at least 45/s, and from 200 ms after
// the kill (the bound is one window, 100 ms) the next 5 s see at least
// 225 (0.9 × the rate).
func TestFleetRateLimitProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("20 s of three bridge processes")
	}
	srv := jetbridgetest.NewServer(t)
	_, js := srv.Connect(t)
	sink := jetbridgetest.NewReceiver(t)
	yaml := fmt.Sprintf(`nats:
  url: %s
admin:
  listen: ${JETBRIDGE_ADMIN_LISTEN:-}
log:
  format: json
shutdown_timeout: 5s
destinations:
  sink:
    url: %s/events
    rate_limit: {requests: 50, per: 1s, burst: 5}
routes:
  - {name: %s, subjects: ["events.>"], destination: sink, ack_wait: 2s, max_in_flight: 16}
`, srv.URL(), sink.URL(), routeName)
	path := filepath.Join(t.TempDir(), "bridge.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := plainBinary(t) // three replicas for 20 s: built without -race (ordering_test.go)
	procs := []*proc{runBinary(t, bin, path), runBinary(t, bin, path), runBinary(t, bin, path)}

	const n = 1300
	natstest.NewLedger("fleet", n).Publish(t, js, "events.info.fleet")
	waitCount(t, sink, 500, time.Minute)
	procs[2].kill(t)
	killed := time.Now()
	waitCount(t, sink, 1000, time.Minute)

	reqs := sink.Requests()[:1000]
	at := make([]time.Time, len(reqs))
	for i, r := range reqs {
		at[i] = r.At
	}
	most, from := 0, time.Time{}
	j := 0
	for i := range at {
		for j < len(at) && at[j].Sub(at[i]) < time.Second {
			j++
		}
		if j-i > most {
			most, from = j-i, at[i]
		}
	}
	span := at[len(at)-1].Sub(at[0])
	after := 0
	for _, a := range at {
		if !a.Before(killed.Add(200*time.Millisecond)) && a.Before(killed.Add(5200*time.Millisecond)) {
			after++
		}
	}
	t.Logf("1000 requests over %s (%.1f/s); the most in a second: %d (from %s); %d from 0.2 s to 5.2 s after the kill",
		span.Round(time.Millisecond), 999/span.Seconds(), most, from.Format("15:04:05.000"), after)
	if most > 55 {
		t.Errorf("%d requests in the second from %s, want at most 55", most, from.Format("15:04:05.000"))
	}
	if rate := 999 / span.Seconds(); rate < 45 {
		t.Errorf("%.1f requests a second, want at least 45", rate)
	}
	if after < 225 {
		t.Errorf("%d requests from 0.2 s to 5.2 s after the kill, want at least 225", after)
	}
}

package bridge

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/sinktest"
)

// A full idempotency bucket (an operator's max_msgs reached, discard new)
// fails every new reservation. That is not the messages' fault: each one is
// held with progress acks, no delivery spent, nothing sent and nothing
// dead-lettered, while /readyz answers 503 with the cause, the log names
// the failure kind and the cause, and bridge_idempotency_errors_total counts
// the failed reservations. Once the operator makes room, the held event is
// delivered exactly once and the bridge is ready again.
func TestFullIdempotencyBucketHoldsMessages(t *testing.T) {
	sink := sinktest.New(t, sinktest.Always(200))
	cfg := testConfig(t, `
idempotency: {bucket: DELIVERED}
destinations:
  d: {url: %s, circuit_breaker: {enabled: false}}
routes:
  - {name: r, subjects: ["events.>"], destination: d, idempotency: true, ack_wait: 1s, max_deliver: 2, backoff: [50ms]}
`, sink.URL())
	h := startBridge(t, cfg, faults{})
	admin := httptest.NewServer(h.b.AdminHandler(h.reg))
	t.Cleanup(admin.Close)
	ctx := t.Context()

	// One event delivered: its record is the bucket's one message.
	h.publish("events.info.x", "e0", []byte(`{}`), nil)
	sink.WaitCount(t, 1, settleWait)
	h.waitOutcomes(1, settleWait, nil)

	// The operator caps the bucket at the one record it holds.
	setMaxMsgs := func(n int64) {
		t.Helper()
		s, err := h.js.Stream(ctx, "KV_DELIVERED")
		if err != nil {
			t.Fatal(err)
		}
		c := s.CachedInfo().Config
		c.MaxMsgs, c.Discard = n, jetstream.DiscardNew
		if _, err := h.js.UpdateStream(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	setMaxMsgs(1)

	h.publish("events.info.x", "e1", []byte(`{}`), nil)
	var reason string
	if !waitUntil(settleWait, func() bool {
		code, body := get(t, admin.URL+"/readyz")
		reason = body
		return code == 503
	}) {
		t.Fatalf("/readyz never answered 503 with the bucket full: %s", reason)
	}
	if !strings.Contains(reason, "idempotency bucket DELIVERED: ") || !strings.Contains(reason, "maximum messages") ||
		!strings.Contains(reason, "reservations cannot be taken") {
		t.Errorf("/readyz reason %s, want the bucket, the cause and what it means", reason)
	}
	// Six failed reservations in a row take more than 3 s of pauses
	// (100 ms doubling): three times ack_wait, and more than max_deliver
	// deliveries' worth had the message not been held.
	errorsSeries := `bridge_idempotency_errors_total{route="r"}`
	if !waitUntil(30*time.Second, func() bool { return scrape(t, admin.URL+"/metrics")[errorsSeries] >= 6 }) {
		t.Fatalf("%s = %v, want 6 failed reservations", errorsSeries, scrape(t, admin.URL+"/metrics")[errorsSeries])
	}
	info, err := h.b.routes[0].consumer().Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumRedelivered != 0 || info.NumAckPending != 1 || info.Delivered.Consumer != 2 {
		t.Errorf("consumer: %d redelivered, %d ack pending, %d deliveries; want the held event delivered once, not redelivered",
			info.NumRedelivered, info.NumAckPending, info.Delivered.Consumer)
	}
	if n := len(h.deadLetters()); n != 0 || sink.Count() != 1 || len(h.outcomes()) != 1 {
		t.Errorf("%d dead letters, %d requests, %d settled; want 0, 1 (e0), 1 (e0)", n, sink.Count(), len(h.outcomes()))
	}
	logs := h.logs.String()
	if strings.Count(logs, "idempotency reservation failed") != 1 || !strings.Contains(logs, `"failure":"idempotency-store"`) ||
		!strings.Contains(logs, "maximum messages") {
		t.Errorf("want one warning with the failure kind and the cause:\n%s", logs)
	}

	// The operator makes room: e1 is delivered once, the bridge ready again.
	setMaxMsgs(-1)
	sink.WaitCount(t, 2, settleWait)
	h.waitOutcomes(2, settleWait, nil)
	if !waitUntil(settleWait, func() bool { code, _ := get(t, admin.URL+"/readyz"); return code == 200 }) {
		t.Error("/readyz did not come back to 200 once the bucket had room")
	}
	if ids := eventIDsOf(sink.Requests()); strings.Join(ids, ",") != "e0,e1" {
		t.Errorf("requests for %v, want e0,e1", ids)
	}
}

func eventIDsOf(reqs []sinktest.Request) []string {
	out := make([]string, 0, len(reqs))
	for _, r := range reqs {
		out = append(out, r.Header.Get("X-Event-Id"))
	}
	return out
}

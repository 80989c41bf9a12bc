package jetbridgetest_test

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/jetbridgetest"
	"github.com/sotercare/jetbridge/producer"
)

// routeYAML is a configuration with one route r from events.> to url.
func routeYAML(url string, extra string) string {
	return fmt.Sprintf(`
shutdown_timeout: 200ms
destinations:
  receiver:
    url: %s/events
%s
routes:
  - name: r
    subjects: ["events.>"]
    destination: receiver
    backoff: [20ms]
`, url, extra)
}

// A user's test with 100 events: each reaches the receiver exactly once,
// with the bridge's headers, and settles as delivered. The log states how
// long the start and the delivery took (measured, not asserted).
func TestHundredEvents(t *testing.T) {
	t.Parallel()
	begin := time.Now()
	srv := jetbridgetest.NewServer(t)
	rec := jetbridgetest.NewReceiver(t)
	b := jetbridgetest.StartBridge(t, srv, routeYAML(rec.URL(), ""))
	started := time.Since(begin)

	for i := range 100 {
		srv.Publish(t, producer.Event{ID: fmt.Sprintf("e-%03d", i), Type: "order.created", Payload: []byte(`{"n":1}`)})
	}
	reqs := rec.WaitCount(t, 100)
	b.WaitSettled(t, 100, bridge.OutcomeDelivered)
	t.Logf("server, receiver and bridge started in %s; 100 events delivered in %s", started.Round(time.Millisecond), time.Since(begin).Round(time.Millisecond))

	if err := exactlyOnce(reqs, "e-", 100); err != nil {
		t.Fatal(err)
	}
	if got := reqs[0]; got.Path != "/events" || got.Attempt() != 1 || got.Header.Get("Idempotency-Key") != got.EventID() {
		t.Errorf("first request: path %s attempt %d Idempotency-Key %q event %q", got.Path, got.Attempt(), got.Header.Get("Idempotency-Key"), got.EventID())
	}
	b.WaitQuiet(t)
	if s := b.Settlements(); len(s) != 100 {
		t.Errorf("%d settlements, want exactly 100", len(s))
	}
}

// exactlyOnce checks that reqs carry the events <prefix>000 to
// <prefix>(n-1), each exactly once, and nothing else.
func exactlyOnce(reqs []jetbridgetest.Request, prefix string, n int) error {
	seen := map[string]int{}
	for _, r := range reqs {
		seen[r.EventID()]++
	}
	for i := range n {
		id := fmt.Sprintf("%s%03d", prefix, i)
		if seen[id] != 1 {
			return fmt.Errorf("event %s arrived %d times, want exactly once", id, seen[id])
		}
		delete(seen, id)
	}
	if len(seen) > 0 {
		return fmt.Errorf("unexpected events arrived: %v", seen)
	}
	return nil
}

func TestExactlyOnceCatches(t *testing.T) {
	reqs := func(ids ...string) []jetbridgetest.Request {
		var out []jetbridgetest.Request
		for _, id := range ids {
			out = append(out, jetbridgetest.Request{Header: http.Header{"X-Event-Id": {id}}})
		}
		return out
	}
	if err := exactlyOnce(reqs("a000", "a001"), "a", 2); err != nil {
		t.Fatalf("a correct delivery: %v", err)
	}
	for name, r := range map[string][]jetbridgetest.Request{
		"missing":   reqs("a000"),
		"duplicate": reqs("a000", "a001", "a001"),
		"foreign":   reqs("a000", "a001", "b000"),
	} {
		if err := exactlyOnce(r, "a", 2); err == nil {
			t.Errorf("%s: not caught", name)
		}
	}
}

// A destination answering 400 dead-letters the event on its first
// delivery: the dead letter holds the payload byte for byte and says why.
func TestDeadLetter(t *testing.T) {
	t.Parallel()
	srv := jetbridgetest.NewServer(t)
	rec := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(jetbridgetest.Always(http.StatusBadRequest)))
	b := jetbridgetest.StartBridge(t, srv, routeYAML(rec.URL(), ""))

	srv.Publish(t, producer.Event{ID: "bad-1", Type: "order.created", Payload: []byte(`{"bad":true}`)},
		jetbridgetest.WithTraceParent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))
	s := b.WaitEvent(t, "bad-1")
	if s.Outcome != bridge.OutcomeDeadLettered || s.Reason != bridge.ReasonRejected {
		t.Fatalf("settled %s/%s, want %s/%s", s.Outcome, s.Reason, bridge.OutcomeDeadLettered, bridge.ReasonRejected)
	}
	var de *bridge.DownstreamError
	if !errors.As(s.Err, &de) || de.Status != http.StatusBadRequest {
		t.Fatalf("settlement error %v, want a DownstreamError with status 400", s.Err)
	}
	dl := b.WaitDeadLetters(t, 1)
	if len(dl) != 1 || dl[0].EventID != "bad-1" || dl[0].Reason != bridge.ReasonRejected || dl[0].Status != 400 ||
		string(dl[0].Data) != `{"bad":true}` || dl[0].Header.Get("traceparent") == "" {
		t.Fatalf("dead letters %+v", dl)
	}
	if n := len(srv.Messages(t, b.Config().DeadLetter.Stream)); n != 1 {
		t.Fatalf("the dead-letter stream holds %d messages, want 1", n)
	}
	if rec.Count() != 1 {
		t.Fatalf("%d requests, want exactly 1 (a rejection is not retried)", rec.Count())
	}
}

// Per-event scripts, Retry-After and status sequences drive the bridge's
// redeliveries: the settlements show each scheduled redelivery.
func TestScriptsDriveRedelivery(t *testing.T) {
	t.Parallel()
	srv := jetbridgetest.NewServer(t)
	rec := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(jetbridgetest.ByEvent(func(id string, attempt int) jetbridgetest.Response {
		if id == "flaky" && attempt == 1 {
			return jetbridgetest.Response{Status: http.StatusServiceUnavailable, RetryAfter: time.Second}
		}
		if id == "cut" && attempt == 1 {
			return jetbridgetest.Response{CloseConn: true}
		}
		return jetbridgetest.Response{Status: http.StatusAccepted}
	})))
	b := jetbridgetest.StartBridge(t, srv, routeYAML(rec.URL(), "    transport_retry: {count: 0}\n"))
	for _, id := range []string{"ok", "flaky", "cut"} {
		srv.Publish(t, producer.Event{ID: id, Type: "t", Payload: []byte(`{}`)})
	}
	for _, id := range []string{"ok", "flaky", "cut"} {
		if s := b.WaitEvent(t, id); s.Outcome != bridge.OutcomeDelivered {
			t.Errorf("%s settled %s, want delivered", id, s.Outcome)
		}
	}
	b.WaitQuiet(t)
	var redelivered []string
	for _, s := range b.Settlements() {
		if s.Outcome == bridge.OutcomeRedeliveryScheduled {
			redelivered = append(redelivered, s.EventID)
			if s.EventID == "flaky" && s.Delay < time.Second {
				t.Errorf("flaky redelivered after %s, want at least the Retry-After of 1s", s.Delay)
			}
		}
	}
	slices.Sort(redelivered)
	if !slices.Equal(redelivered, []string{"cut", "flaky"}) {
		t.Errorf("redeliveries scheduled for %v, want exactly [cut flaky]", redelivered)
	}
	if n := len(rec.Events("flaky")); n != 2 {
		t.Errorf("flaky arrived %d times, want 2", n)
	}
	if got := rec.Events("flaky")[1].Attempt(); got != 2 {
		t.Errorf("second request of flaky has attempt %d, want 2", got)
	}
}

// Latency within the destination's timeout is delivered; a hang is cut
// off by it (a transport error, redelivered); a status sequence answers
// in order.
func TestDelayHangAndSequence(t *testing.T) {
	t.Parallel()
	srv := jetbridgetest.NewServer(t)
	seq := jetbridgetest.Sequence(http.StatusServiceUnavailable, http.StatusOK)
	rec := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(func(r jetbridgetest.Request) jetbridgetest.Response {
		switch {
		case r.EventID() == "slow":
			return jetbridgetest.Response{Delay: 20 * time.Millisecond}
		case r.EventID() == "hung" && r.Attempt() == 1:
			return jetbridgetest.Response{Hang: true}
		case r.EventID() == "seq":
			return seq(r)
		}
		return jetbridgetest.Response{}
	}))
	b := jetbridgetest.StartBridge(t, srv, routeYAML(rec.URL(), "    timeout: 1s\n    transport_retry: {count: 0}\n"))
	for _, id := range []string{"slow", "hung", "seq"} {
		srv.Publish(t, producer.Event{ID: id, Type: "t", Payload: []byte(`{}`)})
	}
	for id, want := range map[string][]string{
		"slow": {bridge.OutcomeDelivered},
		"hung": {bridge.OutcomeRedeliveryScheduled, bridge.OutcomeDelivered},
		"seq":  {bridge.OutcomeRedeliveryScheduled, bridge.OutcomeDelivered},
	} {
		b.WaitEvent(t, id)
		var got []string
		for _, s := range b.Settlements() {
			if s.EventID == id {
				got = append(got, s.Outcome)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s settled %v, want %v", id, got, want)
		}
	}
	var te *bridge.TransportError
	for _, s := range b.Settlements() {
		if s.EventID == "hung" && s.Outcome == bridge.OutcomeRedeliveryScheduled && !errors.As(s.Err, &te) {
			t.Errorf("the hung attempt failed with %v, want a TransportError (the timeout)", s.Err)
		}
	}
}

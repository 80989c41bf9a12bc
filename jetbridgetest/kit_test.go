package jetbridgetest_test

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/deadletter"
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
	if s.Outcome != bridge.OutcomeDeadLettered || s.Reason != deadletter.ReasonRejected {
		t.Fatalf("settled %s/%s, want %s/%s", s.Outcome, s.Reason, bridge.OutcomeDeadLettered, deadletter.ReasonRejected)
	}
	var de *bridge.DownstreamError
	if !errors.As(s.Err, &de) || de.Status != http.StatusBadRequest {
		t.Fatalf("settlement error %v, want a DownstreamError with status 400", s.Err)
	}
	dl := b.WaitDeadLetters(t, 1)
	if len(dl) != 1 || dl[0].EventID != "bad-1" || dl[0].Reason != deadletter.ReasonRejected || dl[0].Status != 400 ||
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

// flakyAndCut answers "flaky" 503 with Retry-After 1s and closes the
// connection of "cut" on their first tries; everything else 202.
func flakyAndCut() jetbridgetest.Script {
	return jetbridgetest.ByEvent(func(id string, attempt int) jetbridgetest.Response {
		if id == "flaky" && attempt == 1 {
			return jetbridgetest.Response{Status: http.StatusServiceUnavailable, RetryAfter: time.Second}
		}
		if id == "cut" && attempt == 1 {
			return jetbridgetest.Response{CloseConn: true}
		}
		return jetbridgetest.Response{Status: http.StatusAccepted}
	})
}

// checkFlakyAndCut reports a settlement that is not what flakyAndCut must
// cause: one redelivery each for flaky (after at least its Retry-After)
// and cut, then delivered; ok delivered at once.
func checkFlakyAndCut(all []bridge.Settled) error {
	var errs []error
	got := map[string][]bridge.Outcome{}
	for _, s := range all {
		got[s.EventID] = append(got[s.EventID], s.Outcome)
		if s.EventID == "flaky" && s.Outcome == bridge.OutcomeRedeliveryScheduled && s.Delay < time.Second {
			errs = append(errs, fmt.Errorf("flaky redelivered after %s, want at least the Retry-After of 1s", s.Delay))
		}
	}
	redelivered := []bridge.Outcome{bridge.OutcomeRedeliveryScheduled, bridge.OutcomeDelivered}
	for id, want := range map[string][]bridge.Outcome{"ok": {bridge.OutcomeDelivered}, "flaky": redelivered, "cut": redelivered} {
		if !slices.Equal(got[id], want) {
			errs = append(errs, fmt.Errorf("%s settled %v, want %v", id, got[id], want))
		}
	}
	return errors.Join(errs...)
}

// Per-event scripts, Retry-After and a closed connection drive the
// bridge's redeliveries: the settlements show each scheduled redelivery.
func TestScriptsDriveRedelivery(t *testing.T) {
	t.Parallel()
	_, b := scripted(t, flakyAndCut(), "    transport_retry: {count: 0}\n", "ok", "flaky", "cut")
	b.WaitQuiet(t)
	if err := checkFlakyAndCut(b.Settlements()); err != nil {
		t.Fatal(err)
	}
}

// Negative control: a Retry-After the receiver does not send, and no
// closed connection, fail the same check.
func TestScriptsDriveRedeliveryCheckCatchesIgnoredScript(t *testing.T) {
	t.Parallel()
	_, b := scripted(t, jetbridgetest.ByEvent(func(id string, attempt int) jetbridgetest.Response {
		if id == "flaky" && attempt == 1 {
			return jetbridgetest.Response{Status: http.StatusServiceUnavailable} // no Retry-After
		}
		return jetbridgetest.Response{Status: http.StatusAccepted}
	}), "    transport_retry: {count: 0}\n", "ok", "flaky", "cut")
	if err := checkFlakyAndCut(b.Settlements()); err == nil {
		t.Fatal("a receiver without Retry-After and without closing connections passed the check")
	}
}

// scripted publishes ids to a bridge delivering to a receiver answering
// by script, waits for each one's final settlement, and returns the
// outcomes of each id in order, with the bridge.
func scripted(t *testing.T, script jetbridgetest.Script, extraYAML string, ids ...string) (map[string][]bridge.Outcome, *jetbridgetest.Bridge) {
	t.Helper()
	srv := jetbridgetest.NewServer(t)
	rec := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(script))
	b := jetbridgetest.StartBridge(t, srv, routeYAML(rec.URL(), extraYAML))
	for _, id := range ids {
		srv.Publish(t, producer.Event{ID: id, Type: "t", Payload: []byte(`{}`)})
	}
	for _, id := range ids {
		b.WaitEvent(t, id)
	}
	got := map[string][]bridge.Outcome{}
	for _, s := range b.Settlements() {
		got[s.EventID] = append(got[s.EventID], s.Outcome)
	}
	return got, b
}

// latencyHangSequence answers "slow" after 20 ms, hangs on the first try
// of "hung" and answers "seq" 503 then 200.
func latencyHangSequence() jetbridgetest.Script {
	seq := jetbridgetest.Sequence(http.StatusServiceUnavailable, http.StatusOK)
	return func(r jetbridgetest.Request) jetbridgetest.Response {
		switch {
		case r.EventID() == "slow":
			return jetbridgetest.Response{Delay: 20 * time.Millisecond}
		case r.EventID() == "hung" && r.Attempt() == 1:
			return jetbridgetest.Response{Hang: true}
		case r.EventID() == "seq":
			return seq(r)
		}
		return jetbridgetest.Response{}
	}
}

const timeoutNoRetry = "    timeout: 1s\n    transport_retry: {count: 0}\n"

// checkLatencyHangSequence reports an outcome that is not what
// latencyHangSequence must cause.
func checkLatencyHangSequence(got map[string][]bridge.Outcome) error {
	var errs []error
	for id, want := range map[string][]bridge.Outcome{
		"slow": {bridge.OutcomeDelivered},
		"hung": {bridge.OutcomeRedeliveryScheduled, bridge.OutcomeDelivered},
		"seq":  {bridge.OutcomeRedeliveryScheduled, bridge.OutcomeDelivered},
	} {
		if !slices.Equal(got[id], want) {
			errs = append(errs, fmt.Errorf("%s settled %v, want %v", id, got[id], want))
		}
	}
	return errors.Join(errs...)
}

// Latency within the destination's timeout is delivered; a hang is cut
// off by it (a transport error, redelivered); a status sequence answers
// in order.
func TestDelayHangAndSequence(t *testing.T) {
	t.Parallel()
	got, b := scripted(t, latencyHangSequence(), timeoutNoRetry, "slow", "hung", "seq")
	if err := checkLatencyHangSequence(got); err != nil {
		t.Fatal(err)
	}
	var te *bridge.TransportError
	for _, s := range b.Settlements() {
		if s.EventID == "hung" && s.Outcome == bridge.OutcomeRedeliveryScheduled && !errors.As(s.Err, &te) {
			t.Errorf("the hung attempt failed with %v, want a TransportError (the timeout)", s.Err)
		}
	}
}

// Negative control: a receiver that ignores the script (200 to all) fails
// the same check.
func TestDelayHangAndSequenceCheckCatchesIgnoredScript(t *testing.T) {
	t.Parallel()
	got, _ := scripted(t, jetbridgetest.Always(http.StatusOK), timeoutNoRetry, "slow", "hung", "seq")
	if err := checkLatencyHangSequence(got); err == nil {
		t.Fatal("a receiver answering 200 to everything passed the check")
	}
}

// WaitQuiet waits for an ordered route too (its partitioned copy): an
// event published and refused twice by the receiver is still unsettled
// when WaitQuiet is called, and delivered (three requests) when it
// returns. Checked against a WaitQuiet that ignores ordered routes: it
// returns with 0 or 1 request, and so did one that trusted the copy's
// lag as the server last reported it (0 requests).
func TestWaitQuietOrderedRoute(t *testing.T) {
	t.Parallel()
	srv := jetbridgetest.NewServer(t)
	rec := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(jetbridgetest.Sequence(503, 503, 200)))
	b := jetbridgetest.StartBridge(t, srv, fmt.Sprintf(`
shutdown_timeout: 200ms
destinations:
  receiver:
    url: %s/events
routes:
  - name: r
    subjects: ["events.>"]
    destination: receiver
    backoff: [300ms]
    ordering: {key: subject, partitions: 2}
`, rec.URL()))
	srv.Publish(t, producer.Event{ID: "o-1", Type: "order.created", Payload: []byte(`{"n":1}`)})
	b.WaitQuiet(t)
	if n := len(rec.Events("o-1")); n != 3 {
		t.Fatalf("%d requests for o-1 when WaitQuiet returned, want 3 (two 503s, then delivered)", n)
	}
}

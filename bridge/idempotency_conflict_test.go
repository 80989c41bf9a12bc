package bridge

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/idempotency"
	"github.com/sotercare/jetbridge/internal/sinktest"
)

// conflictCanary is in the payload of every event the conflict tests
// publish: no log line may show it.
const conflictCanary = "PAYLOAD-CANARY-7c1e"

const conflictRoute = `
idempotency: {bucket: DELIVERED}
destinations:
  d: {url: %s, circuit_breaker: {enabled: false}}
routes:
  - {name: r, subjects: ["events.>"], destination: d, idempotency: true, ack_wait: 2s, backoff: [50ms]}
`

// publishEvent publishes with an Event-Id header and no Nats-Msg-Id, as a
// producer that sets its own event ids: each publish gets a normal PubAck.
func (h *harness) publishEvent(subject, eventID, payload string) uint64 {
	h.t.Helper()
	return h.publish(subject, "", []byte(payload), map[string]string{"Event-Id": eventID})
}

// conflictCase is one scenario: a first event delivered, then a second one
// with the same event id.
type conflictCase struct {
	subject1, payload1 string
	subject2, payload2 string
	part               string // "" when the second is a duplicate
}

// runConflict publishes the first event, waits until it is delivered,
// publishes the second with the same event id and checks what became of
// it: a conflict (dead-lettered event-id-conflict with a warn line, counted,
// nothing sent) or, when c.part is "", a duplicate (acked, nothing sent).
func runConflict(t testing.TB, c conflictCase, f faults) error {
	sink := sinktest.New(t, sinktest.Always(200))
	h := startBridge(t, testConfig(t, conflictRoute, sink.URL()), f)
	admin := httptest.NewServer(h.b.AdminHandler(h.reg))
	t.Cleanup(admin.Close)

	seq1 := h.publishEvent(c.subject1, "fall-0001", c.payload1)
	sink.WaitCount(t, 1, settleWait)
	h.waitOutcomes(1, settleWait, nil)
	seq2 := h.publishEvent(c.subject2, "fall-0001", c.payload2)
	out := h.waitOutcomes(2, settleWait, nil)
	h.quiet("r")

	if len(out) != 2 || out[0].Seq != seq1 || out[0].Outcome != OutcomeDelivered || out[1].Seq != seq2 {
		return fmt.Errorf("outcomes %+v, want the first event (seq %d) delivered, then the second (seq %d) settled", out, seq1, seq2)
	}
	if n := sink.Count(); n != 1 {
		return fmt.Errorf("destination received %d requests, want exactly 1 (the first event; nothing sent for the second)", n)
	}
	if got := sink.Requests()[0]; !strings.Contains(string(got.Body), c.payload1) {
		return errors.New("the one request is not the first event's")
	}
	m := scrape(t, admin.URL+"/metrics")
	logs := h.logs.String()
	if strings.Contains(logs, conflictCanary) {
		return errors.New("a log line shows a payload")
	}
	dls := h.deadLetters()
	if c.part == "" {
		if out[1].Outcome != OutcomeDuplicateSkipped || len(dls) != 0 || m[`bridge_messages_total{outcome="duplicate_skipped",route="r"}`] != 1 {
			return fmt.Errorf("second event: %s, %d dead letters; want duplicate_skipped, none", out[1].Outcome, len(dls))
		}
		if n := logLines(logs, "event id conflict"); n != 0 {
			return fmt.Errorf("%d conflict lines for a duplicate, want 0", n)
		}
		return nil
	}
	if out[1].Outcome != OutcomeDeadLettered || out[1].Reason != deadletter.ReasonEventIDConflict {
		return fmt.Errorf("second event: %s %s, want dead_lettered %s", out[1].Outcome, out[1].Reason, deadletter.ReasonEventIDConflict)
	}
	var conflict *EventIDConflictError
	if !errors.As(out[1].Err, &conflict) || conflict.Part != c.part || conflict.Seq != seq1 || conflict.State != stateDone {
		return fmt.Errorf("second event's failure %v, want an EventIDConflictError on the %s naming seq %d done", out[1].Err, c.part, seq1)
	}
	if len(dls) != 1 {
		return fmt.Errorf("%d dead letters, want 1", len(dls))
	}
	dl := dls[0].Header
	if dl.Get(deadletter.HeaderReason) != string(deadletter.ReasonEventIDConflict) || dl.Get(deadletter.HeaderFailure) != string(deadletter.FailureEventIDConflict) ||
		dl.Get("Bridge-Original-Subject") != c.subject2 || dl.Get("Bridge-Original-Sequence") != fmt.Sprint(seq2) ||
		dl.Get(deadletter.HeaderError) != fmt.Sprintf("event id already delivered for another %s (EVENTS seq %d)", c.part, seq1) ||
		string(dls[0].Data) != c.payload2 {
		return fmt.Errorf("dead letter headers %v, want reason and failure %s, the second event's subject and seq, an error naming the %s and seq %d", dl, deadletter.ReasonEventIDConflict, c.part, seq1)
	}
	if n := logLines(logs, `"level":"warn"`, `"message":"event id conflict`, `"route":"r"`, `"differs":"`+c.part+`"`,
		fmt.Sprintf(`"stream_seq":%d`, seq2), fmt.Sprintf(`"record_stream_seq":%d`, seq1), `"record_state":"done"`); n != 1 {
		return fmt.Errorf("%d warn lines of the conflict with the route, part and both sequences, want 1:\n%s", n, logs)
	}
	if n := logLines(logs, `"level":"warn"`, `"message":"dead-lettered"`, `"reason":"event-id-conflict"`, `"failure":"event-id-conflict"`); n != 1 {
		return fmt.Errorf("%d dead-lettered warn lines, want 1:\n%s", n, logs)
	}
	for series, want := range map[string]float64{
		`bridge_messages_total{outcome="dead_lettered",route="r"}`:                   1,
		`bridge_messages_total{outcome="duplicate_skipped",route="r"}`:               0,
		`bridge_dead_letters_total{reason="event-id-conflict",route="r"}`:            1,
		`bridge_idempotency_conflicts_total{part="` + c.part + `",route="r"}`:        1,
		`bridge_idempotency_conflicts_total{part="` + other(c.part) + `",route="r"}`: 0,
	} {
		if got, ok := m[series]; !ok || got != want {
			return fmt.Errorf("%s = %v (present %t), want %v", series, got, ok, want)
		}
	}
	return nil
}

func other(part string) string {
	if part == ConflictSubject {
		return ConflictPayload
	}
	return ConflictSubject
}

// The security review's attack: with idempotency, an info event published
// first with Event-Id fall-0001 must not suppress the critical fall event
// with the same id. The real event is dead-lettered event-id-conflict (warn
// line, counted, nothing sent), never acked as duplicate_skipped. Negative
// control: a store that compares event ids only (the previous behaviour)
// acks the fall as a duplicate, and the same check fails.
func TestEventIDConflictAcrossSubjects(t *testing.T) {
	attack := conflictCase{
		subject1: "events.info.spam", payload1: `{"n":1,"c":"` + conflictCanary + `"}`,
		subject2: "events.critical.care.caregiver.fall", payload2: `{"n":1,"c":"` + conflictCanary + `"}`,
		part: ConflictSubject,
	}
	if err := runConflict(t, attack, faults{}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "reservations compare event ids only", func(t testing.TB) error {
		return runConflict(t, attack, faults{contentBlind: true})
	})
}

// Same event id and subject, another payload: a conflict on the payload.
func TestEventIDConflictOnPayload(t *testing.T) {
	c := conflictCase{
		subject1: "events.critical.care.caregiver.fall", payload1: `{"room":1,"c":"` + conflictCanary + `"}`,
		subject2: "events.critical.care.caregiver.fall", payload2: `{"room":2,"c":"` + conflictCanary + `"}`,
		part: ConflictPayload,
	}
	if err := runConflict(t, c, faults{}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "reservations compare event ids only", func(t testing.TB) error {
		return runConflict(t, c, faults{contentBlind: true})
	})
}

// Same event id, subject and payload bytes: a duplicate, as before (acked,
// nothing sent, no conflict).
func TestSameEventIDAndContentIsADuplicate(t *testing.T) {
	p := `{"room":1,"c":"` + conflictCanary + `"}`
	c := conflictCase{subject1: "events.critical.care.caregiver.fall", payload1: p, subject2: "events.critical.care.caregiver.fall", payload2: p}
	if err := runConflict(t, c, faults{}); err != nil {
		t.Fatal(err)
	}
}

// A conflict with a reservation still in flight is decided at once: while
// the first event's request hangs, the second (same id, another payload)
// is dead-lettered event-id-conflict naming the in-flight record; then the
// first is delivered. Nothing is sent for the second.
func TestEventIDConflictWithAnInFlightReservation(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	sink := sinktest.New(t, func(r sinktest.Request) sinktest.Response {
		if r.N == 1 {
			<-release
		}
		return sinktest.Response{Status: 200}
	})
	h := startBridge(t, testConfig(t, conflictRoute, sink.URL()), faults{})
	seq1 := h.publishEvent("events.critical.care.caregiver.fall", "fall-0001", `{"room":1}`)
	sink.WaitCount(t, 1, settleWait) // the first request hangs: its reservation is in flight
	seq2 := h.publishEvent("events.critical.care.caregiver.fall", "fall-0001", `{"room":2}`)
	out := h.waitOutcomes(1, settleWait, nil)
	var conflict *EventIDConflictError
	if len(out) != 1 || out[0].Seq != seq2 || out[0].Reason != deadletter.ReasonEventIDConflict || !errors.As(out[0].Err, &conflict) ||
		conflict.State != stateInFlight || conflict.Seq != seq1 || conflict.Part != ConflictPayload {
		t.Fatalf("outcomes %+v, want the second event (seq %d) dead-lettered event-id-conflict on the payload, naming seq %d in flight, while the first hangs", out, seq2, seq1)
	}
	close(release)
	out = h.waitOutcomes(2, settleWait, nil)
	h.quiet("r")
	if len(out) != 2 || out[1].Seq != seq1 || out[1].Outcome != OutcomeDelivered || sink.Count() != 1 {
		t.Fatalf("outcomes %+v, %d requests; want the first delivered, 1 request", out, sink.Count())
	}
	if n := logLines(h.logs.String(), `"message":"event id conflict`, `"record_state":"inflight"`, fmt.Sprintf(`"record_stream_seq":%d`, seq1)); n != 1 {
		t.Fatalf("%d conflict lines naming the in-flight record, want 1", n)
	}
}

// The encoding of a reservation: content round-trips, a subject may hold
// "/", and a record of the previous release (no content) is read as such;
// the previous release's parser (four space-separated fields, the state
// first, two integers last) reads every record written now.
func TestHolderEncoding(t *testing.T) {
	ev := &event{Stream: "EVENTS", Seq: 12, Delivered: 3, Subject: "events.a/b/c.x", Payload: []byte(`{}`)}
	for _, state := range []string{stateInFlight, stateDone} {
		h := holderOf(ev)
		h.state = state
		got, err := parseHolder(h.encode())
		if err != nil || got != h {
			t.Fatalf("round trip of %+v: %+v, %v", h, got, err)
		}
		if old, err := parseHolderV0(h.encode()); err != nil || old.state != state || old.seq != 12 || old.delivered != 3 {
			t.Fatalf("the previous release reads %q as %+v, %v", h.encode(), old, err)
		}
	}
	// A record names the replica that wrote it (package idempotency reads
	// it); the delivery reads past it, and so does the previous release.
	for _, state := range []string{stateInFlight, stateDone} {
		h := holderOf(ev)
		h.state, h.replica = state, idempotency.Replica(4242, "ops 1/x")
		enc := h.encode()
		v, err := idempotency.ParseValue(enc)
		if err != nil || v.PID != 4242 || v.Host != "ops_1_x" || v.Stream != "EVENTS" || v.Subject != ev.Subject {
			t.Fatalf("idempotency.ParseValue(%q) = %+v, %v", enc, v, err)
		}
		got, err := parseHolder(enc)
		if want := (holder{state: state, stream: "EVENTS", seq: 12, delivered: 3, subject: ev.Subject, digest: h.digest}); err != nil || got != want {
			t.Fatalf("parseHolder(%q) = %+v, %v; want %+v", enc, got, err, want)
		}
		if old, err := parseHolderV0(enc); err != nil || old.state != state || old.seq != 12 || old.delivered != 3 {
			t.Fatalf("the previous release reads %q as %+v, %v", enc, old, err)
		}
	}
	legacy, err := parseHolder([]byte("done EVENTS 7 1"))
	if err != nil || legacy != (holder{state: stateDone, stream: "EVENTS", seq: 7, delivered: 1}) {
		t.Fatalf("previous release's record: %+v, %v", legacy, err)
	}
	if d := differs(legacy, holderOf(ev)); d != "" {
		t.Fatalf("a record without content differs on %q, want trusted as before", d)
	}
	for _, bad := range []string{"done EVENTS/abc/x 1 1", "done EVENTS/" + strings.Repeat("z", 64) + "/x 1 1", "done /" + strings.Repeat("a", 64) + "/x 1 1", "done EVENTS/" + strings.Repeat("a", 64) + "/ 1 1"} {
		if _, err := parseHolder([]byte(bad)); err == nil || strings.Contains(err.Error(), "EVENTS") {
			t.Errorf("%q: %v, want unreadable, without quoting the record", bad, err)
		}
	}
}

// parseHolderV0 is parseHolder as the previous release has it.
func parseHolderV0(b []byte) (holder, error) {
	f := strings.Fields(string(b))
	if len(f) != 4 || (f[0] != stateInFlight && f[0] != stateDone) {
		return holder{}, errors.New("unreadable")
	}
	var seq, n uint64
	if _, err := fmt.Sscan(f[2]+" "+f[3], &seq, &n); err != nil {
		return holder{}, err
	}
	return holder{state: f[0], stream: f[1], seq: seq, delivered: n}, nil
}

// Reserve and Lookup on a previous release's done record (no content): a
// duplicate whatever the content, until the record expires.
func TestPreviousReleaseRecordIsADuplicate(t *testing.T) {
	kv := testBucket(t)
	s := newReservations(kv)
	ctx := context.Background()
	key := reservationKey("r", "e")
	if _, err := kv.Put(ctx, key, []byte("done EVENTS 1 1")); err != nil {
		t.Fatal(err)
	}
	me := holderOf(&event{Stream: "EVENTS", Seq: 2, Delivered: 1, Subject: "events.x", Payload: []byte(`{"a":1}`)})
	var dup *DuplicateEventError
	if _, err := s.reserve(ctx, key, me, time.Minute); !errors.As(err, &dup) {
		t.Fatalf("Reserve: %v, want DuplicateEventError", err)
	}
	if err := s.lookup(ctx, key, me); !errors.As(err, &dup) {
		t.Fatalf("Lookup: %v, want DuplicateEventError", err)
	}
}

// Reserve and Lookup (the check of a message past max_deliver) apply one
// rule: another subject or payload is a conflict whether the record is in
// flight or done; the same content waits (in flight) or is a duplicate
// (done). Negative control: the content-blind rule sees no conflict.
func TestReservationContentRule(t *testing.T) {
	check := func(t testing.TB, s *reservations) error {
		ctx := context.Background()
		key := reservationKey("r", "fall-0001")
		ev := &event{Stream: "EVENTS", Seq: 1, Delivered: 1, Subject: "events.info.spam", Payload: []byte(`{"a":1}`)}
		l, err := s.reserve(ctx, key, holderOf(ev), time.Minute)
		if err != nil {
			return err
		}
		other := func(subject, payload string) holder {
			return holderOf(&event{Stream: "EVENTS", Seq: 2, Delivered: 1, Subject: subject, Payload: []byte(payload)})
		}
		want := func(state string) error {
			var c *EventIDConflictError
			for _, tc := range []struct {
				me   holder
				part string
			}{
				{other("events.critical.care.caregiver.fall", `{"a":1}`), ConflictSubject},
				{other("events.info.spam", `{"a":2}`), ConflictPayload},
			} {
				if _, err := s.reserve(ctx, key, tc.me, 0); !errors.As(err, &c) || c.Part != tc.part || c.State != state || c.Seq != 1 {
					return fmt.Errorf("Reserve with another %s (record %s): %v, want a conflict", tc.part, state, err)
				}
				if err := s.lookup(ctx, key, tc.me); !errors.As(err, &c) || c.Part != tc.part || c.State != state {
					return fmt.Errorf("Lookup with another %s (record %s): %v, want a conflict", tc.part, state, err)
				}
			}
			return nil
		}
		if err := want(stateInFlight); err != nil {
			return err
		}
		same := other(ev.Subject, string(ev.Payload))
		if _, err := s.reserve(ctx, key, same, time.Minute); !errors.Is(err, errReserved) {
			return fmt.Errorf("same content in flight: %v, want errReserved", err)
		}
		if err := l.done(ctx, l.me); err != nil {
			return err
		}
		if err := want(stateDone); err != nil {
			return err
		}
		var dup *DuplicateEventError
		if _, err := s.reserve(ctx, key, same, time.Minute); !errors.As(err, &dup) {
			return fmt.Errorf("same content done: %v, want a duplicate", err)
		}
		return nil
	}
	if err := check(t, newReservations(testBucket(t))); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "content-blind reservations", func(t testing.TB) error {
		s := newReservations(kvFaults{contentBlind: true}.wrap(testBucket(t)))
		return check(t, s)
	})
}

package bridge

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/deadletter"
)

var testPolicy = settlePolicy{
	MaxDeliver:        3,
	Backoff:           []time.Duration{time.Second, 5 * time.Second},
	RedeliverStatuses: []int{408, 425, 429, 500, 502, 503, 504},
	MaxRetryAfter:     time.Minute,
}

type decideFunc func(err error, delivered uint64, p settlePolicy) decision

// decideBy is the bridge's table as a decideFunc.
func decideBy(err error, delivered uint64, p settlePolicy) decision { return p.decide(err, delivered) }

// decisionMismatches runs the settlement table (docs/delivery.md#delivery), its
// unusual cases included, against decide and returns every row it gets
// wrong.
func decisionMismatches(decide decideFunc) []string {
	type row struct {
		name      string
		err       error
		delivered uint64
		want      decision
	}
	wrap := func(err error) error {
		return fmt.Errorf("outer: %w", &DeliveryError{Route: "r", Destination: "d", Err: err})
	}
	rows := []row{
		{"2xx", nil, 1, decision{action: actAck}},
		{"duplicate", wrap(&DuplicateEventError{EventID: "e"}), 1, decision{action: actAck}},
		{"transport first", wrap(&TransportError{Kind: "timeout"}), 1, decision{action: actRedeliver, delay: time.Second}},
		{"transport second", wrap(&TransportError{Kind: "timeout"}), 2, decision{action: actRedeliver, delay: 5 * time.Second}},
		{"transport last", wrap(&TransportError{Kind: "timeout"}), 3, decision{action: actDeadLetter, reason: deadletter.ReasonMaxDeliveries}},
		{"circuit open", wrap(&CircuitOpenError{}), 3, decision{action: actHold, delay: interruptedDelay}},
		{"failed probe", wrap(&CircuitOpenError{Err: &DownstreamError{Status: 400}}), 1, decision{action: actHold, delay: interruptedDelay}},
		{"invalid", wrap(&InvalidEventError{Reason: "x"}), 1, decision{action: actDeadLetter, reason: deadletter.ReasonInvalidEvent}},
		{"event-id conflict, subject", wrap(&EventIDConflictError{Part: ConflictSubject, State: stateDone, Stream: "EVENTS", Seq: 1}), 1, decision{action: actDeadLetter, reason: deadletter.ReasonEventIDConflict}},
		{"event-id conflict, in flight, last delivery", wrap(&EventIDConflictError{Part: ConflictPayload, State: stateInFlight}), 3, decision{action: actDeadLetter, reason: deadletter.ReasonEventIDConflict}},
		{"exhausted", wrap(ErrDeliveriesExhausted), 4, decision{action: actDeadLetter, reason: deadletter.ReasonMaxDeliveries}},
		{"interrupted", wrap(ErrInterrupted), 3, decision{action: actRedeliver, delay: interruptedDelay}},
		{"hold interrupted by shutdown", wrap(fmt.Errorf("%w: %w", ErrInterrupted, &CircuitOpenError{})), 1, decision{action: actRedeliver, delay: interruptedDelay}},
		{"retry-after longer than backoff", wrap(&DownstreamError{Status: 503, RetryAfter: 30 * time.Second}), 1, decision{action: actRedeliver, delay: 30 * time.Second}},
		{"retry-after shorter than backoff", wrap(&DownstreamError{Status: 429, RetryAfter: time.Millisecond}), 2, decision{action: actRedeliver, delay: 5 * time.Second}},
		{"retry-after capped", wrap(&DownstreamError{Status: 503, RetryAfter: 24 * time.Hour}), 1, decision{action: actRedeliver, delay: time.Minute}},
		{"retry-after on the last delivery", wrap(&DownstreamError{Status: 503, RetryAfter: time.Second}), 3, decision{action: actDeadLetter, reason: deadletter.ReasonMaxDeliveries}},
		// The unusual cases.
		{"untouched as the route stops", ErrInterrupted, 1, decision{action: actRedeliver, delay: interruptedDelay}},
		{"no JetStream metadata", fmt.Errorf("%w: %w", ErrNoMetadata, errors.New("x")), 0, decision{action: actRedeliver, delay: time.Second}},
		{"unexpected error", errors.New("x"), 2, decision{action: actRedeliver, delay: 5 * time.Second}},
		{"rejected, dead letter not stored", &DeadLetterError{Reason: deadletter.ReasonRejected, Failure: wrap(&DownstreamError{Status: 400}), Err: errors.New("x")}, 1,
			decision{action: actRedeliver, delay: time.Second}},
		{"last delivery, dead letter not stored", &DeadLetterError{Reason: deadletter.ReasonMaxDeliveries, Failure: wrap(&TransportError{}), Err: ErrDeadLetterRefused}, 3,
			decision{action: actRedeliver, delay: 5 * time.Second}},
		{"exhausted, dead letter not stored", &DeadLetterError{Reason: deadletter.ReasonMaxDeliveries, Failure: ErrDeliveriesExhausted, Err: errors.New("x")}, 4,
			decision{action: actRedeliver, delay: 5 * time.Second}},
		{"invalid, dead letter not stored", &DeadLetterError{Reason: deadletter.ReasonInvalidEvent, Failure: &InvalidEventError{}, Err: errors.New("x")}, 1,
			decision{action: actRedeliver, delay: time.Second}},
		{"event-id conflict, dead letter not stored", &DeadLetterError{Reason: deadletter.ReasonEventIDConflict, Failure: wrap(&EventIDConflictError{Part: ConflictSubject}), Err: errors.New("x")}, 1,
			decision{action: actRedeliver, delay: time.Second}},
	}
	// Every status code net/http knows, on first and last delivery.
	for status := 100; status < 600; status++ {
		if http.StatusText(status) == "" || status/100 == 2 {
			continue
		}
		for _, delivered := range []uint64{1, 3} {
			want := decision{action: actDeadLetter, reason: deadletter.ReasonRejected}
			if slices.Contains(testPolicy.RedeliverStatuses, status) {
				want = decision{action: actRedeliver, delay: testPolicy.backoff(delivered)}
				if delivered >= uint64(testPolicy.MaxDeliver) {
					want = decision{action: actDeadLetter, reason: deadletter.ReasonMaxDeliveries}
				}
			}
			rows = append(rows, row{fmt.Sprintf("status %d delivery %d", status, delivered),
				wrap(&DownstreamError{Status: status}), delivered, want})
		}
	}
	var bad []string
	for _, r := range rows {
		if got := decide(r.err, r.delivered, testPolicy); got != r.want {
			bad = append(bad, fmt.Sprintf("%s: got %+v, want %+v", r.name, got, r.want))
		}
	}
	return bad
}

func TestDecide(t *testing.T) {
	for _, m := range decisionMismatches(decideBy) {
		t.Error(m)
	}
}

// TestDecideNegativeControl shows the table catches the classic mistakes:
// "any error means redeliver", ignoring Retry-After, and burning the
// delivery budget on an open breaker.
func TestDecideNegativeControl(t *testing.T) {
	broken := map[string]decideFunc{
		"any error redelivers": func(err error, delivered uint64, p settlePolicy) decision {
			if err == nil {
				return decision{action: actAck}
			}
			return decision{action: actRedeliver, delay: p.backoff(delivered)}
		},
		"retry-after ignored": func(err error, delivered uint64, p settlePolicy) decision {
			var de *DownstreamError
			if errors.As(err, &de) {
				de2 := *de
				de2.RetryAfter = 0
				return p.decide(&de2, delivered)
			}
			return p.decide(err, delivered)
		},
		"open breaker counts": func(err error, delivered uint64, p settlePolicy) decision {
			var ce *CircuitOpenError
			if errors.As(err, &ce) {
				return p.decide(&TransportError{}, delivered)
			}
			return p.decide(err, delivered)
		},
		"terminate without a stored dead letter": func(err error, delivered uint64, p settlePolicy) decision {
			var dle *DeadLetterError
			if errors.As(err, &dle) {
				return decision{action: actDeadLetter, reason: dle.Reason}
			}
			return p.decide(err, delivered)
		},
		"bare nak": func(err error, delivered uint64, p settlePolicy) decision {
			d := p.decide(err, delivered)
			if errors.Is(err, ErrInterrupted) {
				d.delay = 0
			}
			return d
		},
		"4xx redelivered": func(err error, delivered uint64, p settlePolicy) decision {
			p.RedeliverStatuses = append(slices.Clone(p.RedeliverStatuses), 400, 404, 422)
			return p.decide(err, delivered)
		},
	}
	for name, f := range broken {
		if len(decisionMismatches(f)) == 0 {
			t.Errorf("the settlement table does not catch the broken variant %q", name)
		}
	}
}

func TestErrorsMatchThroughWrapping(t *testing.T) {
	inner := &DownstreamError{Destination: "d", Status: 503, RetryAfter: time.Second}
	err := fmt.Errorf("context: %w", &DeliveryError{Route: "r", Destination: "d", Err: inner})
	var de *DownstreamError
	if !errors.As(err, &de) || de.Status != 503 || de.RetryAfter != time.Second {
		t.Fatalf("errors.As DownstreamError failed: %v", err)
	}
	var parent *DeliveryError
	if !errors.As(err, &parent) || parent.Route != "r" {
		t.Fatalf("errors.As DeliveryError failed")
	}
	if got := FailureKind(err); got != deadletter.FailureDownstream {
		t.Errorf("FailureKind = %q", got)
	}
	probe := &DeliveryError{Err: &CircuitOpenError{Destination: "d", Err: &TransportError{Kind: "timeout"}}}
	if got := FailureKind(probe); got != deadletter.FailureCircuitOpen {
		t.Errorf("FailureKind(failed probe) = %q", got)
	}
	var te *TransportError
	if !errors.As(probe, &te) {
		t.Error("the probe's transport failure is not reachable")
	}
	if FailureKind(&DeliveryError{Err: &InvalidEventError{}}) != deadletter.FailureInvalid ||
		FailureKind(&DeliveryError{Err: &TransportError{}}) != deadletter.FailureTransport || FailureKind(nil) != "" {
		t.Error("FailureKind mismatch")
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	in := func(d time.Duration) string { return now.Add(d).Format(http.TimeFormat) }
	tests := []struct {
		v, date string
		want    time.Duration
	}{
		{"", "", 0},
		{"1", "", time.Second},
		{"120", "", 2 * time.Minute},
		{"0", "", 0},
		{"-5", "", 0},
		{"soon", "", 0},
		{in(3 * time.Second), "", 3 * time.Second},
		{in(-time.Hour), "", 0},
		// The destination's clock runs an hour ahead: measure against its Date.
		{in(time.Hour + 2*time.Second), in(time.Hour), 2 * time.Second},
	}
	for _, tt := range tests {
		if got := parseRetryAfter(tt.v, tt.date, now); got != tt.want {
			t.Errorf("parseRetryAfter(%q, %q) = %v, want %v", tt.v, tt.date, got, tt.want)
		}
	}
}

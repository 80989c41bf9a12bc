package bridge

import (
	"errors"
	"slices"
	"time"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/deadletter"
)

// action is what happens to a JetStream message after an attempt.
type action int

const (
	// actAck: the destination answered 2xx, or the event was already delivered.
	actAck action = iota + 1
	// actRedeliver: NakWithDelay(delay); the broker schedules the next delivery.
	actRedeliver
	// actDeadLetter: store a dead letter with reason, then terminate the message.
	actDeadLetter
	// actHold: the breaker is open; keep the message (with progress acks) and
	// attempt again once the breaker lets a request through. A hold that
	// cannot happen (shutdown) hands the message back after delay.
	actHold
)

func (a action) String() string {
	switch a {
	case actAck:
		return "ack"
	case actRedeliver:
		return "redeliver"
	case actDeadLetter:
		return "dead-letter"
	case actHold:
		return "hold"
	}
	return "unknown"
}

// interruptedDelay is the redelivery delay of an attempt cut off by
// shutdown: prompt, but never a bare nak.
const interruptedDelay = 100 * time.Millisecond

// minRedeliveryDelay is the shortest delay of a redelivery: a NakWithDelay
// of 0 would be a bare nak, which redelivers at once.
const minRedeliveryDelay = time.Millisecond

// settleRules decide the settlement of a message: settlePolicy.decide, the
// table below, on every route. It is the seam where a whole table can be
// put in its place (tests put deliberately broken ones).
type settleRules interface {
	decide(failure error, delivered uint64) decision
}

// settlePolicy is the part of a route's configuration that decides a
// settlement.
type settlePolicy struct {
	MaxDeliver        int             // deliveries before dead-lettering, first included
	Backoff           []time.Duration // delay before redelivery n; the last repeats
	RedeliverStatuses []int           // statuses worth a redelivery
	MaxRetryAfter     time.Duration   // cap on an honoured Retry-After
}

// policyOf is the route's settlePolicy.
func policyOf(rc *config.Route) settlePolicy {
	backoff := make([]time.Duration, len(rc.Backoff))
	for i, d := range rc.Backoff {
		backoff[i] = d.D()
	}
	return settlePolicy{
		MaxDeliver:        rc.MaxDeliver,
		Backoff:           backoff,
		RedeliverStatuses: rc.RedeliverStatuses,
		MaxRetryAfter:     rc.MaxRetryAfter.D(),
	}
}

// backoff is the delay before the redelivery that follows delivery number
// delivered (1-based).
func (p settlePolicy) backoff(delivered uint64) time.Duration {
	return config.BackoffAt(p.Backoff, delivered)
}

// decision is what decide says to do with one message.
type decision struct {
	action action
	delay  time.Duration     // actRedeliver and actHold
	reason deadletter.Reason // actDeadLetter only
}

// decide maps the failure of an attempt (nil for a 2xx) and the JetStream
// delivery count to a decision. It is pure, and it is the whole settlement
// table of docs/delivery.md#delivery, unusual cases included: every
// settlement of a source message (delivery.go, settle) is one of its rows.
func (p settlePolicy) decide(err error, delivered uint64) decision {
	if err == nil {
		return decision{action: actAck} // before the targets below, which escape: no allocation for a 2xx
	}
	var (
		te  *TransportError
		de  *DownstreamError
		ce  *CircuitOpenError
		ie  *InvalidEventError
		dup *DuplicateEventError
		dle *DeadLetterError
		eic *EventIDConflictError
	)
	switch {
	case errors.As(err, &dup):
		return decision{action: actAck}
	case errors.As(err, &dle):
		// The dead letter was not stored: never terminate, try again later.
		return redeliverAfter(p.backoff(delivered))
	case errors.As(err, &eic):
		// Never acked as a duplicate: another event holds the id.
		return decision{action: actDeadLetter, reason: deadletter.ReasonEventIDConflict}
	case errors.Is(err, ErrInterrupted):
		// Shutdown cut the attempt (or a hold) short: hand it back promptly.
		return redeliverAfter(interruptedDelay)
	case errors.As(err, &ce):
		return decision{action: actHold, delay: interruptedDelay}
	case errors.Is(err, ErrDeliveriesExhausted):
		return decision{action: actDeadLetter, reason: deadletter.ReasonMaxDeliveries}
	case errors.As(err, &ie):
		return decision{action: actDeadLetter, reason: deadletter.ReasonInvalidEvent}
	case errors.As(err, &de):
		if !slices.Contains(p.RedeliverStatuses, de.Status) {
			return decision{action: actDeadLetter, reason: deadletter.ReasonRejected}
		}
		return redeliver(delivered, p, min(de.RetryAfter, p.MaxRetryAfter))
	case errors.As(err, &te):
		return redeliver(delivered, p, 0)
	}
	// Anything else (ErrNoMetadata, an unexpected error) is not the
	// message's fault: try again after the backoff.
	return redeliverAfter(p.backoff(delivered))
}

func redeliver(delivered uint64, p settlePolicy, retryAfter time.Duration) decision {
	if delivered >= uint64(p.MaxDeliver) {
		return decision{action: actDeadLetter, reason: deadletter.ReasonMaxDeliveries}
	}
	return redeliverAfter(max(p.backoff(delivered), retryAfter))
}

func redeliverAfter(d time.Duration) decision {
	return decision{action: actRedeliver, delay: max(d, minRedeliveryDelay)}
}

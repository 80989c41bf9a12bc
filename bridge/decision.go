package bridge

import (
	"errors"
	"slices"
	"time"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/deadletter"
)

// Action is what happens to a JetStream message after an attempt.
type Action int

const (
	// Ack: the destination answered 2xx, or the event was already delivered.
	Ack Action = iota + 1
	// Redeliver: NakWithDelay(Delay); the broker schedules the next delivery.
	Redeliver
	// DeadLetter: store a dead letter with Reason, then terminate the message.
	DeadLetter
	// Hold: the breaker is open; keep the message (with progress acks) and
	// attempt again once the breaker lets a request through. A hold that
	// cannot happen (shutdown) hands the message back after Delay.
	Hold
)

func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Redeliver:
		return "redeliver"
	case DeadLetter:
		return "dead-letter"
	case Hold:
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

// SettlePolicy is the part of a route's configuration that decides a
// settlement.
type SettlePolicy struct {
	MaxDeliver        int             // deliveries before dead-lettering, first included
	Backoff           []time.Duration // delay before redelivery n; the last repeats
	RedeliverStatuses []int           // statuses worth a redelivery
	MaxRetryAfter     time.Duration   // cap on an honoured Retry-After
}

// settlePolicy is the route's SettlePolicy.
func settlePolicy(rc *config.Route) SettlePolicy {
	backoff := make([]time.Duration, len(rc.Backoff))
	for i, d := range rc.Backoff {
		backoff[i] = d.D()
	}
	return SettlePolicy{
		MaxDeliver:        rc.MaxDeliver,
		Backoff:           backoff,
		RedeliverStatuses: rc.RedeliverStatuses,
		MaxRetryAfter:     rc.MaxRetryAfter.D(),
	}
}

// backoff is the delay before the redelivery that follows delivery number
// delivered (1-based).
func (p SettlePolicy) backoff(delivered uint64) time.Duration {
	return config.BackoffAt(p.Backoff, delivered)
}

// Decision is what Decide says to do with one message.
type Decision struct {
	Action Action
	Delay  time.Duration     // Redeliver and Hold
	Reason deadletter.Reason // DeadLetter only
}

// Decide maps the failure of an attempt (nil for a 2xx) and the JetStream
// delivery count to a decision. It is pure, and it is the whole settlement
// table of the README's Delivery section, unusual cases included: every
// settlement of a source message (settle.go) is one of its rows.
func Decide(err error, delivered uint64, p SettlePolicy) Decision {
	if err == nil {
		return Decision{Action: Ack} // before the targets below, which escape: no allocation for a 2xx
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
		return Decision{Action: Ack}
	case errors.As(err, &dle):
		// The dead letter was not stored: never terminate, try again later.
		return redeliverAfter(p.backoff(delivered))
	case errors.As(err, &eic):
		// Never acked as a duplicate: another event holds the id.
		return Decision{Action: DeadLetter, Reason: deadletter.ReasonEventIDConflict}
	case errors.Is(err, ErrInterrupted):
		// Shutdown cut the attempt (or a hold) short: hand it back promptly.
		return redeliverAfter(interruptedDelay)
	case errors.As(err, &ce):
		return Decision{Action: Hold, Delay: interruptedDelay}
	case errors.Is(err, ErrDeliveriesExhausted):
		return Decision{Action: DeadLetter, Reason: deadletter.ReasonMaxDeliveries}
	case errors.As(err, &ie):
		return Decision{Action: DeadLetter, Reason: deadletter.ReasonInvalidEvent}
	case errors.As(err, &de):
		if !slices.Contains(p.RedeliverStatuses, de.Status) {
			return Decision{Action: DeadLetter, Reason: deadletter.ReasonRejected}
		}
		return redeliver(delivered, p, min(de.RetryAfter, p.MaxRetryAfter))
	case errors.As(err, &te):
		return redeliver(delivered, p, 0)
	}
	// Anything else (ErrNoMetadata, an unexpected error) is not the
	// message's fault: try again after the backoff.
	return redeliverAfter(p.backoff(delivered))
}

func redeliver(delivered uint64, p SettlePolicy, retryAfter time.Duration) Decision {
	if delivered >= uint64(p.MaxDeliver) {
		return Decision{Action: DeadLetter, Reason: deadletter.ReasonMaxDeliveries}
	}
	return redeliverAfter(max(p.backoff(delivered), retryAfter))
}

func redeliverAfter(d time.Duration) Decision {
	return Decision{Action: Redeliver, Delay: max(d, minRedeliveryDelay)}
}

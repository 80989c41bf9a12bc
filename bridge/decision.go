package bridge

import (
	"errors"
	"slices"
	"time"
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
	// attempt again once the breaker lets a request through.
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

// Dead-letter reasons, as written in the Bridge-Reason header.
const (
	ReasonRejected      = "rejected"
	ReasonMaxDeliveries = "max-deliveries"
	ReasonInvalidEvent  = "invalid-event"
)

// interruptedDelay is the redelivery delay of an attempt cut off by
// shutdown: prompt, but never a bare nak.
const interruptedDelay = 100 * time.Millisecond

// SettlePolicy is the part of a route's configuration that decides a
// settlement.
type SettlePolicy struct {
	MaxDeliver        int             // deliveries before dead-lettering, first included
	Backoff           []time.Duration // delay before redelivery n; the last repeats
	RedeliverStatuses []int           // statuses worth a redelivery
	MaxRetryAfter     time.Duration   // cap on an honoured Retry-After
}

// backoff is the delay before the redelivery that follows delivery number
// delivered (1-based).
func (p SettlePolicy) backoff(delivered uint64) time.Duration {
	if len(p.Backoff) == 0 {
		return time.Second
	}
	i := int(min(max(delivered, 1)-1, uint64(len(p.Backoff)-1)))
	return p.Backoff[i]
}

// Settlement is the decision for one message.
type Settlement struct {
	Action Action
	Delay  time.Duration // Redeliver only
	Reason string        // DeadLetter only: one of the Reason* constants
}

// Decide maps the failure of an attempt (nil for a 2xx) and the JetStream
// delivery count to a settlement. It is pure: the table in the README and
// CONTRACT 4.2 is exactly this function.
func Decide(err error, delivered uint64, p SettlePolicy) Settlement {
	var (
		te  *TransportError
		de  *DownstreamError
		ce  *CircuitOpenError
		ie  *InvalidEventError
		dup *DuplicateEventError
	)
	switch {
	case err == nil, errors.As(err, &dup):
		return Settlement{Action: Ack}
	case errors.Is(err, ErrInterrupted):
		// Shutdown cut the attempt (or a hold) short: hand it back promptly.
		return Settlement{Action: Redeliver, Delay: interruptedDelay}
	case errors.As(err, &ce):
		return Settlement{Action: Hold}
	case errors.Is(err, ErrDeliveriesExhausted):
		return Settlement{Action: DeadLetter, Reason: ReasonMaxDeliveries}
	case errors.As(err, &ie):
		return Settlement{Action: DeadLetter, Reason: ReasonInvalidEvent}
	case errors.As(err, &de):
		if !slices.Contains(p.RedeliverStatuses, de.Status) {
			return Settlement{Action: DeadLetter, Reason: ReasonRejected}
		}
		return redeliver(delivered, p, min(de.RetryAfter, p.MaxRetryAfter))
	case errors.As(err, &te):
		return redeliver(delivered, p, 0)
	}
	// Anything else (a dead letter that could not be stored, an unexpected
	// error) is not the message's fault: try again after the backoff.
	return Settlement{Action: Redeliver, Delay: p.backoff(delivered)}
}

func redeliver(delivered uint64, p SettlePolicy, retryAfter time.Duration) Settlement {
	if delivered >= uint64(p.MaxDeliver) {
		return Settlement{Action: DeadLetter, Reason: ReasonMaxDeliveries}
	}
	return Settlement{Action: Redeliver, Delay: max(p.backoff(delivered), retryAfter)}
}

package bridge

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sotercare/jetbridge/deadletter"
)

// What differs in an event-id conflict (EventIDConflictError.Part).
const (
	ConflictSubject = "subject"
	ConflictPayload = "payload"
)

// Every error of the package starts with "bridge: " and matches one of the
// sentinels or types below with errors.Is or errors.As, whatever wraps it.
// None carries a URL, payload, header value or response body.

// Sentinels of a delivery's unusual cases; the settlement table
// (decision.go) maps each to its settlement.
var (
	// ErrInterrupted is returned for an attempt cut off by shutdown, or a
	// message handed back untouched as its route stopped. The message is
	// handed back to JetStream for a prompt redelivery.
	ErrInterrupted = errors.New("bridge: attempt interrupted by shutdown")
	// ErrNoMetadata is the failure of a message without JetStream metadata
	// (which a pull consumer never delivers): redelivered after the backoff.
	ErrNoMetadata = errors.New("bridge: message without JetStream metadata")
	// ErrDeliveriesExhausted is the failure of a message that arrives with
	// its delivery budget already spent: its previous delivery was the last
	// one allowed but was never settled (the bridge died, or ack_wait
	// expired).
	ErrDeliveriesExhausted = errors.New("bridge: delivery limit reached by an unsettled delivery")
	// ErrGivenUp is the failure recorded for a message JetStream stopped
	// redelivering (its MAX_DELIVERIES advisory).
	ErrGivenUp = errors.New("bridge: JetStream stopped redelivering: max deliveries reached without a settlement")
	// ErrDeadLetterRefused means the dead-letter stream (or the connection)
	// refused a dead letter for its size or format even in its smallest
	// form: no payload and no original headers beyond the four kept ones.
	// Retrying cannot help; the message stays in the source stream.
	ErrDeadLetterRefused = errors.New("bridge: dead letter refused even without its payload and original headers")
)

// Internal sentinels.
var (
	errShutdownTimeout = errors.New("bridge: shutdown timeout")
	// errReserved is what Reserve returns while another message holds a
	// fresh in-flight reservation for the same event id.
	errReserved        = errors.New("bridge: event id reserved by another delivery")
	errInvalidAdvisory = errors.New("bridge: unreadable MAX_DELIVERIES advisory")
	errForeignStream   = errors.New("bridge: MAX_DELIVERIES advisory names a stream that is not the bridge's")
)

// DeadLetterError is the failure of a message whose dead letter could not
// be stored: the message is redelivered after its backoff, never
// terminated. It wraps both the failure that called for the dead letter
// and the error of the store.
type DeadLetterError struct {
	Reason  deadletter.Reason // the dead letter's Bridge-Reason
	Failure error             // what made the message a dead letter
	Err     error             // why the dead letter was not stored
}

func (e *DeadLetterError) Error() string {
	return "bridge: dead letter (" + string(e.Reason) + ") not stored: " + e.Err.Error()
}

func (e *DeadLetterError) Unwrap() []error {
	if e.Failure == nil {
		return []error{e.Err}
	}
	return []error{e.Failure, e.Err}
}

// DeliveryError is the parent of every delivery failure: it names the route,
// destination and message, and wraps exactly one typed failure
// (*TransportError, *DownstreamError, *CircuitOpenError, *InvalidEventError,
// *DuplicateEventError or *EventIDConflictError), reachable with errors.As.
type DeliveryError struct {
	Route       string
	Destination string
	Stream      string
	Seq         uint64 // stream sequence
	Delivered   uint64 // JetStream delivery count, 1-based
	Tries       int    // HTTP tries made in this attempt
	Err         error
}

func (e *DeliveryError) Error() string {
	return fmt.Sprintf("bridge: route %s, destination %s, %s seq %d, delivery %d: %v",
		e.Route, e.Destination, e.Stream, e.Seq, e.Delivered, e.Err)
}

func (e *DeliveryError) Unwrap() error { return e.Err }

// TransportError means no HTTP response was obtained: the connection was
// refused, reset or closed, TLS failed, or the per-try timeout fired.
// Its text never includes the destination URL.
type TransportError struct {
	Destination string
	Kind        string // short class: "timeout", "connection refused", "connection reset", ...
	Err         error  // underlying cause, stripped of the URL
}

func (e *TransportError) Error() string {
	return "transport error to " + e.Destination + ": " + e.Kind
}

func (e *TransportError) Unwrap() error { return e.Err }

// DownstreamError is an HTTP response that is not 2xx.
type DownstreamError struct {
	Destination string
	Status      int
	RetryAfter  time.Duration // 0 when absent or unparsable
}

func (e *DownstreamError) Error() string {
	s := "destination " + e.Destination + " answered " + strconv.Itoa(e.Status)
	if e.RetryAfter > 0 {
		s += " (Retry-After " + e.RetryAfter.String() + ")"
	}
	return s
}

// CircuitOpenError means the destination's breaker refused the attempt or
// its half-open probe failed. It never counts toward max_deliver.
type CircuitOpenError struct {
	Destination string
	Remaining   time.Duration // until the breaker half-opens; 0 if unknown
	Err         error         // the probe's failure, if a probe was sent
}

func (e *CircuitOpenError) Error() string {
	if e.Err != nil {
		return "circuit open for " + e.Destination + ": half-open probe failed: " + e.Err.Error()
	}
	return "circuit open for " + e.Destination
}

func (e *CircuitOpenError) Unwrap() error { return e.Err }

// InvalidEventError means the message cannot be turned into a request:
// a payload that is not JSON for the envelope format, or a header that
// cannot be sent. Nothing is sent; the message is dead-lettered.
type InvalidEventError struct {
	Reason string // never includes payload bytes or header values
}

func (e *InvalidEventError) Error() string { return "invalid event: " + e.Reason }

// DuplicateEventError means the event id was already delivered on this
// route (routes with idempotency). The message is acked; nothing is sent.
type DuplicateEventError struct {
	EventID string
}

func (e *DuplicateEventError) Error() string { return "event already delivered" }

// EventIDConflictError means the event id was already reserved (in flight)
// or delivered (done) on this route for another message whose subject or
// payload differs (routes with idempotency): the same id names another
// event, and one producer could otherwise suppress another's event. Nothing
// is sent; the message is dead-lettered with reason event-id-conflict. It
// names the part that differs and where the record's message is in the
// source stream, never a payload, a subject, a header value or the id.
type EventIDConflictError struct {
	Part   string // ConflictSubject or ConflictPayload
	State  string // of the record: "done" or "inflight"
	Stream string // the record's message: stream
	Seq    uint64 // and stream sequence
}

func (e *EventIDConflictError) Error() string {
	what := "delivered"
	if e.State == stateInFlight {
		what = "reserved"
	}
	return "event id already " + what + " for another " + e.Part + " (" + e.Stream + " seq " + strconv.FormatUint(e.Seq, 10) + ")"
}

// IdempotencyStoreError means the idempotency bucket could not take or read
// a reservation (unreachable, full, or refusing writes). It is not the
// message's fault: the message is held, with progress acks and without
// spending a delivery, and the reservation tried again until the store
// answers or the bridge stops (then it is handed back promptly).
type IdempotencyStoreError struct {
	Bucket string
	Err    error // from nats.go; never carries a payload or an event id
}

func (e *IdempotencyStoreError) Error() string {
	return "idempotency bucket " + e.Bucket + ": " + e.Err.Error()
}

func (e *IdempotencyStoreError) Unwrap() error { return e.Err }

// FailureKind classifies err into one of the Failure* constants, or "" when
// err is nil or not a delivery failure.
func FailureKind(err error) deadletter.Failure {
	var (
		te *TransportError
		de *DownstreamError
		ce *CircuitOpenError
		ie *InvalidEventError
		se *IdempotencyStoreError
		ee *EventIDConflictError
	)
	switch {
	case err == nil:
		return ""
	case errors.As(err, &ee):
		return deadletter.FailureEventIDConflict
	case errors.As(err, &se):
		return deadletter.FailureIdempotencyStore
	case errors.As(err, &ce):
		return deadletter.FailureCircuitOpen
	case errors.As(err, &ie):
		return deadletter.FailureInvalid
	case errors.As(err, &de):
		return deadletter.FailureDownstream
	case errors.As(err, &te):
		return deadletter.FailureTransport
	}
	return ""
}

// statusOf is the HTTP status of a destination's refusal, 0 for any other
// failure.
func statusOf(err error) int {
	var de *DownstreamError
	if errors.As(err, &de) {
		return de.Status
	}
	return 0
}

// describe is the Bridge-Error text: the typed failure's own message, which
// never includes a URL, payload, header value or response body.
func describe(err error) string {
	var de *DeliveryError
	if errors.As(err, &de) {
		err = de.Err
	}
	if err == nil {
		return ""
	}
	return err.Error()
}

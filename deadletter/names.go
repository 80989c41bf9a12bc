package deadletter

// Headers of a dead letter (docs/operating.md#dead-letters).
const (
	HeaderReason           = "Bridge-Reason"
	HeaderFailure          = "Bridge-Failure"
	HeaderStatus           = "Bridge-Status"
	HeaderError            = "Bridge-Error"
	HeaderRoute            = "Bridge-Route"
	HeaderDestination      = "Bridge-Destination"
	HeaderDeliveries       = "Bridge-Deliveries"
	HeaderOriginalSubject  = "Bridge-Original-Subject"
	HeaderOriginalStream   = "Bridge-Original-Stream"
	HeaderOriginalSequence = "Bridge-Original-Sequence"
	HeaderFailedAt         = "Bridge-Failed-At"
	HeaderReplayedFrom     = "Bridge-Replayed-From"
	// HeaderPayloadOmitted marks a dead letter stored without its payload
	// because the payload and headers together would exceed the server's
	// max_payload; its value is the original payload size in bytes.
	HeaderPayloadOmitted = "Bridge-Payload-Omitted"
	// HeaderHeadersOmitted marks a dead letter that, even without its
	// payload, would not fit: the original headers were dropped too,
	// except Event-Id, Event-Type, Event-Severity and Content-Type. Its
	// value is the number of original header fields dropped.
	HeaderHeadersOmitted = "Bridge-Headers-Omitted"
)

// Reason is why a message was dead-lettered: the value of its
// Bridge-Reason header.
type Reason string

// Dead-letter reasons.
const (
	ReasonRejected      Reason = "rejected"
	ReasonMaxDeliveries Reason = "max-deliveries"
	ReasonInvalidEvent  Reason = "invalid-event"
	// ReasonEventIDConflict: the event id was already reserved or delivered
	// on the route for another subject or payload.
	ReasonEventIDConflict Reason = "event-id-conflict"
)

// Reasons lists every Reason, in a stable order.
var Reasons = []Reason{ReasonRejected, ReasonMaxDeliveries, ReasonInvalidEvent, ReasonEventIDConflict}

// Failure is the kind of the last failure of a dead-lettered (or
// redelivered) message: the value of its Bridge-Failure header and the
// failure label of logs.
type Failure string

// Failure kinds.
const (
	FailureTransport   Failure = "transport"
	FailureDownstream  Failure = "downstream-status"
	FailureCircuitOpen Failure = "circuit-open"
	FailureInvalid     Failure = "invalid-event"
	// FailureIdempotencyStore: the idempotency bucket could not be read or
	// written; the message is held (not spent) until it can.
	FailureIdempotencyStore Failure = "idempotency-store"
	// FailureEventIDConflict: the event id was already reserved or
	// delivered on the route for another subject or payload; nothing is
	// sent and the message is dead-lettered.
	FailureEventIDConflict Failure = "event-id-conflict"
)

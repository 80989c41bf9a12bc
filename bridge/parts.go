package bridge

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// parts are the decisions of the bridge that are worth testing on their
// own: each is a plain function, table-tested in isolation, and set once
// by defaultParts. Tests of the running bridge replace one of them with a
// deliberately broken variant (in test code) to show that the test goes
// red when the behaviour it names is broken. Nothing else in the package
// reads a test switch: a Bridge built by New always runs defaultParts.
type parts struct {
	// severity decides an event's severity from its Event-Severity header
	// and its subject (severityOf, event.go).
	severity severityRule
	// decide maps an attempt's failure to a settlement (Decide).
	decide func(err error, delivered uint64, p SettlePolicy) Decision
	// progress keeps a message from being redelivered while worker w works
	// on it (progress acks every third of ack_wait) until it is stopped.
	progress func(r *route, w int, m jetstream.Msg, held *atomic.Pointer[lease]) stopper
	// ack acknowledges a delivered (or duplicate) message.
	ack func(ctx context.Context, m jetstream.Msg, connected bool) error
	// reservations builds the idempotency store on the bucket.
	reservations func(kv jetstream.KeyValue) *reservations
	// overlap is how many free slots a route waits for before it makes a
	// pull while another is still open (pull.go).
	overlap func(maxInFlight int) int
	// pullHeartbeat is the idle heartbeat a pull asks for, given whether
	// the last pull that ended came back full; 0 for none (pull.go).
	pullHeartbeat func(lastFull bool) time.Duration
}

// defaultParts are the parts of every production bridge.
func defaultParts() parts {
	p := parts{
		severity:      severityOf,
		decide:        Decide,
		progress:      (*route).progress,
		ack:           ackMsg,
		reservations:  newReservations,
		overlap:       overlapSlots,
		pullHeartbeat: pullHeartbeat,
	}
	return p
}

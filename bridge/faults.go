package bridge

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// faults swaps one piece of the bridge for a deliberately broken one. Only
// tests set it, to show that a test goes red when the behaviour it names is
// broken (a test that cannot fail is not a test). The zero value is the
// real bridge.
type faults struct {
	// reserveCreate replaces the atomic create of a reservation (a racy
	// check-then-act store, for the contention tests).
	reserveCreate func(kv jetstream.KeyValue) func(ctx context.Context, key string, value []byte) (uint64, error)
	// beforeAck runs after the 2xx (and, with idempotency, after the event
	// was recorded as done) and before the ack: tests lose the ack there.
	beforeAck                func()
	keepReservationOnFailure bool // a failed delivery leaves its reservation behind
	noTakeover               bool // an in-flight reservation is never taken over
	ignoreAdvisories         bool // MAX_DELIVERIES advisories are not processed

	transportRetryStatuses  bool // the transport retry also retries 5xx responses
	transportRetryOnlyOn5xx bool // the transport retry handles statuses only, so transport errors pass unretried
	statusRetryAnyCode      bool // the status retry ignores its codes and retries any 5xx
	breakerIgnoresStatuses  bool // the breaker counts transport errors only
	keepGetBody             bool // net/http may re-send a POST by itself on a reused connection
	retryAfterIgnored       bool // Retry-After is not read
	noHold                  bool // an open breaker's refusal is redelivered, spending the budget
	termWithoutDeadLetter   bool // terminate even when the dead letter was not stored
	noProgress              bool // no InProgress while an attempt runs
	maxDeliverOffByOne      bool // one delivery more than max_deliver is allowed
}

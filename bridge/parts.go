package bridge

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// parts are the decisions of the bridge that are worth testing on their
// own: each is a plain function, table-tested in isolation, and set once
// by defaultParts. Tests of the running bridge replace one of them with a
// deliberately broken variant (in test code) to show that the test goes
// red when the behaviour it names is broken. Nothing else in the package
// reads a test switch: a Bridge built by New always runs defaultParts.
type parts struct {
	// transportRetryable is the condition of the transport retry: no HTTP
	// response was obtained (never a status, so an HTTP 500 is never
	// transport-retried).
	transportRetryable func(r *response, err error) bool
	// statusRetryable builds the condition of the status retry from the
	// destination's listed codes.
	statusRetryable func(codes []int) func(r *response, err error) bool
	// breakerFailure builds the breaker's failure predicate from the
	// destination's breaker statuses: every transport error, and the listed
	// statuses.
	breakerFailure func(statuses []int) func(r *response, err error) bool
	// retryAfter reads a response's Retry-After (seconds or HTTP-date,
	// against its Date header).
	retryAfter func(h http.Header, now time.Time) time.Duration
	// request builds one HTTP try of a payload.
	request func(ctx context.Context, d *destination, p *payload, now time.Time) (*http.Request, error)
	// pauseFor is how long a failure pauses the destination (back-pressure).
	pauseFor func(failure error, maxRetryAfter time.Duration) time.Duration
	// shrinkDeadLetter returns a reduced form of a dead letter that does
	// not fit (see deadletter_store.go).
	shrinkDeadLetter func(full *nats.Msg, to dlForm) *nats.Msg
	// deadLetterMismatch says what makes the message a duplicate PubAck
	// names on the dead-letter stream another than the dead letter sent,
	// "" when it is this one (see deadletter_store.go).
	deadLetterMismatch func(stored *jetstream.RawStreamMsg, sent *nats.Msg) string
	// classifyAdvisory decides whether a safety-net failure is permanent.
	classifyAdvisory advisoryClassifier
	// safetyNet processes the stored MAX_DELIVERIES advisories until ctx
	// ends (Bridge.advisories).
	safetyNet func(b *Bridge, ctx context.Context)
	// keepContext keeps a try's context, and so its response body, alive
	// after the try has returned, until the returned func is called
	// (destination.go).
	keepContext func(exec failsafe.Execution[*response]) context.CancelFunc
	// beforeRetry finishes a try's response (drains and closes its body)
	// when a retry policy schedules the next try: outside that try's
	// timeout (destination.go).
	beforeRetry func(r *response)
}

// defaultParts are the parts of every production bridge.
func defaultParts() parts {
	p := parts{
		transportRetryable: func(_ *response, err error) bool { return isTransport(err) },
		statusRetryable:    listedStatus,
		breakerFailure:     breakerFailure,
		retryAfter: func(h http.Header, now time.Time) time.Duration {
			return parseRetryAfter(h.Get("Retry-After"), h.Get("Date"), now)
		},
		request: func(ctx context.Context, d *destination, p *payload, now time.Time) (*http.Request, error) {
			return p.request(ctx, d, now)
		},
		pauseFor:         retryAfterPause,
		shrinkDeadLetter: shrinkDeadLetter,
		classifyAdvisory: classifyAdvisoryFailure,
		safetyNet:        (*Bridge).advisories,
		keepContext:      keepContext,
		beforeRetry:      (*response).finish,
	}
	p.deadLetterMismatch = deadLetterMismatch
	return p
}

// listedStatus is the status retry's condition: a response whose status is
// one of codes.
func listedStatus(codes []int) func(r *response, err error) bool {
	return func(r *response, err error) bool {
		return err == nil && r != nil && slices.Contains(codes, r.status)
	}
}

// breakerFailure is the breaker's failure predicate: any error but a
// cancellation (shutdown is nobody's failure), and the listed statuses.
func breakerFailure(statuses []int) func(r *response, err error) bool {
	return func(r *response, err error) bool {
		if err != nil {
			return !errors.Is(err, context.Canceled)
		}
		return r != nil && slices.Contains(statuses, r.status)
	}
}

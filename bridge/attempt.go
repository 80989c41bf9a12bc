package bridge

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"go.opentelemetry.io/otel/trace"

	"github.com/sotercare/jetbridge/subjects"
)

// This file is one attempt: one JetStream delivery's worth of HTTP tries,
// run by the destination's pipeline (pipeline.go), each try one HTTP
// request.

// admission is what a destination's flow control (its gate, the
// pipeline's first stage) needs to know of an attempt.
type admission struct {
	// hold ends a wait at the gate: a message waiting there is held like
	// one held by the open breaker, and handed back when hold ends
	// (shutdown), while admitted attempts run on the attempt's context.
	hold context.Context
	// severity orders the waiters at the gate.
	severity subjects.Severity
	// maxPause caps the pause a 429 or 503 with Retry-After puts on the
	// destination (the route's max_retry_after).
	maxPause time.Duration
}

// errHeldAtGate ends an attempt whose admission was still waiting at the
// gate when its hold ended.
var errHeldAtGate = errors.New("waiting for the destination's flow control")

// attempt makes one JetStream delivery's worth of HTTP tries: the first
// try plus the in-process retries, once the destination's flow control
// admits it. It returns the number of HTTP requests sent and nil for a
// 2xx, or the typed failure. ctx bounds the tries (shutdown_timeout), adm
// the wait for admission.
func (d *destination) attempt(ctx context.Context, p *payload, adm admission) (tries int, err error) {
	a := &attemptState{d: d, pipe: d.pipe.Load(), p: p, adm: adm}
	a.ctx = context.WithValue(ctx, attemptKey{}, a)
	a.open = a.buf[:0]
	res, err := a.pipe.exec.WithContext(a.ctx).GetWithExecution(a.try)
	a.finish()
	switch {
	case err == nil && res.ok():
		return a.tries, nil // a 2xx seen just as shutdown cut in still counts
	case errors.Is(err, errHeldAtGate):
		return 0, fmt.Errorf("%w: %w", ErrInterrupted, err)
	case ctx.Err() != nil:
		return a.tries, fmt.Errorf("%w: %w", ErrInterrupted, context.Cause(ctx))
	case errors.Is(err, circuitbreaker.ErrOpen):
		return a.tries, &CircuitOpenError{Destination: d.name, Remaining: a.pipe.breaker.RemainingDelay()}
	}
	failure := d.classify(res, err)
	if failure != nil && a.probeFailed {
		return a.tries, &CircuitOpenError{Destination: d.name, Err: failure}
	}
	return a.tries, failure
}

// attemptKey is the context key of the attemptState: the gate, the
// pipeline's outermost stage, reads the attempt's admission from its
// execution's context (as failsafe-go's own limiters read a priority).
type attemptKey struct{}

// attemptOf is the attempt an execution's context belongs to; nil for a
// context attempt did not make.
func attemptOf(ctx context.Context) *attemptState {
	a, _ := ctx.Value(attemptKey{}).(*attemptState)
	return a
}

// attemptState is one attempt's tries. The pipeline runs every try on the
// attempt's goroutine, so it needs no lock.
type attemptState struct {
	d           *destination
	pipe        *pipeline       // the pipeline the attempt started with
	ctx         context.Context // the attempt's: shutdown, not the per-try timeout
	p           *payload
	adm         admission
	tries       int
	probeFailed bool
	// The responses whose bodies may still be open: finished (drained or
	// closed) outside the per-try timeout, a retried one when its retry is
	// scheduled (finishRetried), the last one, and any other, after the
	// pipeline returns (finish is idempotent).
	open []*response
	buf  [2]*response
}

func (a *attemptState) finish() {
	for i, r := range a.open {
		r.finish()
		a.open[i] = nil
	}
	a.open = a.open[:0]
}

// finishRetried finishes the response of a try that a retry policy is
// about to retry, before the retry's delay: draining its body then never
// counts against the next try's timeout.
func finishRetried(e failsafe.ExecutionScheduledEvent[*response]) {
	e.LastResult().finish()
}

// try is one try, as the pipeline runs it.
func (a *attemptState) try(exec failsafe.Execution[*response]) (*response, error) {
	d := a.d
	probe := a.pipe.breaker != nil && a.pipe.breaker.IsHalfOpen()
	if a.ctx.Err() != nil {
		return nil, a.ctx.Err()
	}
	a.tries++
	r, err := d.send(a.ctx, a.pipe, a.p)
	if r != nil {
		a.open = append(a.open, r)
	}
	if err != nil && a.ctx.Err() != nil { // shutdown, not a failure of the destination
		return nil, a.ctx.Err()
	}
	a.probeFailed = probe && (err != nil || a.pipe.breakerCounts(r, err))
	return r, err
}

func (d *destination) classify(res *response, err error) error {
	switch {
	case err != nil:
		return err
	case res == nil:
		return &TransportError{Destination: d.name, Kind: kindClosed}
	case res.ok():
		return nil
	}
	return &DownstreamError{Destination: d.name, Status: res.status, RetryAfter: res.retryAfter}
}

// send sends one HTTP request through the pipeline's transport and
// returns once the response headers have arrived, leaving the body open
// (see response). The per-try timeout bounds the request only until then
// (tryContext): once the try has a status, neither the timeout nor a slow
// or large body can make the try a failure. The timeout firing as the
// headers come in still wins, as it would a moment earlier.
func (d *destination) send(ctx context.Context, pipe *pipeline, p *payload) (res *response, err error) {
	ctx, headersIn, release := tryContext(ctx, pipe.tryTimeout)
	if d.trace != nil {
		var span trace.Span
		if ctx, span = d.trace.startTry(ctx); span != nil {
			defer func() { d.trace.endTry(span, res, err) }()
		}
	}
	req, err := p.request(ctx, d, time.Now())
	if err != nil {
		release()
		return nil, &TransportError{Destination: d.name, Kind: kindRequestUnbuildable}
	}
	if d.trace != nil {
		req.Header = d.trace.inject(ctx, req.Header) // from the try span, never the message's header
	}
	start := time.Now()
	if d.budget != nil {
		d.budget.request(start)
	}
	resp, err := pipe.transport.RoundTrip(req)
	took := time.Since(start)
	inTime := headersIn()
	if !inTime {
		if err == nil {
			_ = resp.Body.Close()
		}
		err = errTryTimeout
	}
	if err != nil {
		release()
		d.m.observeTry(d.name, 0, took)
		return nil, transportError(d.name, err)
	}
	d.m.observeTry(d.name, resp.StatusCode, took)
	return newResponse(resp, release, time.Now()), nil
}

// errTryTimeout is the cause of a try the per-try timeout ended.
var errTryTimeout = errors.New("no response within the destination's timeout")

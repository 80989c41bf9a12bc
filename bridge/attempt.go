package bridge

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
	a := getAttempt(ctx, d, p, adm)
	defer a.release()
	res, err := a.exec.Get(a.tryFn)
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

// attempts keeps the attemptStates of finished attempts for the next ones,
// with the context and executor each last ran on: an attempt on the same
// context and pipeline (without tracing, every attempt of a route's
// workers runs on the same context) reuses them instead of making a
// context, an executor copy and a try closure per message.
//
// The lifetime is the attempt's: an attemptState is taken as the attempt
// starts and put back as it returns, after every response it made is
// finished (finish) and nothing it was given (payload, admission) is kept.
// What may outlive the attempt holds only its context, whose one value is
// the attemptState pointer itself, read by the gate (during an execution)
// and by attemptOf; the responses and the payload are never reachable from
// it once put back.
var attempts = sync.Pool{New: func() any {
	a := new(attemptState)
	a.tryFn = a.try
	return a
}}

// getAttempt is the attemptState of an attempt of d on ctx (see attempts).
func getAttempt(ctx context.Context, d *destination, p *payload, adm admission) *attemptState {
	a := attempts.Get().(*attemptState)
	pipe := d.pipe.Load()
	// Contexts are compared as the pointers they are (every context of the
	// bridge is made by package context or wraps one by pointer).
	if a.parent != ctx || a.pipe != pipe {
		a.parent, a.pipe = ctx, pipe
		a.ctx = context.WithValue(ctx, attemptKey{}, a)
		a.exec = pipe.exec.WithContext(a.ctx)
	}
	a.d, a.p, a.adm = d, p, adm
	a.tries, a.probeFailed, a.nresp = 0, false, 0
	a.open = a.buf[:0]
	return a
}

// release puts a back in attempts, forgetting what the attempt was given
// and the responses it made (finished already).
func (a *attemptState) release() {
	a.finish()
	a.d, a.p, a.adm = nil, nil, admission{}
	for i := range a.resp {
		a.resp[i] = response{}
	}
	attempts.Put(a)
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
	parent      context.Context // what ctx was made from
	exec        failsafe.Executor[*response]
	tryFn       func() (*response, error) // try, made once
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
	// The first tries' responses live here (newResponse makes the rest).
	resp  [2]response
	nresp int
	// headersIn is every try's per-try timeout, drain every response's
	// drain timeout (cancelTimer): two timers per attemptState, not one
	// per try and per response. Each is disarmed whenever no try or drain
	// of this attempt runs.
	headersIn, drain cancelTimer
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
func (a *attemptState) try() (*response, error) {
	d := a.d
	probe := a.pipe.breaker != nil && a.pipe.breaker.IsHalfOpen()
	if a.ctx.Err() != nil {
		return nil, a.ctx.Err()
	}
	a.tries++
	r, err := d.send(a.ctx, a.pipe, a.p, a.slot(), &a.headersIn, &a.drain)
	if r != nil {
		a.open = append(a.open, r)
	}
	if err != nil && a.ctx.Err() != nil { // shutdown, not a failure of the destination
		return nil, a.ctx.Err()
	}
	a.probeFailed = probe && (err != nil || a.pipe.breakerCounts(r, err))
	return r, err
}

// slot is where the next try's response is kept: one of a's own for the
// first tries, nil (a new one) after.
func (a *attemptState) slot() *response {
	if a.nresp == len(a.resp) {
		return nil
	}
	a.nresp++
	return &a.resp[a.nresp-1]
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
//
// headersIn is the per-try timeout's timer and drain the one the response
// will drain its body with (the attempt's own, see attemptState).
func (d *destination) send(ctx context.Context, pipe *pipeline, p *payload, into *response, headersIn, drain *cancelTimer) (res *response, err error) {
	ctx, release := tryContext(ctx, pipe.tryTimeout, headersIn)
	if d.trace != nil {
		var span trace.Span
		if ctx, span = d.trace.startTry(ctx); span != nil {
			defer func() { d.trace.endTry(span, res, err) }()
		}
	}
	req, err := p.request(ctx, d, pipe, time.Now())
	if err != nil {
		headersIn.stop()
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
	inTime := headersIn.stop()
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
	return newResponse(into, resp, release, drain, time.Now()), nil
}

// errTryTimeout is the cause of a try the per-try timeout ended.
var errTryTimeout = errors.New("no response within the destination's timeout")

package bridge

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/common"
	"github.com/failsafe-go/failsafe-go/retrypolicy"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/webhook"
)

// pipeline is a destination's failsafe-go executor and the named policies
// it is made of, built from the destination's configuration, outermost
// first:
//
//	gate(statusRetry(transportRetry(breaker(rate(one HTTP try)))))
//
// The gate (flow.go) admits the attempt: every try of it runs admitted.
// The two retry policies handle disjoint failures (no HTTP response; a
// listed status), so each keeps its own count across the attempt, and
// both abort at once when the breaker is open. Every try passes the
// breaker, so every try counts in it. The rate limit gives every try its
// permit before the try's timeout starts; the timeout (tryTimeout) bounds
// each try until its response headers arrive (tryContext, response.go). Every route
// delivering to the destination shares the pipeline, breaker included.
//
// A pipeline is immutable once built: a destination replaces it whole
// (destination.replace), and an attempt runs on the one it started with.
type pipeline struct {
	gate           *gate
	statusRetry    retrypolicy.RetryPolicy[*response]       // nil when off
	transportRetry retrypolicy.RetryPolicy[*response]       // nil when off
	breaker        circuitbreaker.CircuitBreaker[*response] // nil when disabled
	rate           *rateWait                                // nil without a rate limit
	tryTimeout     time.Duration                            // per try, until the response headers
	exec           failsafe.Executor[*response]
	// breakerStatuses are the statuses the breaker counts as failures (a
	// failed half-open probe).
	breakerStatuses []int
	// transport sends the tries: the destination's connection pool
	// (transport.go).
	transport http.RoundTripper
	// signers keeps the *signer values of a signed destination's tries
	// (request.go), each used by one try at a time, for one call; nil
	// when the destination does not sign.
	signers *sync.Pool
}

// newPipeline builds the pipeline of cfg for d, sending through
// transport.
func newPipeline(cfg *config.Destination, d *destination, transport http.RoundTripper) *pipeline {
	p := &pipeline{
		gate:       d.gate,
		tryTimeout: cfg.Timeout.D(),
		rate:       newRateWait(cfg.RateLimit, d),
		transport:  transport,
	}
	if keys := d.secrets; len(keys) > 0 {
		p.signers = &sync.Pool{New: func() any { return &signer{Signer: webhook.NewSigner(keys)} }}
	}
	if sr := cfg.StatusRetry; sr != nil && sr.Count > 0 {
		p.statusRetry = d.statusRetry(sr).HandleIf(listedStatus(sr.Codes)).Build()
	}
	if tr := cfg.TransportRetry; tr.Count > 0 {
		p.transportRetry = d.transportRetry(tr).HandleIf(noResponse).Build()
	}
	if cb := cfg.CircuitBreaker; cb.Enabled {
		p.breaker = d.circuitBreaker(cb).HandleIf(breakerFailure(cb.Statuses)).Build()
		p.breakerStatuses = cb.Statuses
	}
	return p.build()
}

// build makes the executor of p's policies and returns p.
func (p *pipeline) build() *pipeline {
	p.exec = failsafe.With(p.policies()...)
	return p
}

// policies are p's policies, outermost first.
func (p *pipeline) policies() []failsafe.Policy[*response] {
	out := make([]failsafe.Policy[*response], 0, 5)
	out = append(out, p.gate)
	if p.statusRetry != nil {
		out = append(out, p.statusRetry)
	}
	if p.transportRetry != nil {
		out = append(out, p.transportRetry)
	}
	if p.breaker != nil {
		out = append(out, p.breaker)
	}
	if p.rate != nil {
		out = append(out, p.rate)
	}
	return out
}

// close releases what p holds: its idle connections.
func (p *pipeline) close() {
	if c, ok := p.transport.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// breakerCounts reports whether the breaker counts a response as a
// failure (for telling a failed half-open probe).
func (p *pipeline) breakerCounts(r *response, err error) bool {
	return err == nil && r != nil && slices.Contains(p.breakerStatuses, r.status)
}

// statusRetry is the status retry of sr, all but its condition (which
// statuses it retries, listedStatus). A Retry-After longer than it would
// sleep is left to the broker (the settlement honours it with
// NakWithDelay).
func (d *destination) statusRetry(sr *config.StatusRetry) retrypolicy.Builder[*response] {
	maxWait := sr.MaxInterval.D()
	return d.budgeted(retrypolicy.NewBuilder[*response]().
		AbortIf(func(r *response, err error) bool {
			return err == nil && r != nil && r.retryAfter > maxWait
		}).
		AbortOnErrors(circuitbreaker.ErrOpen, context.Canceled).
		WithMaxRetries(sr.Count).
		WithMaxDuration(sr.MaxElapsed.D()).
		WithBackoffFactor(sr.Interval.D(), sr.MaxInterval.D(), sr.BackoffFactor).
		WithDelayFunc(retryAfterDelay).
		OnRetryScheduled(finishRetried).
		ReturnLastFailure())
}

// transportRetry is the transport retry of tr, all but its condition
// (which failures it retries, noResponse).
func (d *destination) transportRetry(tr config.Backoff) retrypolicy.Builder[*response] {
	return d.budgeted(retrypolicy.NewBuilder[*response]().
		AbortOnErrors(circuitbreaker.ErrOpen, context.Canceled).
		WithMaxRetries(tr.Count).
		WithBackoffFactor(tr.Interval.D(), tr.MaxInterval.D(), tr.BackoffFactor).
		OnRetryScheduled(finishRetried).
		ReturnLastFailure())
}

// budgeted adds the destination's retry budget to a retry policy: a retry
// the budget refuses aborts the policy, and the failure is then settled
// as it is (a redelivery with its backoff). The budget's condition comes
// last, so that it is asked (and counts a retry) only when no other
// condition ends the retries.
func (d *destination) budgeted(b retrypolicy.Builder[*response]) retrypolicy.Builder[*response] {
	if d.budget == nil {
		return b
	}
	return b.AbortIf(func(*response, error) bool {
		if d.budget.allowRetry(time.Now()) {
			return false
		}
		d.m.budgetRefused(d.name)
		return true
	})
}

// circuitBreaker is the breaker of cb, all but its condition (what counts
// as a failure, breakerFailure). Its transitions are reported in order
// (breaker.go), and its opening from closed starts the slow start.
func (d *destination) circuitBreaker(cb config.CircuitBreaker) circuitbreaker.Builder[*response] {
	return circuitbreaker.NewBuilder[*response]().
		WithFailureRateThreshold(cb.FailureRate, uint(cb.MinRequests), cb.Window.D()).
		WithDelay(cb.Delay.D()).
		WithSuccessThreshold(uint(cb.SuccessThreshold)).
		OnStateChanged(d.breakerChanged).
		OnOpen(d.slowStartAfterOutage)
}

// retryAfterDelay is the status retry's delay: the response's Retry-After
// when it has one, else the backoff.
func retryAfterDelay(exec failsafe.ExecutionAttempt[*response]) time.Duration {
	if r := exec.LastResult(); r != nil && r.retryAfter > 0 {
		return r.retryAfter
	}
	return -1 // the backoff
}

// noResponse is the transport retry's condition: no HTTP response was
// obtained (never a status, so an HTTP 500 is never transport-retried).
func noResponse(_ *response, err error) bool { return isTransport(err) }

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

// rateWait is the pipeline's rate-limit stage, a failsafe-go policy: it
// waits for a permit of the destination's rate limit before every try,
// retries included. Its source is the fleet-wide limit (fleet.go), which
// takes a permit of the per-process limit (failsafe-go's bursty rate
// limiter) first. That one is asked once per refill period and never
// reserves a permit ahead (the limiter's own blocking wait would): a
// reserved permit is used whenever its waiter wakes, so a stalled process
// would send several periods' permits at once; asked for at wake time,
// permits never come in bursts larger than the configured burst.
type rateWait struct {
	src rateSource
	d   *destination // for its metrics
}

// newRateWait builds the rate limit of rl: Burst permits every
// ratePeriod, so at most Requests per Per on average and never more than
// Burst at once, for all replicas together once the fleet's state is
// provisioned. nil when none.
func newRateWait(rl *config.RateLimit, d *destination) *rateWait {
	if rl == nil {
		return nil
	}
	return &rateWait{src: newFleetRate(rl, d.name, d.gate, d.m), d: d}
}

// ratePeriod is Per*Burst/Requests: the period in which a rate limit's
// Burst permits are refilled.
func ratePeriod(rl *config.RateLimit) time.Duration {
	return rl.Per.D() * time.Duration(rl.Burst) / time.Duration(rl.Requests)
}

// ToExecutor makes rateWait a failsafe-go policy.
func (w *rateWait) ToExecutor(*response) any { return w }

// Apply runs the try once it has its permit; the wait ends with the
// execution's context.
func (w *rateWait) Apply(inner func(failsafe.Execution[*response]) *common.PolicyResult[*response]) func(failsafe.Execution[*response]) *common.PolicyResult[*response] {
	return func(exec failsafe.Execution[*response]) *common.PolicyResult[*response] {
		start := time.Now()
		if err := w.src.wait(exec.Context()); err != nil {
			return &common.PolicyResult[*response]{Error: err, Done: true}
		}
		w.d.m.rateLimited(w.d.name, time.Since(start))
		return inner(exec)
	}
}

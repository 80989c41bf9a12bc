package bridge

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/common"
)

// This file breaks destinations for the negative controls, on a built
// bridge before it runs: never through a switch of production code, only
// by replacing what a built destination is made of anyway. A pipeline is
// copied, one of its policies rebuilt from the same builder with a broken
// condition or listener, and the copy replaces the destination's pipeline
// (destination.replace); or its transport or executor is wrapped.

// breakDestinations applies the destination faults f names to every
// destination of b.
func (f faults) breakDestinations(b *Bridge) {
	for _, d := range b.dests {
		cfg := b.cfg.Destinations[d.name]
		p := *d.pipe.Load()
		if tr := cfg.TransportRetry; tr.Count > 0 {
			switch {
			case f.transportRetryStatuses:
				p.transportRetry = d.transportRetry(tr).HandleIf(func(r *response, err error) bool { return noResponse(r, err) || is5xx(r, err) }).Build()
			case f.transportRetryOnlyOn5xx:
				p.transportRetry = d.transportRetry(tr).HandleIf(is5xx).Build()
			case f.drainInNextTry:
				p.transportRetry = d.transportRetry(tr).HandleIf(noResponse).OnRetryScheduled(func(failsafe.ExecutionScheduledEvent[*response]) {}).Build()
			}
		}
		if sr := cfg.StatusRetry; sr != nil && sr.Count > 0 {
			switch {
			case f.statusRetryAnyCode:
				p.statusRetry = d.statusRetry(sr).HandleIf(is5xx).Build()
			case f.drainInNextTry:
				p.statusRetry = d.statusRetry(sr).HandleIf(listedStatus(sr.Codes)).OnRetryScheduled(func(failsafe.ExecutionScheduledEvent[*response]) {}).Build()
			}
		}
		if cb := cfg.CircuitBreaker; cb.Enabled && f.breakerIgnoresStatuses {
			p.breaker = d.circuitBreaker(cb).HandleIf(func(_ *response, err error) bool {
				return err != nil && !errors.Is(err, context.Canceled)
			}).Build()
		}
		if f.keepGetBody { // net/http may then re-send the POST by itself on a reused connection
			p.transport = tripWrapper{next: p.transport, before: func(req *http.Request) {
				body, _ := io.ReadAll(req.Body)
				req.Body = io.NopCloser(bytes.NewReader(body))
				req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
			}}
		}
		if f.drainInNextTry { // the next try finishes the retried response, inside its timeout
			p.transport = tripWrapper{next: p.transport, before: func(req *http.Request) { attemptOf(req.Context()).finish() }}
		}
		if f.retryAfterIgnored {
			p.transport = tripWrapper{next: p.transport, after: func(resp *http.Response) { resp.Header.Del("Retry-After") }}
		}
		p.build()
		switch {
		case f.bodyEndsWithTry:
			// Nothing kept: the try's request context ends as the try
			// returns, before the body is drained.
			p.exec = failsafe.With(append(p.policies(), afterTry(func(r *response) { r.cancel() }))...)
		case f.keptForever:
			// The body is finished, its request context never released.
			p.exec = failsafe.With(append(p.policies(), afterTry(func(r *response) { r.cancel = func() {} }))...)
		}
		if f.noBackPressure {
			p.exec = admissionOverride{Executor: p.exec, set: func(a *admission) { a.maxPause = 0 }}
		}
		d.replace(&p)
	}
}

// is5xx is the broken retry conditions' test: any 5xx response.
func is5xx(r *response, err error) bool { return err == nil && r != nil && r.status >= 500 }

// oneQueue makes d's gate one FIFO queue: every attempt waits as INFO.
func oneQueue(d *destination) {
	p := *d.pipe.Load()
	p.exec = admissionOverride{Executor: p.exec, set: func(a *admission) { a.severity = "INFO" }}
	d.replace(&p)
}

// noSlowStart rebuilds d's breaker without the slow start on its opening.
func noSlowStart(b *Bridge, d *destination) {
	cb := b.cfg.Destinations[d.name].CircuitBreaker
	p := *d.pipe.Load()
	p.breaker = d.circuitBreaker(cb).HandleIf(breakerFailure(cb.Statuses)).OnOpen(func(circuitbreaker.StateChangedEvent) {}).Build()
	d.replace(p.build())
}

// unlimited gives d a gate without its concurrency limit.
func unlimited(d *destination) {
	d.gate = newGate(nil, d.name, d.m, d.log)
	p := *d.pipe.Load()
	p.gate = d.gate
	d.replace(p.build())
}

// onRequest calls seen with every request d sends.
func onRequest(d *destination, seen func(*http.Request)) {
	p := *d.pipe.Load()
	p.transport = tripWrapper{next: p.transport, before: seen}
	d.replace(&p) // the executor as it is: the transport is no policy
}

// tripWrapper is a destination's transport with something done to each
// request before it is sent, and to each response received.
type tripWrapper struct {
	next   http.RoundTripper
	before func(*http.Request)
	after  func(*http.Response)
}

func (w tripWrapper) RoundTrip(req *http.Request) (*http.Response, error) {
	if w.before != nil {
		w.before(req)
	}
	resp, err := w.next.RoundTrip(req)
	if err == nil && w.after != nil {
		w.after(resp)
	}
	return resp, err
}

func (w tripWrapper) CloseIdleConnections() {
	if c, ok := w.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// afterTry is a policy, innermost, that does something to each try's
// response as the try returns.
type afterTry func(*response)

func (f afterTry) ToExecutor(*response) any { return f }

func (f afterTry) Apply(inner func(failsafe.Execution[*response]) *common.PolicyResult[*response]) func(failsafe.Execution[*response]) *common.PolicyResult[*response] {
	return func(exec failsafe.Execution[*response]) *common.PolicyResult[*response] {
		r := inner(exec)
		if r.Result != nil {
			f(r.Result)
		}
		return r
	}
}

// admissionOverride is a destination's executor that changes every
// attempt's admission before it runs.
type admissionOverride struct {
	failsafe.Executor[*response]
	set func(*admission)
}

// WithContext keeps the override on the attempt's executor (an attempt
// may reuse it for later attempts on the same context, attempts).
func (o admissionOverride) WithContext(ctx context.Context) failsafe.Executor[*response] {
	return admissionOverride{Executor: o.Executor.WithContext(ctx), set: o.set}
}

// Get changes the admission of the attempt the executor runs.
func (o admissionOverride) Get(fn func() (*response, error)) (*response, error) {
	if a := attemptOf(o.Executor.Context()); a != nil {
		o.set(&a.adm)
	}
	return o.Executor.Get(fn)
}

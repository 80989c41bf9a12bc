package bridge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/policy"
	"github.com/failsafe-go/failsafe-go/ratelimiter"
	"github.com/failsafe-go/failsafe-go/retrypolicy"
	"github.com/failsafe-go/failsafe-go/timeout"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/sotercare/jetbridge/config"
)

// halfOpenPoll is how often a held message looks for a free half-open
// permit while probes are running.
const halfOpenPoll = 50 * time.Millisecond

// Outage reminders: while a destination's breaker stays open, a warning
// says how many messages are held and when the next probe is due, first
// after outageRemindFirst, then at doubling intervals up to
// outageRemindMax.
const (
	outageRemindFirst = 10 * time.Second
	outageRemindMax   = 10 * time.Minute
)

// response is what the pipeline keeps of an HTTP response. Its body is
// left open by the try and drained (bounded) or closed by the attempt,
// outside the per-try timeout, so that a slow body never turns a received
// status into a timeout.
type response struct {
	status     int
	retryAfter time.Duration
	body       io.ReadCloser
	length     int64 // Content-Length; -1 when unknown
	cancel     context.CancelFunc
}

// finish drains the body, when it is not known to be longer than
// maxResponseDrain, up to that size and within drainTimeout (so that the
// connection can be reused), and closes it. A nil response, or one
// already finished, has nothing to finish.
func (r *response) finish() {
	if r == nil || r.body == nil {
		return
	}
	if r.length != 0 && r.length <= maxResponseDrain {
		t := time.AfterFunc(drainTimeout, r.cancel)
		_, _ = io.Copy(io.Discard, io.LimitReader(r.body, maxResponseDrain))
		t.Stop()
	}
	_ = r.body.Close()
	r.cancel()
	r.body = nil
}

// destination is one HTTP endpoint with its long-lived failsafe-go pipeline:
//
//	statusRetry(transportRetry(breaker(timeout(one HTTP try))))
//
// The timeout applies to each try, until the response headers arrive.
// Every try passes the breaker, so every try counts in it. The two retry
// policies handle disjoint failures (no HTTP response; a listed status), so
// each keeps its own count across the attempt, and both abort at once when
// the breaker is open. Every route delivering to the destination shares
// it, breaker included.
type destination struct {
	name   string
	format string
	// baseHeader is the configured headers, canonical, without the
	// signature headers (only the bridge signs); nil when none.
	baseHeader http.Header
	secrets    [][]byte
	// reqTemplate is the POST every try copies (request.go), its URL
	// parsed once; transport sends it directly (net/http's Transport never
	// follows a redirect, and http.Client's bookkeeping would copy the
	// headers of every request).
	reqTemplate *http.Request
	transport   *http.Transport
	breaker     circuitbreaker.CircuitBreaker[*response] // nil when disabled
	exec        failsafe.Executor[*response]
	parts       *parts
	// Flow control (flow.go): the gate admits attempts; rate, when set,
	// gives every try its permit before tryExec's per-try timeout (the
	// pipeline then has no timeout of its own).
	gate     *gate
	rate     ratelimiter.RateLimiter[*response]
	ratePoll time.Duration // the rate limit's refill period
	tryExec  failsafe.Executor[*response]
	budget   *retryBudget // nil: in-process retries are not budgeted
	// poolSize is the sum of max_in_flight of the routes using this
	// destination: the most requests it can have in flight at once.
	poolSize int
	changed  atomic.Pointer[chan struct{}] // closed and replaced on every breaker transition
	// breakerCounts reports whether the breaker counts a response as a
	// failure (for telling a failed half-open probe).
	breakerCounts func(r *response, err error) bool
	held          atomic.Int64 // messages of every route held by the open breaker
	m             *metrics
	log           zerolog.Logger

	// Transitions are reported (logged, counted, passed on) in chain order:
	// failsafe-go calls its listener outside its lock, so two transitions
	// racing on two goroutines can arrive swapped.
	transMu  sync.Mutex
	reported BreakerState      // the state the last reported transition led to
	early    [][2]BreakerState // transitions that arrived before their predecessor
	outage   outage            // the current outage, while the breaker is not closed
	closed   bool              // close was called: no more reminders
	// remindFirst is the delay of the first outage reminder
	// (outageRemindFirst; tests shorten it).
	remindFirst time.Duration
	trace       *destTrace // try spans (trace.go); nil when tracing is off
}

// outage is what the breaker's logs say about an outage in progress.
type outage struct {
	since    time.Time // when the breaker opened; zero while closed
	probes   int       // half-open probes that failed
	every    time.Duration
	reminder *time.Timer // the next "still open" warning
}

// BreakerState is a destination's circuit state, as in the
// bridge_circuit_state metric: 0 closed, 1 half-open, 2 open.
type BreakerState int

// Breaker states.
const (
	BreakerClosed BreakerState = iota
	BreakerHalfOpen
	BreakerOpen
)

func (s BreakerState) String() string {
	switch s {
	case BreakerHalfOpen:
		return "half-open"
	case BreakerOpen:
		return "open"
	}
	return "closed"
}

func breakerState(s circuitbreaker.State) BreakerState {
	switch s {
	case circuitbreaker.OpenState:
		return BreakerOpen
	case circuitbreaker.HalfOpenState:
		return BreakerHalfOpen
	}
	return BreakerClosed
}

func newDestination(cfg *config.Destination, log zerolog.Logger, onState func(dest string, from, to BreakerState), m *metrics, p *parts) (*destination, error) {
	d := &destination{
		m:             m,
		parts:         p,
		name:          cfg.Name,
		format:        cfg.Format,
		log:           log.With().Str("destination", cfg.Name).Logger(),
		breakerCounts: func(*response, error) bool { return false },
		remindFirst:   outageRemindFirst,
		gate:          newGate(newLimiter(cfg.Concurrency), 0),
		rate:          newRateLimiter(cfg.RateLimit),
		ratePoll:      ratePeriod(cfg.RateLimit),
		budget:        newRetryBudget(cfg.RetryBudget),
	}
	d.gate.onChange = func() { m.observeGate(d.name, d.gate) }
	ch := make(chan struct{})
	d.changed.Store(&ch)
	for k, v := range cfg.Headers {
		if d.baseHeader == nil {
			d.baseHeader = make(http.Header, len(cfg.Headers))
		}
		d.baseHeader.Set(k, v.Value())
	}
	for _, k := range []string{"Webhook-Id", "Webhook-Timestamp", "Webhook-Signature"} {
		d.baseHeader.Del(k) // only the bridge signs
	}
	var err error
	if d.reqTemplate, d.baseHeader, err = requestTemplate(cfg.URL.Value(), d.baseHeader); err != nil {
		return nil, fmt.Errorf("bridge: destination %s: url does not parse", cfg.Name) // never quoted: it may carry credentials
	}
	if cfg.Signing != nil {
		keys, err := cfg.Signing.Keys()
		if err != nil {
			return nil, fmt.Errorf("bridge: destination %s: %w", cfg.Name, err)
		}
		d.secrets = keys
	}
	tlsConf, err := clientTLS(cfg.TLS)
	if err != nil {
		return nil, fmt.Errorf("bridge: destination %s: %w", cfg.Name, err)
	}
	d.transport = destinationTransport(tlsConf, maxResponseHeaderBytes)

	// A retry the budget refuses aborts the retry policy: the failure is
	// then settled as it is (a redelivery with its backoff). The budget's
	// condition comes last, so that it is asked (and counts a retry) only
	// when no other condition ends the retries.
	withBudget := func(b retrypolicy.Builder[*response]) retrypolicy.Builder[*response] {
		if d.budget == nil {
			return b
		}
		return b.AbortIf(func(*response, error) bool {
			if d.budget.allowRetry(time.Now()) {
				return false
			}
			m.budgetRefused(cfg.Name)
			return true
		})
	}
	// A retried try's response is finished before the retry's delay, so
	// that draining its body never counts against the next try's timeout.
	beforeRetry := func(e failsafe.ExecutionScheduledEvent[*response]) { p.beforeRetry(e.LastResult()) }
	var policies []failsafe.Policy[*response]
	if sr := cfg.StatusRetry; sr != nil && sr.Count > 0 {
		maxWait := sr.MaxInterval.D()
		policies = append(policies, withBudget(retrypolicy.NewBuilder[*response]().
			HandleIf(p.statusRetryable(sr.Codes)).
			// A Retry-After longer than we would sleep here is left to the
			// broker: the settlement honours it with NakWithDelay.
			AbortIf(func(r *response, err error) bool {
				return err == nil && r != nil && r.retryAfter > maxWait
			}).
			AbortOnErrors(circuitbreaker.ErrOpen, context.Canceled).
			WithMaxRetries(sr.Count).
			WithMaxDuration(sr.MaxElapsed.D()).
			WithBackoffFactor(sr.Interval.D(), sr.MaxInterval.D(), sr.BackoffFactor).
			WithDelayFunc(func(exec failsafe.ExecutionAttempt[*response]) time.Duration {
				if r := exec.LastResult(); r != nil && r.retryAfter > 0 {
					return r.retryAfter
				}
				return -1 // the backoff
			}).
			OnRetryScheduled(beforeRetry).
			ReturnLastFailure()).
			Build())
	}
	if tr := cfg.TransportRetry; tr.Count > 0 {
		policies = append(policies, withBudget(retrypolicy.NewBuilder[*response]().
			HandleIf(p.transportRetryable).
			AbortOnErrors(circuitbreaker.ErrOpen, context.Canceled).
			WithMaxRetries(tr.Count).
			WithBackoffFactor(tr.Interval.D(), tr.MaxInterval.D(), tr.BackoffFactor).
			OnRetryScheduled(beforeRetry).
			ReturnLastFailure()).
			Build())
	}
	if cb := cfg.CircuitBreaker; cb.Enabled {
		statuses := cb.Statuses
		d.breakerCounts = func(r *response, err error) bool {
			return err == nil && r != nil && slices.Contains(statuses, r.status)
		}
		d.breaker = circuitbreaker.NewBuilder[*response]().
			HandleIf(p.breakerFailure(cb.Statuses)).
			WithFailureRateThreshold(cb.FailureRate, uint(cb.MinRequests), cb.Window.D()).
			WithDelay(cb.Delay.D()).
			WithSuccessThreshold(uint(cb.SuccessThreshold)).
			OnStateChanged(func(e circuitbreaker.StateChangedEvent) {
				if e.OldState == circuitbreaker.ClosedState {
					// Slow start after the outage: the ramp begins now, at one
					// attempt at a time, so that held messages waking up while
					// the breaker half-opens and closes pass the gate one by
					// one; it grows once attempts succeed again.
					d.gate.startRamp()
				}
				d.transition(breakerState(e.OldState), breakerState(e.NewState), onState)
				next := make(chan struct{})
				close(*d.changed.Swap(&next))
			}).
			Build()
		policies = append(policies, d.breaker)
	}
	perTry := timeout.New[*response](cfg.Timeout.D())
	if d.rate != nil {
		d.tryExec = failsafe.With[*response](perTry)
	} else {
		policies = append(policies, perTry)
	}
	d.exec = failsafe.With(policies...)
	return d, nil
}

// transition reports from -> to once every transition before it has been
// reported, so that logs, the state gauge and OnBreaker always see a
// consistent chain closed -> open -> half-open -> ...
func (d *destination) transition(from, to BreakerState, onState func(dest string, from, to BreakerState)) {
	d.transMu.Lock()
	defer d.transMu.Unlock()
	d.early = append(d.early, [2]BreakerState{from, to})
	for {
		i := slices.IndexFunc(d.early, func(t [2]BreakerState) bool { return t[0] == d.reported })
		if i < 0 {
			if len(d.early) < 8 {
				return // wait for the missing predecessor
			}
			i = 0 // cannot happen; never let reports stall
		}
		t := d.early[i]
		d.early = slices.Delete(d.early, i, i+1)
		d.reported = t[1]
		d.logTransition(t[0], t[1])
		if onState != nil {
			onState(d.name, t[0], t[1])
		}
	}
}

// logTransition logs an outage, not every breaker transition: the opening
// (with the messages held and when the first probe is due) and the
// closing (with how long it lasted) at warning level, each failed probe at
// debug level, and in between a reminder at falling rate (see
// outageRemindFirst). Called with transMu held.
func (d *destination) logTransition(from, to BreakerState) {
	o := &d.outage
	switch {
	case to == BreakerOpen && o.since.IsZero():
		o.since, o.probes, o.every = time.Now(), 0, d.remindFirst
		d.log.Warn().Int64("held", d.held.Load()).Str("next_probe_in", d.nextProbe().String()).
			Msg("circuit breaker opened: no new requests to this destination until a probe succeeds; held messages keep their delivery count")
		d.scheduleReminder()
	case to == BreakerOpen:
		o.probes++
		d.log.Debug().Int("failed_probes", o.probes).Str("next_probe_in", d.nextProbe().String()).Msg("half-open probe failed; circuit breaker open again")
	case to == BreakerHalfOpen:
		d.log.Debug().Msg("circuit breaker half-open: probing")
	case to == BreakerClosed:
		if o.reminder != nil {
			o.reminder.Stop()
		}
		if !o.since.IsZero() {
			d.log.Warn().Str("outage", time.Since(o.since).Round(time.Millisecond).String()).Int("failed_probes", o.probes).
				Msg("circuit breaker closed: the destination answers again")
		}
		*o = outage{}
	}
}

// scheduleReminder arms the next "still open" warning. Called with transMu
// held.
func (d *destination) scheduleReminder() {
	o := &d.outage
	if d.closed {
		return
	}
	since := o.since
	o.reminder = time.AfterFunc(o.every, func() {
		d.transMu.Lock()
		defer d.transMu.Unlock()
		if d.closed || d.outage.since != since {
			return // the outage ended (or another began) meanwhile
		}
		d.log.Warn().Str("open_for", time.Since(since).Round(time.Second).String()).Int64("held", d.held.Load()).
			Int("failed_probes", d.outage.probes).Str("next_probe_in", d.nextProbe().String()).
			Msg("circuit breaker still open: the destination does not answer")
		d.outage.every = min(2*d.outage.every, outageRemindMax)
		d.scheduleReminder()
	})
}

// nextProbe is the time until the breaker lets a probe through.
func (d *destination) nextProbe() time.Duration {
	if d.breaker == nil {
		return 0
	}
	return max(d.breaker.RemainingDelay(), 0).Round(time.Millisecond)
}

// close stops the outage reminders and closes idle connections; Run calls
// it once every attempt has ended.
func (d *destination) close() {
	d.transMu.Lock()
	d.closed = true
	if d.outage.reminder != nil {
		d.outage.reminder.Stop()
	}
	d.transMu.Unlock()
	d.gate.close()
	d.transport.CloseIdleConnections()
}

// state is the breaker's current state (closed when disabled).
func (d *destination) state() BreakerState {
	if d.breaker == nil {
		return BreakerClosed
	}
	return breakerState(d.breaker.State())
}

// attempt makes one JetStream delivery's worth of HTTP tries: the first try
// plus the in-process retries. It returns the number of HTTP requests sent
// and nil for a 2xx, or the typed failure.
func (d *destination) attempt(ctx context.Context, p *payload) (tries int, err error) {
	a := attemptState{d: d, ctx: ctx, p: p}
	a.open = a.buf[:0]
	res, err := d.exec.WithContext(ctx).GetWithExecution(a.try)
	a.finish()
	switch {
	case err == nil && res != nil && res.status >= 200 && res.status < 300:
		return a.tries, nil // a 2xx seen just as shutdown cut in still counts
	case ctx.Err() != nil:
		return a.tries, fmt.Errorf("%w: %w", ErrInterrupted, context.Cause(ctx))
	case errors.Is(err, circuitbreaker.ErrOpen):
		return a.tries, &CircuitOpenError{Destination: d.name, Remaining: d.breaker.RemainingDelay()}
	}
	failure := d.classify(res, err)
	if failure != nil && a.probeFailed {
		return a.tries, &CircuitOpenError{Destination: d.name, Err: failure}
	}
	return a.tries, failure
}

// attemptState is one attempt's tries. The pipeline runs every try on the
// attempt's goroutine, so it needs no lock.
type attemptState struct {
	d           *destination
	ctx         context.Context // the attempt's: shutdown, not the per-try timeout
	p           *payload
	tries       int
	probeFailed bool
	// The responses whose bodies may still be open: finished (drained or
	// closed) outside the per-try timeout, a retried one when its retry is
	// scheduled (beforeRetry), the last one after the pipeline returns.
	// The next try finishes any left as it starts (finish is idempotent).
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

// try is one try, as the pipeline runs it.
func (a *attemptState) try(exec failsafe.Execution[*response]) (*response, error) {
	a.finish()
	d := a.d
	probe := d.breaker != nil && d.breaker.IsHalfOpen()
	if a.ctx.Err() != nil {
		return nil, a.ctx.Err()
	}
	a.tries++
	r, err := d.send(exec, a.p)
	if r != nil {
		a.open = append(a.open, r)
	}
	if err != nil && a.ctx.Err() != nil { // shutdown, not a failure of the destination
		return nil, a.ctx.Err()
	}
	a.probeFailed = probe && (err != nil || exec.Context().Err() != nil || d.breakerCounts(r, err))
	return r, err
}

func (d *destination) classify(res *response, err error) error {
	switch {
	case errors.Is(err, timeout.ErrExceeded):
		return &TransportError{Destination: d.name, Kind: kindTimeout, Err: err}
	case err != nil:
		return err
	case res == nil:
		return &TransportError{Destination: d.name, Kind: kindClosed}
	case res.status >= 200 && res.status < 300:
		return nil
	}
	return &DownstreamError{Destination: d.name, Status: res.status, RetryAfter: res.retryAfter}
}

// send makes one try: with a rate limit, once the try has its permit and
// within tryExec's per-try timeout (the wait is not part of the try);
// without one, within the pipeline's own timeout.
func (d *destination) send(exec failsafe.Execution[*response], p *payload) (*response, error) {
	if d.rate == nil {
		return d.try(exec, p)
	}
	ctx := exec.Context()
	start := time.Now()
	if err := d.waitRate(ctx); err != nil {
		return nil, err
	}
	d.m.rateLimited(d.name, time.Since(start))
	return d.tryExec.WithContext(ctx).GetWithExecution(func(exec failsafe.Execution[*response]) (*response, error) {
		return d.try(exec, p)
	})
}

// waitRate waits for a permit of the rate limit, asking once per refill
// period. It never reserves one ahead (the limiter's blocking wait would):
// a reserved permit is used whenever its waiter wakes, so a stalled
// process would send several periods' permits at once; asked for at wake
// time, permits never come in bursts larger than the configured burst.
func (d *destination) waitRate(ctx context.Context) error {
	for !d.rate.TryAcquirePermit() {
		t := time.NewTimer(d.ratePoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// backPressure pauses new requests to the destination, from every route,
// for as long as pauseFor says (a 429 or 503 with Retry-After).
func (d *destination) backPressure(failure error, maxRetryAfter time.Duration) {
	if pause := d.parts.pauseFor(failure, maxRetryAfter); pause > 0 {
		d.m.paused(d.name, d.gate.pause(pause))
		d.log.Info().Int("status", statusOf(failure)).Str("pause", pause.String()).
			Msg("destination asked to wait (Retry-After): no new requests to it from any route until then")
	}
}

// try sends one HTTP request and returns once the response headers have
// arrived, leaving the body open (see response). The execution's context,
// that of the per-try timeout, bounds the request only until then: once
// the try has returned a status, neither the timeout nor a slow or large
// body can make the try a failure (the timeout firing between the
// headers and the return still wins, as it would a moment earlier).
func (d *destination) try(exec failsafe.Execution[*response], p *payload) (res *response, err error) {
	ctx := exec.Context()
	if d.trace != nil {
		var span trace.Span
		if ctx, span = d.trace.startTry(ctx); span != nil {
			defer func() { d.trace.endTry(span, res, err) }()
		}
	}
	req, err := d.parts.request(ctx, d, p, time.Now())
	if err != nil {
		return nil, &TransportError{Destination: d.name, Kind: kindRequestUnbuildable}
	}
	if d.trace != nil {
		req.Header = d.trace.inject(ctx, req.Header) // from the try span, never the message's header
	}
	start := time.Now()
	if d.budget != nil {
		d.budget.request(start)
	}
	resp, err := d.transport.RoundTrip(req)
	took := time.Since(start)
	if err != nil {
		d.m.observeTry(d.name, 0, took)
		return nil, transportError(d.name, err)
	}
	d.m.observeTry(d.name, resp.StatusCode, took)
	return &response{
		status:     resp.StatusCode,
		retryAfter: d.parts.retryAfter(resp.Header, time.Now()),
		body:       resp.Body,
		length:     resp.ContentLength,
		cancel:     d.parts.keepContext(exec),
	}, nil
}

// keepContext keeps the try's context alive once the try has returned,
// until the returned func is called: the timeout policy would otherwise
// cancel it at once, and with it the response body still to be drained
// (response.finish). The timeout firing before the try returns still
// cancels it. failsafe-go's own HTTP client keeps its response bodies
// readable the same way.
//
// The returned func may be called more than once and from two goroutines
// (finish's drain timer and finish itself); only the first call releases,
// and a concurrent one waits for it. This matters: failsafe-go's
// deferral is one flag shared by every try of an attempt, so a second
// call made after the next try has deferred its own cancellation (a late
// drain timer) would clear that try's deferral instead, and its context
// would stay registered in the bridge's work context for good.
func keepContext(exec failsafe.Execution[*response]) context.CancelFunc {
	return sync.OnceFunc(exec.(policy.ExecutionInternal[*response]).DeferCancel())
}

// waitUsable blocks while the breaker refuses every request: until its
// open delay has run out (the next request becomes a half-open probe), a
// transition, a half-open poll tick, or the end of ctx.
func (d *destination) waitUsable(ctx context.Context) error {
	for d.breaker != nil {
		changed := *d.changed.Load()
		var wait time.Duration
		switch d.state() {
		case BreakerClosed:
			return nil
		case BreakerOpen:
			if wait = d.breaker.RemainingDelay(); wait <= 0 {
				return nil
			}
		case BreakerHalfOpen:
			wait = halfOpenPoll
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-changed:
			t.Stop()
		case <-t.C:
			if d.state() == BreakerHalfOpen {
				return nil // a permit may be free
			}
		}
	}
	return nil
}

package bridge

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/adaptivelimiter"
	"github.com/failsafe-go/failsafe-go/bulkhead"
	"github.com/failsafe-go/failsafe-go/common"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/subjects"
)

// Flow control of one destination (docs/delivery.md#flow-control), shared by every
// route delivering to it: two stages of its failsafe-go pipeline
// (pipeline.go).
//
//   - the gate admits attempts (one message's tries): none while the
//     destination is paused by a Retry-After (back-pressure), at most the
//     concurrency limit at once (failsafe-go's bulkhead, or its adaptive
//     limiter, asked without waiting), at most the slow-start ramp after
//     an outage (from the breaker's opening) or a pause, and the waiters highest severity
//     first, in arrival order within a severity (no failsafe-go policy
//     orders waiters, so this ordering is the gate's own);
//   - the rate limit (rateWait, on failsafe-go's bursty rate limiter) gives
//     every HTTP try its permit, retries included, before the per-try
//     timeout starts.
//
// A message waiting at either is held like one held by the open breaker:
// progress acks run, no delivery is spent, shutdown hands it back. With
// nothing configured and no ramp or pause in progress the gate costs one
// atomic load.

// The adaptive limit is recomputed every adaptiveWindowMin (at most
// adaptiveWindowMax) once adaptiveWindowSamples attempts completed:
// failsafe-go's default of a second makes it climb from min by one a
// second.
const (
	adaptiveWindowMin     = 250 * time.Millisecond
	adaptiveWindowMax     = 2 * time.Second
	adaptiveWindowSamples = 50
	// adaptiveBaselineAge is how many recent windows the baseline latency
	// averages: long, so that it stays near the unloaded latency instead of
	// drifting up with the queueing the limit is meant to avoid.
	adaptiveBaselineAge = 100
)

// slowStartRound is the shortest step of the slow-start ramp: the cap
// doubles once as many attempts as it allows succeeded, and no sooner than
// this after the previous step.
const slowStartRound = 100 * time.Millisecond

// severities in admission order.
var severities = [...]subjects.Severity{subjects.Critical, subjects.Warning, subjects.Info}

func severityRank(s subjects.Severity) int {
	switch s {
	case subjects.Critical:
		return 0
	case subjects.Warning:
		return 1
	}
	return 2
}

// limiter is a concurrency limit the gate asks without waiting.
type limiter interface {
	tryAcquire() (permit, bool)
	limit() int
}

// permit is one admission's hold on the gate's limit, given back once by
// release (measured: the attempt got a response, whose latency counts).
type permit interface{ release(measured bool) }

// noPermit is the admission of a gate without a limit: nothing to give back.
type noPermit struct{}

func (noPermit) release(bool) {}

// fixedLimit is concurrency.max, a failsafe-go bulkhead.
// It is its own permit: every admission gives back one bulkhead permit.
type fixedLimit struct {
	b   bulkhead.Bulkhead[any]
	max int
}

func newFixedLimit(max int) *fixedLimit {
	return &fixedLimit{b: bulkhead.New[any](uint(max)), max: max}
}

func (l *fixedLimit) tryAcquire() (permit, bool) {
	if !l.b.TryAcquirePermit() {
		return nil, false
	}
	return l, true
}

func (l *fixedLimit) release(bool) { l.b.ReleasePermit() }

func (l *fixedLimit) limit() int { return l.max }

// adaptiveLimit is concurrency.adaptive, failsafe-go's adaptive limiter: it
// measures each attempt that got a response and moves the limit with the
// destination's latency trend.
type adaptiveLimit struct {
	l adaptivelimiter.AdaptiveLimiter[any]
}

func (l adaptiveLimit) tryAcquire() (permit, bool) {
	p, ok := l.l.TryAcquirePermit()
	if !ok {
		return nil, false
	}
	return adaptivePermit{p}, true
}

// adaptivePermit records a measured attempt's latency, and drops the others.
type adaptivePermit struct{ p adaptivelimiter.Permit }

func (a adaptivePermit) release(measured bool) {
	if measured {
		a.p.Record()
	} else {
		a.p.Drop()
	}
}

func (l adaptiveLimit) limit() int { return l.l.Limit() }

// newLimiter builds the concurrency limit of a destination; nil when none.
func newLimiter(c *config.Concurrency) limiter {
	switch {
	case c == nil:
		return nil
	case c.Adaptive:
		initial := c.Min // from the bottom: the baseline latency is then the unloaded one
		return adaptiveLimit{l: adaptivelimiter.NewBuilder[any]().
			WithLimits(uint(c.Min), uint(c.Max), uint(initial)).
			WithRecentWindow(adaptiveWindowMin, adaptiveWindowMax, adaptiveWindowSamples).
			WithBaselineWindow(adaptiveBaselineAge).
			Build()}
	}
	return newFixedLimit(c.Max)
}

// waiter is one attempt waiting at the gate.
type waiter struct {
	grant chan permit // receives its admission
}

// slowStartFrom is the first cap of a slow start: one attempt at a time.
const slowStartFrom = 1

// gate admits a destination's attempts (see the file comment); it is the
// outermost stage of the destination's pipeline (pipeline.go).
type gate struct {
	active atomic.Bool // anything to enforce: a limit, a ramp or a pause
	// full is the concurrency of the destination without a limit: the sum
	// of its routes' max_in_flight, the ramp's target then.
	full int
	lim  limiter // nil without a concurrency limit

	dest string
	m    *metrics // nil: no metrics
	log  zerolog.Logger
	// fleet is the bridge's shared state (fleet.go): a pause is shared
	// through it; nil, or holding nil, when there is none.
	fleet *fleetHolder
	// slots is the fleet-wide share of a fixed concurrency limit
	// (fleet_slots.go); nil: per process.
	slots *fleetSlots

	mu       sync.Mutex
	waiting  [len(severities)][]*waiter
	inflight int       // admitted attempts (while active)
	ramp     int       // slow-start cap; 0 when not ramping
	rampOK   int       // successes since the last step
	rampAt   time.Time // the last step
	paused   time.Time // no admission before then
	pauseT   *time.Timer
	closed   bool
}

// newGate builds the gate of a destination (dest, with its metrics m and
// logger) with the concurrency limit lim (nil: none).
func newGate(lim limiter, dest string, m *metrics, log zerolog.Logger) *gate {
	g := &gate{lim: lim, dest: dest, m: m, log: log}
	g.active.Store(lim != nil)
	return g
}

// ToExecutor makes the gate a failsafe-go policy: the pipeline's first.
func (g *gate) ToExecutor(*response) any { return g }

// Apply runs an attempt once the gate admits it (the attempt's admission,
// attemptOf, says how long to wait and in which order), releases its
// admission when its tries are over, and pauses the destination when the
// last try's response asks to wait (back-pressure).
func (g *gate) Apply(inner func(failsafe.Execution[*response]) *common.PolicyResult[*response]) func(failsafe.Execution[*response]) *common.PolicyResult[*response] {
	return func(exec failsafe.Execution[*response]) *common.PolicyResult[*response] {
		adm := admission{hold: exec.Context(), severity: subjects.Info}
		if a := attemptOf(exec.Context()); a != nil {
			adm = a.adm
		}
		adm0, err := g.acquire(adm.hold, adm.severity)
		if err != nil {
			return &common.PolicyResult[*response]{Error: errHeldAtGate, Done: true}
		}
		// Then a slot of the fleet-wide limit (fleet_slots.go), held like
		// the local admission.
		var lease *slotLease
		f := g.fleet.load()
		if g.slots != nil && f != nil {
			if lease, err = g.slots.acquire(adm.hold, f, g.m); err != nil {
				g.release(adm0, false, false)
				return &common.PolicyResult[*response]{Error: errHeldAtGate, Done: true}
			}
		}
		r := inner(exec)
		if lease != nil {
			g.slots.release(f, lease, g.m)
		}
		res := r.Result
		if r.Error != nil {
			res = nil
		}
		// A response (any status) measures the destination: its duration
		// teaches the adaptive limit; a 2xx is a slow-start step.
		g.release(adm0, res != nil, res.ok())
		g.backPressure(res, adm.maxPause)
		return r
	}
}

// backPressure pauses new attempts to the destination, from every route,
// for as long as res asks (a 429 or 503 with Retry-After, capped by
// maxPause).
func (g *gate) backPressure(res *response, maxPause time.Duration) {
	pause := res.pause(maxPause)
	if pause <= 0 {
		return
	}
	until := time.Now().Add(pause)
	grew := g.pauseUntil(until, true)
	if f := g.fleet.load(); f != nil && grew > 0 {
		// The other replicas pause too (their watch of the fleet's
		// bucket, fleet.go): docs/delivery.md#flow-control.
		if err := f.sharePause(context.Background(), g.dest, until); err != nil {
			g.m.fleetError(g.dest, "pause")
			g.log.Warn().Str("error", err.Error()).Msg("the pause could not be shared with the other replicas")
		}
	}
	g.log.Info().Int("status", res.status).Str("pause", pause.String()).
		Msg("destination asked to wait (Retry-After): no new requests to it from any route until then")
}

// admitted is an admission by the gate: the release of its limit's
// permit, nil when the gate was inactive (nothing to release).
type admitted struct {
	rel permit
}

// acquire waits for the attempt's admission (see gate), to be given back
// with release. It returns ctx's error when ctx ends first.
func (g *gate) acquire(ctx context.Context, sev subjects.Severity) (admitted, error) {
	if !g.active.Load() {
		return admitted{}, nil
	}
	g.mu.Lock()
	if g.queued() == 0 {
		if rel, ok := g.admit(); ok {
			g.mu.Unlock()
			return admitted{rel: rel}, nil
		}
	}
	w := &waiter{grant: make(chan permit, 1)}
	rank := severityRank(sev)
	g.waiting[rank] = append(g.waiting[rank], w)
	g.changed()
	g.mu.Unlock()
	select {
	case rel := <-w.grant:
		return admitted{rel: rel}, nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if i := slices.Index(g.waiting[rank], w); i >= 0 {
		g.waiting[rank] = slices.Delete(g.waiting[rank], i, i+1)
		g.changed()
		return admitted{}, ctx.Err()
	}
	// Admitted just as ctx ended: give the admission back.
	rel := <-w.grant
	g.releaseLocked(rel, false, false)
	return admitted{}, ctx.Err()
}

// release gives an admission back: measured says the attempt got a
// response (its duration then teaches the adaptive limit) and success that
// it was a 2xx (a slow-start step).
func (g *gate) release(a admitted, measured, success bool) {
	if a.rel == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.releaseLocked(a.rel, measured, success)
}

func (g *gate) queued() int {
	n := 0
	for _, q := range g.waiting {
		n += len(q)
	}
	return n
}

// admit takes an admission if one is free now. Called with mu held.
func (g *gate) admit() (permit, bool) {
	if !g.paused.IsZero() {
		return nil, false
	}
	if g.ramp > 0 && g.inflight >= g.ramp {
		return nil, false
	}
	var rel permit = noPermit{}
	if g.lim != nil {
		var ok bool
		if rel, ok = g.lim.tryAcquire(); !ok {
			return nil, false
		}
	}
	g.inflight++
	g.changed()
	return rel, true
}

func (g *gate) releaseLocked(rel permit, measured, success bool) {
	rel.release(measured)
	g.inflight--
	if g.ramp > 0 && success {
		g.rampOK++
		if g.rampOK >= g.ramp && time.Since(g.rampAt) >= slowStartRound {
			g.ramp *= 2
			g.rampOK, g.rampAt = 0, time.Now()
			if g.ramp >= g.target() {
				g.ramp = 0 // full concurrency again
			}
		}
	}
	g.dispatch()
	g.changed()
	g.settle()
}

// dispatch admits waiters, highest severity first, while admissions are
// free. Called with mu held.
func (g *gate) dispatch() {
	for r := range g.waiting {
		for len(g.waiting[r]) > 0 {
			rel, ok := g.admit()
			if !ok {
				return
			}
			w := g.waiting[r][0]
			g.waiting[r] = g.waiting[r][1:]
			w.grant <- rel
		}
	}
}

// target is the concurrency the ramp grows to.
func (g *gate) target() int {
	if g.lim != nil {
		return max(g.lim.limit(), 1)
	}
	return max(g.full, 1)
}

// settle turns the gate's fast path back on when nothing is left to
// enforce. Called with mu held.
func (g *gate) settle() {
	if g.lim == nil && g.ramp == 0 && g.paused.IsZero() && g.inflight <= 0 && g.queued() == 0 {
		g.inflight = 0
		g.active.Store(false)
	}
}

// startRamp begins a slow start from one attempt at a time: the breaker
// opened (the ramp then grows only once attempts succeed, after it
// closed), or a pause ended.
func (g *gate) startRamp() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.startRampLocked()
}

func (g *gate) startRampLocked() {
	if g.closed || slowStartFrom >= g.target() {
		return
	}
	g.ramp, g.rampOK, g.rampAt = slowStartFrom, 0, time.Now()
	g.active.Store(true)
	g.changed()
}

// pause admits nothing until d has passed (a longer pause in progress is
// kept), then starts a slow start. It returns by how much the pause grew.
func (g *gate) pause(d time.Duration) time.Duration {
	return g.pauseUntil(time.Now().Add(d), true)
}

// pauseUntil admits nothing until until (a longer pause in progress is
// kept; a time already past does nothing), then starts a slow start. It
// returns by how much the pause grew, counted in the paused metric when
// count is set (a pause another replica shared is counted by it).
func (g *gate) pauseUntil(until time.Time, count bool) time.Duration {
	now := time.Now()
	d := until.Sub(now)
	if d <= 0 {
		return 0
	}
	grew := g.setPause(now, until, d)
	if count && g.m != nil {
		g.m.paused(g.dest, grew)
	}
	return grew
}

func (g *gate) setPause(now, until time.Time, d time.Duration) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || !g.paused.IsZero() && !until.After(g.paused) {
		return 0
	}
	grew := until.Sub(now)
	if !g.paused.IsZero() {
		grew = until.Sub(g.paused)
	}
	g.paused = until
	g.active.Store(true)
	if g.pauseT != nil {
		g.pauseT.Stop()
	}
	g.pauseT = time.AfterFunc(d, func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.closed || time.Now().Before(g.paused) {
			return // extended meanwhile: a later timer ends it
		}
		g.paused = time.Time{}
		g.startRampLocked()
		g.dispatch()
		g.changed()
		g.settle()
	})
	g.changed()
	return grew
}

// close stops the pause timer; Run calls it once every attempt has ended.
func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	if g.pauseT != nil {
		g.pauseT.Stop()
	}
}

// changed reports the gate's state to its metrics. Called with mu held.
func (g *gate) changed() {
	if g.m != nil {
		g.m.observeGate(g.dest, g.effectiveLimitLocked(), g.inflight, &g.waiting)
	}
}

// effectiveLimitLocked is statusLocked().effectiveLimit() without the
// status (its map). Called with mu held.
func (g *gate) effectiveLimitLocked() int {
	st := GateStatus{SlowStart: g.ramp}
	if g.lim != nil {
		st.ConcurrencyLimit = g.lim.limit()
	}
	return st.effectiveLimit()
}

// GateStatus is a destination's flow control as /status shows it.
type GateStatus struct {
	ConcurrencyLimit int            `json:"concurrency_limit"` // 0: none
	InFlight         int            `json:"in_flight"`         // admitted attempts, while a limit applies
	Waiting          map[string]int `json:"waiting"`           // by severity
	SlowStart        int            `json:"slow_start,omitempty"`
	PausedFor        string         `json:"paused_for,omitempty"`
	// FleetSlots is how many of the fleet's concurrency slots this
	// replica holds (fleet_slots.go); absent when the limit is per
	// process.
	FleetSlots *int `json:"fleet_slots_held,omitempty"`
}

// effectiveLimit is the concurrency limit in force: the limit, or the
// slow-start ramp while it is lower; 0 when none applies.
func (s GateStatus) effectiveLimit() int {
	if s.SlowStart > 0 && (s.ConcurrencyLimit == 0 || s.SlowStart < s.ConcurrencyLimit) {
		return s.SlowStart
	}
	return s.ConcurrencyLimit
}

// statusLocked is the gate's state. Called with mu held.
func (g *gate) statusLocked() GateStatus {
	st := GateStatus{InFlight: g.inflight, Waiting: make(map[string]int, len(severities)), SlowStart: g.ramp}
	if g.lim != nil {
		st.ConcurrencyLimit = g.lim.limit()
	}
	for r, s := range severities {
		st.Waiting[string(s)] = len(g.waiting[r])
	}
	if !g.paused.IsZero() {
		st.PausedFor = time.Until(g.paused).Round(time.Millisecond).String()
	}
	if g.slots != nil && g.fleet.load() != nil {
		n := g.slots.heldHere()
		st.FleetSlots = &n
	}
	return st
}

// Status is the gate's state, consistent at one instant.
func (g *gate) Status() GateStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.statusLocked()
}

package bridge

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/failsafe-go/failsafe-go/ratelimiter"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/config"
)

// Fleet-wide flow control (docs/delivery.md#across-replicas): every
// replica of a bridge shares, through JetStream, a destination's rate
// limit, its Retry-After pauses, and a fixed concurrency limit (slot
// leases, fleet_slots.go). Adaptive concurrency, slow start, the severity
// order, the breaker and the retry budget stay per process.
//
//   - Rate: time is cut into windows of per/10 (fleetWindows windows per
//     period), aligned on the wall clock, so every replica computes the
//     same window index. Window i of a period has the quota
//     ⌊(i+1)R/10⌋ − ⌊iR/10⌋ (any ten consecutive windows sum to R). A
//     replica leases permits of the current window from a JetStream
//     counter (a stream with AllowMsgCounter; a publish with the header
//     Nats-Incr: m returns the new total): the lease is granted
//     clamp(quota − (total − m), 0, m). Permits of a lease are used only
//     inside their window: one left at its end is lost, never carried.
//     Hence every span of one period overlaps at most eleven windows and
//     sees at most R + ⌈R/10⌉ tries, whichever replicas send them; a
//     replica that dies holds nothing past its current window.
//   - Every try still takes a permit of the per-process limiter (today's,
//     with its burst) first: a single replica behaves as it did, and a
//     counter that cannot be reached leaves each replica at the
//     per-process limit (counted in bridge_fleet_state_errors_total).
//   - Pause: a Retry-After that pauses a destination is written to the
//     key fleet.<destination>.pause of the fleet's bucket (its end, unix
//     milliseconds); every replica watches the bucket and pauses the
//     destination until then.
//
// The lease size is what the replica needs now: the tries waiting for a
// permit, or as many as it used in the previous window when more, at most
// the window's quota. A replica with steady work thus asks the counter
// about once a window, not once a try.

// fleetWindows is how many windows a rate limit's period is cut into.
const fleetWindows = 10

// fleetMinWindow is the shortest window: a shorter period has fewer
// windows.
const fleetMinWindow = 10 * time.Millisecond

// fleetCallTimeout bounds one call to the fleet's JetStream state.
const fleetCallTimeout = 2 * time.Second

// fleetRetryAfterError is how long a replica keeps to its per-process
// limit after a failed call to the counter before it asks again.
const fleetRetryAfterError = time.Second

// fleetRateMaxAge is how long the counter stream keeps a window's count,
// at least: longer when a destination's windows are longer than half of
// it (fleetRateAge).
const fleetRateMaxAge = 10 * time.Minute

// fleetRateAge is the counter stream's max age for cfg: a count outlives
// its window twice over.
func fleetRateAge(cfg *config.Config) time.Duration {
	age := fleetRateMaxAge
	for _, d := range cfg.Destinations {
		if rl := d.RateLimit; rl != nil {
			age = max(age, 2*rl.Per.D()/fleetWindows)
		}
	}
	return age
}

// fleet is the bridge's shared state in JetStream, set by Provision when
// a destination has a flow-control block.
type fleet struct {
	js      jetstream.JetStream
	stream  string // the source stream's name: the subjects' prefix
	kv      jetstream.KeyValue
	replica string // this replica (host and process id), the value of its slots
}

// fleetGate makes gate g of destination dc share the fleet's state held
// by h (set by Provision): its pauses, and the slots of a fixed
// concurrency limit.
func fleetGate(g *gate, h *fleetHolder, dc *config.Destination) {
	g.fleet = h
	if c := dc.Concurrency; c != nil && !c.Adaptive && c.Max > 0 {
		g.slots = newFleetSlots(dc.Name, c.Max)
	}
}

// fleetHolder holds the bridge's fleet once provisioned; a destination
// reads it at each use (nil: per process only).
type fleetHolder struct{ p atomic.Pointer[fleet] }

func (h *fleetHolder) load() *fleet {
	if h == nil {
		return nil
	}
	return h.p.Load()
}

// fleetRateStreamName and fleetBucketName name the fleet's objects after
// the source stream.
func fleetRateStreamName(stream string) string { return stream + "_RATE" }
func fleetBucketName(stream string) string     { return config.StateBucket(stream) }

// fleetRateSubjects are the counter stream's subjects.
func fleetRateSubjects(stream string) string { return "jetbridge.rate." + stream + ".>" }

// fleetRateStreamConfig is the counter stream of the source stream sc,
// keeping counts for maxAge.
func fleetRateStreamConfig(sc config.Stream, maxAge time.Duration) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              fleetRateStreamName(sc.Name),
		Description:       "jetbridge: fleet-wide rate limit counters (docs/delivery.md#flow-control)",
		Subjects:          []string{fleetRateSubjects(sc.Name)},
		Storage:           jetstream.FileStorage,
		Retention:         jetstream.LimitsPolicy,
		MaxAge:            maxAge,
		MaxMsgsPerSubject: 1,
		AllowMsgCounter:   true,
		AllowDirect:       true,
		Replicas:          sc.Replicas,
	}
}

// fleetBucketConfig is the bucket of the fleet's keys (pauses).
func fleetBucketConfig(sc config.Stream) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:         fleetBucketName(sc.Name),
		Description:    "jetbridge: fleet-wide flow-control state (docs/delivery.md#flow-control)",
		History:        1,
		Storage:        jetstream.FileStorage,
		Replicas:       sc.Replicas,
		LimitMarkerTTL: time.Second,
	}
}

// needsFleet reports whether a destination of cfg has flow control, which
// the replicas then share.
func needsFleet(cfg *config.Config) bool {
	for _, d := range cfg.Destinations {
		if d.RateLimit != nil || d.Concurrency != nil {
			return true
		}
	}
	return false
}

// errFleetCounter is a counter answer that does not parse.
var errFleetCounter = errors.New("bridge: fleet counter: malformed total")

// incr adds m to the counter subj and returns its new total.
func (f *fleet) incr(ctx context.Context, subj string, m int) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, fleetCallTimeout)
	defer cancel()
	msg := &nats.Msg{Subject: subj, Header: nats.Header{"Nats-Incr": []string{strconv.Itoa(m)}}}
	ack, err := f.js.PublishMsg(ctx, msg)
	if err != nil {
		return 0, err
	}
	if len(ack.Value) > 20 {
		return 0, errFleetCounter
	}
	total, err := strconv.ParseInt(ack.Value, 10, 64)
	if err != nil {
		return 0, errFleetCounter
	}
	return total, nil
}

// pauseKey is the key of destination dest's pause.
func pauseKey(dest string) string { return "fleet." + dest + ".pause" }

// sharePause writes the end of a pause of dest for the other replicas.
func (f *fleet) sharePause(ctx context.Context, dest string, until time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, fleetCallTimeout)
	defer cancel()
	_, err := f.kv.Put(ctx, pauseKey(dest), strconv.AppendInt(nil, until.UnixMilli(), 10))
	return err
}

// rateSource gives a destination's tries their permits: wait returns once
// the try may start, or ctx's error.
type rateSource interface {
	wait(ctx context.Context) error
}

// localRate is the per-process rate limit: failsafe-go's bursty limiter,
// asked once per refill period (see rateWait).
type localRate struct {
	limiter ratelimiter.RateLimiter[*response]
	poll    time.Duration // the refill period
}

func newLocalRate(rl *config.RateLimit) *localRate {
	period := ratePeriod(rl)
	return &localRate{limiter: ratelimiter.NewBursty[*response](uint(rl.Burst), period), poll: period}
}

func (l *localRate) wait(ctx context.Context) error {
	for !l.limiter.TryAcquirePermit() {
		if err := sleepCtx(ctx, l.poll); err != nil {
			return err
		}
	}
	return nil
}

// sleepCtx waits d, or returns ctx's error when it ends first.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// fleetRate is the fleet-wide rate limit of one destination (see the file
// comment): the per-process limiter, then a lease of the window's quota.
type fleetRate struct {
	local    *localRate
	requests int
	windows  int           // windows per period
	window   time.Duration // a window's length
	dest     string
	gate     *gate // its fleet is the bridge's shared state
	m        *metrics

	waiting atomic.Int64  // tries in wait
	claim   chan struct{} // one lease request at a time

	mu        sync.Mutex
	win       int64 // the window the pool belongs to
	avail     int   // leased permits of win not used yet
	full      bool  // win's quota is spent
	used      int   // permits of win used here
	prevUsed  int   // permits of the window before used here
	total     int64 // the fleet's count of win, as last seen
	errorTill time.Time
}

func newFleetRate(rl *config.RateLimit, dest string, g *gate, m *metrics) *fleetRate {
	windows := fleetWindows
	if per := rl.Per.D(); per/fleetWindows < fleetMinWindow {
		windows = max(1, int(per/fleetMinWindow))
	}
	return &fleetRate{
		local:    newLocalRate(rl),
		requests: rl.Requests,
		windows:  windows,
		window:   rl.Per.D() / time.Duration(windows),
		dest:     dest,
		gate:     g,
		m:        m,
		claim:    make(chan struct{}, 1),
	}
}

// quota is window k's share of the period's requests.
func (r *fleetRate) quota(k int64) int {
	i := k % int64(r.windows)
	n, w := int64(r.requests), int64(r.windows)
	return int((i+1)*n/w - i*n/w)
}

// windowOf is the window of t, and when the next one starts.
func (r *fleetRate) windowOf(t time.Time) (int64, time.Time) {
	w := int64(r.window)
	k := t.UnixNano() / w
	return k, time.Unix(0, (k+1)*w)
}

// roll moves the pool to window k. Called with mu held.
func (r *fleetRate) roll(k int64) {
	if k == r.win {
		return
	}
	if k == r.win+1 {
		r.prevUsed = r.used
	} else {
		r.prevUsed = 0
	}
	r.win, r.avail, r.full, r.used, r.total = k, 0, false, 0, 0
}

func (r *fleetRate) wait(ctx context.Context) error {
	if err := r.local.wait(ctx); err != nil {
		return err
	}
	f := r.gate.fleet.load()
	if f == nil {
		return nil // not provisioned: per process
	}
	r.waiting.Add(1)
	defer r.waiting.Add(-1)
	var waited time.Duration
	defer func() { r.m.fleetWaited(r.dest, waited) }()
	for {
		ok, next, err := r.take(ctx, f)
		if ok || err != nil {
			return err
		}
		start := time.Now()
		// The next window, and a little after it, so that the waiters of
		// every replica do not all ask at its first instant.
		err = sleepCtx(ctx, time.Until(next)+jitter(r.window/50))
		waited += time.Since(start)
		if err != nil {
			return err
		}
	}
}

// jitter is a duration in [0, d).
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(time.Now().UnixNano() % int64(d))
}

// use takes a leased permit of the current window if the pool has one, and
// reports whether the window is spent. Called with mu held.
func (r *fleetRate) use(now time.Time) (ok, full bool, next time.Time) {
	k, next := r.windowOf(now)
	r.roll(k)
	if r.avail > 0 {
		r.avail--
		r.used++
		return true, false, next
	}
	if now.Before(r.errorTill) {
		return true, false, next // the counter failed: per process for now
	}
	return false, r.full, next
}

// take gives a permit of the current window (ok), or the start of the
// next window when this one is spent.
func (r *fleetRate) take(ctx context.Context, f *fleet) (bool, time.Time, error) {
	r.mu.Lock()
	ok, full, next := r.use(time.Now())
	r.mu.Unlock()
	if ok || full {
		return ok, next, nil
	}
	select {
	case r.claim <- struct{}{}:
	case <-ctx.Done():
		return false, next, ctx.Err()
	}
	defer func() { <-r.claim }()
	r.mu.Lock()
	now := time.Now()
	ok, full, next = r.use(now) // a lease may have come meanwhile
	if ok || full {
		r.mu.Unlock()
		return ok, next, nil
	}
	k := r.win
	q := r.quota(k)
	m := min(max(int(r.waiting.Load()), r.prevUsed, 1), max(q, 1))
	r.mu.Unlock()

	total, err := f.incr(ctx, r.subject(f, k), m)

	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		if ctx.Err() != nil {
			return false, next, ctx.Err()
		}
		r.errorTill = time.Now().Add(fleetRetryAfterError)
		r.m.fleetError(r.dest, "rate")
		return true, next, nil
	}
	granted := int(min(max(int64(q)-(total-int64(m)), 0), int64(m)))
	k2, next := r.windowOf(time.Now())
	r.roll(k2)
	if k2 != k {
		return false, next, nil // the lease came too late: its window is over
	}
	r.total = total
	r.avail += granted
	if granted < m {
		r.full = true
	}
	if r.avail > 0 {
		r.avail--
		r.used++
		return true, next, nil
	}
	return false, next, nil
}

// subject is the counter of window k.
func (r *fleetRate) subject(f *fleet, k int64) string {
	return fmt.Sprintf("jetbridge.rate.%s.%s.%d", f.stream, r.dest, k)
}

// FleetRateStatus is a destination's fleet-wide rate limit as /status
// shows it: the current window, its quota, what the whole fleet claimed
// of it as this replica last saw, and what this replica used.
type FleetRateStatus struct {
	Window       string `json:"window"`        // a window's length
	Quota        int    `json:"quota"`         // of the current window, for the whole fleet
	ClaimedFleet int64  `json:"claimed_fleet"` // as last seen by this replica (leases asked, granted or not)
	UsedHere     int    `json:"used_here"`     // permits this replica used in the current window
	Shared       bool   `json:"shared"`        // false: per process (not provisioned, or the counter failed)
}

// status is r's state now.
func (r *fleetRate) status() FleetRateStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	k, _ := r.windowOf(now)
	r.roll(k)
	return FleetRateStatus{
		Window:       r.window.String(),
		Quota:        r.quota(k),
		ClaimedFleet: r.total,
		UsedHere:     r.used,
		Shared:       r.gate.fleet.load() != nil && !now.Before(r.errorTill),
	}
}

// watchPauses applies the pauses other replicas share (and its own,
// already in force) to the destinations of b until ctx ends.
func (b *Bridge) watchPauses(ctx context.Context) {
	f := b.fleet.load()
	if f == nil {
		return
	}
	followKV(ctx, f.kv, "fleet.>", b.applyPause, func() { b.m.fleetError("", "pause") })
}

// applyPause applies one update of the fleet's records: a slot taken or
// given back, or a pause shared by a replica (nil: nothing to do).
func (b *Bridge) applyPause(e jetstream.KeyValueEntry) {
	if e == nil {
		return // the initial values are all in
	}
	if dest, i, ok := slotOf(e.Key()); ok {
		b.mu.RLock()
		d := b.dests[dest]
		b.mu.RUnlock()
		if d != nil && d.gate.slots != nil {
			d.gate.slots.seen(i, e.Revision(), e.Operation() == jetstream.KeyValuePut)
		}
		return
	}
	if e.Operation() != jetstream.KeyValuePut {
		return
	}
	dest, ok := pauseDest(e.Key())
	if !ok {
		return
	}
	v := e.Value()
	if len(v) > 20 {
		return
	}
	ms, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil || ms <= 0 || ms > math.MaxInt64/int64(time.Millisecond) {
		return
	}
	until := time.UnixMilli(ms)
	b.mu.RLock()
	d := b.dests[dest]
	longest := longestPause(b.applied)
	b.mu.RUnlock()
	if d == nil {
		return
	}
	if latest := time.Now().Add(longest); until.After(latest) {
		until = latest // no longer than a route of this replica would honour
	}
	d.gate.pauseUntil(until, false)
}

// pauseDest is the destination of a pause key.
func pauseDest(key string) (string, bool) {
	const prefix, suffix = "fleet.", ".pause"
	if len(key) <= len(prefix)+len(suffix) || key[:len(prefix)] != prefix || key[len(key)-len(suffix):] != suffix {
		return "", false
	}
	return key[len(prefix) : len(key)-len(suffix)], true
}

// fleetWaited counts the time a try waited for the fleet's rate limit.
func (m *metrics) fleetWaited(dest string, waited time.Duration) {
	if m != nil && waited > 0 {
		m.fleetWaitSecs.WithLabelValues(dest).Add(waited.Seconds())
	}
}

// fleetError counts a failed call to the fleet's state.
func (m *metrics) fleetError(dest, op string) {
	if m != nil {
		m.fleetErrors.WithLabelValues(dest, op).Inc()
	}
}

// longestPause is the longest Retry-After a route of cfg honours.
func longestPause(cfg *config.Config) time.Duration {
	var out time.Duration
	for _, r := range cfg.Routes {
		out = max(out, r.MaxRetryAfter.D())
	}
	return out
}

// slotOf is the destination and slot number of a slot key.
func slotOf(key string) (string, int, bool) {
	const prefix = "fleet."
	if !strings.HasPrefix(key, prefix) {
		return "", 0, false
	}
	dest, num, ok := strings.Cut(key[len(prefix):], ".slot.")
	if !ok || len(num) > 6 {
		return "", 0, false
	}
	i, err := strconv.Atoi(num)
	if err != nil || i < 0 {
		return "", 0, false
	}
	return dest, i, true
}

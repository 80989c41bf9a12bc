package bridge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/config"
)

// fetchWait is how long one pull request stays open on the server. A
// stopping route cancels its open pull at once (the server drops it, and
// the messages it did not deliver stay pending).
const fetchWait = 5 * time.Second

// fetchHeartbeat is the idle heartbeat of a pull; two missed ones end it.
const fetchHeartbeat = time.Second

// settleTimeout bounds the JetStream calls that settle a message (a dead
// letter's publish included); ackTimeout bounds the wait for an ack's
// confirmation.
const (
	settleTimeout = 5 * time.Second
	ackTimeout    = 2 * time.Second
)

// ErrDeliveriesExhausted is the failure of a message that arrives with its
// delivery budget already spent: its previous delivery was the last one
// allowed but was never settled (the bridge died, or ack_wait expired).
var ErrDeliveriesExhausted = errors.New("delivery limit reached by an unsettled delivery")

// route is one durable consumer feeding one destination.
type route struct {
	b        *Bridge
	cfg      *config.Route
	dest     *destination
	policy   SettlePolicy
	cons     atomic.Pointer[jetstream.Consumer] // set by Provision; see consumer()
	received atomic.Uint64                      // messages fetched, for the watchdog
	rebind   atomic.Bool                        // the watchdog asks for a fresh consumer
	missing  atomic.Bool                        // the consumer was deleted by hand
	log      zerolog.Logger
	slots    chan struct{} // one token per message in flight
	held     atomic.Int32  // messages waiting for the breaker
	inFlight atomic.Int64
	gauge    prometheus.Gauge // bridge_in_flight of this route
}

func newRoute(b *Bridge, rc *config.Route, d *destination) *route {
	backoff := make([]time.Duration, len(rc.Backoff))
	for i, d := range rc.Backoff {
		backoff[i] = d.D()
	}
	maxDeliver := rc.MaxDeliver
	if b.faults.maxDeliverOffByOne {
		maxDeliver++
	}
	return &route{
		b:    b,
		cfg:  rc,
		dest: d,
		policy: SettlePolicy{
			MaxDeliver:        maxDeliver,
			Backoff:           backoff,
			RedeliverStatuses: rc.RedeliverStatuses,
			MaxRetryAfter:     rc.MaxRetryAfter.D(),
		},
		log:   b.log.With().Str("route", rc.Name).Str("destination", d.name).Logger(),
		slots: make(chan struct{}, rc.MaxInFlight),
		gauge: b.m.inFlight.WithLabelValues(rc.Name),
	}
}

// startWorkers starts the route's fixed pool of max_in_flight workers on
// workers, and returns the channel that feeds them; closing it stops them
// once they have settled what they hold. A worker lives as long as the
// route, so no goroutine is started (and no stack grown) per message.
// Attempts run on work; a message held by an open breaker is released as
// soon as stop ends.
func (r *route) startWorkers(stop, work context.Context, workers *sync.WaitGroup) chan<- jetstream.Msg {
	jobs := make(chan jetstream.Msg, cap(r.slots))
	for range cap(r.slots) {
		workers.Go(func() {
			for m := range jobs {
				r.handle(stop, work, m)
				r.release(1)
			}
		})
	}
	return jobs
}

// pull fetches exactly as many messages as the route has free slots, and
// none while the destination's breaker is open, so nothing is ever pulled
// that cannot be processed at once (no prefetch to strand, no delivery
// burned by an open breaker). Each message goes to the route's workers
// (startWorkers) with the slot it holds. It returns when ctx ends, and
// closes jobs.
func (r *route) pull(ctx context.Context, jobs chan<- jetstream.Msg) {
	defer close(jobs)
	failures := 0
	for ctx.Err() == nil {
		if err := r.dest.waitUsable(ctx); err != nil {
			return
		}
		n := r.acquire(ctx)
		if n == 0 {
			return
		}
		if st := r.dest.state(); st != BreakerClosed {
			if st == BreakerOpen && r.dest.breaker.RemainingDelay() > 0 {
				r.release(n) // it opened while we waited for a slot
				continue
			}
			// Probing: one message at a time, and none while a held
			// message can serve as the probe.
			if r.held.Load() > 0 {
				r.release(n)
				sleep(ctx, halfOpenPoll)
				continue
			}
			r.release(n - 1)
			n = 1
		}
		if r.rebind.Swap(false) {
			r.lookupConsumer(ctx)
		}
		fctx, cancel := context.WithTimeout(ctx, fetchWait)
		// The heartbeat ends a pull the server no longer knows (it restarted,
		// or a new leader took over) within a second or two, instead of
		// leaving the route idle until the pull expires.
		batch, err := r.consumer().Fetch(n, jetstream.FetchContext(fctx), jetstream.FetchHeartbeat(fetchHeartbeat))
		if err != nil {
			cancel()
			r.release(n)
			failures++
			r.pullFailed(ctx, failures, err)
			continue
		}
		got := 0
		for m := range batch.Messages() {
			got++
			r.received.Add(1)
			if ctx.Err() != nil {
				// The signal came while this pull was open: hand the message
				// back untouched rather than start new work.
				_ = m.NakWithDelay(interruptedDelay)
				r.release(1)
				continue
			}
			jobs <- m // never blocks for long: a free worker exists for every slot
		}
		cancel()
		r.release(n - got)
		if err := batch.Error(); err != nil && ctx.Err() == nil &&
			!errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
			failures++
			r.pullFailed(ctx, failures, err)
			continue
		}
		failures = 0
	}
}

// pullFailed logs a failed pull, makes the next pull check that the
// consumer still exists when the error suggests it may not (a deleted one
// answers "no responders"), and backs off.
func (r *route) pullFailed(ctx context.Context, failures int, err error) {
	// Only an error that can mean "no such consumer" is worth a lookup: after
	// a leader change or a server shutdown the handle still works.
	if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrConsumerNotFound) ||
		errors.Is(err, jetstream.ErrConsumerDeleted) {
		r.rebind.Store(true)
	}
	r.log.Warn().Int("failures", failures).Str("error", err.Error()).Msg("pull failed")
	sleep(ctx, retryPause(failures))
}

// acquire blocks for one free slot, then takes every other free slot.
// It returns 0 when ctx ends first.
func (r *route) acquire(ctx context.Context) int {
	select {
	case r.slots <- struct{}{}:
	case <-ctx.Done():
		return 0
	}
	n := 1
	for n < cap(r.slots) {
		select {
		case r.slots <- struct{}{}:
			n++
		default:
			return n
		}
	}
	return n
}

func (r *route) release(n int) {
	for range n {
		<-r.slots
	}
}

// handle processes one message from receipt to settlement. Attempts run on
// work; a message held by an open breaker is released as soon as stop ends.
func (r *route) handle(stop, work context.Context, m jetstream.Msg) {
	r.inFlight.Add(1)
	r.gauge.Inc()
	defer func() {
		r.inFlight.Add(-1)
		r.gauge.Dec()
	}()

	ev, err := parseEvent(m)
	if ev == nil {
		// Not a JetStream message: cannot happen on a pull consumer.
		r.log.Error().Str("error", err.Error()).Msg("message without JetStream metadata")
		_ = m.NakWithDelay(r.policy.backoff(1))
		return
	}
	var held atomic.Pointer[lease] // the idempotency reservation, refreshed with progress acks
	stopProgress := r.progress(m, &held)
	defer stopProgress()

	tries := 0
	failure := err
	if failure == nil && ev.Delivered > uint64(r.policy.MaxDeliver) {
		failure = ErrDeliveriesExhausted
	}
	if failure == nil {
		var p *payload
		if p, failure = buildPayload(ev, r.dest); failure == nil {
			var l *lease
			if r.b.idem != nil && r.cfg.Idempotency {
				l, failure = r.reserve(stop, ev)
				held.Store(l)
			}
			if failure == nil {
				tries, failure = r.deliver(stop, work, p, ev)
				failure = r.record(l, ev, failure)
			}
		}
	}
	if failure != nil {
		failure = &DeliveryError{
			Route: r.cfg.Name, Destination: r.dest.name, Stream: ev.Stream,
			Seq: ev.Seq, Delivered: ev.Delivered, Tries: tries, Err: failure,
		}
	}
	r.settle(m, ev, failure, tries)
}

// msgLog adds the message's stream sequence and delivery count to a log
// event. No logger is built per message: at a level the logger hides, e is
// nil and this and every later field call cost nothing.
func msgLog(e *zerolog.Event, ev *event) *zerolog.Event {
	return e.Uint64("stream_seq", ev.Seq).Uint64("delivered", ev.Delivered)
}

// deliver runs attempts until one is not refused by the open breaker. A
// message held here keeps its delivery (progress acks run meanwhile), so an
// outage alone never spends the delivery budget. Holding ends with stop:
// a held message is handed back at once on shutdown.
func (r *route) deliver(stop, work context.Context, p *payload, ev *event) (int, error) {
	total := 0
	for {
		tries, err := r.dest.attempt(work, p)
		total += tries
		var open *CircuitOpenError
		if !errors.As(err, &open) {
			return total, err
		}
		if r.b.faults.noHold {
			return total, &TransportError{Destination: r.dest.name, Kind: "circuit open"}
		}
		msgLog(r.log.Debug(), ev).Msg("held: circuit breaker open")
		r.held.Add(1)
		werr := r.dest.waitUsable(stop)
		r.held.Add(-1)
		if werr != nil {
			return total, fmt.Errorf("%w: %w", ErrInterrupted, err)
		}
	}
}

// reserve takes the event's idempotency reservation. While another message
// with the same event id is being delivered, it waits (progress acks keep
// this message) for that delivery's outcome: done makes this one a
// duplicate, a release lets it reserve.
func (r *route) reserve(stop context.Context, ev *event) (*lease, error) {
	key := reservationKey(r.cfg.Name, ev.ID)
	me := holder{stream: ev.Stream, seq: ev.Seq, delivered: ev.Delivered}
	for {
		ctx, cancel := context.WithTimeout(stop, settleTimeout)
		l, err := r.b.idem.Reserve(ctx, key, me, r.cfg.AckWait.D())
		cancel()
		var dup *DuplicateEventError
		switch {
		case errors.As(err, &dup):
			dup.EventID = ev.ID
			return nil, err
		case !errors.Is(err, errReserved):
			return l, err
		}
		if sleep(stop, reservePoll); stop.Err() != nil {
			return nil, fmt.Errorf("%w: %w", ErrInterrupted, err)
		}
	}
}

// record closes the reservation after the attempt: done after a 2xx (before
// the ack, so a lost ack is recognised on redelivery), released after any
// failure (so a failed delivery never consumes the event id).
func (r *route) record(l *lease, ev *event, failure error) error {
	if l == nil {
		return failure
	}
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	if failure != nil {
		if r.b.faults.keepReservationOnFailure {
			return failure
		}
		if err := l.release(ctx); err != nil {
			msgLog(r.log.Warn(), ev).Str("error", err.Error()).Msg("idempotency reservation not released; it expires after ack_wait")
		}
		return failure
	}
	h := holder{stream: ev.Stream, seq: ev.Seq, delivered: ev.Delivered}
	if err := l.done(ctx, h); err != nil {
		msgLog(r.log.Warn(), ev).Str("error", err.Error()).Msg("delivered, but not recorded as done: a redelivery would be sent again")
	}
	return nil
}

// settle applies the decision for the message, then reports it.
func (r *route) settle(m jetstream.Msg, ev *event, failure error, tries int) {
	s := Decide(failure, ev.Delivered, r.policy)
	out := Settled{
		Route: r.cfg.Name, Destination: r.dest.name, Stream: ev.Stream, Seq: ev.Seq,
		Delivered: ev.Delivered, EventID: ev.ID, Tries: tries, Err: failure,
	}
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	var err error
	switch s.Action {
	case Ack:
		out.Outcome = OutcomeDelivered
		var dup *DuplicateEventError
		if errors.As(failure, &dup) {
			out.Outcome = OutcomeDuplicateSkipped
		}
		if r.b.faults.beforeAck != nil {
			r.b.faults.beforeAck()
		}
		if r.b.js.Conn().IsConnected() {
			actx, cancel := context.WithTimeout(ctx, ackTimeout)
			err = m.DoubleAck(actx)
			cancel()
		} else {
			// Disconnected: the client buffers the ack for the reconnect
			// instead of holding this message's slot until a timeout.
			err = m.Ack()
		}
		msgLog(r.log.Debug(), ev).Int("tries", tries).Str("outcome", out.Outcome).Msg("settled")
	case DeadLetter:
		out.Outcome, out.Reason = OutcomeDeadLettered, s.Reason
		if derr := r.deadLetter(ctx, m.Headers(), m.Data(), ev, s.Reason, failure); derr != nil && !r.b.faults.termWithoutDeadLetter {
			// Never terminate without a stored dead letter: try again later.
			out.Outcome, out.Reason = OutcomeRedeliveryScheduled, ""
			out.Delay = r.policy.backoff(ev.Delivered)
			msgLog(r.log.Error(), ev).Str("reason", s.Reason).Str("error", derr.Error()).Dur("delay", out.Delay).
				Msg("dead letter not stored; message left for redelivery")
			err = m.NakWithDelay(out.Delay)
			break
		}
		err = m.TermWithReason("jetbridge: " + s.Reason)
		withStatus(msgLog(r.log.Warn(), ev).Str("reason", s.Reason).Str("failure", FailureKind(failure)).Int("tries", tries), failure).
			Msg("dead-lettered")
	default: // Redeliver; Hold never reaches here (deliver resolves it)
		out.Outcome, out.Delay = OutcomeRedeliveryScheduled, max(s.Delay, time.Millisecond)
		err = m.NakWithDelay(out.Delay)
		withStatus(msgLog(r.log.Info(), ev).Str("failure", FailureKind(failure)).Int("tries", tries), failure).
			Dur("delay", out.Delay).Msg("redelivery scheduled")
	}
	if err != nil {
		// The broker redelivers after ack_wait; with idempotency the second
		// delivery is recognised.
		msgLog(r.log.Warn(), ev).Str("outcome", out.Outcome).Str("error", err.Error()).Msg("settlement not confirmed by JetStream")
	}
	r.b.settled(out)
}

// progress sends InProgress every third of ack_wait until stopped, so a long
// attempt (or a message held by an open breaker) is never redelivered to
// another replica meanwhile; it refreshes the idempotency reservation too.
// It runs on a timer, not a goroutine of its own: most messages settle
// long before the first tick. stop waits for a tick in progress.
func (r *route) progress(m jetstream.Msg, held *atomic.Pointer[lease]) (stop func()) {
	if r.b.faults.noProgress {
		return func() {}
	}
	every := r.cfg.AckWait.D() / 3
	var (
		mu      sync.Mutex
		stopped bool
		t       *time.Timer
	)
	mu.Lock() // the first tick must not run before t is set
	defer mu.Unlock()
	t = time.AfterFunc(every, func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		_ = m.InProgress()
		if l := held.Load(); l != nil {
			ctx, cancel := context.WithTimeout(context.Background(), every)
			if err := l.refresh(ctx); err != nil {
				r.log.Warn().Str("error", err.Error()).Msg("idempotency reservation not refreshed")
			}
			cancel()
		}
		t.Reset(every)
	})
	return func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
	}
}

// withStatus adds the HTTP status of failure to a log event, when there is one.
func withStatus(e *zerolog.Event, failure error) *zerolog.Event {
	if st := statusOf(failure); st != 0 {
		return e.Int("status", st)
	}
	return e
}

func statusOf(err error) int {
	var de *DownstreamError
	if errors.As(err, &de) {
		return de.Status
	}
	return 0
}

// retryPause backs off repeated pull failures: 100 ms doubling to 5 s.
func retryPause(failures int) time.Duration {
	return min(100*time.Millisecond<<min(failures-1, 6), 5*time.Second)
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

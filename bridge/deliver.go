package bridge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/sotercare/jetbridge/deadletter"
)

// handle processes one message from receipt to settlement:
//
//	parseEvent (event.go) -> delivery budget -> buildPayload (request.go)
//	-> reserve the event id (idempotency.go, routes with idempotency)
//	-> deliver: attempts through the destination's pipeline
//	   (destination.go), held while its breaker is open
//	-> record the outcome of the reservation -> settle (settle.go)
//
// Every path ends in settle, exactly once. Attempts run on work; a message
// held by an open breaker (or waiting for a reservation) is released as
// soon as stop ends.
func (r *route) handle(stop, work context.Context, m jetstream.Msg, w int) {
	r.load.inFlight.Add(1)
	r.load.gauge.Inc()
	defer func() {
		r.load.inFlight.Add(-1)
		r.load.gauge.Dec()
	}()

	ev, err := r.readEvent(m)
	if ev == nil {
		// Not a JetStream message: cannot happen on a pull consumer.
		r.settle(m, &event{}, err, 0, nil)
		return
	}
	// The delivery span (trace.go), ended by settle.
	work = r.b.tr.startDelivery(work, r, m, ev)
	var held atomic.Pointer[lease] // the idempotency reservation, refreshed with progress acks
	progress := r.b.parts.progress(r, w, m, &held)

	tries, failure := r.process(stop, work, ev, err, &held)
	if failure != nil {
		failure = &DeliveryError{
			Route: r.cfg.Name, Destination: r.dest.name, Stream: ev.Stream,
			Seq: ev.Seq, Delivered: ev.Delivered, Tries: tries, Err: failure,
		}
	}
	r.settle(m, ev, failure, tries, progress)
}

// process is handle's pipeline from a parsed event to the failure that
// decides its settlement (nil for a 2xx). invalid is parseEvent's error for
// an event with an unusable header.
func (r *route) process(stop, work context.Context, ev *event, invalid error, held *atomic.Pointer[lease]) (tries int, failure error) {
	if invalid != nil {
		return 0, invalid
	}
	idempotent := r.b.idem != nil && r.cfg.Idempotency
	if ev.Delivered > uint64(r.policy.MaxDeliver) {
		// The previous delivery was the last one allowed and was never
		// settled. If it did deliver (its ack was lost), this is a
		// duplicate, not a dead letter.
		if idempotent {
			if err := r.alreadyDone(stop, ev); err != nil {
				return 0, err
			}
		}
		return 0, ErrDeliveriesExhausted
	}
	p, err := buildPayload(ev, r.dest)
	if err != nil {
		return 0, err
	}
	var l *lease
	if idempotent {
		if l, err = r.reserve(stop, ev); err != nil {
			return 0, err
		}
		held.Store(l)
	}
	tries, failure = r.deliver(stop, work, p, ev)
	return tries, r.record(l, ev, failure)
}

// msgLog adds the message's stream sequence and delivery count to a log
// event. No logger is built per message: at a level the logger hides, e is
// nil and this and every later field call cost nothing.
func msgLog(e *zerolog.Event, ev *event) *zerolog.Event {
	return traceLog(e.Uint64("stream_seq", ev.Seq).Uint64("delivered", ev.Delivered), ev)
}

// deliver runs attempts until one is not held by the open breaker (the
// decision says Hold). A message held here keeps its delivery (progress
// acks run meanwhile), so an outage alone never spends the delivery
// budget. Holding ends with stop: a held message is handed back at once on
// shutdown.
func (r *route) deliver(stop, work context.Context, p *payload, ev *event) (int, error) {
	total := 0
	for {
		// The destination's flow control admits the attempt (flow.go);
		// waiting there holds the message like an open breaker does.
		tries, err := r.dest.attempt(work, p, admission{hold: stop, severity: ev.Severity, maxPause: r.policy.MaxRetryAfter})
		total += tries
		if err == nil || r.b.parts.decide(err, ev.Delivered, r.policy).Action != Hold {
			return total, err
		}
		msgLog(r.log.Debug(), ev).Msg("held: circuit breaker open")
		r.load.held.Add(1)
		r.dest.held.Add(1)
		since := time.Now()
		werr := r.dest.waitUsable(stop)
		traceWait(ev, eventHold, since)
		r.dest.held.Add(-1)
		r.load.held.Add(-1)
		if werr != nil {
			return total, fmt.Errorf("%w: %w", ErrInterrupted, err)
		}
	}
}

// progressSlot is one worker's message while it is worked on: the
// route's progress loop sends it InProgress every third of ack_wait (and
// refreshes its idempotency reservation), so a long attempt, or a message
// held by an open breaker or a destination's flow control, is never
// redelivered to another replica meanwhile. One slot per worker, for the
// route's life: no timer and no goroutine per message.
type progressSlot struct {
	mu   sync.Mutex
	m    jetstream.Msg          // nil while the worker holds no message
	held *atomic.Pointer[lease] // the message's reservation, if any
	last time.Time              // when it was fetched, or last kept
}

// stopper ends a message's progress acks.
type stopper interface{ stop() }

// progress registers m in the worker's slot; its stop must be called
// before the message is settled.
func (r *route) progress(w int, m jetstream.Msg, held *atomic.Pointer[lease]) stopper {
	s := &r.progressSlots[w]
	s.mu.Lock()
	s.m, s.held, s.last = m, held, time.Now()
	s.mu.Unlock()
	return s
}

// stop ends the slot's progress acks, waiting for one in progress: none is
// sent once it has returned (one sent after a NakWithDelay would stretch
// its delay to ack_wait).
func (s *progressSlot) stop() {
	s.mu.Lock()
	s.m, s.held = nil, nil
	s.mu.Unlock()
}

// progressLoop keeps the route's messages in progress until stop is closed
// (after every worker has settled what it held): every sixth of ack_wait
// it sends InProgress for each message not kept for a third of ack_wait,
// so none goes longer than half of ack_wait without one.
func (r *route) progressLoop(stop <-chan struct{}) {
	every := r.cfg.AckWait.D() / 3
	t := time.NewTicker(every / 2)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			for i := range r.progressSlots {
				r.keep(&r.progressSlots[i], now, every)
			}
		}
	}
}

// keep sends the slot's message InProgress if it is due, and refreshes its
// reservation.
func (r *route) keep(s *progressSlot, now time.Time, every time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil || now.Sub(s.last) < every {
		return
	}
	s.last = now
	_ = s.m.InProgress()
	if l := s.held.Load(); l != nil {
		ctx, cancel := context.WithTimeout(context.Background(), every)
		if err := l.refresh(ctx); err != nil {
			r.b.m.idempotencyErrors.WithLabelValues(r.cfg.Name).Inc()
			r.log.Warn().Str("error", err.Error()).Msg("idempotency reservation not refreshed")
		}
		cancel()
	}
}

// reserve takes the event's idempotency reservation. A reservation of the
// event id for another subject or payload, done or still in flight, makes
// this message an event-id conflict at once (an *EventIDConflictError:
// dead-lettered, nothing sent; it does not wait for an in-flight one's
// outcome). While another message with the same event id and content is
// being delivered, it waits (progress acks keep this message) for that
// delivery's outcome: done makes this one a duplicate, a release lets it
// reserve. While the bucket cannot be read or written (an
// *IdempotencyStoreError: unreachable, full), it holds the message the same
// way and tries again with a growing pause: no delivery is spent, the
// bridge is not ready meanwhile, and shutdown hands the message back
// promptly.
func (r *route) reserve(stop context.Context, ev *event) (*lease, error) {
	key := reservationKey(r.cfg.Name, ev.ID)
	me := holderOf(ev)
	var since time.Time // when waiting for another delivery's outcome began
	failures := 0       // store failures in a row
	for {
		ctx, cancel := context.WithTimeout(stop, settleTimeout)
		l, err := r.b.idem.Reserve(ctx, key, me, r.cfg.AckWait.D())
		cancel()
		if !errors.Is(err, errReserved) && !since.IsZero() {
			traceWait(ev, eventReservation, since)
		}
		var (
			dup      *DuplicateEventError
			conflict *EventIDConflictError
		)
		pause := reservePoll
		switch {
		case errors.As(err, &dup):
			dup.EventID = ev.ID
			r.b.storeHealth.succeeded()
			return nil, err
		case errors.As(err, &conflict):
			r.b.storeHealth.succeeded()
			r.conflict(ev, conflict)
			return nil, err
		case err == nil:
			r.b.storeHealth.succeeded()
			return l, nil
		case stop.Err() != nil:
			return nil, fmt.Errorf("%w: %w", ErrInterrupted, err)
		case errors.Is(err, errReserved):
			r.b.storeHealth.succeeded()
			failures = 0
			if since.IsZero() {
				since = time.Now()
			}
		default:
			failures++
			se := &IdempotencyStoreError{Bucket: r.b.cfg.Idempotency.Bucket, Err: err}
			r.b.m.idempotencyErrors.WithLabelValues(r.cfg.Name).Inc()
			r.b.storeHealth.failed(se)
			if failures == 1 {
				msgLog(r.log.Warn(), ev).Str("failure", string(deadletter.FailureIdempotencyStore)).Str("error", se.Error()).
					Msg("idempotency reservation failed: the message is held (no delivery spent) and the reservation tried again until the bucket answers")
			}
			pause = retryPause(failures)
		}
		if sleep(stop, pause); stop.Err() != nil {
			if failures > 0 {
				return nil, fmt.Errorf("%w: %w", ErrInterrupted, &IdempotencyStoreError{Bucket: r.b.cfg.Idempotency.Bucket, Err: err})
			}
			return nil, fmt.Errorf("%w: %w", ErrInterrupted, err)
		}
	}
}

// conflict counts and reports an event-id conflict: the message's stream
// sequence, the part that differs and where the record's message is (never
// a payload, subject or header value). The dead-lettering that follows
// logs its own line.
func (r *route) conflict(ev *event, c *EventIDConflictError) {
	r.b.m.idempotencyConflicts.WithLabelValues(r.cfg.Name, c.Part).Inc()
	msgLog(r.log.Warn(), ev).Str("failure", string(deadletter.FailureEventIDConflict)).Str("differs", c.Part).
		Str("record_state", c.State).Str("record_stream", c.Stream).Uint64("record_stream_seq", c.Seq).
		Msg("event id conflict: the event id is already reserved or delivered on this route for another " + c.Part + "; nothing is sent and the message is dead-lettered")
}

// alreadyDone reads the event's reservation for a message past
// max_deliver: a *DuplicateEventError when it says the event was delivered
// with this content, an *EventIDConflictError when it was reserved or
// delivered for another subject or payload, else nil. A failed lookup
// answers nil: the message is then dead-lettered as it would be without
// idempotency.
func (r *route) alreadyDone(stop context.Context, ev *event) error {
	ctx, cancel := context.WithTimeout(stop, settleTimeout)
	defer cancel()
	err := r.b.idem.Lookup(ctx, reservationKey(r.cfg.Name, ev.ID), holderOf(ev))
	var (
		dup      *DuplicateEventError
		conflict *EventIDConflictError
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &dup):
		dup.EventID = ev.ID
		return err
	case errors.As(err, &conflict):
		r.conflict(ev, conflict)
		return err
	}
	r.b.m.idempotencyErrors.WithLabelValues(r.cfg.Name).Inc()
	msgLog(r.log.Warn(), ev).Str("error", err.Error()).Msg("idempotency lookup failed for a message past max_deliver")
	return nil
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
		if err := r.b.idem.release(ctx, l); err != nil {
			r.b.m.idempotencyErrors.WithLabelValues(r.cfg.Name).Inc()
			msgLog(r.log.Warn(), ev).Str("error", err.Error()).Msg("idempotency reservation not released; it expires after ack_wait")
		}
		return failure
	}
	if err := l.done(ctx, l.me); err != nil {
		r.b.m.idempotencyErrors.WithLabelValues(r.cfg.Name).Inc()
		msgLog(r.log.Warn(), ev).Str("error", err.Error()).Msg("delivered, but not recorded as done: a redelivery would be sent again")
	}
	return nil
}

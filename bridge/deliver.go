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
func (r *route) handle(stop, work context.Context, m jetstream.Msg) {
	r.load.inFlight.Add(1)
	r.load.gauge.Inc()
	defer func() {
		r.load.inFlight.Add(-1)
		r.load.gauge.Dec()
	}()

	ev, err := parseEvent(m)
	if ev == nil {
		// Not a JetStream message: cannot happen on a pull consumer.
		r.settle(m, &event{}, err, 0, nil)
		return
	}
	// The delivery span (trace.go), ended by settle.
	work = r.b.tr.startDelivery(work, r, m, ev)
	var held atomic.Pointer[lease] // the idempotency reservation, refreshed with progress acks
	stopProgress := r.b.parts.progress(r, m, &held)

	tries, failure := r.process(stop, work, ev, err, &held)
	if failure != nil {
		failure = &DeliveryError{
			Route: r.cfg.Name, Destination: r.dest.name, Stream: ev.Stream,
			Seq: ev.Seq, Delivered: ev.Delivered, Tries: tries, Err: failure,
		}
	}
	r.settle(m, ev, failure, tries, stopProgress)
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
		if idempotent && r.alreadyDone(stop, ev) {
			return 0, &DuplicateEventError{EventID: ev.ID}
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
		tries, err := r.dest.attempt(work, p)
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

// progress sends InProgress every third of ack_wait until stopped, so a long
// attempt (or a message held by an open breaker) is never redelivered to
// another replica meanwhile; it refreshes the idempotency reservation too.
// It runs on a timer, not a goroutine of its own: most messages settle
// long before the first tick. stop waits for a tick in progress, so no
// progress ack is sent once it has returned.
func (r *route) progress(m jetstream.Msg, held *atomic.Pointer[lease]) (stop func()) {
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

// reserve takes the event's idempotency reservation. While another message
// with the same event id is being delivered, it waits (progress acks keep
// this message) for that delivery's outcome: done makes this one a
// duplicate, a release lets it reserve.
func (r *route) reserve(stop context.Context, ev *event) (*lease, error) {
	key := reservationKey(r.cfg.Name, ev.ID)
	me := holder{stream: ev.Stream, seq: ev.Seq, delivered: ev.Delivered}
	var since time.Time // when waiting for another delivery's outcome began
	for {
		ctx, cancel := context.WithTimeout(stop, settleTimeout)
		l, err := r.b.idem.Reserve(ctx, key, me, r.cfg.AckWait.D())
		cancel()
		if !errors.Is(err, errReserved) && !since.IsZero() {
			traceWait(ev, eventReservation, since)
		}
		var dup *DuplicateEventError
		switch {
		case errors.As(err, &dup):
			dup.EventID = ev.ID
			return nil, err
		case !errors.Is(err, errReserved):
			return l, err
		}
		if since.IsZero() {
			since = time.Now()
		}
		if sleep(stop, reservePoll); stop.Err() != nil {
			return nil, fmt.Errorf("%w: %w", ErrInterrupted, err)
		}
	}
}

// alreadyDone reports whether the event's reservation says it was
// delivered. A failed lookup answers false: the message is then
// dead-lettered as it would be without idempotency.
func (r *route) alreadyDone(stop context.Context, ev *event) bool {
	ctx, cancel := context.WithTimeout(stop, settleTimeout)
	defer cancel()
	done, err := r.b.idem.Done(ctx, reservationKey(r.cfg.Name, ev.ID))
	if err != nil {
		msgLog(r.log.Warn(), ev).Str("error", err.Error()).Msg("idempotency lookup failed for a message past max_deliver")
	}
	return done
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

package bridge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/deadletter"
)

// This file is one message's journey through a route, from the worker
// that took it off a pull (pull.go) to its settlement. The stages are the
// methods of delivery, in the order they run:
//
//	receive   parse the event (event.go) and register progress acks
//	budget    past max_deliver: a dead letter (or, with idempotency, a
//	          duplicate of a delivery whose ack was lost)
//	build     the payload of the HTTP request (request.go)
//	reserve   the event id's idempotency reservation (idempotency.go)
//	attempt   the tries through the destination's pipeline (attempt.go),
//	          held while its breaker is open
//	record    the reservation: done after a 2xx, released after a failure
//	settle    decide (decision.go); a dead letter first when needed
//	          (deadletter_store.go); then ack, nak with delay or term
//
// Every path ends in settle, exactly once.

// settleTimeout bounds the JetStream calls that settle a message (a dead
// letter's publish included); ackTimeout bounds one wait for an ack's
// confirmation, of which there are at most ackTries, ackRetryPause apart.
const (
	settleTimeout = 5 * time.Second
	ackTimeout    = 2 * time.Second
	ackTries      = 3
	ackRetryPause = 100 * time.Millisecond
)

// delivery is one JetStream delivery of a message on a route: what the
// stages below know of it, and what they decided. Each worker keeps one
// and reuses it for every message it takes (start).
type delivery struct {
	r  *route
	m  jetstream.Msg
	ev *event
	// invalid is parseEvent's error for an event with an unusable header:
	// the event is usable for its dead letter, not for a request.
	invalid  error
	p        *payload
	lease    atomic.Pointer[lease] // the idempotency reservation, refreshed with progress acks
	progress *progressSlot         // nil when no progress acks run
	tries    int                   // HTTP requests sent
	failure  error                 // what decides the settlement; nil for a 2xx
	// rec is the reservation's done record when record left it to the
	// route's completer (deferred), which stores it before the ack.
	rec      doneRecord
	deferred bool

	// Of an ordered route (ordered_route.go): head is the key's head
	// being delivered (set by its worker); settle sets what it did:
	// action, and kept (for keptFor) when a redelivery is held in the
	// process rather than handed back; dlq is a dead letter's sequence.
	head    *heldMsg
	action  action
	kept    bool
	keptFor time.Duration
	dlq     uint64
}

// handle takes one message from receipt to settlement, on worker w, whose
// delivery d it reuses (no allocation per message). Attempts run on work;
// a message held by an open breaker (or waiting for a reservation) is
// released as soon as stop ends.
func (r *route) handle(stop, work context.Context, d *delivery, m jetstream.Msg, w int) {
	r.load.inFlight.Add(1)
	r.load.gauge.Inc()
	defer func() {
		r.load.inFlight.Add(-1)
		r.load.gauge.Dec()
	}()
	d.start(r, m)
	if !d.receive(w) {
		d.settle() // not a JetStream message: cannot happen on a pull consumer
		return
	}
	// The delivery span (trace.go), ended by settle.
	work = r.b.tr.startDelivery(work, r, m, d.ev)
	if d.failure = d.process(stop, work); d.failure != nil {
		d.failure = &DeliveryError{
			Route: r.cfg.Name, Destination: r.dest.name, Stream: d.ev.Stream,
			Seq: d.ev.Seq, Delivered: d.ev.Delivered, Tries: d.tries, Err: d.failure,
		}
	}
	d.settle()
}

// start makes d the delivery of m on r, forgetting the previous one.
func (d *delivery) start(r *route, m jetstream.Msg) {
	d.r, d.m, d.ev, d.invalid, d.p = r, m, nil, nil, nil
	d.lease.Store(nil)
	d.progress, d.tries, d.failure = nil, 0, nil
	d.rec, d.deferred = doneRecord{}, false
	d.action, d.kept, d.keptFor, d.dlq = 0, false, 0, 0
}

// handBack settles a message the route hands back without working on it
// (it arrived as the route stopped), through settle like any other.
func (r *route) handBack(m jetstream.Msg) {
	d := &delivery{r: r, m: m, failure: ErrInterrupted}
	ev, err := parseEvent(m)
	if ev == nil {
		ev, d.failure = &event{}, err
	}
	d.ev = ev
	d.settle()
}

// receive parses the message, and starts its progress acks on worker w's
// slot. It reports false for a message without JetStream metadata (its
// failure is set, and the event is empty).
func (d *delivery) receive(w int) bool {
	d.ev, d.invalid = d.r.readEvent(d.m)
	if d.ev == nil {
		d.ev, d.failure = &event{}, d.invalid
		return false
	}
	d.progress = d.r.progress(w, d.m, &d.lease)
	return true
}

// process runs the stages from the budget check to the record of the
// reservation, and returns the failure that decides the settlement (nil
// for a 2xx).
func (d *delivery) process(stop, work context.Context) error {
	if d.invalid != nil {
		return d.invalid
	}
	if err := d.budget(stop); err != nil {
		return err
	}
	if err := d.build(); err != nil {
		return err
	}
	if err := d.reserve(stop); err != nil {
		return err
	}
	return d.record(d.attempt(stop, work))
}

// idempotent reports whether the delivery's route reserves event ids.
func (d *delivery) idempotent() bool { return d.r.b.idem != nil && d.r.cfg.Idempotency }

// budget refuses a delivery past max_deliver: the previous delivery was
// the last one allowed and was never settled. If it did deliver (its ack
// was lost), this is a duplicate, not a dead letter.
func (d *delivery) budget(stop context.Context) error {
	if d.ev.Delivered <= uint64(d.r.policy.MaxDeliver) {
		return nil
	}
	if d.idempotent() {
		if err := d.alreadyDone(stop); err != nil {
			return err
		}
	}
	return ErrDeliveriesExhausted
}

// alreadyDone reads the event's reservation for a message past
// max_deliver: a *DuplicateEventError when it says the event was delivered
// with this content, an *EventIDConflictError when it was reserved or
// delivered for another subject or payload, else nil. A failed lookup
// answers nil: the message is then dead-lettered as it would be without
// idempotency.
func (d *delivery) alreadyDone(stop context.Context) error {
	r, ev := d.r, d.ev
	ctx, cancel := context.WithTimeout(stop, settleTimeout)
	defer cancel()
	err := r.b.idem.lookup(ctx, reservationKey(r.cfg.Name, ev.ID), holderOf(ev))
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
		d.conflict(conflict)
		return err
	}
	r.b.m.idempotencyErrors.WithLabelValues(r.cfg.Name).Inc()
	msgLog(r.log.Warn(), ev).Str("error", err.Error()).Msg("idempotency lookup failed for a message past max_deliver")
	return nil
}

// build makes the payload of the HTTP request.
func (d *delivery) build() error {
	p, err := buildPayload(d.ev, d.r.dest)
	d.p = p
	return err
}

// reserve takes the event's idempotency reservation, on a route with
// idempotency. A reservation of the event id for another subject or
// payload, done or still in flight, makes this message an event-id
// conflict at once (an *EventIDConflictError: dead-lettered, nothing sent;
// it does not wait for an in-flight one's outcome). While another message
// with the same event id and content is being delivered, it waits
// (progress acks keep this message) for that delivery's outcome: done
// makes this one a duplicate, a release lets it reserve. While the bucket
// cannot be read or written (an *IdempotencyStoreError: unreachable,
// full), it holds the message the same way and tries again with a growing
// pause: no delivery is spent, the bridge is not ready meanwhile, and
// shutdown hands the message back promptly.
func (d *delivery) reserve(stop context.Context) error {
	if !d.idempotent() {
		return nil
	}
	r, ev := d.r, d.ev
	key := reservationKey(r.cfg.Name, ev.ID)
	me := holderOf(ev)
	var since time.Time                   // when waiting for another delivery's outcome began
	failures := 0                         // store failures in a row
	var paced *backoff.ExponentialBackOff // paces them; made at the first
	for {
		ctx, cancel := context.WithTimeout(stop, settleTimeout)
		l, err := r.b.idem.reserve(ctx, key, me, r.cfg.AckWait.D())
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
			return err
		case errors.As(err, &conflict):
			r.b.storeHealth.succeeded()
			d.conflict(conflict)
			return err
		case err == nil:
			r.b.storeHealth.succeeded()
			d.lease.Store(l)
			return nil
		case stop.Err() != nil:
			return fmt.Errorf("%w: %w", ErrInterrupted, err)
		case errors.Is(err, errReserved):
			r.b.storeHealth.succeeded()
			failures = 0
			if paced != nil {
				paced.Reset()
			}
			if since.IsZero() {
				since = time.Now()
			}
		default:
			failures++
			if paced == nil {
				paced = newRetryBackoff()
			}
			se := &IdempotencyStoreError{Bucket: r.b.cfg.Idempotency.Bucket, Err: err}
			r.b.m.idempotencyErrors.WithLabelValues(r.cfg.Name).Inc()
			r.b.storeHealth.failed(se)
			if failures == 1 {
				msgLog(r.log.Warn(), ev).Str("failure", string(deadletter.FailureIdempotencyStore)).Str("error", se.Error()).
					Msg("idempotency reservation failed: the message is held (no delivery spent) and the reservation tried again until the bucket answers")
			}
			pause = paced.NextBackOff()
		}
		if sleep(stop, pause); stop.Err() != nil {
			if failures > 0 {
				return fmt.Errorf("%w: %w", ErrInterrupted, &IdempotencyStoreError{Bucket: r.b.cfg.Idempotency.Bucket, Err: err})
			}
			return fmt.Errorf("%w: %w", ErrInterrupted, err)
		}
	}
}

// conflict counts and reports an event-id conflict: the message's stream
// sequence, the part that differs and where the record's message is (never
// a payload, subject or header value). The dead-lettering that follows
// logs its own line.
func (d *delivery) conflict(c *EventIDConflictError) {
	r := d.r
	r.b.m.idempotencyConflicts.WithLabelValues(r.cfg.Name, c.Part).Inc()
	msgLog(r.log.Warn(), d.ev).Str("failure", string(deadletter.FailureEventIDConflict)).Str("differs", c.Part).
		Str("record_state", c.State).Str("record_stream", c.Stream).Uint64("record_stream_seq", c.Seq).
		Msg("event id conflict: the event id is already reserved or delivered on this route for another " + c.Part + "; nothing is sent and the message is dead-lettered")
}

// attempt runs attempts through the destination until one is not held by
// the open breaker (the decision says hold). A message held here keeps
// its delivery (progress acks run meanwhile), so an outage alone never
// spends the delivery budget. Holding ends with stop: a held message is
// handed back at once on shutdown. Attempts run on work.
func (d *delivery) attempt(stop, work context.Context) error {
	r, dest := d.r, d.r.dest
	for {
		// The destination's flow control admits the attempt inside its
		// pipeline; waiting there holds the message like an open breaker
		// does (flow.go).
		tries, err := dest.attempt(work, d.p, admission{hold: stop, severity: d.ev.Severity, maxPause: r.policy.MaxRetryAfter})
		d.tries += tries
		if err == nil || r.rules.decide(err, d.ev.Delivered).action != actHold {
			return err
		}
		msgLog(r.log.Debug(), d.ev).Msg("held: circuit breaker open")
		r.load.held.Add(1)
		dest.held.Add(1)
		since := time.Now()
		werr := dest.waitUsable(stop)
		traceWait(d.ev, eventHold, since)
		dest.held.Add(-1)
		r.load.held.Add(-1)
		if werr != nil {
			return fmt.Errorf("%w: %w", ErrInterrupted, err)
		}
	}
}

// record closes the reservation after the attempt: done after a 2xx (before
// the ack, so a lost ack is recognised on redelivery), released after any
// failure (so a failed delivery never consumes the event id). It returns
// failure. The done record is left to the route's completer, which stores
// it and then acks, unless the completer is not running or the connection
// is down: then it is stored here.
func (d *delivery) record(failure error) error {
	l := d.lease.Load()
	if l == nil {
		return failure
	}
	r := d.r
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	if failure != nil {
		if err := r.b.idem.release(ctx, l); err != nil {
			r.b.m.idempotencyErrors.WithLabelValues(r.cfg.Name).Inc()
			msgLog(r.log.Warn(), d.ev).Str("error", err.Error()).Msg("idempotency reservation not released; it expires after ack_wait")
		}
		return failure
	}
	if r.acks.running() && r.b.js.Conn().IsConnected() {
		// Stored by the route's completer, which sends the ack once
		// JetStream has answered (acks.go).
		d.rec, d.deferred = r.b.idem.doneRecord(l), true
		return nil
	}
	if err := r.b.idem.done(ctx, l); err != nil {
		r.b.m.idempotencyErrors.WithLabelValues(r.cfg.Name).Inc()
		msgLog(r.log.Warn(), d.ev).Str("error", err.Error()).Msg("delivered, but not recorded as done: a redelivery would be sent again")
	}
	return nil
}

// settle is the one place where a source message is acked, nak'ed or
// terminated. The decision comes from the route's rules (decision.go) for
// the failure (nil for a 2xx); a dead letter is stored before the message
// is terminated, and when it cannot be stored the failure becomes a
// *DeadLetterError and is decided again (a redelivery), so that the
// message is never dropped. Progress acks are stopped right before the
// settlement is sent: a progress ack after a NakWithDelay would stretch
// its delay to ack_wait. Every settled message is reported once (metrics,
// OnSettle).
func (d *delivery) settle() {
	r, ev, m := d.r, d.ev, d.m
	dec := r.rules.decide(d.failure, ev.Delivered)
	var dlq uint64
	if dec.action == actDeadLetter {
		ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
		seq, err := r.deadLetter(ctx, m.Headers(), m.Data(), ev, dec.reason, d.failure)
		cancel()
		if err != nil {
			d.failure = &DeadLetterError{Reason: dec.reason, Failure: d.failure, Err: err}
			dec = r.rules.decide(d.failure, ev.Delivered)
		}
		dlq = seq
	}
	if d.progress != nil {
		d.progress.stop()
	}
	d.action, d.dlq = dec.action, dlq
	failure, tries := d.failure, d.tries
	out := Settled{
		Route: r.cfg.Name, Destination: r.dest.name, Stream: ev.Stream, Seq: ev.Seq,
		Delivered: ev.Delivered, EventID: ev.ID, Tries: tries, Err: failure,
	}
	var err error
	switch dec.action {
	case actAck:
		out.Outcome = OutcomeDelivered
		if failure != nil { // a duplicate: the only other failure decide acks
			out.Outcome = OutcomeDuplicateSkipped
		}
		// Connected, the ack is confirmed off the worker and reported then
		// (acks.go). Disconnected, ackMsg only buffers it for the
		// reconnect; each of its tries has its own timeout.
		connected := r.b.js.Conn().IsConnected()
		var rec *doneRecord
		if d.deferred {
			rec = &d.rec // the completer stores it before the ack
		}
		if (connected || rec != nil) && r.acks.send(m, ev, out, rec) {
			return
		}
		err = ackMsg(context.Background(), m, connected)
		msgLog(r.log.Debug(), ev).Int("tries", tries).Str("outcome", string(out.Outcome)).Msg("settled")
	case actDeadLetter:
		out.Outcome, out.Reason = OutcomeDeadLettered, dec.reason
		err = m.TermWithReason("jetbridge: " + string(dec.reason))
		e := msgLog(r.log.Warn(), ev).Str("event_id", ev.ID).Str("reason", string(dec.reason)).Int("tries", tries)
		if dlq != 0 {
			e = e.Uint64("dlq_seq", dlq)
		}
		withFailure(e, failure).Msg("dead-lettered")
	default: // redeliver; hold, which attempt resolves, only after a shutdown cut it short
		out.Outcome, out.Delay = OutcomeRedeliveryScheduled, dec.delay
		if d.head != nil && r.ord.keep(d.head) {
			// An ordered route holds its key's head in the process: a
			// delayed redelivery would let the key's next message go first
			// (docs/delivery.md#ordered-delivery).
			d.kept, d.keptFor = true, dec.delay
			withFailure(msgLog(r.log.Info(), ev).Int("tries", tries), failure).Str("delay", dec.delay.String()).
				Msg("redelivery held in the process: the key waits")
			break
		}
		err = m.NakWithDelay(dec.delay)
		var dle *DeadLetterError
		if errors.As(failure, &dle) {
			withFailure(msgLog(r.log.Error(), ev).Str("reason", string(dle.Reason)), failure).Str("delay", dec.delay.String()).
				Msg("dead letter not stored; message left for redelivery")
		} else {
			withFailure(msgLog(r.log.Info(), ev).Int("tries", tries), failure).Str("delay", dec.delay.String()).
				Msg("redelivery scheduled")
		}
	}
	if err != nil {
		// The broker redelivers after ack_wait; with idempotency the second
		// delivery is recognised.
		msgLog(r.log.Warn(), ev).Str("outcome", string(out.Outcome)).Str("error", err.Error()).Msg("settlement not confirmed by JetStream")
	}
	endDelivery(ev, out, dlq)
	r.b.settled(out)
}

// ackMsg acknowledges a message and waits for JetStream's confirmation,
// trying again (at most ackTries times) when none comes: during a stream
// leader change the first ack can go unanswered, and an ack that is never
// confirmed means a duplicate delivery after ack_wait. Disconnected, it
// only buffers the ack for the reconnect instead of holding the message's
// slot until a timeout.
func ackMsg(ctx context.Context, m jetstream.Msg, connected bool) error {
	if !connected {
		return m.Ack()
	}
	var err error
	for try := 1; try <= ackTries; try++ {
		actx, cancel := context.WithTimeout(ctx, ackTimeout)
		err = m.DoubleAck(actx)
		cancel()
		if err == nil || errors.Is(err, jetstream.ErrMsgAlreadyAckd) || ctx.Err() != nil {
			return err
		}
		if try < ackTries {
			sleep(ctx, ackRetryPause)
		}
	}
	return err
}

// msgLog adds the message's stream sequence and delivery count to a log
// event. No logger is built per message: at a level the logger hides, e is
// nil and this and every later field call cost nothing.
func msgLog(e *zerolog.Event, ev *event) *zerolog.Event {
	return traceLog(e.Uint64("stream_seq", ev.Seq).Uint64("delivered", ev.Delivered), ev)
}

// withFailure adds what is known of a failure to a log event: its kind,
// its HTTP status when there is one, and the cause of a transport failure
// (connection refused, timeout, tls certificate not trusted...). None of
// them carries a URL, header value or body.
func withFailure(e *zerolog.Event, failure error) *zerolog.Event {
	if e == nil || failure == nil {
		return e
	}
	if kind := FailureKind(failure); kind != "" {
		e = e.Str("failure", string(kind))
	}
	if st := statusOf(failure); st != 0 {
		e = e.Int("status", st)
	}
	var te *TransportError
	if errors.As(failure, &te) {
		e = e.Str("cause", te.Kind)
	}
	return e
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

// progress registers m in worker w's slot; the slot's stop must be called
// before the message is settled.
func (r *route) progress(w int, m jetstream.Msg, held *atomic.Pointer[lease]) *progressSlot {
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
			if r.ord != nil {
				r.ord.keepHeld(now, every) // every message an ordered route holds
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

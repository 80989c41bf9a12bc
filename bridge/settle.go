package bridge

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// settleTimeout bounds the JetStream calls that settle a message (a dead
// letter's publish included); ackTimeout bounds one wait for an ack's
// confirmation, of which there are at most ackTries, ackRetryPause apart.
const (
	settleTimeout = 5 * time.Second
	ackTimeout    = 2 * time.Second
	ackTries      = 3
	ackRetryPause = 100 * time.Millisecond
)

// settle is the one place where a source message is acked, nak'ed or
// terminated. The decision comes from the bridge's decide part (Decide)
// for the failure (nil for a 2xx); a dead letter is stored before the
// message is terminated, and when it cannot be stored the failure becomes
// a *DeadLetterError and is decided again (a redelivery), so that the
// message is never dropped. progress (nil when none runs) is stopped
// right before the settlement is sent: a progress ack after a NakWithDelay
// would stretch its delay to ack_wait. Every settled message is reported
// once (metrics, OnSettle).
func (r *route) settle(m jetstream.Msg, ev *event, failure error, tries int, progress stopper) {
	decide := r.b.parts.decide
	d := decide(failure, ev.Delivered, r.policy)
	var dlq uint64
	if d.Action == DeadLetter {
		ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
		seq, err := r.deadLetter(ctx, m.Headers(), m.Data(), ev, d.Reason, failure)
		cancel()
		if err != nil {
			failure = &DeadLetterError{Reason: d.Reason, Failure: failure, Err: err}
			d = decide(failure, ev.Delivered, r.policy)
		}
		dlq = seq
	}
	if progress != nil {
		progress.stop()
	}
	out := Settled{
		Route: r.cfg.Name, Destination: r.dest.name, Stream: ev.Stream, Seq: ev.Seq,
		Delivered: ev.Delivered, EventID: ev.ID, Tries: tries, Err: failure,
	}
	var err error
	switch d.Action {
	case Ack:
		out.Outcome = OutcomeDelivered
		if failure != nil { // a duplicate: the only other failure Decide acks
			out.Outcome = OutcomeDuplicateSkipped
		}
		// Each of ackMsg's tries has its own timeout.
		err = r.b.parts.ack(context.Background(), m, r.b.js.Conn().IsConnected())
		msgLog(r.log.Debug(), ev).Int("tries", tries).Str("outcome", out.Outcome).Msg("settled")
	case DeadLetter:
		out.Outcome, out.Reason = OutcomeDeadLettered, d.Reason
		err = m.TermWithReason("jetbridge: " + string(d.Reason))
		e := msgLog(r.log.Warn(), ev).Str("event_id", ev.ID).Str("reason", string(d.Reason)).Int("tries", tries)
		if dlq != 0 {
			e = e.Uint64("dlq_seq", dlq)
		}
		withFailure(e, failure).Msg("dead-lettered")
	default: // Redeliver; Hold, which deliver resolves, only after a shutdown cut it short
		out.Outcome, out.Delay = OutcomeRedeliveryScheduled, d.Delay
		err = m.NakWithDelay(d.Delay)
		var dle *DeadLetterError
		if errors.As(failure, &dle) {
			withFailure(msgLog(r.log.Error(), ev).Str("reason", string(dle.Reason)), failure).Str("delay", d.Delay.String()).
				Msg("dead letter not stored; message left for redelivery")
		} else {
			withFailure(msgLog(r.log.Info(), ev).Int("tries", tries), failure).Str("delay", d.Delay.String()).
				Msg("redelivery scheduled")
		}
	}
	if err != nil {
		// The broker redelivers after ack_wait; with idempotency the second
		// delivery is recognised.
		msgLog(r.log.Warn(), ev).Str("outcome", out.Outcome).Str("error", err.Error()).Msg("settlement not confirmed by JetStream")
	}
	endDelivery(ev, out, dlq)
	r.b.settled(out)
}

// settleUntouched settles a message the route hands back without working
// on it (it arrived as the route stopped), through settle like any other.
func (r *route) settleUntouched(m jetstream.Msg, failure error) {
	ev, err := parseEvent(m)
	if ev == nil {
		ev, failure = &event{}, err
	}
	r.settle(m, ev, failure, 0, nil)
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

func statusOf(err error) int {
	var de *DownstreamError
	if errors.As(err, &de) {
		return de.Status
	}
	return 0
}

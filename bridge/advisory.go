package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/config"
)

// The max-deliveries safety net. When a message's server-side MaxDeliver
// (max_deliver + 1) runs out without a settlement (the bridge died during
// its last deliveries, or could not store the dead letter), JetStream stops
// redelivering it and only publishes a MAX_DELIVERIES advisory. The bridge
// keeps those advisories in a small work-queue stream of its own, so that
// none is lost while no bridge runs, and dead-letters the message each one
// names (read back from the source stream by sequence). Every replica
// shares one durable consumer on that stream; a dead letter's Nats-Msg-Id
// makes a repeated one harmless.

const (
	maxDeliveriesPrefix = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."
	advisoryConsumer    = "jetbridge"
	advisoryRetry       = 5 * time.Second
)

// ErrGivenUp is the failure recorded for a message JetStream stopped
// redelivering (its MAX_DELIVERIES advisory).
var ErrGivenUp = errors.New("JetStream stopped redelivering: max deliveries reached without a settlement")

// AdvisoryStreamName is the stream that keeps the MAX_DELIVERIES advisories.
func AdvisoryStreamName(dl config.DeadLetter) string { return dl.Stream + "_ADVISORIES" }

func advisoryStreamConfig(dl config.DeadLetter, source string) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        AdvisoryStreamName(dl),
		Description: "jetbridge: MAX_DELIVERIES advisories of " + source + " consumers",
		Subjects:    []string{maxDeliveriesPrefix + source + ".*"},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		MaxAge:      dl.MaxAge.D(),
		Replicas:    dl.Replicas,
	}
}

// maxDeliveriesAdvisory is the part of the advisory the bridge reads.
type maxDeliveriesAdvisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

// advisories processes the stored advisories until ctx ends.
func (b *Bridge) advisories(ctx context.Context, cons jetstream.Consumer) {
	log := b.log.With().Str("component", "max-deliveries").Logger()
	failures := 0
	for ctx.Err() == nil {
		fctx, cancel := context.WithTimeout(ctx, fetchWait)
		batch, err := cons.Fetch(16, jetstream.FetchContext(fctx))
		if err != nil {
			cancel()
			failures++
			log.Warn().Int("failures", failures).Str("error", err.Error()).Msg("advisory fetch failed")
			sleep(ctx, retryPause(failures))
			continue
		}
		for m := range batch.Messages() {
			b.handleAdvisory(m, log)
		}
		cancel()
		failures = 0
	}
}

func (b *Bridge) handleAdvisory(m jetstream.Msg, log zerolog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	var adv maxDeliveriesAdvisory
	if err := json.Unmarshal(m.Data(), &adv); err != nil || adv.StreamSeq == 0 {
		log.Warn().Msg("unreadable MAX_DELIVERIES advisory dropped")
		_ = m.Ack()
		return
	}
	var r *route
	for _, rt := range b.routes {
		if rt.cfg.Name == adv.Consumer {
			r = rt
		}
	}
	if r == nil || adv.Stream != b.cfg.Stream.Name {
		if b.isBridgeConsumer(ctx, adv) {
			// A route this replica does not know (a rolling deploy added
			// it): leave the advisory to a replica that does.
			log.Warn().Str("consumer", adv.Consumer).Msg("MAX_DELIVERIES advisory for a route this replica does not run; left for another replica")
			_ = m.NakWithDelay(advisoryRetry)
			return
		}
		_ = m.Ack() // a consumer of the stream that is not jetbridge's
		return
	}
	log = log.With().Str("route", r.cfg.Name).Uint64("stream_seq", adv.StreamSeq).Uint64("delivered", adv.Deliveries).Logger()
	err := b.deadLetterGivenUp(ctx, r, adv)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		log.Warn().Msg("message named by a MAX_DELIVERIES advisory is no longer in the stream")
		_ = m.Ack()
		return
	}
	if err != nil {
		log.Error().Str("error", err.Error()).Msg("dead letter not stored; advisory kept for a retry")
		_ = m.NakWithDelay(advisoryRetry)
		return
	}
	log.Warn().Str("reason", ReasonMaxDeliveries).Msg("dead-lettered after JetStream gave up redelivering")
	_ = m.DoubleAck(ctx)
	b.settled(Settled{Route: r.cfg.Name, Destination: r.dest.name, Stream: adv.Stream, Seq: adv.StreamSeq,
		Delivered: adv.Deliveries, Outcome: OutcomeDeadLettered, Reason: ReasonMaxDeliveries, Err: ErrGivenUp})
}

// isBridgeConsumer reports whether the advisory's consumer is a jetbridge
// route (its description says so), whether or not this replica runs it.
func (b *Bridge) isBridgeConsumer(ctx context.Context, adv maxDeliveriesAdvisory) bool {
	c, err := b.js.Consumer(ctx, adv.Stream, adv.Consumer)
	if err != nil {
		return false
	}
	return strings.HasPrefix(c.CachedInfo().Config.Description, "jetbridge route ")
}

// deadLetterGivenUp reads the message back from the source stream and
// stores its dead letter.
func (b *Bridge) deadLetterGivenUp(ctx context.Context, r *route, adv maxDeliveriesAdvisory) error {
	stream, err := b.js.Stream(ctx, adv.Stream)
	if err != nil {
		return fmt.Errorf("bridge: stream %s: %w", adv.Stream, err)
	}
	raw, err := stream.GetMsg(ctx, adv.StreamSeq)
	if err != nil {
		return err
	}
	ev := &event{
		ID:        eventID(raw.Header, adv.Stream, adv.StreamSeq),
		Subject:   raw.Subject,
		Stream:    adv.Stream,
		Seq:       adv.StreamSeq,
		Delivered: adv.Deliveries,
	}
	return r.deadLetter(ctx, raw.Header, raw.Data, ev, ReasonMaxDeliveries, ErrGivenUp)
}

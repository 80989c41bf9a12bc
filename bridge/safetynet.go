package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/throttle"
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
//
// The advisory stream is untrusted input: an advisory is size-bounded,
// validated, and must agree with the subject it was stored under before
// anything acts on it. A failure is classified (see
// docs/delivery.md#the-max-deliveries-safety-net):
//   - permanent (retrying can never help: the advisory is unreadable or
//     names another stream, the route's consumer no longer exists, the
//     message is gone, or the dead letter is refused even without its
//     payload): logged once at error level with the stream sequence, counted
//     in bridge_safety_net_failures_total{reason}, and the advisory is acked.
//     The message itself, if still there, stays in the source stream.
//   - transient (NATS unavailable, a timeout): the advisory is nak'ed with a
//     delay that grows with its delivery count (kept by the server, so it
//     survives restarts) from 5 s to 5 min, and logged on its first delivery
//     and every transientLogEvery-th after (at the 5 min cap, once an hour).
// An advisory for a jetbridge route that this replica does not run (a
// rolling deploy) is left for another replica with the same growing delay,
// and logged once per consumer name.

const (
	maxDeliveriesPrefix = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."
	advisoryConsumer    = "jetbridge"
	// maxAdvisoryBytes bounds the JSON read: real advisories are under 1 KiB.
	maxAdvisoryBytes = 64 << 10
	// maxNameLen bounds the stream and consumer names an advisory may carry.
	maxNameLen = 255
	// transientLogEvery: a transient failure is logged on the advisory's
	// first delivery and every transientLogEvery-th one after. Deliveries 1
	// to 12 span about 30 minutes; at the 5 min cap, 12 are an hour.
	transientLogEvery = 12
	// fetchLogEvery is the most often a failed advisory fetch is logged.
	fetchLogEvery = time.Minute
	// routeDescPrefix marks a consumer as a jetbridge route (see consumerConfig).
	routeDescPrefix = "jetbridge route "
	// maxNotRunLogged bounds the set of consumer names already logged as run
	// by another replica.
	maxNotRunLogged = 1024
)

// advisoryRetry is the schedule of an advisory's retries: 5 s, doubling
// with every delivery of the advisory, up to 5 min (see advisoryBackoff).
func advisoryRetry() *backoff.ExponentialBackOff {
	return &backoff.ExponentialBackOff{InitialInterval: 5 * time.Second, Multiplier: 2, MaxInterval: 5 * time.Minute}
}

// safetyNetReason is why the safety net gave up on an advisory: the reason
// label of bridge_safety_net_failures_total.
type safetyNetReason string

// The safety-net failure reasons.
const (
	safetyNetInvalidAdvisory   safetyNetReason = "invalid-advisory"    // oversized, not JSON, or fields missing, malformed or inconsistent with its subject
	safetyNetForeignStream     safetyNetReason = "foreign-stream"      // names a stream that is not stream.name
	safetyNetConsumerGone      safetyNetReason = "consumer-gone"       // names a route this replica does not run whose consumer no longer exists
	safetyNetMessageGone       safetyNetReason = "message-gone"        // the message is no longer in the source stream
	safetyNetDeadLetterRefused safetyNetReason = "dead-letter-refused" // refused for size or format even without payload and original headers
)

// safetyNetReasons are every safetyNetReason, in the order the metric's
// help lists them.
var safetyNetReasons = []safetyNetReason{safetyNetInvalidAdvisory, safetyNetForeignStream, safetyNetConsumerGone,
	safetyNetMessageGone, safetyNetDeadLetterRefused}

// advisoryStreamName is the stream that keeps the MAX_DELIVERIES advisories.
func advisoryStreamName(dl config.DeadLetter) string { return dl.Stream + "_ADVISORIES" }

func advisoryStreamConfig(dl config.DeadLetter, source string) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        advisoryStreamName(dl),
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

// parseAdvisory reads and validates an advisory stored under subject. Its
// errors match errInvalidAdvisory and never quote the advisory.
func parseAdvisory(subject string, data []byte) (maxDeliveriesAdvisory, error) {
	var adv maxDeliveriesAdvisory
	if len(data) > maxAdvisoryBytes {
		return adv, fmt.Errorf("%w: %d bytes, more than %d", errInvalidAdvisory, len(data), maxAdvisoryBytes)
	}
	if err := json.Unmarshal(data, &adv); err != nil {
		return adv, fmt.Errorf("%w: not a JSON advisory", errInvalidAdvisory)
	}
	switch {
	case adv.StreamSeq == 0:
		return adv, fmt.Errorf("%w: no stream_seq", errInvalidAdvisory)
	case !validName(adv.Stream):
		return adv, fmt.Errorf("%w: missing or malformed stream name", errInvalidAdvisory)
	case !validName(adv.Consumer):
		return adv, fmt.Errorf("%w: missing or malformed consumer name", errInvalidAdvisory)
	case subject != maxDeliveriesPrefix+adv.Stream+"."+adv.Consumer:
		return adv, fmt.Errorf("%w: stream and consumer do not match the advisory's subject", errInvalidAdvisory)
	}
	return adv, nil
}

// validName reports whether s can be a JetStream stream or consumer name:
// 1 to maxNameLen bytes, no whitespace, control characters, '.', '*', '>'
// or path separators.
func validName(s string) bool {
	if s == "" || len(s) > maxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c <= ' ' || c == 0x7f, c == '.', c == '*', c == '>', c == '/', c == '\\':
			return false
		}
	}
	return true
}

// advisoryVerdict is what the safety net does after a failure.
type advisoryVerdict struct {
	reason safetyNetReason // permanent: why; empty: transient
	delay  time.Duration   // transient: the NakWithDelay delay
	log    bool            // transient: log this retry
}

// classifyAdvisoryFailure decides permanent or transient for a failure of
// an advisory delivered for the delivered-th time: every failure retrying
// can never cure is permanent; anything else (NATS unavailable, a timeout,
// a stream leader election) is transient and retried after
// advisoryBackoff.
func classifyAdvisoryFailure(err error, delivered uint64) advisoryVerdict {
	switch {
	case errors.Is(err, errInvalidAdvisory):
		return advisoryVerdict{reason: safetyNetInvalidAdvisory}
	case errors.Is(err, errForeignStream):
		return advisoryVerdict{reason: safetyNetForeignStream}
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		return advisoryVerdict{reason: safetyNetConsumerGone}
	case errors.Is(err, jetstream.ErrMsgNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		return advisoryVerdict{reason: safetyNetMessageGone}
	case errors.Is(err, ErrDeadLetterRefused):
		return advisoryVerdict{reason: safetyNetDeadLetterRefused}
	}
	return advisoryVerdict{delay: advisoryBackoff(delivered), log: delivered <= 1 || delivered%transientLogEvery == 0}
}

// advisoryBackoff is the retry delay of an advisory delivered n times: the
// n-th delay of advisoryRetry. The server keeps n (the advisory's delivery
// count), so the delay keeps growing across restarts.
func advisoryBackoff(n uint64) time.Duration { return nthBackOff(advisoryRetry(), n) }

// nthBackOff is the n-th delay (1-based; 0 counts as 1) of b without
// randomization: what its n-th NextBackOff after a Reset returns (b is
// reset, and its RandomizationFactor set to 0). It stops early once the
// delays stop growing (the cap, or a multiplier of 1), so any n is cheap.
func nthBackOff(b *backoff.ExponentialBackOff, n uint64) time.Duration {
	b.RandomizationFactor = 0
	b.Reset()
	d := b.NextBackOff()
	for i := uint64(1); i < n; i++ {
		next := b.NextBackOff()
		if next == d { // its state is the delay alone: a fixed point stays
			break
		}
		d = next
	}
	return d
}

// safetyNet is the state of the advisory loop; one goroutine owns it.
type safetyNet struct {
	b      *Bridge
	log    zerolog.Logger
	notRun map[string]struct{} // consumers already logged as run by another replica
	fetch  *throttle.Log       // failed fetches
}

// advisories processes the stored advisories until ctx ends.
func (b *Bridge) advisories(ctx context.Context) {
	cons := b.advisoryCons
	n := &safetyNet{
		b:      b,
		log:    b.log.With().Str("component", "max-deliveries").Logger(),
		notRun: make(map[string]struct{}),
		fetch:  &throttle.Log{Interval: fetchLogEvery},
	}
	pause := newRetryBackoff()
	failures := 0
	for ctx.Err() == nil {
		fctx, cancel := context.WithTimeout(ctx, fetchWait)
		batch, err := cons.Fetch(16, jetstream.FetchContext(fctx))
		if err != nil {
			cancel()
			failures++
			n.fetch.Do("", func(_, suppressed int) {
				n.log.Warn().Int("failures", failures).Int("suppressed", suppressed).Str("error", err.Error()).
					Msg("advisory fetch failed")
			})
			sleep(ctx, pause.NextBackOff())
			continue
		}
		for m := range batch.Messages() {
			n.handle(m)
		}
		cancel()
		failures = 0
		pause.Reset()
	}
}

// handle processes one advisory and settles it.
func (n *safetyNet) handle(m jetstream.Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	b := n.b
	log := n.log
	delivered := uint64(1)
	if md, err := m.Metadata(); err == nil {
		delivered = max(md.NumDelivered, 1)
		log = log.With().Uint64("advisory_seq", md.Sequence.Stream).Logger()
	}
	adv, err := parseAdvisory(m.Subject(), m.Data())
	if err != nil {
		n.failed(ctx, m, err, delivered, log)
		return
	}
	log = log.With().Str("consumer", adv.Consumer).Uint64("stream_seq", adv.StreamSeq).Logger()
	if adv.Stream != b.cfg.Stream.Name {
		n.failed(ctx, m, errForeignStream, delivered, log)
		return
	}
	r := b.routeNamed(adv.Consumer)
	if r == nil {
		n.notOurs(ctx, m, adv, delivered, log)
		return
	}
	log = log.With().Str("route", r.cfg.Name).Uint64("delivered", adv.Deliveries).Logger()
	if err := b.deadLetterGivenUp(ctx, r, adv); err != nil {
		n.failed(ctx, m, err, delivered, log)
		return
	}
	log.Warn().Str("reason", string(deadletter.ReasonMaxDeliveries)).Msg("dead-lettered after JetStream gave up redelivering")
	_ = m.DoubleAck(ctx)
	b.settled(Settled{Route: r.cfg.Name, Destination: r.dest.name, Stream: adv.Stream, Seq: adv.StreamSeq,
		Delivered: adv.Deliveries, Outcome: OutcomeDeadLettered, Reason: deadletter.ReasonMaxDeliveries, Err: ErrGivenUp})
}

// notOurs handles an advisory for a consumer this replica does not run: a
// jetbridge route run by another replica (a rolling deploy added it) is
// left for that replica; a consumer that no longer exists is a permanent
// failure; a consumer that is not jetbridge's is none of our business.
func (n *safetyNet) notOurs(ctx context.Context, m jetstream.Msg, adv maxDeliveriesAdvisory, delivered uint64, log zerolog.Logger) {
	c, err := n.b.js.Consumer(ctx, adv.Stream, adv.Consumer)
	if err != nil {
		n.failed(ctx, m, err, delivered, log)
		return
	}
	if !strings.HasPrefix(c.CachedInfo().Config.Description, routeDescPrefix) {
		log.Debug().Msg("MAX_DELIVERIES advisory of a consumer that is not jetbridge's; dropped")
		_ = m.Ack()
		return
	}
	delay := advisoryBackoff(delivered)
	if _, seen := n.notRun[adv.Consumer]; !seen {
		if len(n.notRun) >= maxNotRunLogged {
			clear(n.notRun)
		}
		n.notRun[adv.Consumer] = struct{}{}
		log.Warn().Str("retry_in", delay.String()).
			Msg("MAX_DELIVERIES advisory for a jetbridge route this replica does not run; left for another replica (logged once per consumer)")
	} else {
		log.Debug().Str("retry_in", delay.String()).Msg("MAX_DELIVERIES advisory left for another replica")
	}
	_ = m.NakWithDelay(delay)
}

// failed settles an advisory whose processing failed, as the classifier
// says: a permanent failure is logged once, counted and acked; a transient
// one is nak'ed with a growing delay and logged at a falling rate.
func (n *safetyNet) failed(ctx context.Context, m jetstream.Msg, err error, delivered uint64, log zerolog.Logger) {
	v := classifyAdvisoryFailure(err, delivered)
	if v.reason != "" {
		n.b.m.safetyNet.WithLabelValues(string(v.reason)).Inc()
		log.Error().Str("reason", string(v.reason)).Str("error", err.Error()).
			Msg("safety net: permanent failure, advisory dropped; the message (if any) stays in the source stream at stream_seq")
		_ = m.DoubleAck(ctx)
		return
	}
	if v.log {
		log.Warn().Str("error", err.Error()).Uint64("advisory_deliveries", delivered).Str("retry_in", v.delay.String()).
			Msg("safety net: dead letter not stored yet; advisory kept for a retry")
	} else {
		log.Debug().Str("error", err.Error()).Uint64("advisory_deliveries", delivered).Str("retry_in", v.delay.String()).
			Msg("safety net: still failing; advisory kept for a retry")
	}
	_ = m.NakWithDelay(v.delay)
}

// routeNamed is the route this replica runs under that name, or nil.
func (b *Bridge) routeNamed(name string) *route {
	b.mu.RLock()
	defer b.mu.RUnlock()
	for _, r := range b.routes {
		if r.cfg.Name == name {
			return r
		}
	}
	return nil
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
	_, err = r.deadLetter(ctx, raw.Header, raw.Data, ev, deadletter.ReasonMaxDeliveries, ErrGivenUp)
	return err
}

package bridge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/config"
)

// provisionTimeout bounds each JetStream API call made while provisioning.
const provisionTimeout = 10 * time.Second

// Provision creates or updates the source stream (unless stream.create is
// false, in which case it must exist and is never changed), the dead-letter
// stream, the stream that keeps MAX_DELIVERIES advisories (see
// safetynet.go), the idempotency bucket (when a route uses it) and one
// durable pull consumer per route. Every call is idempotent,
// so several bridges may provision at the same moment.
func (b *Bridge) Provision(ctx context.Context) error {
	sc := b.cfg.Stream
	if sc.Create {
		if err := apiCall(ctx, func(ctx context.Context) error {
			return ensureStream(ctx, b.js, sourceStreamConfig(sc))
		}); err != nil {
			return fmt.Errorf("bridge: stream %s: %w", sc.Name, err)
		}
	} else if err := apiCall(ctx, func(ctx context.Context) error {
		_, err := b.js.Stream(ctx, sc.Name)
		return err
	}); err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("bridge: stream %s does not exist and stream.create is false", sc.Name)
		}
		return fmt.Errorf("bridge: stream %s: %w", sc.Name, err)
	}
	if err := apiCall(ctx, func(ctx context.Context) error {
		return ensureStream(ctx, b.js, deadLetterStreamConfig(b.cfg.DeadLetter))
	}); err != nil {
		return fmt.Errorf("bridge: dead-letter stream %s: %w", b.cfg.DeadLetter.Stream, err)
	}
	if err := apiCall(ctx, func(ctx context.Context) error {
		if err := ensureStream(ctx, b.js, advisoryStreamConfig(b.cfg.DeadLetter, sc.Name)); err != nil {
			return err
		}
		cons, err := b.js.CreateOrUpdateConsumer(ctx, AdvisoryStreamName(b.cfg.DeadLetter), jetstream.ConsumerConfig{
			Durable:     advisoryConsumer,
			Description: "jetbridge: dead-letters what JetStream gave up on",
			AckPolicy:   jetstream.AckExplicitPolicy,
			AckWait:     30 * time.Second,
		})
		b.advisoryCons = cons
		return err
	}); err != nil {
		return fmt.Errorf("bridge: advisory stream %s: %w", AdvisoryStreamName(b.cfg.DeadLetter), err)
	}
	if b.needsIdempotency() {
		var kv jetstream.KeyValue
		if err := apiCall(ctx, func(ctx context.Context) error {
			var err error
			kv, err = b.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
				Bucket:      b.cfg.Idempotency.Bucket,
				Description: "jetbridge delivered event ids",
				TTL:         b.cfg.Idempotency.TTL.D(),
				History:     1,
				Storage:     jetstream.FileStorage,
				Replicas:    sc.Replicas,
			})
			return err
		}); err != nil {
			return fmt.Errorf("bridge: idempotency bucket %s: %w", b.cfg.Idempotency.Bucket, err)
		}
		b.idem = b.parts.reservations(kv)
	}
	for _, r := range b.routes {
		if err := apiCall(ctx, r.bindConsumer); err != nil {
			return fmt.Errorf("bridge: route %s: consumer: %w", r.cfg.Name, err)
		}
	}
	return nil
}

// ensureStream creates the stream, or updates it when a setting the bridge
// owns differs. A stream that already matches is left alone: besides
// sparing a write, this keeps replicas starting together from updating a
// stream while another one creates its consumer on it, a combination on
// which nats-server v2.15 has a data race (fileStore.UpdateConfig against
// fileStore.ConsumerStore).
func ensureStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig) error {
	s, err := js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		// Not CreateOrUpdateStream, which tries an update first: a replica
		// whose update lands just after another one's create would update
		// the stream as that one creates its consumer. Creating with the
		// same configuration as an existing stream is a no-op.
		if _, err = js.CreateStream(ctx, want); !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return err
		}
		s, err = js.Stream(ctx, want.Name)
	}
	if err != nil {
		return err
	}
	if streamMatches(s.CachedInfo().Config, want) {
		return nil
	}
	_, err = js.UpdateStream(ctx, want)
	return err
}

// streamMatches reports whether have already carries every setting of want
// that the bridge sets (the server fills in the others).
func streamMatches(have, want jetstream.StreamConfig) bool {
	dup := want.Duplicates
	if dup == 0 {
		dup = 2 * time.Minute // the server's default window
	}
	return have.Description == want.Description &&
		slices.Equal(have.Subjects, want.Subjects) &&
		have.Storage == want.Storage &&
		have.Retention == want.Retention &&
		have.MaxAge == want.MaxAge &&
		have.Duplicates == dup &&
		max(have.Replicas, 1) == max(want.Replicas, 1) &&
		!have.Sealed
}

func (b *Bridge) needsIdempotency() bool {
	if b.cfg.Idempotency.Bucket == "" {
		return false
	}
	for _, r := range b.routes {
		if r.cfg.Idempotency {
			return true
		}
	}
	return false
}

func apiCall(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, provisionTimeout)
	defer cancel()
	return f(ctx)
}

func sourceStreamConfig(sc config.Stream) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:       sc.Name,
		Subjects:   sc.Subjects,
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.LimitsPolicy,
		Duplicates: sc.DuplicateWindow.D(),
		MaxAge:     sc.MaxAge.D(),
		Replicas:   sc.Replicas,
	}
}

func deadLetterStreamConfig(dc config.DeadLetter) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        dc.Stream,
		Description: "jetbridge dead letters",
		Subjects:    []string{dc.SubjectPrefix + ".>"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      dc.MaxAge.D(),
		// Dead letters carry Nats-Msg-Id dlq:<route>:<stream>:<seq>, so a
		// dead-lettering retried within this window stores one copy.
		Duplicates: min(2*time.Minute, dc.MaxAge.D()),
		Replicas:   dc.Replicas,
	}
}

// consumerConfig is deterministic in the route's configuration: replicas
// with the same configuration write the same consumer.
func consumerConfig(rc *config.Route) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        rc.Name,
		Description:    "jetbridge route " + rc.Name,
		FilterSubjects: rc.Subjects,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        rc.AckWait.D(),
		// One above the bridge's own limit: a crash during the final
		// attempt still yields one more delivery, which the bridge
		// dead-letters. No BackOff: redelivery delays come from
		// NakWithDelay alone (the two together inflate delays).
		MaxDeliver: rc.MaxDeliver + 1,
		// Nak-delayed messages hold ack-pending slots; leave room for them
		// beyond what replicas have in flight.
		MaxAckPending: max(1000, 4*rc.MaxInFlight),
	}
}

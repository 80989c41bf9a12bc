package bridge

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
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
			return ensureStream(ctx, b.js, sourceStreamConfig(sc), b.warnDiffers)
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
		return ensureStream(ctx, b.js, deadLetterStreamConfig(b.cfg.DeadLetter), b.warnDiffers)
	}); err != nil {
		return fmt.Errorf("bridge: dead-letter stream %s: %w", b.cfg.DeadLetter.Stream, err)
	}
	if err := apiCall(ctx, func(ctx context.Context) error {
		if err := ensureStream(ctx, b.js, advisoryStreamConfig(b.cfg.DeadLetter, sc.Name), b.warnDiffers); err != nil {
			return err
		}
		cons, err := b.js.CreateOrUpdateConsumer(ctx, advisoryStreamName(b.cfg.DeadLetter), jetstream.ConsumerConfig{
			Durable:     advisoryConsumer,
			Description: "jetbridge: dead-letters what JetStream gave up on",
			AckPolicy:   jetstream.AckExplicitPolicy,
			AckWait:     30 * time.Second,
		})
		b.advisoryCons = cons
		return err
	}); err != nil {
		return fmt.Errorf("bridge: advisory stream %s: %w", advisoryStreamName(b.cfg.DeadLetter), err)
	}
	if b.needsIdempotency() {
		var kv jetstream.KeyValue
		if err := apiCall(ctx, func(ctx context.Context) error {
			var err error
			kv, err = ensureBucket(ctx, b.js, jetstream.KeyValueConfig{
				Bucket:      b.cfg.Idempotency.Bucket,
				Description: "jetbridge delivered event ids",
				TTL:         b.cfg.Idempotency.TTL.D(),
				History:     1,
				Storage:     jetstream.FileStorage,
				Replicas:    sc.Replicas,
			}, b.warnDiffers)
			return err
		}); err != nil {
			return fmt.Errorf("bridge: idempotency bucket %s: %w", b.cfg.Idempotency.Bucket, err)
		}
		b.idem = newReservations(kv)
	}
	if needsFleet(b.cfg) {
		if err := b.provisionFleet(ctx); err != nil {
			return err
		}
	}
	for _, r := range b.liveRoutes() {
		if err := apiCall(ctx, r.bindConsumer); err != nil {
			return fmt.Errorf("bridge: route %s: consumer: %w", r.cfg.Name, err)
		}
	}
	return nil
}

// ensureStream creates the stream, or updates the settings the bridge owns
// (subjects, max age, duplicate window, replicas, description) when they
// differ. Every other setting of an existing stream is the operator's and
// is kept as it is: limits such as max_bytes, max_msgs, max_msg_size and
// discard are never removed or loosened
// (docs/deploy.md#what-provisioning-changes). Storage and retention cannot be changed on an existing stream:
// a difference is reported through warn and left alone.
//
// A stream that already matches is left alone: besides sparing a write,
// this keeps replicas starting together from updating a stream while
// another one creates its consumer on it, a combination on which
// nats-server v2.15 has a data race (fileStore.UpdateConfig against
// fileStore.ConsumerStore).
func ensureStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig, warn func(what, key, have, want string)) error {
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
	have := s.CachedInfo().Config
	if have.Storage != want.Storage {
		warn("stream "+want.Name, "storage", have.Storage.String(), want.Storage.String())
	}
	if have.Retention != want.Retention {
		warn("stream "+want.Name, "retention", have.Retention.String(), want.Retention.String())
	}
	if streamMatches(have, want) {
		return nil
	}
	upd := have
	upd.Description = want.Description
	upd.Subjects = want.Subjects
	upd.MaxAge = want.MaxAge
	upd.Duplicates = want.Duplicates
	upd.Replicas = want.Replicas
	upd.Sealed = want.Sealed
	_, err = js.UpdateStream(ctx, upd)
	return err
}

// ensureBucket opens the key-value bucket, or creates it with want when it
// does not exist. Of an existing bucket the bridge applies only the TTL the
// configuration states (the max age of its stream, and the duplicate
// window that goes with it); every other setting, such as a max_bytes or a
// max value size an operator set, is kept. A different history or storage
// is reported through warn.
func ensureBucket(ctx context.Context, js jetstream.JetStream, want jetstream.KeyValueConfig, warn func(what, key, have, want string)) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, want.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, want)
		if errors.Is(err, jetstream.ErrBucketExists) { // another replica created it meanwhile
			kv, err = js.KeyValue(ctx, want.Bucket)
		}
	}
	if err != nil {
		return nil, err
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, err
	}
	what := "idempotency bucket " + want.Bucket
	if have := st.Config().Storage; have != want.Storage {
		warn(what, "storage", have.String(), want.Storage.String())
	}
	if st.History() != int64(want.History) {
		warn(what, "history", strconv.FormatInt(st.History(), 10), strconv.Itoa(int(want.History)))
	}
	if st.TTL() == want.TTL {
		return kv, nil
	}
	// The bucket's stream, as nats.go names and configures it (kv.go:
	// prepareKeyValueConfig): max age is the TTL, and the duplicate window
	// is the TTL capped at 2 minutes.
	s, err := js.Stream(ctx, "KV_"+want.Bucket)
	if err != nil {
		return nil, err
	}
	upd := s.CachedInfo().Config
	upd.MaxAge = want.TTL
	upd.Duplicates = min(want.TTL, 2*time.Minute)
	if _, err := js.UpdateStream(ctx, upd); err != nil {
		return nil, err
	}
	return kv, nil
}

// warnDiffers reports a setting of an existing stream or bucket that
// differs from what the bridge would create and that it leaves alone.
func (b *Bridge) warnDiffers(what, key, have, want string) {
	b.log.Warn().Str("object", what).Str("setting", key).Str("have", have).Str("bridge_default", want).
		Msg("an existing stream or bucket differs from what the bridge would create; it is left as it is")
}

// streamMatches reports whether have already carries every setting of want
// that the bridge sets (the server fills in the others).
func streamMatches(have, want jetstream.StreamConfig) bool {
	dup := want.Duplicates
	if dup == 0 {
		dup = 2 * time.Minute // the server's default window
	}
	// Storage and retention are not compared: they cannot change on an
	// existing stream, and ensureStream only warns about them.
	return have.Description == want.Description &&
		slices.Equal(have.Subjects, want.Subjects) &&
		have.MaxAge == want.MaxAge &&
		have.Duplicates == dup &&
		max(have.Replicas, 1) == max(want.Replicas, 1) &&
		!have.Sealed
}

func (b *Bridge) needsIdempotency() bool {
	if b.cfg.Idempotency.Bucket == "" {
		return false
	}
	for _, r := range b.liveRoutes() {
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

// provisionFleet creates the counter stream and the bucket the replicas
// share for flow control (fleet.go), and makes them the bridge's fleet.
func (b *Bridge) provisionFleet(ctx context.Context) error {
	sc := b.cfg.Stream
	if err := apiCall(ctx, func(ctx context.Context) error {
		return ensureStream(ctx, b.js, fleetRateStreamConfig(sc, fleetRateAge(b.cfg)), b.warnDiffers)
	}); err != nil {
		return fmt.Errorf("bridge: fleet rate stream %s: %w", fleetRateStreamName(sc.Name), err)
	}
	var kv jetstream.KeyValue
	if err := apiCall(ctx, func(ctx context.Context) error {
		var err error
		kv, err = ensureBucket(ctx, b.js, fleetBucketConfig(sc), b.warnDiffers)
		return err
	}); err != nil {
		return fmt.Errorf("bridge: fleet bucket %s: %w", fleetBucketName(sc.Name), err)
	}
	host, _ := os.Hostname()
	b.fleet.p.Store(&fleet{js: b.js, stream: sc.Name, kv: kv, replica: host + "-" + strconv.Itoa(os.Getpid())})
	return nil
}

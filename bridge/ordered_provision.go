package bridge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/subjects"
)

// This file provisions what an ordered route delivers from
// (docs/configuration.md#routes): a partitioned copy of the source
// stream, and one durable consumer per partition whose messages the server
// gives to one replica at a time (a pinned-client priority group).
//
//   - The copy, stream <stream>-<route>, sources the route's messages from
//     the source stream through the subject transforms of
//     subjects.Partitioner: each is stored as <partition>.<subject>. The
//     source stream is never changed (its stored subjects are those of
//     the other routes, dead letters and replay); each copied message
//     carries Nats-Stream-Source, from which copyMsg gives back the
//     original stream, sequence and subject.
//   - The copy has work-queue retention (a message is gone once its
//     partition's consumer acked it), and the source stream's max age
//     and replicas.
//   - Partition p's consumer, durable <route>-p<p>, filters <p>.>; the
//     server pins it to the first replica that pulls with the priority
//     group and moves the pin when that replica has not pulled for
//     PinnedTTL = ack_wait + 1s, by when the messages it held have
//     come back for redelivery (the server serves redeliveries before new
//     messages, so the next replica starts with them). MaxDeliver is
//     unlimited: an ordered route counts attempts itself.
//
// Every step is idempotent: replicas starting together create the same
// objects. A copy made for another key or another number of partitions
// (its sources differ) is never changed while it may hold messages:
// provisioning fails with a *CopyDiffersError.

// orderingGroup is the priority group of every partition consumer.
const orderingGroup = "jetbridge"

// partitionConsumerName is the durable consumer of partition p.
func partitionConsumerName(route string, p int) string { return route + "-p" + strconv.Itoa(p) }

// partitionPinnedTTL is how long the server keeps a partition pinned to a
// replica that has stopped pulling: past ack_wait, so that the messages
// the replica held are back for redelivery before another replica is
// pinned.
func partitionPinnedTTL(rc *config.Route) time.Duration { return rc.AckWait.D() + time.Second }

// orderedBuffer is B, the most messages an ordered route holds in the
// process (pulled, not settled), which is also each partition consumer's
// MaxAckPending.
func orderedBuffer(rc *config.Route) int { return max(64, 4*rc.MaxInFlight) }

// CopyDiffersError: an ordered route's copy exists with other sources
// (another key, another number of partitions, another source stream).
type CopyDiffersError struct {
	Stream string // the copy
	Route  string
}

func (e *CopyDiffersError) Error() string {
	return fmt.Sprintf("stream %s, the partitioned copy of route %s, was made for another key or another number of partitions; "+
		"it is not changed while it may hold messages: delete it once its consumers have nothing pending, and start again", e.Stream, e.Route)
}

// orderedCopy is what provisionOrdered made for an ordered route.
type orderedCopy struct {
	stream jetstream.Stream
	parts  []jetstream.Consumer // index: partition
	key    *subjects.Partitioner
}

// partitionerOf is the partitioner of an ordered route.
func partitionerOf(rc *config.Route) (*subjects.Partitioner, error) {
	return subjects.NewPartitioner(rc.Subjects, rc.Ordering.Partitions, rc.Ordering.Key.Tokens)
}

// copyStreamConfig is the copy's configuration, deterministic in the
// configuration; start is the first source sequence to copy (0: all).
func copyStreamConfig(sc config.Stream, rc *config.Route, key *subjects.Partitioner, start uint64) jetstream.StreamConfig {
	var trs []jetstream.SubjectTransformConfig
	for _, tr := range key.Transforms() {
		trs = append(trs, jetstream.SubjectTransformConfig{Source: tr.Source, Destination: tr.Destination})
	}
	return jetstream.StreamConfig{
		Name:        config.CopyStream(sc.Name, rc.Name),
		Description: "jetbridge: partitioned copy of " + sc.Name + " for ordered route " + rc.Name,
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.WorkQueuePolicy,
		MaxAge:      sc.MaxAge.D(),
		Replicas:    sc.Replicas,
		AllowDirect: true,
		// No subjects (only the source writes to it) and no duplicate
		// window: the source stream deduplicates; the copy stores what it
		// sources.
		Sources: []*jetstream.StreamSource{{Name: sc.Name, OptStartSeq: start, SubjectTransforms: trs}},
	}
}

// partitionConsumerConfig is partition p's consumer, deterministic in the
// route's configuration.
func partitionConsumerConfig(rc *config.Route, p int) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        partitionConsumerName(rc.Name, p),
		Description:    "jetbridge ordered route " + rc.Name + " partition " + strconv.Itoa(p),
		FilterSubject:  strconv.Itoa(p) + ".>",
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        rc.AckWait.D(),
		MaxDeliver:     -1,
		MaxAckPending:  orderedBuffer(rc),
		PriorityGroups: []string{orderingGroup},
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PinnedTTL:      partitionPinnedTTL(rc),
	}
}

// provisionOrdered creates or binds an ordered route's copy and partition
// consumers. A new copy starts after what the route's unordered durable
// (when it exists: the route was unordered before) has acknowledged, so
// that turning ordering on does not deliver the stream's history again.
func provisionOrdered(ctx context.Context, js jetstream.JetStream, sc config.Stream, rc *config.Route, warn func(what, key, have, want string)) (*orderedCopy, error) {
	return provisionCopy(ctx, js, sc, rc, warn, true)
}

// provisionCopy is provisionOrdered; with pinned false (the hand-over's
// negative controls only) the partition consumers have no pinned group.
func provisionCopy(ctx context.Context, js jetstream.JetStream, sc config.Stream, rc *config.Route, warn func(what, key, have, want string), pinned bool) (*orderedCopy, error) {
	key, err := partitionerOf(rc)
	if err != nil {
		return nil, err
	}
	oc := &orderedCopy{key: key}
	want := copyStreamConfig(sc, rc, key, 0)
	if err := apiCall(ctx, func(ctx context.Context) error {
		var err error
		oc.stream, err = ensureCopyStream(ctx, js, sc.Name, rc, want, warn)
		return err
	}); err != nil {
		return nil, fmt.Errorf("stream %s: %w", want.Name, err)
	}
	for p := range rc.Ordering.Partitions {
		if err := apiCall(ctx, func(ctx context.Context) error {
			cc := partitionConsumerConfig(rc, p)
			if !pinned {
				cc.PriorityGroups, cc.PriorityPolicy, cc.PinnedTTL = nil, jetstream.PriorityPolicyNone, 0
			}
			c, err := oc.stream.CreateOrUpdateConsumer(ctx, cc)
			oc.parts = append(oc.parts, c)
			return err
		}); err != nil {
			return nil, fmt.Errorf("stream %s: consumer %s: %w", want.Name, partitionConsumerName(rc.Name, p), err)
		}
	}
	return oc, nil
}

// ensureCopyStream creates the copy (from the unordered durable's ack
// floor when there is one), or checks an existing one's sources and
// updates the settings the bridge owns (description, max age, replicas,
// direct get) when they differ; the rest is the operator's.
func ensureCopyStream(ctx context.Context, js jetstream.JetStream, source string, rc *config.Route, want jetstream.StreamConfig, warn func(what, key, have, want string)) (jetstream.Stream, error) {
	s, err := js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		create, src := want, *want.Sources[0]
		create.Sources = []*jetstream.StreamSource{&src}
		switch c, err := js.Consumer(ctx, source, rc.Name); {
		case err == nil:
			create.Sources[0].OptStartSeq = c.CachedInfo().AckFloor.Stream + 1
		case !errors.Is(err, jetstream.ErrConsumerNotFound):
			return nil, err
		}
		if _, err = js.CreateStream(ctx, create); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil, err
		}
		s, err = js.Stream(ctx, want.Name)
	}
	if err != nil {
		return nil, err
	}
	have := s.CachedInfo().Config
	if !sameSource(have.Sources, want.Sources[0]) {
		return nil, &CopyDiffersError{Stream: want.Name, Route: rc.Name}
	}
	if have.Storage != want.Storage {
		warn("stream "+want.Name, "storage", have.Storage.String(), want.Storage.String())
	}
	if have.Retention != want.Retention {
		warn("stream "+want.Name, "retention", have.Retention.String(), want.Retention.String())
	}
	if have.Description == want.Description && have.MaxAge == want.MaxAge &&
		max(have.Replicas, 1) == max(want.Replicas, 1) && have.AllowDirect == want.AllowDirect {
		return s, nil
	}
	upd := have
	upd.Description, upd.MaxAge, upd.Replicas, upd.AllowDirect = want.Description, want.MaxAge, want.Replicas, want.AllowDirect
	return js.UpdateStream(ctx, upd)
}

// sameSource reports whether a copy's sources are exactly want, its start
// sequence aside (it only matters when the copy is created).
func sameSource(have []*jetstream.StreamSource, want *jetstream.StreamSource) bool {
	if len(have) != 1 || have[0] == nil {
		return false
	}
	h := have[0]
	return h.Name == want.Name && h.FilterSubject == want.FilterSubject && h.External == nil &&
		slices.Equal(h.SubjectTransforms, want.SubjectTransforms)
}

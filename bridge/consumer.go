package bridge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// watchdogEvery is how often a route checks that it makes progress and that
// its consumer still has this bridge's configuration.
const watchdogEvery = 15 * time.Second

// lookupTimeout bounds a consumer lookup made from the pull loop.
const lookupTimeout = time.Second

// binding is a route's handle on its durable consumer, and what the
// watchdog and the readiness watch know of it.
type binding struct {
	cons     atomic.Pointer[jetstream.Consumer] // set by Provision; see consumer()
	received atomic.Uint64                      // messages fetched, for the watchdog
	rebind   atomic.Bool                        // the watchdog asks for a fresh consumer
	missing  atomic.Bool                        // the consumer was deleted by hand
}

// consumer returns the route's consumer handle (nil before Provision).
func (r *route) consumer() jetstream.Consumer {
	if c := r.bound.cons.Load(); c != nil {
		return *c
	}
	return nil
}

func (r *route) setConsumer(c jetstream.Consumer) { r.bound.cons.Store(&c) }

// bindConsumer creates or updates the route's durable consumer. When the
// consumer exists with another configuration, that is reported loudly:
// replicas sharing a durable have no config owner, and two versions (a
// rolling deploy, a forgotten replica) flip its settings back and forth.
func (r *route) bindConsumer(ctx context.Context) error {
	if r.cfg.Ordering != nil {
		return r.bindOrdered(ctx)
	}
	want := consumerConfig(r.cfg)
	if cur, err := r.b.js.Consumer(ctx, r.b.cfg.Stream.Name, r.cfg.Name); err == nil {
		if diff := consumerDrift(cur.CachedInfo().Config, want); diff != "" {
			r.log.Error().Str("differences", diff).
				Msg("consumer configuration differs from this replica's: another replica runs a different config; applying this one")
		}
	}
	c, err := r.b.js.CreateOrUpdateConsumer(ctx, r.b.cfg.Stream.Name, want)
	if err != nil {
		return err
	}
	r.setConsumer(c)
	return nil
}

// lookupConsumer takes a fresh handle on the route's durable consumer. A
// consumer deleted by hand is not created again behind the operator's back
// (a new durable would redeliver the whole stream): the route reports it
// through Readiness until the bridge is restarted.
func (r *route) lookupConsumer(ctx context.Context) {
	// Short: a lookup sent to a server that is shutting down gets no answer,
	// and the route pulls nothing while it waits.
	lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	c, err := r.b.js.Consumer(lctx, r.b.cfg.Stream.Name, r.cfg.Name)
	switch {
	case err == nil:
		r.setConsumer(c)
		r.bound.missing.Store(false)
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		if !r.bound.missing.Swap(true) {
			r.log.Error().Msg("the route's consumer was deleted; restart the bridge to create it again (it will then deliver the stream from its start)")
		}
	default:
		r.log.Warn().Str("error", err.Error()).Msg("consumer lookup failed")
	}
}

// consumerDrift names the settings of have that differ from want.
func consumerDrift(have, want jetstream.ConsumerConfig) string {
	var d []string
	if !slices.Equal(have.FilterSubjects, want.FilterSubjects) {
		d = append(d, fmt.Sprintf("filter_subjects %v != %v", have.FilterSubjects, want.FilterSubjects))
	}
	if have.AckWait != want.AckWait {
		d = append(d, fmt.Sprintf("ack_wait %s != %s", have.AckWait, want.AckWait))
	}
	if have.MaxDeliver != want.MaxDeliver {
		d = append(d, fmt.Sprintf("max_deliver(+1) %d != %d", have.MaxDeliver, want.MaxDeliver))
	}
	if have.MaxAckPending != want.MaxAckPending {
		d = append(d, fmt.Sprintf("max_ack_pending %d != %d", have.MaxAckPending, want.MaxAckPending))
	}
	return strings.Join(d, "; ")
}

// watchdog notices a route that makes no progress while its consumer has
// messages waiting (the pull stall of nats.go#1622 and #2063 cannot happen
// to the Fetch loop, but a lost consumer or a broken subscription could),
// and asks the pull loop to re-bind the consumer. It also re-checks the
// consumer's configuration against this replica's.
func (r *route) watchdog(ctx context.Context) {
	t := time.NewTicker(watchdogEvery)
	defer t.Stop()
	last := r.bound.received.Load()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c := r.consumer()
		if c == nil {
			continue
		}
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := c.Info(ictx)
		cancel()
		if err != nil {
			continue // the pull loop reports connection problems
		}
		if diff := consumerDrift(info.Config, consumerConfig(r.cfg)); diff != "" {
			r.log.Error().Str("differences", diff).Msg("consumer configuration changed by another replica with a different config")
		}
		now := r.bound.received.Load()
		idle := len(r.load.slots) < cap(r.load.slots)
		if now == last && info.NumPending > 0 && idle && r.dest.state() == BreakerClosed {
			r.log.Warn().Uint64("pending", info.NumPending).Str("for", watchdogEvery.String()).
				Msg("no progress while messages are pending: re-binding the consumer")
			r.bound.rebind.Store(true)
		}
		last = now
	}
}

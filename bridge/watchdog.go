package bridge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// watchdogEvery is how often a route checks that it makes progress and that
// its consumer still has this bridge's configuration.
const watchdogEvery = 15 * time.Second

// lookupTimeout bounds a consumer lookup made from the pull loop.
const lookupTimeout = time.Second

// consumer returns the route's consumer handle (nil before Provision).
func (r *route) consumer() jetstream.Consumer {
	if c := r.cons.Load(); c != nil {
		return *c
	}
	return nil
}

func (r *route) setConsumer(c jetstream.Consumer) { r.cons.Store(&c) }

// bindConsumer creates or updates the route's durable consumer. When the
// consumer exists with another configuration, that is reported loudly:
// replicas sharing a durable have no config owner, and two versions (a
// rolling deploy, a forgotten replica) flip its settings back and forth.
func (r *route) bindConsumer(ctx context.Context) error {
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
		r.missing.Store(false)
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		if !r.missing.Swap(true) {
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
	last := r.received.Load()
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
		now := r.received.Load()
		idle := int64(len(r.slots)) < int64(cap(r.slots))
		if now == last && info.NumPending > 0 && idle && r.dest.state() == BreakerClosed {
			r.log.Warn().Uint64("pending", info.NumPending).Dur("for", watchdogEvery).
				Msg("no progress while messages are pending: re-binding the consumer")
			r.rebind.Store(true)
		}
		last = now
	}
}

// readinessEvery is how often the readiness watch checks the source and
// dead-letter streams and every route's consumer.
const readinessEvery = 2 * time.Second

// readinessTimeout bounds one lookup of the readiness watch.
const readinessTimeout = 2 * time.Second

// lookupFailuresNotReady is how many consecutive failed lookups of a
// route's consumer make the bridge not ready.
const lookupFailuresNotReady = 3

// readiness holds what the readiness watch found; Readiness reports it.
type readiness struct {
	mu         sync.Mutex
	stream     string // why the source stream is unusable; "" when it is fine
	deadLetter string // why dead letters cannot be stored; "" when they can
	streamGone bool   // the source stream was seen missing: its consumers went with it
	routes     map[*route]*routeHealth
}

// routeHealth counts a route's consecutive failed consumer lookups.
type routeHealth struct {
	failures int
	lastErr  string
}

func newReadiness(routes []*route) *readiness {
	h := &readiness{routes: make(map[*route]*routeHealth, len(routes))}
	for _, r := range routes {
		h.routes[r] = &routeHealth{}
	}
	return h
}

// reason is the first problem found, nil when there is none.
func (h *readiness) reason(routes []*route) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stream != "" {
		return errors.New(h.stream)
	}
	if h.deadLetter != "" {
		return errors.New(h.deadLetter)
	}
	for _, r := range routes {
		if r.missing.Load() {
			return errors.New("route " + r.cfg.Name + ": consumer deleted; restart the bridge to create it again")
		}
		if rh := h.routes[r]; rh != nil && rh.failures >= lookupFailuresNotReady {
			return fmt.Errorf("route %s: consumer lookups failing (%d in a row): %s", r.cfg.Name, rh.failures, rh.lastErr)
		}
	}
	return nil
}

// watchReadiness checks the streams and consumers every readinessEvery
// until ctx ends: a source stream that does not exist, a dead-letter
// stream that is missing or sealed, a consumer deleted by hand or whose
// lookups keep failing make the bridge not ready (see Readiness). Neither
// stream is created again behind the operator's back. When the source
// stream comes back (created by hand, or by another replica's start), the
// routes' consumers, which were deleted with it, are created again: the
// new stream's messages are then delivered.
func (b *Bridge) watchReadiness(ctx context.Context) {
	t := time.NewTicker(readinessEvery)
	defer t.Stop()
	for {
		b.checkReadiness(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (b *Bridge) checkReadiness(ctx context.Context) {
	if nc := b.js.Conn(); nc != nil && !nc.IsConnected() {
		return // Readiness reports the connection; lookups would only time out
	}
	h := b.health
	streamReason, gone, ok := b.checkSourceStream(ctx)
	dlReason := b.checkDeadLetterStream(ctx)

	h.mu.Lock()
	wasGone := h.streamGone
	if ok {
		h.stream = streamReason
		h.streamGone = gone || (wasGone && streamReason != "")
	}
	if dlReason != "?" {
		h.deadLetter = dlReason
	}
	h.mu.Unlock()

	if ok && gone && !wasGone {
		b.log.Error().Str("stream", b.cfg.Stream.Name).Msg("the source stream does not exist: nothing is consumed until it exists again")
	}
	if !ok || streamReason != "" {
		return // the consumers went with the stream
	}
	if wasGone && !b.rebindAfterStreamLoss(ctx) {
		h.mu.Lock()
		h.streamGone = true // try again on the next round
		h.mu.Unlock()
	}
	for _, r := range b.routes {
		b.checkConsumer(ctx, r)
	}
}

// checkSourceStream returns why the source stream is unusable ("" when it
// exists), whether it is missing, and false when the lookup itself failed.
func (b *Bridge) checkSourceStream(ctx context.Context) (reason string, missing, ok bool) {
	lctx, cancel := context.WithTimeout(ctx, readinessTimeout)
	defer cancel()
	_, err := b.js.Stream(lctx, b.cfg.Stream.Name)
	switch {
	case err == nil:
		return "", false, true
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return "stream " + b.cfg.Stream.Name + " does not exist: nothing can be consumed until it is created again", true, true
	default:
		return "", false, false // a transient failure; the connection check covers outages
	}
}

// checkDeadLetterStream returns why dead letters cannot be stored ("" when
// they can, "?" when the lookup failed).
func (b *Bridge) checkDeadLetterStream(ctx context.Context) string {
	name := b.cfg.DeadLetter.Stream
	lctx, cancel := context.WithTimeout(ctx, readinessTimeout)
	defer cancel()
	s, err := b.js.Stream(lctx, name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return "dead-letter stream " + name + " does not exist: dead letters cannot be stored (messages that need one are redelivered); restart the bridge to create it"
	case err != nil:
		return "?"
	case s.CachedInfo().Config.Sealed:
		return "dead-letter stream " + name + " is sealed: dead letters cannot be stored (messages that need one are redelivered)"
	}
	return ""
}

// rebindAfterStreamLoss creates the consumers of a source stream that was
// deleted and exists again. It reports whether every route is bound.
func (b *Bridge) rebindAfterStreamLoss(ctx context.Context) bool {
	all := true
	for _, r := range b.routes {
		lctx, cancel := context.WithTimeout(ctx, readinessTimeout)
		err := r.bindConsumer(lctx)
		cancel()
		if err != nil {
			r.log.Warn().Str("error", err.Error()).Msg("source stream is back; creating the route's consumer failed")
			all = false
			continue
		}
		r.missing.Store(false)
		r.log.Warn().Str("stream", b.cfg.Stream.Name).Msg("source stream exists again; the route's consumer was created again")
	}
	return all
}

// checkConsumer looks the route's consumer up and counts failures.
func (b *Bridge) checkConsumer(ctx context.Context, r *route) {
	c := r.consumer()
	if c == nil {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, readinessTimeout)
	_, err := c.Info(lctx)
	cancel()
	rh := b.health.routes[r]
	b.health.mu.Lock()
	defer b.health.mu.Unlock()
	switch {
	case err == nil:
		rh.failures, rh.lastErr = 0, ""
		r.missing.Store(false)
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		rh.failures, rh.lastErr = 0, ""
		if !r.missing.Swap(true) {
			r.log.Error().Msg("the route's consumer was deleted; restart the bridge to create it again (it will then deliver the stream from its start)")
		}
	case ctx.Err() == nil:
		rh.failures++
		rh.lastErr = err.Error()
		if rh.failures == lookupFailuresNotReady {
			r.log.Warn().Int("failures", rh.failures).Str("error", rh.lastErr).Msg("consumer lookups keep failing: not ready")
		}
	}
}

package bridge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Readiness returns nil once the bridge is connected, the source and
// dead-letter streams exist (the latter writable) and every route's
// consumer is bound and answers lookups, else the reason it is not ready.
// Stream and consumer checks come from the readiness watch (see
// watchReadiness below), so a change shows within about readinessEvery.
func (b *Bridge) Readiness() error {
	select {
	case <-b.ready:
	default:
		if err := b.provisionErr.Load(); err != nil {
			return errors.New("provisioning: " + (*err).Error())
		}
		return errors.New("starting: streams and consumers not provisioned yet")
	}
	if err := b.Healthy(); err != nil {
		return err
	}
	if nc := b.js.Conn(); nc != nil && !nc.IsConnected() {
		at := "the embedded JetStream server"
		if u := b.cfg.NATS.URL.RedactedURL(); u != "" {
			at = u
		}
		cause := natsCause(nc.LastError())
		if cause == "" {
			cause = nc.Status().String()
		}
		return errors.New("cannot reach NATS at " + at + " (reconnecting): " + cause)
	}
	if se := b.storeHealth.err.Load(); se != nil {
		return errors.New(se.Error() + ": reservations cannot be taken; the messages of idempotent routes are held until they can")
	}
	if err := b.health.reason(b.liveRoutes()); err != nil {
		return err
	}
	if b.opts.NoDelivery {
		return ErrNoDelivery
	}
	return nil
}

// liveRoutes is a copy of the routes in force (a reload may replace them).
func (b *Bridge) liveRoutes() []*route {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return slices.Clone(b.routes)
}

// storeHealth is the outcome of the last reservation attempt of any route:
// while the idempotency bucket fails, the bridge is not ready, with the
// cause (Readiness), and the messages that need a reservation are held.
type storeHealth struct {
	err atomic.Pointer[IdempotencyStoreError]
}

func (h *storeHealth) failed(e *IdempotencyStoreError) { h.err.Store(e) }

// succeeded clears the failure it saw, not one recorded since by another
// route's attempt.
func (h *storeHealth) succeeded() {
	if e := h.err.Load(); e != nil {
		h.err.CompareAndSwap(e, nil)
	}
}

// Healthy returns nil unless the bridge's NATS connection is closed for
// good (nats.go gave up reconnecting): then nothing will ever be delivered
// again and the process must be restarted. /healthz answers 503 then.
func (b *Bridge) Healthy() error {
	if nc := b.js.Conn(); nc != nil && nc.IsClosed() {
		msg := "NATS connection closed for good"
		if cause := natsCause(nc.LastError()); cause != "" {
			msg += ": " + cause
		}
		return errors.New(msg)
	}
	return nil
}

// natsCause describes a connection error for /readyz and /healthz without
// anything a client sent: an authentication or TLS rejection by its class,
// other errors by their text (nats.go's protocol errors carry no secrets).
func natsCause(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, nats.ErrAuthorization):
		return "NATS rejected the credentials: authorization violation"
	case errors.Is(err, nats.ErrAuthExpired), errors.Is(err, nats.ErrAuthRevoked), errors.Is(err, nats.ErrAccountAuthExpired):
		return "NATS rejected the credentials: " + strings.TrimPrefix(err.Error(), "nats: ")
	}
	return err.Error()
}

// readinessEvery is how often the readiness watch checks the source and
// dead-letter streams and every route's consumer.
const readinessEvery = 2 * time.Second

// readinessTimeout bounds one lookup of the readiness watch.
const readinessTimeout = 2 * time.Second

// lookupFailuresNotReady is how many consecutive failed lookups of a
// route's consumer make the bridge not ready.
const lookupFailuresNotReady = 3

// statusMinInterval is the shortest time between the starts of two rounds
// of the readiness watch when /status asks for fresh consumer state: the
// JetStream API requests of /status are bounded by the number of routes
// per statusMinInterval, however many /status requests come in.
const statusMinInterval = 500 * time.Millisecond

// readiness holds what the readiness watch found; Readiness reports it,
// and routeStatuses shows each route's last consumer lookup.
type readiness struct {
	mu         sync.Mutex
	stream     string // why the source stream is unusable; "" when it is fine
	deadLetter string // why dead letters cannot be stored; "" when they can
	streamGone bool   // the source stream was seen missing: its consumers went with it
	routes     map[*route]*routeHealth

	// Rounds of the watch, for routeStatuses (see fresh).
	watching  bool          // the watch runs
	started   uint64        // rounds started
	finished  uint64        // rounds finished
	roundDone chan struct{} // closed when a round finishes (or the watch stops), then replaced
	kick      chan struct{} // a /status request asks for a round; buffered, one pending at most
}

// routeHealth counts a route's consecutive failed consumer lookups and
// keeps its last successful one.
type routeHealth struct {
	failures int
	lastErr  string
	info     *jetstream.ConsumerInfo // nil until a lookup succeeded
	infoAt   time.Time               // when info was received
}

func newReadiness(routes []*route) *readiness {
	h := &readiness{routes: make(map[*route]*routeHealth, len(routes)), roundDone: make(chan struct{}), kick: make(chan struct{}, 1)}
	for _, r := range routes {
		h.routes[r] = &routeHealth{}
	}
	return h
}

// track starts keeping the health of the routes a reload added, and
// forgets the ones it retired.
func (h *readiness) track(added, retired []*route) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range added {
		h.routes[r] = &routeHealth{}
	}
	for _, r := range retired {
		delete(h.routes, r)
	}
}

// setWatching records whether the watch runs; when it stops, waiting
// routeStatuses calls are released.
func (h *readiness) setWatching(on bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.watching = on
	if !on {
		close(h.roundDone)
		h.roundDone = make(chan struct{})
	}
}

func (h *readiness) startRound() {
	h.mu.Lock()
	h.started++
	h.mu.Unlock()
}

func (h *readiness) endRound() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.finished++
	close(h.roundDone)
	h.roundDone = make(chan struct{})
}

// fresh waits, until ctx ends, for a round of the watch that started
// after fresh was called, asking the watch for one: the consumer state
// routeStatuses shows is then no older than the request, while any number of
// concurrent callers share the same round (and rounds start at most once
// per statusMinInterval). It returns at once when the watch is not
// running (before Run or after it stopped): routeStatuses then shows the last
// lookups with their age.
func (h *readiness) fresh(ctx context.Context) {
	h.mu.Lock()
	if !h.watching {
		h.mu.Unlock()
		return
	}
	target := h.started + 1 // the next round to start begins after now
	h.mu.Unlock()
	select {
	case h.kick <- struct{}{}:
	default: // a round is asked for already
	}
	for {
		h.mu.Lock()
		if h.finished >= target || !h.watching {
			h.mu.Unlock()
			return
		}
		done := h.roundDone
		h.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return
		}
	}
}

// lastLookup is what the watch's last lookup of r's consumer found.
func (h *readiness) lastLookup(r *route) (info *jetstream.ConsumerInfo, at time.Time, lastErr string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	rh := h.routes[r]
	if rh == nil {
		return nil, time.Time{}, ""
	}
	return rh.info, rh.infoAt, rh.lastErr
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
		if r.bound.missing.Load() {
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
//
// The same lookups serve /status (see routeStatuses): a request asks for a
// round (a kick), which starts at once unless the previous round started
// less than statusMinInterval ago.
func (b *Bridge) watchReadiness(ctx context.Context) {
	h := b.health
	h.setWatching(true) // Run sets it before starting this goroutine too
	defer h.setWatching(false)
	t := time.NewTicker(readinessEvery)
	defer t.Stop()
	for {
		began := time.Now()
		h.startRound()
		b.checkReadiness(ctx)
		h.endRound()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-h.kick:
			if wait := statusMinInterval - time.Since(began); wait > 0 {
				pause := time.NewTimer(wait)
				select {
				case <-ctx.Done():
					pause.Stop()
					return
				case <-pause.C:
				}
			}
			t.Reset(readinessEvery)
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
	for _, r := range b.liveRoutes() {
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
	}
	b.m.deadLettersStored.Set(float64(s.CachedInfo().State.Msgs))
	switch {
	case s.CachedInfo().Config.Sealed:
		return "dead-letter stream " + name + " is sealed: dead letters cannot be stored (messages that need one are redelivered)"
	case full(s.CachedInfo()):
		return "dead-letter stream " + name + " is full and discards new messages: dead letters cannot be stored (messages that need one are redelivered); purge or replay dead letters, or raise its limits"
	}
	return ""
}

// full reports whether a stream that discards new messages has reached
// one of its limits, so that it refuses the next message.
func full(info *jetstream.StreamInfo) bool {
	c, st := info.Config, info.State
	if c.Discard != jetstream.DiscardNew {
		return false
	}
	return c.MaxMsgs > 0 && st.Msgs >= uint64(c.MaxMsgs) || c.MaxBytes > 0 && st.Bytes >= uint64(c.MaxBytes)
}

// rebindAfterStreamLoss creates the consumers of a source stream that was
// deleted and exists again. It reports whether every route is bound.
func (b *Bridge) rebindAfterStreamLoss(ctx context.Context) bool {
	all := true
	for _, r := range b.liveRoutes() {
		lctx, cancel := context.WithTimeout(ctx, readinessTimeout)
		err := r.bindConsumer(lctx)
		cancel()
		if err != nil {
			r.log.Warn().Str("error", err.Error()).Msg("source stream is back; creating the route's consumer failed")
			all = false
			continue
		}
		r.bound.missing.Store(false)
		r.log.Warn().Str("stream", b.cfg.Stream.Name).Msg("source stream exists again; the route's consumer was created again")
	}
	return all
}

// checkConsumer looks the route's consumer up and counts failures.
func (b *Bridge) checkConsumer(ctx context.Context, r *route) {
	var (
		info *jetstream.ConsumerInfo
		err  error
	)
	if r.ord != nil {
		if info, err = r.ord.info(ctx); info == nil && err == nil {
			return // not provisioned yet
		}
	} else {
		c := r.consumer()
		if c == nil {
			return
		}
		lctx, cancel := context.WithTimeout(ctx, readinessTimeout)
		info, err = c.Info(lctx)
		cancel()
	}
	if err == nil {
		b.m.consumerPending.WithLabelValues(r.cfg.Name).Set(float64(info.NumPending))
	}
	b.health.mu.Lock()
	defer b.health.mu.Unlock()
	rh := b.health.routes[r]
	if rh == nil {
		return // retired by a reload meanwhile
	}
	switch {
	case err == nil:
		rh.failures, rh.lastErr = 0, ""
		rh.info, rh.infoAt = info, time.Now()
		r.bound.missing.Store(false)
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		rh.failures, rh.lastErr = 0, ""
		if !r.bound.missing.Swap(true) {
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

package bridge

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/deadletter"
)

// Outcome is how a message was settled, as in the bridge_messages_total
// metric's outcome label.
type Outcome string

// Outcomes of a settled message.
const (
	OutcomeDelivered           Outcome = "delivered"
	OutcomeRedeliveryScheduled Outcome = "redelivery_scheduled"
	OutcomeDeadLettered        Outcome = "dead_lettered"
	OutcomeDuplicateSkipped    Outcome = "duplicate_skipped"
)

// Settled describes one settled message. It carries identifiers only,
// never payload bytes or header values other than the event id.
type Settled struct {
	Route       string
	Destination string
	Stream      string
	Seq         uint64
	Delivered   uint64 // JetStream delivery count
	EventID     string
	Outcome     Outcome
	Reason      deadletter.Reason // dead letters
	Delay       time.Duration     // redeliveries: the NakWithDelay delay
	Tries       int               // HTTP requests sent for this delivery
	Err         error             // the failure that decided it (a *DeliveryError, or ErrGivenUp); nil when delivered
}

// Options are the optional parts of a Bridge.
type Options struct {
	// Logger receives structured logs; the zero value logs nothing.
	Logger zerolog.Logger
	// OnSettle, if set, is called once per settled message, after the
	// settlement was sent to JetStream. It must not block.
	OnSettle func(Settled)
	// OnBreaker, if set, is called on every circuit breaker transition.
	OnBreaker func(destination string, from, to BreakerState)
	// Registerer, if set, receives the bridge's Prometheus series
	// (docs/operating.md#health-status-and-metrics).
	Registerer prometheus.Registerer
	// TracerProvider, if set, turns tracing on (docs/tracing.md); nil
	// costs nothing.
	TracerProvider trace.TracerProvider
	// NoDelivery makes Run provision and watch readiness but pull nothing
	// (see idle; docs/operating.md#forensics-without-delivery).
	NoDelivery bool
}

// Bridge delivers the messages of every configured route to its
// destination. Create it with New, then call Run once.
type Bridge struct {
	cfg    *config.Config
	js     jetstream.JetStream
	opts   Options
	log    zerolog.Logger
	dests  map[string]*destination
	routes []*route
	m      *metrics
	// storeHealth: whether the idempotency bucket takes reservations.
	storeHealth storeHealth
	idem        reservationStore // nil unless a route has idempotency; set by Provision
	// advisoryCons reads the stored MAX_DELIVERIES advisories; set by Provision.
	advisoryCons jetstream.Consumer
	ready        chan struct{}         // closed once provisioned and pulling
	provisionErr atomic.Pointer[error] // the last provisioning error while Run retries
	health       *readiness            // stream and consumer checks for Readiness; see readiness.go
	tr           *tracer               // nil when tracing is off; see trace.go
}

// New builds a Bridge from a validated configuration. It does no I/O:
// streams and consumers are provisioned by Run.
func New(cfg *config.Config, js jetstream.JetStream, opts Options) (*Bridge, error) {
	b := &Bridge{
		ready: make(chan struct{}),
		cfg:   cfg,
		js:    js,
		opts:  opts,
		log:   opts.Logger,
		dests: make(map[string]*destination, len(cfg.Destinations)),
		tr:    newTracer(opts.TracerProvider, cfg.Tracing.EventID, cfg.Log.URLPaths),
	}
	m, err := newMetrics(opts.Registerer, cfg)
	if err != nil {
		return nil, fmt.Errorf("bridge: metrics: %w", err)
	}
	b.m = m
	onBreaker := func(dest string, from, to BreakerState) {
		m.circuit.WithLabelValues(dest).Set(float64(to))
		if opts.OnBreaker != nil {
			opts.OnBreaker(dest, from, to)
		}
	}
	for name, dc := range cfg.Destinations {
		d, err := newDestination(dc, b.log, onBreaker, m)
		if err != nil {
			return nil, err
		}
		d.trace = b.tr.forDestination(d)
		b.dests[name] = d
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(newHeldCollector(b.dests)); err != nil {
			return nil, fmt.Errorf("bridge: metrics: %w", err)
		}
	}
	for _, rc := range cfg.Routes {
		d, ok := b.dests[rc.Destination]
		if !ok { // config.Validate rejects this; a hand-built Config may not
			return nil, fmt.Errorf("bridge: route %s: unknown destination %q", rc.Name, rc.Destination)
		}
		b.routes = append(b.routes, newRoute(b, rc, d))
		d.poolSize += rc.MaxInFlight
	}
	for _, d := range b.dests {
		d.sizePool()
	}
	b.health = newReadiness(b.routes)
	return b, nil
}

// Run provisions the streams and consumers, then delivers until ctx ends.
// Then it stops pulling, lets in-flight attempts finish within the
// configured shutdown_timeout, cuts off the rest (they are handed back to
// JetStream for a prompt redelivery), settles every message it holds and
// returns. It returns nil after a clean shutdown.
func (b *Bridge) Run(ctx context.Context) error {
	if !b.provisionRetrying(ctx) {
		return nil
	}
	if b.opts.NoDelivery {
		return b.idle(ctx)
	}
	// Attempts run on their own context so that a signal stops the pulling
	// at once but lets in-flight HTTP requests finish.
	work, stopWork := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopWork(nil)

	var loops, keepers sync.WaitGroup
	workersDone := make(chan struct{})
	for _, r := range b.routes {
		r.acks.start(b.js.Conn())
		r.workers.start(ctx, work)
		r.puller.start(ctx)
		loops.Go(func() { r.watchdog(ctx) })
		// Progress acks run until every worker has settled what it holds,
		// the drain included.
		keepers.Go(func() { r.progressLoop(workersDone) })
	}
	loops.Go(func() { b.watchReadiness(ctx) })
	loops.Go(func() { b.advisories(ctx) })
	close(b.ready)
	b.log.Info().Int("routes", len(b.routes)).Msg("bridge running")
	<-ctx.Done()
	for _, r := range b.routes {
		r.puller.stop()
	}
	loops.Wait()

	drained := make(chan struct{})
	go func() {
		for _, r := range b.routes {
			r.workers.stop()
		}
		// Every ack sent is confirmed or given up (acks.go).
		for _, r := range b.routes {
			r.acks.stop()
		}
		close(workersDone)
		keepers.Wait()
		close(drained)
	}()
	b.drain(drained, stopWork)
	for _, d := range b.dests {
		d.close()
	}
	b.log.Info().Msg("bridge stopped")
	return nil
}

// provisionRetrying provisions until it succeeds, and reports false when ctx ended
// first: a broker that is not reachable yet (or restarting) is a reason to
// wait, not to exit.
func (b *Bridge) provisionRetrying(ctx context.Context) bool {
	pause := newRetryBackoff()
	for failures := 1; ; failures++ {
		err := b.Provision(ctx)
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		b.provisionErr.Store(&err)
		b.log.Error().Str("error", err.Error()).Int("failures", failures).Msg("provisioning failed; retrying")
		sleep(ctx, pause.NextBackOff())
	}
}

// drain waits until drained is closed (every worker has settled what it
// held), for at most shutdown_timeout: then it interrupts the remaining
// attempts (stopWork) and waits for them to be settled.
func (b *Bridge) drain(drained <-chan struct{}, stopWork context.CancelCauseFunc) {
	grace := b.cfg.ShutdownTimeout.D()
	b.log.Info().Str("shutdown_timeout", grace.String()).Msg("stopped pulling; draining in-flight attempts")
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-drained:
	case <-t.C:
		b.log.Warn().Msg("shutdown timeout: interrupting the remaining attempts")
		stopWork(errShutdownTimeout)
		<-drained
	}
}

// Ready is closed once Run has provisioned every stream and consumer and
// started pulling.
func (b *Bridge) Ready() <-chan struct{} { return b.ready }

func (b *Bridge) settled(s Settled) {
	b.m.observeSettled(s)
	if b.opts.OnSettle != nil {
		b.opts.OnSettle(s)
	}
}

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
// destination. Create it with New, then call Run once; while it runs,
// Reload applies a new configuration (docs/configuration.md#what-a-reload-applies).
//
// Invariants: one configuration is in force at any time (a reload applies
// whole or not at all); an attempt runs to its end on the route and
// destination values it started with (a reload builds new ones and
// retires the old ones, which finish what they hold); no lock is taken
// per message (the hot path reads only its own route's and destination's
// values, which never change once built).
type Bridge struct {
	// cfg is the configuration the bridge was built with. Its sections
	// that only a restart changes (nats, stream, dead_letter, idempotency,
	// admin, log, tracing) are in force for the bridge's whole life; the
	// ones a reload applies are read from applied.
	cfg  *config.Config
	js   jetstream.JetStream
	opts Options
	log  zerolog.Logger
	m    *metrics

	// mu guards what a reload replaces: applied, routes and dests. It is
	// never taken per message: admin, readiness, the safety net and
	// Reload take it.
	mu      sync.RWMutex
	applied *config.Config          // the configuration in force
	dests   map[string]*destination // the destinations in force
	routes  []*route                // the routes in force, in configuration order, paused ones included

	// reloadMu serialises Reload and Run's start and stop; running is the
	// run in progress (nil before Run and once it stopped pulling).
	reloadMu sync.Mutex
	running  *runState
	retiring sync.WaitGroup // routes retired by a reload that are still finishing
	// reloader decides what a reload may change and retires routes
	// (reload.go); negative controls replace it.
	reloader reloader
	// confStatus is what /status shows of the configuration file
	// (SetConfigStatus); nil: nothing.
	confStatus atomic.Pointer[ConfigStatus]

	// storeHealth: whether the idempotency bucket takes reservations.
	storeHealth storeHealth
	idem        reservationStore // nil unless a route has idempotency; set by Provision
	// advisoryCons reads the stored MAX_DELIVERIES advisories; set by Provision.
	advisoryCons jetstream.Consumer
	ready        chan struct{}         // closed once provisioned and pulling
	provisionErr atomic.Pointer[error] // the last provisioning error while Run retries
	health       *readiness            // stream and consumer checks for Readiness; see readiness.go
	tr           *tracer               // nil when tracing is off; see trace.go
	// fleet is the state the replicas share for flow control (fleet.go);
	// set by Provision when a destination has a flow-control block.
	fleet fleetHolder
}

// runState is a running Bridge: the contexts its routes are started with
// and what each running route's goroutines are.
type runState struct {
	ctx  context.Context // ends when Run is asked to stop
	work context.Context // attempts run on it (outlives ctx by the drain)
	runs map[*route]*routeRun
}

// routeRun is one started route: its pull loop, workers, ack completer,
// watchdog and progress acks, stopped in two steps (stopPulling, then
// finish).
type routeRun struct {
	cancel      context.CancelFunc      // ends the route's pulling and what it holds waiting
	cancelWork  context.CancelCauseFunc // interrupts the route's attempts (released by finish)
	watchdog    chan struct{}           // closed when the watchdog returned
	workersDone chan struct{}           // closed once every worker settled what it held
	keeper      chan struct{}           // closed when the progress acks stopped
}

// startRoute starts route r of run rs.
func (b *Bridge) startRoute(rs *runState, r *route) *routeRun {
	ctx, cancel := context.WithCancel(rs.ctx)
	work, cancelWork := context.WithCancelCause(rs.work)
	run := &routeRun{cancel: cancel, cancelWork: cancelWork, watchdog: make(chan struct{}), workersDone: make(chan struct{}), keeper: make(chan struct{})}
	r.acks.start(b.js.Conn())
	if r.ord != nil {
		close(run.watchdog) // the partitions' pulls watch themselves
		r.ord.start(ctx, work)
	} else {
		r.workers.start(ctx, work)
		r.puller.start(ctx)
		go func() {
			defer close(run.watchdog)
			r.watchdog(ctx)
		}()
	}
	// Progress acks run until every worker has settled what it holds,
	// the drain included.
	go func() {
		defer close(run.keeper)
		r.progressLoop(run.workersDone)
	}()
	return run
}

// stopPulling stops route r from taking messages: its open pulls are
// cancelled, and a message held by an open breaker (or one that arrived
// as it stopped) is handed back.
func (run *routeRun) stopPulling(r *route) {
	run.cancel()
	if r.ord != nil {
		r.ord.stopPulling()
	}
	r.puller.stop()
	<-run.watchdog
}

// finish waits, after stopPulling, until every worker of r has settled
// what it held and every ack is confirmed or given up.
func (run *routeRun) finish(r *route) {
	if r.ord != nil {
		r.ord.finish() // hands back what it holds
	}
	r.workers.stop()
	r.acks.stop() // every ack sent is confirmed or given up (acks.go)
	close(run.workersDone)
	<-run.keeper
	run.cancelWork(nil)
}

// New builds a Bridge from a validated configuration. It does no I/O:
// streams and consumers are provisioned by Run.
func New(cfg *config.Config, js jetstream.JetStream, opts Options) (*Bridge, error) {
	b := &Bridge{
		ready:    make(chan struct{}),
		cfg:      cfg,
		applied:  cfg,
		js:       js,
		opts:     opts,
		log:      opts.Logger,
		dests:    make(map[string]*destination, len(cfg.Destinations)),
		tr:       newTracer(opts.TracerProvider, cfg.Tracing.EventID, cfg.Log.URLPaths),
		reloader: liveReload{},
	}
	m, err := newMetrics(opts.Registerer, cfg)
	if err != nil {
		return nil, fmt.Errorf("bridge: metrics: %w", err)
	}
	b.m = m
	for name, dc := range cfg.Destinations {
		d, err := b.newDestination(dc)
		if err != nil {
			return nil, err
		}
		b.dests[name] = d
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(newHeldCollector(b)); err != nil {
			return nil, fmt.Errorf("bridge: metrics: %w", err)
		}
	}
	routes, err := b.newRoutes(cfg, b.dests)
	if err != nil {
		return nil, err
	}
	b.routes = routes
	sizes := poolSizes(cfg)
	for name, d := range b.dests {
		d.poolSize = sizes[name]
		d.sizePool()
	}
	b.health = newReadiness(b.routes)
	return b, nil
}

// newDestination builds destination dc of the bridge: its breaker
// transitions set bridge_circuit_state and reach Options.OnBreaker.
//
// Only the destination in force reports: one that a reload replaced (or
// removed) and that still finishes its attempts has a breaker of its own,
// whose transitions would otherwise overwrite those of the one in force
// under the same name.
func (b *Bridge) newDestination(dc *config.Destination) (*destination, error) {
	var d *destination
	onBreaker := func(dest string, from, to BreakerState) {
		b.mu.RLock()
		live := b.dests[dest] == d
		b.mu.RUnlock()
		if !live {
			return
		}
		b.m.circuit.WithLabelValues(dest).Set(float64(to))
		if b.opts.OnBreaker != nil {
			b.opts.OnBreaker(dest, from, to)
		}
	}
	d, err := newDestination(dc, b.log, onBreaker, b.m)
	if err != nil {
		return nil, err
	}
	d.trace = b.tr.forDestination(d)
	fleetGate(d.gate, &b.fleet, dc)
	return d, nil
}

// newRoutes builds the routes of cfg on dests.
func (b *Bridge) newRoutes(cfg *config.Config, dests map[string]*destination) ([]*route, error) {
	routes := make([]*route, 0, len(cfg.Routes))
	for _, rc := range cfg.Routes {
		d, ok := dests[rc.Destination]
		if !ok { // config.Validate rejects this; a hand-built Config may not
			return nil, fmt.Errorf("bridge: route %s: unknown destination %q", rc.Name, rc.Destination)
		}
		routes = append(routes, newRoute(b, rc, d))
	}
	return routes, nil
}

// poolSizes is, by destination, the sum of max_in_flight of the routes of
// cfg delivering to it: the most requests it can have in flight at once.
func poolSizes(cfg *config.Config) map[string]int {
	out := make(map[string]int, len(cfg.Destinations))
	for _, rc := range cfg.Routes {
		out[rc.Destination] += rc.MaxInFlight
	}
	return out
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

	b.reloadMu.Lock()
	rs := &runState{ctx: ctx, work: work, runs: make(map[*route]*routeRun, len(b.routes))}
	for _, r := range b.routes {
		if !r.cfg.Paused {
			rs.runs[r] = b.startRoute(rs, r)
		}
	}
	b.running = rs
	started := len(rs.runs)
	b.reloadMu.Unlock()

	var loops sync.WaitGroup
	// Watching from now on, before the goroutine runs: a /status asked
	// for as soon as Run is ready waits for the watch's first round
	// instead of finding no lookup yet.
	b.health.setWatching(true)
	loops.Go(func() { b.watchReadiness(ctx) })
	loops.Go(func() { b.advisories(ctx) })
	loops.Go(func() { b.watchPauses(ctx) })
	close(b.ready)
	b.log.Info().Int("routes", started).Msg("bridge running")
	<-ctx.Done()
	// From here on no reload applies (Reload answers ErrNotRunning).
	b.reloadMu.Lock()
	b.running = nil
	b.reloadMu.Unlock()
	for r, run := range rs.runs {
		run.stopPulling(r)
	}
	loops.Wait()

	drained := make(chan struct{})
	go func() {
		for r, run := range rs.runs {
			run.finish(r)
		}
		b.retiring.Wait() // routes a reload retired
		close(drained)
	}()
	b.drain(drained, stopWork)
	b.mu.RLock()
	for _, d := range b.dests {
		d.close()
	}
	b.mu.RUnlock()
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
	b.mu.RLock()
	grace := b.applied.ShutdownTimeout.D()
	b.mu.RUnlock()
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

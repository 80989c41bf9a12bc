package bridge

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/config"
)

// A pull that the server no longer knows (it restarted, or a new leader
// took over) ends within about two seconds, instead of leaving the route
// idle until the pull expires: a pull made after one that came back short
// (it may have to wait for messages) stays open fetchWait and asks for an
// idle heartbeat every fetchHeartbeat, two missed ones ending it; a pull
// made after one that came back full (most likely a backlog, when it
// fills at once) asks for no heartbeat and expires after fetchFullWait.
// A stopping route cancels its open pulls at once (the server drops them,
// and the messages they did not deliver stay pending).
//
// No heartbeat after a full pull on purpose: nats.go 1.55's Fetch leaves
// its heartbeat timer running for two heartbeats after the pull has
// ended, and the timer keeps the pull's subscription and buffers
// reachable. At a pull every millisecond or two, that kept about 2 MiB of
// dead pulls alive in the bridge's heap during a drain
// (docs/performance.md).
const (
	fetchWait      = 5 * time.Second
	fetchHeartbeat = time.Second
	fetchFullWait  = 2 * fetchHeartbeat
)

// route is one durable consumer feeding one destination: its pull loop
// and worker pool (this file), and each message's delivery, from receipt
// to settlement (delivery.go).
type route struct {
	b      *Bridge
	cfg    *config.Route
	dest   *destination
	policy settlePolicy
	// rules decide each settlement: the policy's table (decision.go).
	rules   settleRules
	log     zerolog.Logger
	bound   binding // the durable consumer (consumer.go)
	load    load    // what the route has in flight
	workers *workerPool
	puller  *pullLoop
	// acks are the route's acks awaiting their confirmation (acks.go).
	acks *ackCompleter
	// progressSlots are the workers' messages in progress, one per worker
	// (delivery.go).
	progressSlots []progressSlot
	// ord delivers an ordered route (ordered_route.go) in place of the
	// pull loop and worker pool; nil for an unordered route. ordErr is why
	// it could not be built (Provision reports it).
	ord    *orderedRoute
	ordErr error
}

// load is what a route has in flight.
type load struct {
	slots    chan struct{} // one token per message in flight
	held     atomic.Int32  // messages waiting for the breaker
	inFlight atomic.Int64
	gauge    prometheus.Gauge // bridge_in_flight of this route
}

func newRoute(b *Bridge, rc *config.Route, d *destination) *route {
	r := &route{
		b:      b,
		cfg:    rc,
		dest:   d,
		policy: policyOf(rc),
		log:    b.log.With().Str("route", rc.Name).Str("destination", d.name).Logger(),
	}
	r.rules = r.policy
	r.load.slots = make(chan struct{}, rc.MaxInFlight)
	r.workers = newWorkerPool(r, rc.MaxInFlight)
	r.puller = newPullLoop(r, pullConfigOf(rc.MaxInFlight), r.workers.jobs)
	r.progressSlots = make([]progressSlot, rc.MaxInFlight)
	r.acks = newAckCompleter(r, rc.MaxInFlight)
	r.load.gauge = b.m.inFlight.WithLabelValues(rc.Name)
	if rc.Ordering != nil {
		r.ord, r.ordErr = newOrderedRoute(r)
	}
	return r
}

// workerPool is a route's fixed pool of max_in_flight workers, fed by
// the route's pull loop through jobs. A worker lives as long as the pool,
// so no goroutine is started (and no stack grown) per message. Each job is
// one slot's share of a pull: the worker takes the next message of the
// pull itself (no goroutine between the pull and the worker), or gives the
// slot back when the pull ended without one.
type workerPool struct {
	r    *route
	jobs chan *pullShare
	wg   sync.WaitGroup
}

func newWorkerPool(r *route, size int) *workerPool {
	return &workerPool{r: r, jobs: make(chan *pullShare, size)}
}

// start starts the workers. Attempts run on work; a message held by an
// open breaker is released as soon as stop ends.
func (p *workerPool) start(stop, work context.Context) {
	for w := range cap(p.jobs) {
		p.wg.Go(func() { p.work(stop, work, w) })
	}
}

// stop closes the pool's jobs, once its pull loop has stopped, and waits
// until every worker has settled what it holds.
func (p *workerPool) stop() {
	close(p.jobs)
	p.wg.Wait()
}

// work is worker w: it takes each job's message and delivers it.
func (p *workerPool) work(stop, work context.Context, w int) {
	r := p.r
	d := new(delivery) // this worker's, reused for each message
	for share := range p.jobs {
		m, ok := share.take(r.release)
		if !ok {
			continue // take gave the slot back
		}
		r.bound.received.Add(1)
		if stop.Err() != nil {
			// The signal came while this pull was open: hand the
			// message back untouched rather than start new work.
			r.handBack(m)
		} else {
			r.handle(stop, work, d, m, w)
		}
		r.release(1)
	}
}

// pullShare is one slot of a pull: n workers share the messages of a
// pull of n, each taking at most one.
type pullShare struct {
	msgs   <-chan jetstream.Msg
	left   atomic.Int32  // shares not yet taken
	taken  atomic.Int32  // shares that got a message
	ending chan struct{} // closed when a share found the pull's channel closed
	endOne sync.Once
	over   chan struct{} // closed when every share was taken: the pull is over
}

func newPullShare(msgs <-chan jetstream.Msg, n int) *pullShare {
	s := &pullShare{msgs: msgs, ending: make(chan struct{}), over: make(chan struct{})}
	s.left.Store(int32(n))
	return s
}

// take is the share's message, or false when the pull ended without one;
// then the share's slot is given back (release) before the pull can count
// as over, so that the pull loop, woken by the end of the pull, finds
// every slot of it free at once.
func (s *pullShare) take(release func(int)) (jetstream.Msg, bool) {
	m, ok := <-s.msgs
	if ok {
		s.taken.Add(1)
	} else {
		s.endOne.Do(func() { close(s.ending) })
		release(1)
	}
	if s.left.Add(-1) == 0 {
		close(s.over)
	}
	return m, ok
}

// openPull is a pull whose shares are out with the workers.
type openPull struct {
	share  *pullShare
	batch  jetstream.MessageBatch
	cancel context.CancelFunc
	n      int
}

// pullShape is how a pull is made: how long it stays open, and the idle
// heartbeat it asks for (0: none).
type pullShape struct {
	expires   time.Duration
	heartbeat time.Duration
}

// pullConfig is what a route's pull loop is built from.
type pullConfig struct {
	// overlap is how many free slots the loop waits for before it makes a
	// pull while another is still open.
	overlap int
	// afterShort is a pull made after one that came back short (or the
	// first): it may wait for messages. afterFull is one made after a pull
	// that came back full, most likely under a backlog.
	afterShort, afterFull pullShape
}

// pullConfigOf is the pull loop of a route with max_in_flight slots: the
// next pull overlaps the open one once a quarter of the slots are free
// (so that overlapping pulls cost at most a few more pulls per
// max_in_flight messages), and a pull after a full one asks for no
// heartbeat (see fetchFullWait).
func pullConfigOf(maxInFlight int) pullConfig {
	return pullConfig{
		overlap:    max(1, maxInFlight/4),
		afterShort: pullShape{expires: fetchWait, heartbeat: fetchHeartbeat},
		afterFull:  pullShape{expires: fetchFullWait},
	}
}

// pullLoop is a route's pull loop. It fetches exactly as many messages as
// the route has free slots, and none while the destination's breaker is
// open, so nothing is ever pulled that cannot be processed at once (no
// prefetch to strand, no delivery burned by an open breaker). Each slot
// goes to one of the route's workers (workerPool) as a share of the pull,
// and the worker takes the message.
//
// While a pull is open and still receiving, the next one is made as soon
// as cfg.overlap slots are free again, so that a route with room always
// has a pull open: a message published between two pulls would otherwise
// wait for the next pull's round trip. At most two pulls are open at
// once. A pull that is ending (its time is up, or the server ended it) is
// waited for, so that its slots go into one next pull rather than into a
// string of small ones; under a backlog a pull fills at once and the next
// one is made as soon as a slot is free.
//
// A loop is built from its configuration (newPullLoop), started once
// (start) and stopped (stop), which cancels its open pulls.
type pullLoop struct {
	r    *route
	cfg  pullConfig
	jobs chan<- *pullShare
	// open are the pulls whose shares are out, at most two, oldest first.
	open []*openPull
	// backlog: the last pull that ended came back full. A pull still open
	// does not change it: under a backlog the next pull is often made
	// while the last one is still being taken.
	backlog bool
	// failures counts pull failures in a row; backoff paces them.
	failures int
	backoff  *backoff.ExponentialBackOff

	cancel context.CancelFunc
	done   chan struct{}
}

// newPullLoop is route r's pull loop with configuration cfg, feeding jobs.
func newPullLoop(r *route, cfg pullConfig, jobs chan<- *pullShare) *pullLoop {
	return &pullLoop{r: r, cfg: cfg, jobs: jobs, backoff: newRetryBackoff()}
}

// start runs the loop until ctx ends or stop is called.
func (l *pullLoop) start(ctx context.Context) {
	ctx, l.cancel = context.WithCancel(ctx)
	l.done = make(chan struct{})
	go func() {
		defer close(l.done)
		l.run(ctx)
	}()
}

// stop ends the loop and waits for it: its open pulls are cancelled (the
// server drops them, and the messages they did not deliver stay pending).
// A loop never started has nothing to stop.
func (l *pullLoop) stop() {
	if l.done == nil {
		return
	}
	l.cancel()
	<-l.done
}

// run pulls until ctx ends.
func (l *pullLoop) run(ctx context.Context) {
	defer l.cancelOpen()
	for ctx.Err() == nil {
		if err := l.r.dest.waitUsable(ctx); err != nil {
			return
		}
		if l.endOver(ctx) {
			continue
		}
		if len(l.open) == 2 {
			l.waitOne(ctx)
			continue
		}
		n := l.acquire(ctx)
		if n == 0 {
			return
		}
		if l.endOver(ctx) {
			l.r.release(n)
			continue
		}
		if n = l.probe(ctx, n); n == 0 {
			continue
		}
		l.fetch(ctx, n)
	}
}

// cancelOpen cancels the open pulls as the loop ends.
func (l *pullLoop) cancelOpen() {
	for _, p := range l.open {
		p.cancel()
	}
	l.open = nil
}

// waitOne waits until one of the two open pulls is over.
func (l *pullLoop) waitOne(ctx context.Context) {
	select {
	case <-l.open[0].share.over:
	case <-l.open[1].share.over:
	case <-ctx.Done():
	}
}

// acquire takes the slots of the next pull (0 when ctx ended).
func (l *pullLoop) acquire(ctx context.Context) int {
	var still *pullShare
	if len(l.open) == 1 {
		still = l.open[0].share
	}
	return l.r.acquire(ctx, still, l.cfg.overlap)
}

// probe trims the n slots taken to what the breaker allows: all of them
// while it is closed; none when it opened meanwhile; one while it is half
// open (probing), and none while a held message can serve as the probe.
// The slots it does not keep are given back.
func (l *pullLoop) probe(ctx context.Context, n int) int {
	r := l.r
	st := r.dest.state()
	switch {
	case st == BreakerClosed:
		return n
	case st == BreakerOpen && r.dest.breaker().RemainingDelay() > 0:
		r.release(n) // it opened while we waited for a slot
		return 0
	case r.load.held.Load() > 0:
		r.release(n)
		sleep(ctx, halfOpenPoll)
		return 0
	}
	r.release(n - 1)
	return 1
}

// fetch makes a pull of n, shaped by how the last one ended, and hands
// its n shares to the workers.
func (l *pullLoop) fetch(ctx context.Context, n int) {
	r := l.r
	if r.bound.rebind.Swap(false) {
		r.lookupConsumer(ctx)
	}
	shape := l.cfg.afterShort
	if l.backlog {
		shape = l.cfg.afterFull
	}
	opts := make([]jetstream.FetchOpt, 0, 2)
	if shape.heartbeat > 0 {
		opts = append(opts, jetstream.FetchHeartbeat(shape.heartbeat))
	}
	fctx, cancel := context.WithTimeout(ctx, shape.expires)
	batch, err := r.consumer().Fetch(n, append(opts, jetstream.FetchContext(fctx))...)
	if err != nil {
		cancel()
		r.release(n)
		l.failed(ctx, err)
		return
	}
	// One share per slot: a free worker exists for each, so sending
	// never blocks for long, and each gives its slot back when done.
	p := &openPull{share: newPullShare(batch.Messages(), n), batch: batch, cancel: cancel, n: n}
	for range n {
		l.jobs <- p.share
	}
	l.open = append(l.open, p)
}

// endOver ends the open pulls that are over, and reports whether one of
// them failed (the loop has then backed off).
func (l *pullLoop) endOver(ctx context.Context) (failed bool) {
	l.open = slices.DeleteFunc(l.open, func(p *openPull) bool {
		select {
		case <-p.share.over:
			failed = l.end(ctx, p) || failed
			return true
		default:
			return false
		}
	})
	return failed
}

// end settles a pull that is over (its expiry, its error) and reports
// whether it failed.
func (l *pullLoop) end(ctx context.Context, p *openPull) bool {
	p.cancel()
	l.backlog = int(p.share.taken.Load()) == p.n
	if err := p.batch.Error(); err != nil && ctx.Err() == nil &&
		!errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
		l.failed(ctx, err)
		return true
	}
	l.failures = 0
	l.backoff.Reset()
	return false
}

// failed logs a failed pull, makes the next pull check that the consumer
// still exists when the error suggests it may not (a deleted one answers
// "no responders"), and backs off.
func (l *pullLoop) failed(ctx context.Context, err error) {
	// Only an error that can mean "no such consumer" is worth a lookup: after
	// a leader change or a server shutdown the handle still works.
	if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrConsumerNotFound) ||
		errors.Is(err, jetstream.ErrConsumerDeleted) {
		l.r.bound.rebind.Store(true)
	}
	l.failures++
	pause := l.backoff.NextBackOff()
	l.r.log.Warn().Int("failures", l.failures).Str("error", err.Error()).Str("retry_in", pause.String()).Msg("pull failed")
	sleep(ctx, pause)
}

// acquire takes free slots for the next pull and returns how many (0
// only when ctx ends first). With no pull open (still is nil), it blocks
// for one free slot. With one open, it blocks for atLeast free slots,
// unless that pull ends meanwhile: once the pull is ending it waits for
// the pull to be over (every slot of it given back), and then for one
// free slot. Then it takes every other free slot.
func (r *route) acquire(ctx context.Context, still *pullShare, atLeast int) (n int) {
	want := 1
	var ending, over <-chan struct{}
	if still != nil {
		want, ending, over = max(1, atLeast), still.ending, still.over
	}
	for n < want {
		select {
		case r.load.slots <- struct{}{}:
			n++
			// A slot of the ending pull is given back after ending is
			// closed: seen here, it makes the wait for the whole pull.
			select {
			case <-ending:
				ending, want = nil, math.MaxInt
			default:
			}
		case <-ending:
			ending, want = nil, math.MaxInt
		case <-over:
			ending, over, want = nil, nil, 1
		case <-ctx.Done():
			r.release(n)
			return 0
		}
	}
	for n < cap(r.load.slots) {
		select {
		case r.load.slots <- struct{}{}:
			n++
		default:
			return n
		}
	}
	return n
}

func (r *route) release(n int) {
	for range n {
		<-r.load.slots
	}
}

package bridge

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

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
// dead pulls alive in the bridge's heap during a drain (README
// "Performance").
const (
	fetchWait      = 5 * time.Second
	fetchHeartbeat = time.Second
	fetchFullWait  = 2 * fetchHeartbeat
)

// route is one durable consumer feeding one destination: its pull loop
// (this file), the per-message pipeline (deliver.go) and its settlement
// (settle.go).
type route struct {
	b      *Bridge
	cfg    *config.Route
	dest   *destination
	policy SettlePolicy
	log    zerolog.Logger
	bound  binding // the durable consumer (consumer.go)
	load   load    // what the route has in flight
	// progressSlots are the workers' messages in progress, one per worker
	// (deliver.go).
	progressSlots []progressSlot
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
		policy: settlePolicy(rc),
		log:    b.log.With().Str("route", rc.Name).Str("destination", d.name).Logger(),
	}
	r.load.slots = make(chan struct{}, rc.MaxInFlight)
	r.progressSlots = make([]progressSlot, rc.MaxInFlight)
	r.load.gauge = b.m.inFlight.WithLabelValues(rc.Name)
	return r
}

// startWorkers starts the route's fixed pool of max_in_flight workers on
// workers, and returns the channel that feeds them; closing it stops them
// once they have settled what they hold. A worker lives as long as the
// route, so no goroutine is started (and no stack grown) per message.
// Each job is one slot's share of a pull: the worker takes the next
// message of the pull itself (no goroutine between the pull and the
// worker), or gives the slot back when the pull ended without one.
// Attempts run on work; a message held by an open breaker is released as
// soon as stop ends.
func (r *route) startWorkers(stop, work context.Context, workers *sync.WaitGroup) chan<- *pullShare {
	jobs := make(chan *pullShare, cap(r.load.slots))
	for w := range cap(r.load.slots) {
		workers.Go(func() {
			for share := range jobs {
				m, ok := share.take(r.release)
				if !ok {
					continue // take gave the slot back
				}
				r.bound.received.Add(1)
				if stop.Err() != nil {
					// The signal came while this pull was open: hand the
					// message back untouched rather than start new work.
					r.settleUntouched(m, ErrInterrupted)
				} else {
					r.handle(stop, work, m, w)
				}
				r.release(1)
			}
		})
	}
	return jobs
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

// pull fetches exactly as many messages as the route has free slots, and
// none while the destination's breaker is open, so nothing is ever pulled
// that cannot be processed at once (no prefetch to strand, no delivery
// burned by an open breaker). Each slot goes to one of the route's
// workers (startWorkers) as a share of the pull, and the worker takes the
// message. It returns when ctx ends, and closes jobs.
//
// While a pull is open and still receiving, the next one is made as soon
// as overlap(max_in_flight) slots are free again, so that a route with
// room always has a pull open: a message published between two pulls
// would otherwise wait for the next pull's round trip. At most two pulls
// are open at once. A pull that is ending (its time is up, or the server
// ended it) is waited for, so that its slots go into one next pull
// rather than into a string of small ones; under a backlog a pull fills
// at once and the next one is made as soon as a slot is free.
func (r *route) pull(ctx context.Context, jobs chan<- *pullShare) {
	defer close(jobs)
	failures := 0
	// backlog: the last pull that ended came back full. A pull still open
	// does not change it: under a backlog the next pull is often made
	// while the last one is still being taken.
	backlog := false
	var open []*openPull // at most two, oldest first
	defer func() {
		for _, p := range open {
			p.cancel() // ctx has ended: the server drops them
		}
	}()
	// end settles a pull that is over (its expiry, its error) and reports
	// whether it failed: pullFailed has then backed off.
	end := func(p *openPull) bool {
		p.cancel()
		backlog = int(p.share.taken.Load()) == p.n
		if err := p.batch.Error(); err != nil && ctx.Err() == nil &&
			!errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
			failures++
			r.pullFailed(ctx, failures, err)
			return true
		}
		failures = 0
		return false
	}
	// endOver ends the open pulls that are over, and reports whether one
	// of them failed.
	endOver := func() (failed bool) {
		kept := open[:0]
		for _, p := range open {
			select {
			case <-p.share.over:
				failed = end(p) || failed
			default:
				kept = append(kept, p)
			}
		}
		clear(open[len(kept):])
		open = kept
		return failed
	}
	for ctx.Err() == nil {
		if err := r.dest.waitUsable(ctx); err != nil {
			return
		}
		if endOver() {
			continue
		}
		if len(open) == 2 {
			select {
			case <-open[0].share.over:
			case <-open[1].share.over:
			case <-ctx.Done():
			}
			continue
		}
		var still *pullShare
		if len(open) == 1 {
			still = open[0].share
		}
		n := r.acquire(ctx, still, r.b.parts.overlap(cap(r.load.slots)))
		if n == 0 {
			return
		}
		if endOver() {
			r.release(n)
			continue
		}
		if st := r.dest.state(); st != BreakerClosed {
			if st == BreakerOpen && r.dest.breaker().RemainingDelay() > 0 {
				r.release(n) // it opened while we waited for a slot
				continue
			}
			// Probing: one message at a time, and none while a held
			// message can serve as the probe.
			if r.load.held.Load() > 0 {
				r.release(n)
				sleep(ctx, halfOpenPoll)
				continue
			}
			r.release(n - 1)
			n = 1
		}
		if r.bound.rebind.Swap(false) {
			r.lookupConsumer(ctx)
		}
		wait := fetchFullWait
		opts := make([]jetstream.FetchOpt, 0, 2)
		if hb := r.b.parts.pullHeartbeat(backlog); hb > 0 {
			wait = fetchWait
			opts = append(opts, jetstream.FetchHeartbeat(hb))
		}
		fctx, cancel := context.WithTimeout(ctx, wait)
		batch, err := r.consumer().Fetch(n, append(opts, jetstream.FetchContext(fctx))...)
		if err != nil {
			cancel()
			r.release(n)
			failures++
			r.pullFailed(ctx, failures, err)
			continue
		}
		// One share per slot: a free worker exists for each, so sending
		// never blocks for long, and each gives its slot back when done.
		p := &openPull{share: newPullShare(batch.Messages(), n), batch: batch, cancel: cancel, n: n}
		for range n {
			jobs <- p.share
		}
		open = append(open, p)
	}
}

// pullHeartbeat is the idle heartbeat of a pull: none after a pull that
// came back full (see fetchFullWait), fetchHeartbeat otherwise.
func pullHeartbeat(lastFull bool) time.Duration {
	if lastFull {
		return 0
	}
	return fetchHeartbeat
}

// overlapSlots is how many free slots a route waits for before it makes a
// pull while another is still open: a quarter of max_in_flight, so that
// overlapping pulls cost at most a few more pulls per max_in_flight
// messages.
func overlapSlots(maxInFlight int) int {
	return max(1, maxInFlight/4)
}

// pullFailed logs a failed pull, makes the next pull check that the
// consumer still exists when the error suggests it may not (a deleted one
// answers "no responders"), and backs off.
func (r *route) pullFailed(ctx context.Context, failures int, err error) {
	// Only an error that can mean "no such consumer" is worth a lookup: after
	// a leader change or a server shutdown the handle still works.
	if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrConsumerNotFound) ||
		errors.Is(err, jetstream.ErrConsumerDeleted) {
		r.bound.rebind.Store(true)
	}
	pause := retryPause(failures)
	r.log.Warn().Int("failures", failures).Str("error", err.Error()).Str("retry_in", pause.String()).Msg("pull failed")
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

// retryPause backs off repeated failures: 100 ms doubling to 5 s.
func retryPause(failures int) time.Duration {
	return min(100*time.Millisecond<<min(failures-1, 6), 5*time.Second)
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

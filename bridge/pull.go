package bridge

import (
	"context"
	"errors"
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
// took over) is noticed within about two seconds, instead of leaving the
// route idle until the pull expires: a pull that may have to wait for
// messages (the one before it came back short) stays open fetchWait and
// asks for an idle heartbeat every fetchHeartbeat, two missed ones ending
// it; a pull made while there is a backlog (the one before it came back
// full) fills at once, so it asks for no heartbeat and expires after
// fetchFullWait. A stopping route cancels its open pull at once (the
// server drops it, and the messages it did not deliver stay pending).
//
// No heartbeat under a backlog on purpose: nats.go 1.55's Fetch leaves its
// heartbeat timer running for two heartbeats after the pull has ended, and
// the timer keeps the pull's subscription and buffers reachable. At a pull
// every millisecond or two, that kept about 2 MiB of dead pulls alive in
// the bridge's heap during a drain (README "Performance").
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
				m, ok := share.take()
				if ok {
					r.bound.received.Add(1)
				}
				switch {
				case !ok:
				case stop.Err() != nil:
					// The signal came while this pull was open: hand the
					// message back untouched rather than start new work.
					r.settleUntouched(m, ErrInterrupted)
				default:
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
	msgs  <-chan jetstream.Msg
	left  atomic.Int32  // shares not yet taken
	taken atomic.Int32  // shares that got a message
	over  chan struct{} // closed when every share was taken: the pull is over
}

func newPullShare(msgs <-chan jetstream.Msg, n int) *pullShare {
	s := &pullShare{msgs: msgs, over: make(chan struct{})}
	s.left.Store(int32(n))
	return s
}

// take is the share's message, or false when the pull ended without one.
func (s *pullShare) take() (jetstream.Msg, bool) {
	m, ok := <-s.msgs
	if ok {
		s.taken.Add(1)
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
// While a pull is still open (some of its messages have not arrived),
// the next one is made as soon as overlapSlots(max_in_flight) slots are
// free again, so that a route is never without an open pull while it has
// room: a message published between two pulls would otherwise wait for
// the next pull's round trip. At most two pulls are open at once; under a
// backlog a pull fills at once and the next waits for free slots only.
func (r *route) pull(ctx context.Context, jobs chan<- *pullShare) {
	defer close(jobs)
	failures := 0
	backlog := false   // the last pull that ended came back full
	var prev *openPull // the pull still open, if any
	// end settles a pull that is over: its expiry, its error.
	end := func(p *openPull) {
		p.cancel()
		backlog = int(p.share.taken.Load()) == p.n
		if err := p.batch.Error(); err != nil && ctx.Err() == nil &&
			!errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
			failures++
			r.pullFailed(ctx, failures, err)
			return
		}
		failures = 0
	}
	defer func() {
		if prev != nil {
			prev.cancel() // ctx has ended: the server drops it
		}
	}()
	for ctx.Err() == nil {
		if err := r.dest.waitUsable(ctx); err != nil {
			return
		}
		var prevOver <-chan struct{}
		if prev != nil {
			prevOver = prev.share.over
		}
		n, over := r.acquire(ctx, prevOver, r.b.parts.overlap(cap(r.load.slots)))
		if over {
			end(prev)
			prev = nil
		}
		if n == 0 {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		if st := r.dest.state(); st != BreakerClosed {
			if st == BreakerOpen && r.dest.breaker.RemainingDelay() > 0 {
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
		wait, opts := fetchWait, []jetstream.FetchOpt{jetstream.FetchHeartbeat(fetchHeartbeat), nil}
		if backlog {
			wait, opts = fetchFullWait, opts[1:]
		}
		fctx, cancel := context.WithTimeout(ctx, wait)
		opts[len(opts)-1] = jetstream.FetchContext(fctx)
		batch, err := r.consumer().Fetch(n, opts...)
		backlog = false
		if err != nil {
			cancel()
			r.release(n)
			failures++
			r.pullFailed(ctx, failures, err)
			continue
		}
		// One share per slot: a free worker exists for each, so sending
		// never blocks for long, and each gives its slot back when done.
		cur := &openPull{share: newPullShare(batch.Messages(), n), batch: batch, cancel: cancel, n: n}
		for range n {
			jobs <- cur.share
		}
		if prev != nil {
			// Two pulls are open: the older ends before another is made.
			<-prev.share.over
			end(prev)
		}
		prev = cur
	}
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

// acquire takes free slots for the next pull. With no pull open (open is
// nil), it blocks for one free slot; with one open, for atLeast free slots
// or the end of that pull (over reports it), whichever comes first. Then
// it takes every other free slot. It returns 0 when ctx ends first, and
// may return 0 with over when the open pull ended before any slot was
// free.
func (r *route) acquire(ctx context.Context, open <-chan struct{}, atLeast int) (n int, over bool) {
	want := 1
	if open != nil {
		want = atLeast
	}
	for n < want {
		select {
		case r.load.slots <- struct{}{}:
			n++
		case <-open:
			// The open pull is over: any free slot will do now.
			open, over, want = nil, true, 1
		case <-ctx.Done():
			r.release(n)
			return 0, over
		}
	}
	for n < cap(r.load.slots) {
		select {
		case r.load.slots <- struct{}{}:
			n++
		default:
			return n, over
		}
	}
	return n, over
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

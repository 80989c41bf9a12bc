package bridge

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/subjects"
)

// This file delivers an ordered route (docs/delivery.md#ordered-delivery):
// the messages of its partitioned copy (ordered_provision.go), pulled per
// partition, held per key in the key table (ordered.go), and delivered
// one head per key at a time by the route's usual stages (delivery.go).
//
// Invariants:
//
//   - A partition's messages are worked on only while this replica owns
//     it: a message of the partition arrived with the server's pin id, no
//     pull since was refused with a wrong pin (423), and the lease has not
//     passed. The lease ends PinnedTTL after the sending of the last pull
//     the server answered with our pin, less a margin: the server cannot
//     give the pin to another replica before then. Every attempt of a
//     partition runs on a context cut leaseCut before the lease ends, so
//     no try of this replica is still running when another replica may
//     start one.
//   - A replica that gains a partition (a new pin id) is fenced: it starts
//     nothing of it until every message the partition's consumer has
//     unacknowledged is in this process (NumAckPending <= what it holds),
//     i.e. until the previous owner's messages came back. Then its keys
//     start in copy-sequence order.
//   - A head whose attempt is to be retried later is held in the process
//     (keyTable.hold), never handed back with a delay while the partition
//     is owned; every held message gets progress acks.
//   - What is not worked on when a partition is lost, or the route stops,
//     is handed back (NakWithDelay interruptedDelay) in copy order, key by
//     key; on a graceful stop the partition is then unpinned, so the next
//     owner is pinned at once.
//   - The messages in the process never exceed 2B (orderedBuffer): every
//     pulled message holds one of the route's B tokens until it leaves,
//     or, only for a fenced partition whose missing messages are due, one
//     of B extra places (over), which a leaving message gives back before
//     a token (so no token is free while an extra place is taken). Fences
//     that hold every token between them thus still end: they pull what
//     they wait for on the extra places.

// leaseMargin is taken off the lease for the time between a pull's
// sending and its arrival at the server, which starts the pin's timer.
const leaseMargin = 100 * time.Millisecond

// fenceEvery is how long a fenced partition's pulls stay open, so that
// the fence is checked at least that often.
const fenceEvery = 250 * time.Millisecond

// leaseHold is how long a key waits when its partition's lease is too
// short for a try; it is not counted as an attempt.
const leaseHold = 100 * time.Millisecond

// orderedConfig is how an ordered route pulls and holds.
type orderedConfig struct {
	buffer    int           // B: messages in the process at most
	batch     int           // one pull's most messages
	expiry    time.Duration // how long a pull stays open
	pinnedTTL time.Duration // the partition consumers' PinnedTTL
	leaseCut  time.Duration // attempts end this long before the lease
	// pinned: the partitions are pinned (priority group, fence, lease).
	// Only the negative controls of the hand-over turn it off.
	pinned bool
}

// orderedConfigOf is the configuration of ordered route rc; timeout is
// its destination's.
func orderedConfigOf(rc *config.Route, timeout time.Duration) orderedConfig {
	ttl := partitionPinnedTTL(rc)
	b := orderedBuffer(rc)
	return orderedConfig{
		buffer:    b,
		batch:     max(1, min(2*rc.MaxInFlight, b/rc.Ordering.Partitions)),
		expiry:    orderedExpiry(ttl, timeout),
		pinnedTTL: ttl,
		leaseCut:  timeout,
		pinned:    true,
	}
}

// answerSlack is how late a pull's answer may come without the lease's
// cut firing before it (orderedExpiry).
const answerSlack = 300 * time.Millisecond

// orderedExpiry is how long the pulls of a route whose partitions have
// pinnedTTL stay open, its tries cut leaseCut before the lease ends: at
// most config.OrderedPullExpiry, and short enough that the next pull's
// answer renews the lease before its cut. The lease runs from the sending
// of the last pull answered, which is answered an expiry later; the next
// pull's answer comes an expiry after that: 2 × expiry + leaseMargin +
// leaseCut + answerSlack must fit in pinnedTTL. With the longest timeout
// `bridge check` allows (ack_wait - 0.5 s) that is about half a second.
func orderedExpiry(pinnedTTL, leaseCut time.Duration) time.Duration {
	e := (pinnedTTL - leaseMargin - leaseCut - answerSlack) / 2
	return min(config.OrderedPullExpiry, max(100*time.Millisecond, e))
}

// orderedRoute is the ordered delivery of one route.
type orderedRoute struct {
	r     *route
	cfg   orderedConfig
	key   *subjects.Partitioner
	tab   *keyTable
	block bool // on_dead_letter: block
	// tokens: one per message in the process (B).
	tokens chan struct{}
	// over: B more places, taken one pull at a time by fenced partitions
	// whose missing messages are due when no token is free (overdraw),
	// and given back before tokens as messages leave (release).
	over chan struct{}

	// Set by provision, once: the copy and one consumer handle per
	// partition, kept for the process's life (the pin id lives on it).
	// provisioned is stored after them: status and info, which may run
	// during provisioning, read them only once it is set.
	provisioned atomic.Bool
	stream      jetstream.Stream
	parts       []*partition
	// blocks is the bucket holding the route's block records (on_dead_letter:
	// block only; nil otherwise), which every replica watches.
	blocks jetstream.KeyValue
	// bal spreads the partitions over the live replicas (ordered_balance.go).
	bal *balancer

	workers sync.WaitGroup
	pullers sync.WaitGroup
	// work is the context attempts run on (set by start).
	work context.Context
	m    *routeOrdering
}

// partition is one partition of an ordered route as this replica sees it.
type partition struct {
	n    int
	name string
	cons jetstream.Consumer

	mu       sync.Mutex
	owned    bool
	pin      string
	epoch    uint64 // ownership epochs: a new one on every gain
	fenced   bool
	fencedAt time.Time
	// missing: at the fence's last check, how many unacknowledged
	// messages of the partition were not in this process.
	missing  int
	pending  []*heldMsg // pulled while fenced, copy order
	leaseEnd time.Time
	cut      *time.Timer
	// stop and work of the current epoch: cancelled when it ends.
	stop, work             context.Context
	cancelStop, cancelWork context.CancelFunc
}

func newOrderedRoute(r *route) (*orderedRoute, error) {
	key, err := partitionerOf(r.cfg)
	if err != nil {
		return nil, fmt.Errorf("bridge: route %s: ordering: %w", r.cfg.Name, err)
	}
	cfg := orderedConfigOf(r.cfg, r.dest.cfg.Timeout.D())
	o := &orderedRoute{
		// The table holds what the tokens and the extra places admit.
		r: r, cfg: cfg, key: key, tab: newKeyTable(2 * cfg.buffer),
		block:  r.cfg.Ordering.OnDeadLetter == config.OnDeadLetterBlock,
		tokens: make(chan struct{}, cfg.buffer),
		over:   make(chan struct{}, cfg.buffer),
		m:      r.b.m.ordered.forRoute(r.cfg.Name),
	}
	return o, nil
}

// provision creates or binds the copy and the partition consumers. The
// consumer handles are taken the first time only: a handle carries its
// partition's pin id.
func (o *orderedRoute) provision(ctx context.Context) error {
	r := o.r
	oc, err := provisionCopy(ctx, r.b.js, r.b.cfg.Stream, r.cfg, r.b.warnDiffers, o.cfg.pinned)
	if err != nil {
		return err
	}
	if o.provisioned.Load() {
		return nil
	}
	// The bucket holds the block records and the replicas' presence: a
	// route that does not block runs without it (and does not rebalance).
	kv, err := ensureBucket(ctx, r.b.js, fleetBucketConfig(r.b.cfg.Stream), r.b.warnDiffers)
	switch {
	case err != nil && o.block:
		return fmt.Errorf("bucket %s: %w", fleetBucketName(r.b.cfg.Stream.Name), err)
	case err != nil:
		r.log.Warn().Str("bucket", fleetBucketName(r.b.cfg.Stream.Name)).Str("error", err.Error()).Msg("ordering: bucket not available: this replica does not rebalance the route's partitions")
		kv = nil
	case o.block:
		o.blocks = kv
	}
	o.stream = oc.stream
	for p, c := range oc.parts {
		o.parts = append(o.parts, &partition{n: p, name: partitionConsumerName(r.cfg.Name, p), cons: c})
	}
	o.bal = newBalancer(o, kv)
	o.provisioned.Store(true)
	return nil
}

// start starts the partitions' pulls and the workers; the route's
// progress loop keeps the held messages (keepHeld).
func (o *orderedRoute) start(stop, work context.Context) {
	o.work = work
	for _, p := range o.parts {
		if !o.cfg.pinned {
			o.gain(stop, p, "")
		}
		o.pullers.Go(func() { o.pull(stop, p) })
	}
	for w := range o.r.cfg.MaxInFlight {
		o.workers.Go(func() { o.worker(stop, w) })
	}
	if o.blocks != nil {
		o.pullers.Go(func() { o.watchBlocks(stop) })
	}
	if o.cfg.pinned {
		o.bal.start(stop)
	}
}

// stopPulling waits for the pulls, which end with stop.
func (o *orderedRoute) stopPulling() { o.pullers.Wait() }

// finish waits for the workers (they settle what they work on), then
// hands back every message still held and unpins the partitions this
// replica owns.
func (o *orderedRoute) finish() {
	o.workers.Wait()
	for _, p := range o.parts {
		o.handBackPartition(p, "stopping")
	}
	o.tab.close()
	if !o.cfg.pinned || o.stream == nil {
		for _, p := range o.parts {
			p.mu.Lock()
			if p.cut != nil {
				p.cut.Stop()
			}
			p.mu.Unlock()
		}
		return
	}
	for _, p := range o.parts {
		p.mu.Lock()
		owned := p.owned
		p.owned = false
		if p.cut != nil {
			p.cut.Stop()
		}
		p.mu.Unlock()
		if !owned {
			continue
		}
		o.m.changed("released")
		ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
		if err := o.stream.UnpinConsumer(ctx, p.name, orderingGroup); err != nil {
			o.r.log.Debug().Int("partition", p.n).Str("error", err.Error()).Msg("unpinning a partition failed; it moves after its pinned TTL")
		}
		cancel()
	}
}

// acquire takes up to n tokens, waiting at most wait for the first.
func (o *orderedRoute) acquire(ctx context.Context, n int, wait time.Duration) int {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case o.tokens <- struct{}{}:
	case <-t.C:
		return 0
	case <-ctx.Done():
		return 0
	}
	got := 1
	for got < n {
		select {
		case o.tokens <- struct{}{}:
			got++
		default:
			return got
		}
	}
	return got
}

// release gives back the places of n messages that leave: extra places
// first (messages are alike: what counts is how many are in the process).
func (o *orderedRoute) release(n int) {
	for range n {
		select {
		case <-o.over:
		default:
			<-o.tokens
		}
	}
}

// overdraw takes extra places for fenced partition p when every token is
// taken, one for each message p's fence misses (as many as are free):
// only while those messages are due for redelivery (they were delivered
// to the previous owner at least ack_wait before p was gained, or handed
// back with a shorter delay), so the pull it makes gets them first (the
// server redelivers before it delivers anew). Without it, fences that
// hold every token between them would wait for ever for messages they
// have no place to pull. It returns how many places it took.
func (o *orderedRoute) overdraw(p *partition) int {
	p.mu.Lock()
	want := 0
	if p.fenced && time.Since(p.fencedAt) > o.r.cfg.AckWait.D() {
		want = p.missing
	}
	p.mu.Unlock()
	got := 0
	for got < want {
		select {
		case o.over <- struct{}{}:
			got++
		default:
			return got
		}
	}
	return got
}

// pull is partition p's pull loop. An owned partition's pin is renewed
// at least every pull expiry, whatever happens: while the destination's
// breaker is open, or while the route holds all it may, the loop sends
// keep-alive pulls instead of waiting, so an owner never loses its
// partitions (and its held messages their delivery budget) to an outage
// or a full buffer.
func (o *orderedRoute) pull(ctx context.Context, p *partition) {
	pause := newRetryBackoff()
	failures := 0 // pull failures in a row: the first is logged as a warning
	half := o.cfg.expiry / 2
	for ctx.Err() == nil {
		if o.bal.gate(ctx, p) { // shedding p, or holding back (ordered_balance.go)
			continue
		}
		p.mu.Lock()
		owned, fenced := p.owned, p.fenced
		p.mu.Unlock()
		alive := owned && o.cfg.pinned
		wctx, cancel := context.WithTimeout(ctx, half)
		err := o.r.dest.waitUsable(wctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil { // the breaker is open
			if alive {
				o.keepAlive(ctx, p, half)
			}
			continue
		}
		want := o.cfg.batch
		if !owned && o.cfg.pinned {
			// A bid for the pin: the pull that gains the partition brings
			// one message and ends, so the fence is checked at once.
			want = 1
		}
		expiry := o.cfg.expiry
		if fenced {
			if want = o.fencedPull(ctx, p); want == 0 {
				if alive {
					o.keepAlive(ctx, p, half)
				}
				continue
			}
			expiry = fenceEvery
		}
		n := o.acquire(ctx, want, min(expiry, half))
		if n == 0 && fenced {
			n = o.overdraw(p)
		}
		if ctx.Err() != nil {
			o.release(n)
			return
		}
		if n == 0 {
			if alive {
				o.keepAlive(ctx, p, half)
			}
			continue
		}
		if err := o.fetch(ctx, p, n, expiry); err != nil && ctx.Err() == nil {
			failures++
			e := o.r.log.Debug()
			if failures == 1 {
				e = o.r.log.Warn()
			}
			e.Int("partition", p.n).Int("failures", failures).Str("error", err.Error()).Msg("pull failed")
			sleep(ctx, min(pause.NextBackOff(), half))
			continue
		}
		failures = 0
		pause.Reset()
	}
}

// fencedPull checks p's fence and returns how many messages p may pull
// while it is fenced (a batch when the fence ended). A fenced partition
// holds about a batch of new messages, then two, pulled one at a time:
// more would take the room the previous owner's messages need to come
// back. Once they are due for redelivery (ack_wait after the gain), the
// server serves them before any new message, so one more is pulled at a
// time until they are all here.
func (o *orderedRoute) fencedPull(ctx context.Context, p *partition) int {
	o.checkFence(ctx, p)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.fenced {
		return o.cfg.batch
	}
	if room := o.cfg.batch - len(p.pending); room > 0 {
		return room
	}
	if len(p.pending) < 2*o.cfg.batch || time.Since(p.fencedAt) > o.r.cfg.AckWait.D() {
		return 1
	}
	return 0
}

// fetch makes one pull of n (tokens taken) on p. The pull expires at the
// server after expiry and is read to its end, even once ctx ends (at most
// expiry + 1 s): a pull read with a context would stop listening a tenth
// of its expiry after the server's end (nats.go's FetchContext), too short
// a margin on a loaded machine, and the message the server sent in that
// margin would be lost in flight (back only after ack_wait, which a fence
// waits for) and the pull's answer too (the lease not renewed). What
// arrives after ctx ended is received as usual and handed back with the
// rest.
func (o *orderedRoute) fetch(ctx context.Context, p *partition, n int, expiry time.Duration) error {
	opts := []jetstream.FetchOpt{jetstream.FetchMaxWait(expiry)}
	if expiry >= 2*time.Second {
		opts = append(opts, jetstream.FetchHeartbeat(fetchHeartbeat))
	}
	if o.cfg.pinned {
		opts = append(opts, jetstream.FetchPriorityGroup(orderingGroup))
	}
	sent := time.Now()
	batch, err := p.cons.Fetch(n, opts...)
	if err != nil {
		o.release(n)
		return err
	}
	got := 0
	for m := range batch.Messages() {
		got++
		o.receive(ctx, p, m, sent)
	}
	o.release(n - got)
	heard := got > 0 || time.Since(sent) < expiry+answerMargin
	return o.answered(ctx, p, batch.Error(), sent, heard)
}

// keepAlive keeps an owned partition's pin while it pulls nothing else:
// a pull of one byte, which delivers nothing (a pending message ends it
// at once, then it is paced by the wait before it), open at most wait at
// the server and read to its end (fetch says why), unless ctx ends.
func (o *orderedRoute) keepAlive(ctx context.Context, p *partition, wait time.Duration) {
	sent := time.Now()
	batch, err := p.cons.FetchBytes(1, jetstream.FetchMaxWait(wait), jetstream.FetchPriorityGroup(orderingGroup))
	if err != nil {
		return
	}
	msgs := batch.Messages()
	for {
		select {
		case <-ctx.Done():
			return // nothing is lost: it delivers no message
		case m, ok := <-msgs:
			if !ok {
				_ = o.answered(ctx, p, batch.Error(), sent, time.Since(sent) < wait+answerMargin)
				return
			}
			// Cannot happen: no message fits in 1 byte.
			o.r.log.Error().Int("partition", p.n).Msg("a keep-alive pull delivered a message; handed back")
			_ = m.NakWithDelay(interruptedDelay)
		}
	}
}

// answerMargin is how long after its expiry a pull's end still counts as
// the server's answer. nats.go ends a pull the server did not answer
// expiry + 1 s after it was sent, without an error and without messages,
// as the server's answer (408) would; a timer cannot fire early, so an
// end before expiry + answerMargin is the server's.
const answerMargin = 900 * time.Millisecond

// answered takes the end of a pull sent at sent: a wrong pin loses the
// partition; a pull the server answered (heard: it delivered messages, or
// ended before expiry + answerMargin) renews an owned partition's lease,
// if it was sent while the lease held. It returns the pull's failure,
// nil for an answer.
func (o *orderedRoute) answered(ctx context.Context, p *partition, err error, sent time.Time, heard bool) error {
	switch {
	case errors.Is(err, jetstream.ErrPinIDMismatch):
		o.lose(p, "the server pinned another replica")
		return nil
	case !heard && (err == nil || errors.Is(err, jetstream.ErrNoMessages)):
		return nil // no answer: the lease is not renewed
	case err == nil, errors.Is(err, jetstream.ErrNoMessages),
		// A keep-alive's answer when a message is waiting: the server
		// took the pull with our pin.
		errors.Is(err, jetstream.ErrMaxBytesExceeded):
		o.renew(p, sent)
		return nil
	case ctx.Err() != nil, errors.Is(err, context.DeadlineExceeded):
		return nil // no answer: the lease is not renewed
	}
	return err
}

// renew extends an owned partition's lease to sent + PinnedTTL.
func (o *orderedRoute) renew(p *partition, sent time.Time) {
	if !o.cfg.pinned {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.owned || !sent.Before(p.leaseEnd) {
		return
	}
	p.leaseEnd = sent.Add(o.cfg.pinnedTTL - leaseMargin)
	p.cut.Reset(time.Until(p.leaseEnd) - o.cfg.leaseCut)
}

// receive takes a pulled message of p (its token is taken).
func (o *orderedRoute) receive(ctx context.Context, p *partition, m jetstream.Msg, sent time.Time) {
	r := o.r
	r.bound.received.Add(1)
	if o.cfg.pinned {
		pin := m.Headers().Get(headerPinID)
		p.mu.Lock()
		same := p.owned && pin == p.pin
		p.mu.Unlock()
		if !same {
			o.lose(p, "a new pin")
			o.gain(ctx, p, pin)
			o.renew(p, sent)
		}
	}
	cm, err := newCopyMsg(m, r.b.cfg.Stream.Name)
	if err != nil {
		// Not a message the source stream gave the copy: nothing to
		// deliver, never anything to order.
		r.log.Warn().Int("partition", p.n).Str("error", err.Error()).Msg("message of the partitioned copy terminated: not copied from the source stream")
		_ = m.TermWithReason("jetbridge: not copied from the source stream")
		o.release(1)
		return
	}
	h := &heldMsg{msg: m, cm: cm, key: o.key.Key(cm.Subject()), partition: p.n, copySeq: cm.copySeq,
		base: cm.md.NumDelivered, keep: time.Now()}
	if v := cm.Headers().Get(deadletter.HeaderReplayedFrom); v != "" {
		h.replayOf, _ = strconv.ParseUint(v, 10, 64)
	}
	p.mu.Lock()
	h.epoch = p.epoch
	if p.fenced {
		p.pending = append(p.pending, h)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	o.add(h)
}

// add puts h in the key table, or drops this handle of a message held
// already (a redelivery of it).
func (o *orderedRoute) add(h *heldMsg) {
	if h.replayOf != 0 && o.tab.reopen(h) {
		o.r.log.Info().Uint64("dlq_seq", h.replayOf).Msg("replayed dead letter re-opens its blocked key")
		return
	}
	if !o.tab.add(h) {
		o.release(1)
	}
}

// gain makes p owned with pin, fenced until the previous owner's messages
// are back (not fenced without pinning).
func (o *orderedRoute) gain(ctx context.Context, p *partition, pin string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.owned, p.pin = true, pin
	p.epoch++
	p.stop, p.cancelStop = context.WithCancel(ctx)
	p.work, p.cancelWork = context.WithCancel(o.work)
	if !o.cfg.pinned {
		return
	}
	p.fenced, p.fencedAt, p.missing = true, time.Now(), 0
	p.leaseEnd = time.Now() // renewed by the caller
	if p.cut != nil {
		p.cut.Stop()
	}
	// The cut: leaseCut before the lease ends without a renewal, the
	// partition is given up and its attempts are cut off.
	epoch := p.epoch
	p.cut = time.AfterFunc(time.Hour, func() { o.loseEpoch(p, epoch, "its lease passed (no pull answered)") })
	o.m.changed("acquired")
	o.r.log.Info().Int("partition", p.n).Msg("partition acquired; fenced until its unacknowledged messages are here")
}

// checkFence ends p's fence once every unacknowledged message of p is in
// this process. Two checks, the cheap one first: the partition consumer's
// NumAckPending is at most what this process holds of p; then the copy
// itself (work-queue retention: a message is there until acked) has no
// message of p, up to the highest held or delivered, that this process
// does not hold.
// The second does not trust the consumer's state, which a server restart
// can leave behind what the stream holds.
func (o *orderedRoute) checkFence(ctx context.Context, p *partition) {
	ictx, cancel := context.WithTimeout(ctx, readinessTimeout)
	info, err := p.cons.Info(ictx)
	cancel()
	if err != nil {
		return
	}
	p.mu.Lock()
	if !p.fenced {
		p.mu.Unlock()
		return
	}
	epoch := p.epoch
	here := map[uint64]bool{}
	for _, h := range p.pending {
		here[h.copySeq] = true
	}
	p.mu.Unlock()
	for _, seq := range o.tab.seqsOf(p.n, epoch) {
		here[seq] = true
	}
	p.mu.Lock()
	if p.epoch == epoch {
		p.missing = max(0, info.NumAckPending-len(here))
	}
	p.mu.Unlock()
	if info.NumAckPending > len(here) {
		return
	}
	scanned, ok := o.allHere(ctx, p, here, info.Delivered.Stream)
	if !ok {
		return
	}
	p.mu.Lock()
	if !p.fenced || p.epoch != epoch {
		p.mu.Unlock()
		return
	}
	pending := p.pending
	p.pending, p.fenced, p.missing = nil, false, 0
	since := p.fencedAt
	p.mu.Unlock()
	// In copy order: redeliveries arrive in any order, and a key's head
	// may start as soon as it is added, before an earlier message of the
	// key would be.
	slices.SortFunc(pending, func(a, b *heldMsg) int { return cmpSeq(a.copySeq, b.copySeq) })
	for _, h := range pending {
		o.add(h)
	}
	o.m.fence.Observe(time.Since(since).Seconds())
	o.r.log.Info().Int("partition", p.n).Int("held", len(pending)).Int("ack_pending", info.NumAckPending).Int("scanned", scanned).
		Str("fenced_for", time.Since(since).Round(time.Millisecond).String()).Msg("partition fence released")
}

// allHere reports whether every message of p in the copy, up to the
// highest sequence in here or delivered (the consumer's delivered stream
// sequence: what is past it has never been delivered and comes in order),
// is in here (one direct get per message), and how many it read.
func (o *orderedRoute) allHere(ctx context.Context, p *partition, here map[uint64]bool, delivered uint64) (int, bool) {
	top := delivered
	for seq := range here {
		top = max(top, seq)
	}
	subject := strconv.Itoa(p.n) + ".>"
	n := 0
	for seq := uint64(1); seq <= top; {
		gctx, cancel := context.WithTimeout(ctx, readinessTimeout)
		m, err := o.stream.GetMsg(gctx, seq, jetstream.WithGetMsgSubject(subject))
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return n, true
		case err != nil:
			return n, false
		case m.Sequence > top:
			return n, true
		case !here[m.Sequence]:
			return n, false
		}
		n++
		seq = m.Sequence + 1
	}
	return n, true
}

// lose ends this replica's ownership of p (if it owned it): what it holds
// of p is handed back, and attempts still running are cut.
func (o *orderedRoute) lose(p *partition, why string) { o.loseEpoch(p, 0, why) }

// loseEpoch is lose, only if p's ownership is still epoch (0: any).
func (o *orderedRoute) loseEpoch(p *partition, epoch uint64, why string) {
	p.mu.Lock()
	if !p.owned || epoch != 0 && p.epoch != epoch {
		p.mu.Unlock()
		return
	}
	p.owned = false
	if p.cut != nil {
		p.cut.Stop()
	}
	p.cancelStop()
	p.cancelWork()
	p.mu.Unlock()
	o.m.changed("lost")
	o.r.log.Warn().Int("partition", p.n).Str("why", why).Msg("partition lost; handing back what this replica holds of it")
	o.handBackPartition(p, why)
}

// handBackPartition hands back p's messages held and not being attempted,
// key by key in copy order, and those pulled while fenced.
func (o *orderedRoute) handBackPartition(p *partition, why string) {
	p.mu.Lock()
	pending := p.pending
	p.pending = nil
	p.mu.Unlock()
	n := 0
	for _, k := range o.tab.keysOf(p.n) {
		n += o.handBack(o.tab.handBack(k))
	}
	n += o.handBack(pending)
	if n > 0 {
		o.r.log.Info().Int("partition", p.n).Int("messages", n).Str("why", why).Msg("handed back")
	}
}

// handBack gives msgs (one key's, in copy order) back to JetStream.
func (o *orderedRoute) handBack(msgs []*heldMsg) int {
	for _, h := range msgs {
		h.settleOff()
		err := h.msg.NakWithDelay(interruptedDelay)
		if e := o.r.log.Debug(); e != nil {
			e.Int("partition", h.partition).Uint64("copy_seq", h.copySeq).Bool("sent", err == nil).Msg("handed back")
		}
	}
	o.release(len(msgs))
	return len(msgs)
}

// settleOff stops h's progress acks for good.
func (h *heldMsg) settleOff() {
	h.mu.Lock()
	h.gone = true
	h.mu.Unlock()
}

// current returns p's contexts when h was pulled in p's current
// ownership, else false.
func (p *partition) current(h *heldMsg) (stop, work context.Context, leaseEnd time.Time, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.owned || h.epoch != p.epoch {
		return nil, nil, time.Time{}, false
	}
	return p.stop, p.work, p.leaseEnd, true
}

// worker w takes heads from the key table until stop ends.
func (o *orderedRoute) worker(stop context.Context, w int) {
	r := o.r
	d := new(delivery)
	for {
		h, err := o.tab.next(stop)
		if err != nil {
			return
		}
		p := o.parts[h.partition]
		// Counted before p's ownership is read: a shed of p waits for
		// the count to drop (ordered_balance.go).
		if !o.bal.begin(p.n) { // p is being shed: it starts nothing more
			h.attempts--
			o.tab.hold(h, leaseHold)
			continue
		}
		pstop, pwork, leaseEnd, ok := p.current(h)
		switch {
		case !ok:
			o.after(h, d, false)
			o.bal.end(p.n)
			continue
		case o.cfg.pinned && time.Now().Add(o.cfg.leaseCut).After(leaseEnd):
			h.attempts--
			o.m.held("lease")
			o.tab.hold(h, leaseHold)
			o.bal.end(p.n)
			continue
		}
		h.cm.md.NumDelivered = h.base - 1 + uint64(h.attempts)
		d.head = h
		r.handle(pstop, pwork, d, h.cm, w)
		o.after(h, d, true)
		o.bal.end(p.n)
		d.head = nil
	}
}

// keep reports whether the redelivery of head h is held in the process
// (whatever its delay): always while h's partition is owned in h's epoch
// and the route runs. Otherwise h is handed back (its progress acks stop
// now).
func (o *orderedRoute) keep(h *heldMsg) bool {
	stop, _, _, ok := o.parts[h.partition].current(h)
	if ok && stop.Err() == nil {
		return true
	}
	h.settleOff()
	return false
}

// after moves h's key on once h's delivery d is settled (attempted:
// false when h was not attempted: its partition was lost).
func (o *orderedRoute) after(h *heldMsg, d *delivery, attempted bool) {
	switch {
	case !attempted:
		h.settleOff()
		_ = h.msg.NakWithDelay(interruptedDelay)
		o.leftBehind(h)
	case d.kept:
		o.m.held("backoff")
		o.tab.hold(h, d.keptFor)
	case d.action == actAck:
		h.settleOff()
		o.tab.done(h)
		o.release(1)
		o.unrecord(h)
	case d.action == actDeadLetter && o.block:
		h.settleOff()
		o.tab.block(h, d.dlq)
		o.release(1)
		o.record(h, d.dlq)
		o.r.log.Warn().Int("partition", h.partition).Str("block", blockID(h.key)).Uint64("dlq_seq", d.dlq).Msg("key blocked by its dead letter (on_dead_letter: block) until the dead letter is replayed")
	case d.action == actDeadLetter:
		h.settleOff()
		o.tab.done(h)
		o.release(1)
		o.unrecord(h)
	default: // handed back with a delay (settle sent NakWithDelay)
		o.leftBehind(h)
	}
}

// leftBehind settles head h, which was handed back (NakWithDelay): its
// partition was lost, the route stops, or h was pulled in an ownership of
// its partition that has ended. The key's later messages must not go
// before h comes back. If this replica owns the partition again (a later
// ownership), the partition is fenced again first: its held messages
// leave the key table until h is back. Otherwise the key's later messages
// are handed back too, in copy order.
func (o *orderedRoute) leftBehind(h *heldMsg) {
	p := o.parts[h.partition]
	p.mu.Lock()
	again := p.owned && p.epoch != h.epoch && p.stop.Err() == nil
	p.mu.Unlock()
	if again {
		o.refence(p) // before h leaves: its key's next message must not start
	}
	o.tab.done(h)
	o.release(1)
	if !again {
		o.handBack(o.tab.handBack(h.key))
	}
}

// refence fences owned partition p again: its messages that are not being
// attempted leave the key table for the fence's pending list (in copy
// order), where they wait until every unacknowledged message of p is here.
func (o *orderedRoute) refence(p *partition) {
	p.mu.Lock()
	if !p.owned {
		p.mu.Unlock()
		return
	}
	if !p.fenced {
		p.fenced, p.fencedAt = true, time.Now()
	}
	p.mu.Unlock()
	var msgs []*heldMsg
	for _, k := range o.tab.keysOf(p.n) {
		msgs = append(msgs, o.tab.handBack(k)...) // out of the table, not to JetStream
	}
	p.mu.Lock()
	p.pending = append(p.pending, msgs...)
	slices.SortFunc(p.pending, func(a, b *heldMsg) int { return cmpSeq(a.copySeq, b.copySeq) })
	p.mu.Unlock()
	o.r.log.Info().Int("partition", p.n).Int("held", len(msgs)).Msg("partition fenced again: a message of an earlier ownership was handed back")
}

// keepHeld sends InProgress for every held message not kept for every
// (a third of ack_wait), and sets the route's gauges. The route's
// progress loop calls it on each of its ticks.
func (o *orderedRoute) keepHeld(now time.Time, every time.Duration) {
	o.m.gauges(o.status())
	for _, h := range o.heldAll() {
		h.mu.Lock()
		if !h.gone && now.Sub(h.keep) >= every {
			h.keep = now
			_ = h.msg.InProgress()
		}
		h.mu.Unlock()
	}
}

// heldAll is every message in the process: the table's and the fenced.
func (o *orderedRoute) heldAll() []*heldMsg {
	out := o.tab.heldMsgs()
	for _, p := range o.parts {
		p.mu.Lock()
		out = append(out, p.pending...)
		p.mu.Unlock()
	}
	return out
}

// info sums the partition consumers' state (pending, ack pending,
// redelivered) for the readiness watch and /status; nil before provision.
func (o *orderedRoute) info(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	if !o.provisioned.Load() {
		return nil, nil
	}
	sum := &jetstream.ConsumerInfo{Stream: config.CopyStream(o.r.b.cfg.Stream.Name, o.r.cfg.Name)}
	for _, p := range o.parts {
		lctx, cancel := context.WithTimeout(ctx, readinessTimeout)
		in, err := p.cons.Info(lctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("partition %d: %w", p.n, err)
		}
		sum.NumPending += in.NumPending
		sum.NumAckPending += in.NumAckPending
		sum.NumRedelivered += in.NumRedelivered
	}
	return sum, nil
}

// OrderingStatus is an ordered route's state in this replica, as /status
// shows it.
type OrderingStatus struct {
	Partitions  int          `json:"partitions"`
	Owned       []int        `json:"owned"`
	Fenced      []int        `json:"fenced,omitempty"`
	Held        int          `json:"held"`         // messages in the process
	KeysWaiting int          `json:"keys_waiting"` // keys with messages held, not being attempted
	BlockedKeys []BlockedKey `json:"blocked_keys"`

	// Members is the live replicas running the route (this one included)
	// and Share the partitions this replica should own; both 0 when it
	// does not rebalance (no presence record; docs/delivery.md).
	Members int `json:"members"`
	Share   int `json:"share"`
}

// BlockedKey is a key stopped by its dead letter (on_dead_letter: block).
// The key is shown: it is made of subject tokens, as a subject is in logs.
type BlockedKey struct {
	Key string `json:"key"`
	// ID names its block record: key ord.<route>.blocked.<id> of the
	// bucket <stream>_BRIDGE.
	ID   string `json:"id"`
	Held int    `json:"held"` // its later messages, held in the process
}

func (o *orderedRoute) status() *OrderingStatus {
	st := &OrderingStatus{Partitions: o.r.cfg.Ordering.Partitions, Owned: []int{}, BlockedKeys: []BlockedKey{}}
	if !o.provisioned.Load() {
		return st
	}
	for _, p := range o.parts {
		p.mu.Lock()
		if p.owned {
			st.Owned = append(st.Owned, p.n)
		}
		if p.owned && p.fenced {
			st.Fenced = append(st.Fenced, p.n)
		}
		st.Held += len(p.pending)
		p.mu.Unlock()
	}
	st.Held += len(o.tab.heldMsgs())
	st.Members, st.Share = o.bal.shares()
	st.KeysWaiting = o.tab.waiting()
	for k, n := range o.tab.blockedKeys() {
		st.BlockedKeys = append(st.BlockedKeys, BlockedKey{Key: k, ID: blockID(k), Held: n})
	}
	return st
}

// orderingMetrics are the ordering series (docs/operating.md#metrics),
// by route.
type orderingMetrics struct {
	changes  *prometheus.CounterVec   // route, change: acquired, lost, released, shed
	heldKeys *prometheus.GaugeVec     // route
	blocked  *prometheus.GaugeVec     // route
	holds    *prometheus.CounterVec   // route, reason: backoff, lease
	fence    *prometheus.HistogramVec // route
}

func newOrderingMetrics() *orderingMetrics {
	return &orderingMetrics{
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bridge_partition_ownership_changes_total",
			Help: "Partitions of an ordered route this replica acquired, lost (another replica was pinned, or the lease passed), released (stopping) or shed (given to another replica: this one owned more than its share), by route and change.",
		}, []string{"route", "change"}),
		heldKeys: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "bridge_ordering_held_keys",
			Help: "Keys of an ordered route with messages held in this replica and none being attempted (in backoff, blocked, or waiting for a worker), by route.",
		}, []string{"route"}),
		blocked: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "bridge_ordering_blocked_keys",
			Help: "Keys of an ordered route stopped by a dead letter (on_dead_letter: block) in this replica, by route.",
		}, []string{"route"}),
		holds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bridge_ordering_holds_total",
			Help: "Heads of an ordered route's keys held in the process instead of attempted, by route and reason (backoff: a redelivery delay; lease: the partition's lease too short for a try).",
		}, []string{"route", "reason"}),
		fence: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "bridge_partition_fence_seconds",
			Help:    "How long a partition acquired by this replica waited for the previous owner's unacknowledged messages, by route.",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"route"}),
	}
}

func (m *orderingMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.changes, m.heldKeys, m.blocked, m.holds, m.fence}
}

// routeOrdering is one route's ordering series.
type routeOrdering struct {
	m     *orderingMetrics
	route string
	fence prometheus.Observer
}

func (m *orderingMetrics) forRoute(route string) *routeOrdering {
	for _, c := range []string{"acquired", "lost", "released", "shed"} {
		m.changes.WithLabelValues(route, c)
	}
	for _, c := range []string{"backoff", "lease"} {
		m.holds.WithLabelValues(route, c)
	}
	m.heldKeys.WithLabelValues(route)
	m.blocked.WithLabelValues(route)
	return &routeOrdering{m: m, route: route, fence: m.fence.WithLabelValues(route)}
}

func (r *routeOrdering) changed(change string) { r.m.changes.WithLabelValues(r.route, change).Inc() }
func (r *routeOrdering) held(reason string)    { r.m.holds.WithLabelValues(r.route, reason).Inc() }

// gauges sets the route's held and blocked keys.
func (r *routeOrdering) gauges(st *OrderingStatus) {
	r.m.heldKeys.WithLabelValues(r.route).Set(float64(st.KeysWaiting))
	r.m.blocked.WithLabelValues(r.route).Set(float64(len(st.BlockedKeys)))
}

// bindOrdered provisions ordered route r's copy and partition consumers.
func (r *route) bindOrdered(ctx context.Context) error {
	if r.ordErr != nil {
		return r.ordErr
	}
	return r.ord.provision(ctx)
}

// orderedRestartKeys are the keys of next that a reload cannot apply to
// ordered routes: the ordering of a route that runs (added, changed or
// removed: its partitioned copy and consumers are made for it). The rest
// of an ordered route's keys, and ordered routes added or removed, are
// applied live: the retired route hands back what it holds and unpins
// its partitions, and the route that replaces it gains them and fences
// them as after any hand-over (docs/delivery.md#ordered-delivery).
func orderedRestartKeys(running, next *config.Config) []string {
	old := map[string]*config.Route{}
	for _, rc := range running.Routes {
		old[rc.Name] = rc
	}
	var keys []string
	for i, rc := range next.Routes {
		if o := old[rc.Name]; o != nil && !reflect.DeepEqual(o.Ordering, rc.Ordering) {
			keys = append(keys, fmt.Sprintf("routes[%d].ordering (%s: a route's ordering changes by a restart)", i, rc.Name))
		}
	}
	return keys
}

// blockID names key's block record: the first 16 hex digits of its
// SHA-256 (a key may hold characters a KV key cannot).
func blockID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}

// blockRecord is a block as the bucket keeps it.
type blockRecord struct {
	Key string `json:"key"`
	DLQ uint64 `json:"dlq_seq"`
}

func (o *orderedRoute) blockKey(key string) string {
	return config.BlockRecordPrefix(o.r.cfg.Name) + blockID(key)
}

// record stores the block of h's key by dead letter dlq, so that another
// replica taking the partition over keeps the key blocked. A record not
// stored keeps the block in this replica only (logged).
func (o *orderedRoute) record(h *heldMsg, dlq uint64) {
	if o.blocks == nil {
		return
	}
	v, _ := json.Marshal(blockRecord{Key: h.key, DLQ: dlq})
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	if _, err := o.blocks.Put(ctx, o.blockKey(h.key), v); err != nil {
		o.r.log.Warn().Str("block", blockID(h.key)).Str("error", err.Error()).Msg("block record not stored: the key is blocked in this replica only")
	}
}

// unrecord deletes the block record of h's key once h, the replay that
// re-opened it, is settled.
func (o *orderedRoute) unrecord(h *heldMsg) {
	if o.blocks == nil || !h.first {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	if err := o.blocks.Delete(ctx, o.blockKey(h.key)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		o.r.log.Warn().Str("block", blockID(h.key)).Str("error", err.Error()).Msg("block record not deleted")
	}
}

// watchBlocks applies the route's block records until ctx ends: a record
// blocks its key (recorded by this replica or another), its deletion (the
// replay settled, or an operator deleted it) lets the key go on. The watch
// is made again after a failure; the keys it blocked stay blocked
// meanwhile, and the new watch sends every record again.
func (o *orderedRoute) watchBlocks(ctx context.Context) {
	names := map[string]string{} // record key -> ordering key
	followKV(ctx, o.blocks, "ord."+o.r.cfg.Name+".blocked.*", func(e jetstream.KeyValueEntry) { o.applyBlock(e, names) }, func() {})
}

// applyBlock applies one update of the route's block records (nil:
// nothing to do); names maps a record's key to the ordering key it blocks.
func (o *orderedRoute) applyBlock(e jetstream.KeyValueEntry, names map[string]string) {
	if e == nil {
		return // the records stored so far are in
	}
	switch e.Operation() {
	case jetstream.KeyValuePut:
		var rec blockRecord
		if len(e.Value()) > config.MaxBlockRecord || json.Unmarshal(e.Value(), &rec) != nil || o.blockKey(rec.Key) != e.Key() {
			o.r.log.Warn().Str("record", e.Key()).Msg("block record ignored: not a record of this route")
			return
		}
		names[e.Key()] = rec.Key
		o.tab.setBlocked(rec.Key, rec.DLQ)
	default: // deleted or purged
		if k, ok := names[e.Key()]; ok {
			delete(names, e.Key())
			o.tab.unblock(k)
		}
	}
}

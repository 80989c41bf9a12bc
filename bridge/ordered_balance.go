package bridge

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// This file spreads an ordered route's partitions over the live replicas
// (docs/delivery.md#ordered-delivery, "One replica per partition"). The
// server still decides who owns a partition (the pinned priority group of
// ordered_route.go); a replica only gives partitions back (CONSUMER.UNPIN)
// and holds back from taking more than its share. There is no leader and
// no election: every replica computes the same shares from the same
// presence records.
//
//   - Presence: every replica running the route keeps the key
//     ord.<route>.member.<id> in the bucket <stream>_BRIDGE, <id> random
//     per start, written with a TTL of the partitions' PinnedTTL (ack_wait
//     + 1 s) and renewed every third of it; deleted on a graceful stop. A
//     replica watches ord.<route>.member.*: a member is live while its
//     record is there and was written within the TTL. Keys are untrusted:
//     an id that is not 1 to maxMemberID characters of [a-z0-9] is
//     ignored, values are never read, at most maxMembers are counted.
//   - Share: with the live ids sorted, the one of rank i has P/n
//     partitions, one more when i < P mod n: the shares sum to P, and the
//     replicas agree on them once they see the same records.
//   - Shedding: a replica owning more than its share, with its view of
//     the members unchanged for balanceSettle, gives one partition back
//     at a time, at most one every shedEvery: its workers start no new
//     head of it, its pull loop pulls nothing of it (keep-alives only,
//     while an attempt of it still runs, so that the lease covers the
//     attempt); once no attempt of it runs, the replica ends its
//     ownership, hands back what it holds (copy order) and unpins it. It
//     then does not pull that partition for two pull expiries (a pinned
//     TTL more if the unpin failed), so another replica's waiting pull
//     gets the pin; the new owner's fence waits for what was handed back,
//     as after any hand-over.
//   - Holding back: a replica holding its share (or more) pulls a
//     partition it does not own only with short pulls (lazyOpen), one per
//     pull expiry; a replica below its share pulls it all the time, so it
//     is the one the server pins. A partition whose owner died is still
//     taken over: its owner's record expires within the TTL and the
//     shares grow, and the short pulls take an orphan with pending
//     messages at once. Either pull asks for one message (pullOne): a
//     pull waiting on another replica's partition holds one of the
//     route's B places, not a batch.
//   - A shed partition this replica gains back within two PinnedTTLs (no
//     other replica took it) doubles the pause before the next shed, from
//     one PinnedTTL up to shedPauseMax, so a member that announces itself
//     but does not pull cannot make the partitions bounce.
//   - Without presence (the bucket cannot be created, written or watched:
//     permissions, an old bucket without per-key TTLs) a replica does not
//     rebalance: it never sheds and pulls every partition as before, and
//     logs one warning. Delivery never waits for the bucket.
//
// Invariant: a partition is unpinned by a shed only while no attempt of
// it runs in this replica and none can start (begin refuses, and the
// ownership has ended), after what this replica held of it was handed
// back; so no key is delivered by two replicas at once, the next owner
// being fenced until those messages are back (ordered_route.go).

// balanceTick is how often the balancer looks at its view and shares.
const balanceTick = 100 * time.Millisecond

// balanceSettle is how long the view of the members must be unchanged
// before a replica sheds: replicas starting together are all seen first.
const balanceSettle = time.Second

// shedEvery is the least time between two sheds of one replica.
const shedEvery = 300 * time.Millisecond

// lazyOpen is how long a pull of a replica holding its share stays open
// on a partition it does not own; it makes one every pull expiry.
const lazyOpen = 250 * time.Millisecond

// shedPauseMax bounds the pause between sheds that were not taken.
const shedPauseMax = 30 * time.Second

// maxMemberID and maxMembers bound what the presence records can make a
// replica hold.
const (
	maxMemberID = 32
	maxMembers  = 256
)

// balancer is the rebalancing of one ordered route in this replica.
type balancer struct {
	o      *orderedRoute
	kv     jetstream.KeyValue // nil: no rebalancing
	bucket string
	id     string // this replica's member id
	prefix string // ord.<route>.member.
	ttl    time.Duration
	value  []byte // host and process id, for operators reading the bucket

	mu      sync.Mutex
	written time.Time            // last presence write that succeeded
	failing bool                 // the last presence write failed (warned once)
	synced  bool                 // the watch delivered the stored records
	members map[string]time.Time // other members: when their record was seen
	last    balanceView
	since   time.Time     // when last was first seen
	wake    chan struct{} // closed (and replaced) when the view changes
	parts   []balancePart
	next    time.Time // no shed before
	pause   time.Duration
	recent  []shedRecord
}

// balancePart is one partition as the balancer sees it.
type balancePart struct {
	shedding bool
	running  int       // attempts of it running (begin without end)
	rest     time.Time // not pulled before (after a shed)
}

// shedRecord is a shed partition, to tell when it comes back.
type shedRecord struct {
	n     int
	epoch uint64
	at    time.Time
}

// balanceView is what a replica knows of the members: inactive (zero)
// when it does not rebalance.
type balanceView struct {
	members int // live members, this replica included
	share   int // partitions this replica should own
}

func (v balanceView) active() bool { return v.members > 0 }

// newBalancer makes o's balancer on bucket kv (nil: none).
func newBalancer(o *orderedRoute, kv jetstream.KeyValue) *balancer {
	host, _ := os.Hostname()
	b := &balancer{
		o: o, kv: kv, bucket: fleetBucketName(o.r.b.cfg.Stream.Name),
		id:      memberID(),
		prefix:  "ord." + o.r.cfg.Name + ".member.",
		ttl:     o.cfg.pinnedTTL,
		value:   []byte(host + "-" + strconv.Itoa(os.Getpid())),
		members: map[string]time.Time{},
		wake:    make(chan struct{}),
		parts:   make([]balancePart, len(o.parts)),
	}
	return b
}

// memberID is a random member id: 16 characters of [0-9a-f].
func memberID() string {
	var buf [8]byte
	_, _ = rand.Read(buf[:]) // never fails (crypto/rand)
	return hex.EncodeToString(buf[:])
}

// validMemberID reports whether id may name a member (untrusted: read
// back from the bucket).
func validMemberID(id string) bool {
	if len(id) == 0 || len(id) > maxMemberID {
		return false
	}
	for i := range len(id) {
		if c := id[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// start runs the presence, the watch and the shedding until stop ends
// (the route's pullers wait for them).
func (b *balancer) start(stop context.Context) {
	if b == nil || b.kv == nil {
		return
	}
	b.o.pullers.Go(func() { b.announce(stop) })
	b.o.pullers.Go(func() { b.watch(stop) })
	b.o.pullers.Go(func() { b.run(stop) })
}

// announce writes this replica's record every third of its TTL until ctx
// ends, then deletes it.
func (b *balancer) announce(ctx context.Context) {
	t := time.NewTicker(b.ttl / 3)
	defer t.Stop()
	for {
		b.write(ctx)
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = b.kv.Delete(dctx, b.prefix+b.id)
			return
		case <-t.C:
		}
	}
}

// write writes this replica's record with its TTL; a failure is logged
// once, until a write succeeds again.
func (b *balancer) write(ctx context.Context) {
	wctx, cancel := context.WithTimeout(ctx, min(fleetCallTimeout, b.ttl/3))
	defer cancel()
	msg := &nats.Msg{Subject: "$KV." + b.bucket + "." + b.prefix + b.id, Data: b.value}
	_, err := b.o.r.b.js.PublishMsg(wctx, msg, jetstream.WithMsgTTL(b.ttl))
	if ctx.Err() != nil {
		return
	}
	b.mu.Lock()
	was := b.failing
	b.failing = err != nil
	if err == nil {
		b.written = time.Now()
	}
	b.mu.Unlock()
	switch {
	case err != nil && !was:
		b.o.r.log.Warn().Str("bucket", b.bucket).Str("error", err.Error()).Msg("ordering: presence record not written: this replica does not rebalance the route's partitions (it keeps delivering)")
	case err == nil && was:
		b.o.r.log.Info().Str("bucket", b.bucket).Msg("ordering: presence record written again: this replica rebalances the route's partitions")
	}
}

// watch follows the members' records until ctx ends; the watch is made
// again after a failure, and the view is inactive meanwhile.
func (b *balancer) watch(ctx context.Context) {
	followKV(ctx, b.kv, b.prefix+"*", b.apply, func() {
		b.mu.Lock()
		b.synced = false
		clear(b.members)
		b.mu.Unlock()
	})
}

// apply takes one update of the members' records.
func (b *balancer) apply(e jetstream.KeyValueEntry) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case e == nil:
		b.synced = true // the records stored so far are in
	case !strings.HasPrefix(e.Key(), b.prefix) || !validMemberID(e.Key()[len(b.prefix):]):
		// not a member's record: ignored
	case e.Key()[len(b.prefix):] == b.id:
		// this replica: counted by its own writes
	case e.Operation() == jetstream.KeyValuePut:
		id := e.Key()[len(b.prefix):]
		if _, ok := b.members[id]; ok || len(b.members) < maxMembers {
			b.members[id] = time.Now()
		}
	default: // deleted, purged, or its TTL ran out
		delete(b.members, e.Key()[len(b.prefix):])
	}
}

// viewLocked computes the view at now (b.mu held).
func (b *balancer) viewLocked(now time.Time) balanceView {
	if !b.synced || b.failing || b.written.IsZero() || now.Sub(b.written) > b.ttl {
		return balanceView{}
	}
	ids := []string{b.id}
	for id, seen := range b.members {
		if now.Sub(seen) <= b.ttl {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	parts, n := len(b.parts), len(ids)
	share := parts / n
	if slices.Index(ids, b.id) < parts%n {
		share++
	}
	return balanceView{members: n, share: share}
}

// view is the current view and the channel closed when it changes.
func (b *balancer) view() (balanceView, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.last, b.wake
}

// shares is the members and the share /status shows (0, 0: this replica
// does not rebalance).
func (b *balancer) shares() (members, share int) {
	if b == nil {
		return 0, 0
	}
	v, _ := b.view()
	return v.members, v.share
}

// run updates the view and sheds, every balanceTick, until ctx ends.
func (b *balancer) run(ctx context.Context) {
	t := time.NewTicker(balanceTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		b.tick(time.Now())
	}
}

// tick takes the view at now and, when this replica owns more than its
// share, marks one partition to shed (pull, in the partition's own pull
// loop, sheds it).
func (b *balancer) tick(now time.Time) {
	owned := b.o.ownedParts()
	b.mu.Lock()
	defer b.mu.Unlock()
	if v := b.viewLocked(now); v != b.last {
		b.last, b.since = v, now
		close(b.wake)
		b.wake = make(chan struct{})
	}
	b.regainedLocked(now)
	v := b.last
	if !v.active() || len(owned) <= v.share || now.Sub(b.since) < balanceSettle || now.Before(b.next) {
		return
	}
	for _, bp := range b.parts {
		if bp.shedding {
			return // one at a time
		}
	}
	// The highest-numbered owned partition not fenced: one whose fence
	// runs is still taking its previous owner's messages back.
	for _, op := range slices.Backward(owned) {
		if !op.fenced {
			b.parts[op.n].shedding = true
			b.next = now.Add(shedEvery + b.pause)
			return
		}
	}
}

// regainedLocked notes the shed partitions this replica owns again within
// shedRegain: no other replica took them, so the next shed waits longer.
func (b *balancer) regainedLocked(now time.Time) {
	regain := 2 * b.o.cfg.pinnedTTL
	keep := b.recent[:0]
	for _, s := range b.recent {
		p := b.o.parts[s.n]
		p.mu.Lock()
		back := p.owned && p.epoch != s.epoch
		p.mu.Unlock()
		switch {
		case back:
			b.pause = min(max(2*b.pause, b.o.cfg.pinnedTTL), shedPauseMax)
			b.next = now.Add(b.pause)
			b.o.r.log.Info().Int("partition", s.n).Str("pause", b.pause.String()).Msg("ordering: a shed partition came back to this replica: no other replica took it; the next shed waits")
		case now.Sub(s.at) > regain:
			b.pause = 0 // taken by another replica
		default:
			keep = append(keep, s)
		}
	}
	b.recent = keep
}

// ownedPart is an owned partition, for the balancer.
type ownedPart struct {
	n      int
	fenced bool
}

// ownedParts lists the partitions this replica owns, in order.
func (o *orderedRoute) ownedParts() []ownedPart {
	var out []ownedPart
	for _, p := range o.parts {
		p.mu.Lock()
		if p.owned {
			out = append(out, ownedPart{n: p.n, fenced: p.fenced})
		}
		p.mu.Unlock()
	}
	return out
}

// begin reports whether a worker may go on with a head of partition n
// (not while n is shed) and counts it until end: the worker calls it
// before it reads n's ownership, so a shed that starts later waits for
// the attempt, and one that started first makes the worker hold the head.
func (b *balancer) begin(n int) bool {
	if b == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.parts[n].shedding {
		return false
	}
	b.parts[n].running++
	return true
}

// end ends an attempt counted by begin.
func (b *balancer) end(n int) {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.parts[n].running--
	b.mu.Unlock()
}

// gate runs at the top of partition p's pull loop and reports whether the
// loop must skip its pull this time: p is being shed (it is shed here
// once no attempt of it runs), p was shed a moment ago, or this replica
// holds its share and p is not its own (one short pull per pull expiry).
func (b *balancer) gate(ctx context.Context, p *partition) bool {
	if b == nil || b.kv == nil || !b.o.cfg.pinned {
		return false
	}
	b.mu.Lock()
	bp := b.parts[p.n]
	v := b.last
	wake := b.wake
	b.mu.Unlock()
	p.mu.Lock()
	owned := p.owned
	p.mu.Unlock()
	switch {
	case bp.shedding && bp.running > 0:
		// Keep the lease while the last attempts end, nothing more.
		if owned {
			b.o.keepAlive(ctx, p, lazyOpen)
		}
		sleep(ctx, 50*time.Millisecond)
		return true
	case bp.shedding:
		b.shed(p, v)
		return true
	case time.Now().Before(bp.rest):
		sleep(ctx, time.Until(bp.rest))
		return true
	case owned || !v.active():
		return false
	}
	if len(b.o.ownedParts()) < v.share {
		b.o.pullOne(ctx, p, b.o.cfg.expiry) // below its share: all the time
		return true
	}
	// This replica holds its share: a short pull now and then, so that a
	// partition nobody owns is still taken.
	t := time.NewTimer(max(b.o.cfg.expiry-lazyOpen, lazyOpen))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return true
	case <-wake:
		return true // look again with the new view
	case <-t.C:
	}
	b.o.pullOne(ctx, p, lazyOpen)
	return true
}

// shed gives owned partition p back: this replica's ownership ends, what
// it holds of p is handed back in copy order and p is unpinned, so the
// server pins the next replica that pulls it. No attempt of p runs (gate
// waited for them) and none starts (begin refuses while p is shed).
func (b *balancer) shed(p *partition, v balanceView) {
	o := b.o
	p.mu.Lock()
	owned := p.owned
	if owned {
		p.owned = false
		if p.cut != nil {
			p.cut.Stop()
		}
		p.cancelStop()
		p.cancelWork()
	}
	epoch := p.epoch
	p.mu.Unlock()
	rest := 2 * o.cfg.expiry
	if owned {
		o.m.changed("shed")
		o.r.log.Info().Int("partition", p.n).Int("owned", len(o.ownedParts())+1).Int("share", v.share).Int("members", v.members).
			Msg("ordering: partition shed: this replica owned more than its share; handing it back to another replica")
		o.handBackPartition(p, "shed to another replica")
		ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
		err := o.stream.UnpinConsumer(ctx, p.name, orderingGroup)
		cancel()
		if err != nil {
			// The pin lapses after PinnedTTL: stay away until then.
			rest = o.cfg.pinnedTTL + o.cfg.expiry
			o.r.log.Debug().Int("partition", p.n).Str("error", err.Error()).Msg("unpinning a shed partition failed; it moves after its pinned TTL")
		}
	}
	now := time.Now()
	b.mu.Lock()
	b.parts[p.n].shedding = false
	b.parts[p.n].rest = now.Add(rest)
	if owned {
		b.recent = append(b.recent, shedRecord{n: p.n, epoch: epoch, at: now})
	}
	b.mu.Unlock()
}

// pullOne is one pull of one message of partition p, which this replica
// does not own, open for open; it takes what it gets like any pull (a
// partition given to this replica becomes its own, and its loop then
// pulls it in batches). One message: the pull holds one of the route's
// places, not a batch, while it waits on a partition that is usually
// another replica's, so the partitions this replica owns keep theirs.
func (o *orderedRoute) pullOne(ctx context.Context, p *partition, open time.Duration) {
	half := o.cfg.expiry / 2
	wctx, cancel := context.WithTimeout(ctx, half)
	err := o.r.dest.waitUsable(wctx)
	cancel()
	if err != nil {
		return // the breaker is open: no pull, as in pull
	}
	n := o.acquire(ctx, 1, half)
	if n == 0 {
		return
	}
	if ctx.Err() != nil {
		o.release(n)
		return
	}
	if err := o.fetch(ctx, p, n, open); err != nil && ctx.Err() == nil {
		o.r.log.Debug().Int("partition", p.n).Str("error", err.Error()).Msg("pull failed")
		sleep(ctx, half) // NATS unreachable: not a busy loop
	}
}

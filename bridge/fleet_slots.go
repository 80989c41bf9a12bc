package bridge

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Fleet-wide concurrency (docs/delivery.md#across-replicas): a fixed
// concurrency.max holds for all replicas together through slot leases in
// the fleet's bucket. Slot i of a destination is the key
// fleet.<destination>.slot.<i>, i < max; an attempt the gate admitted
// (so severity order, slow start and pauses stay per process) takes a free
// slot with one publish that expects the key's last revision (the write
// is refused when another replica took it first) and carries a TTL of
// fleetSlotTTL; a lease is renewed every third of it while the attempt
// runs and deleted when it ends. A replica that dies loses its slots
// within fleetSlotTTL of its last renewal (the server removes the key and
// the watch of every replica sees it free). Which slots are free is known
// from the bucket's watch (watchFleet), so taking one costs one round
// trip. adaptive: true keeps a per-process limit.

// fleetSlotTTL is how long a slot outlives its holder's last renewal.
const fleetSlotTTL = 5 * time.Second

// fleetSlotHold is how long a busy replica may keep a slot from one
// attempt to the next before it gives it back (see release).
const fleetSlotHold = time.Second

// fleetSlotIdle is how long a slot kept for this replica's next attempt
// stays unused at most before it is given back.
const fleetSlotIdle = 50 * time.Millisecond

// fleetSlotRetry is how long a replica that found no free slot waits
// before it asks again when no slot is seen freed meanwhile.
const fleetSlotRetry = time.Second

// fleetSlots is the slot table of one destination as this replica sees
// it.
type fleetSlots struct {
	max    int
	dest   string
	offset int // where this replica starts looking: replicas spread

	mu    sync.Mutex
	last  []uint64 // each slot's last revision (0: never written)
	held  []bool   // taken, as last seen
	freed chan struct{}
	mine  int          // slots this replica holds
	idle  []*slotLease // held here between two attempts (see release)
}

func newFleetSlots(dest string, max int) *fleetSlots {
	return &fleetSlots{max: max, dest: dest, offset: rand.IntN(max), last: make([]uint64, max), held: make([]bool, max), freed: make(chan struct{})}
}

// slotKey is slot i of dest.
func slotKey(dest string, i int) string { return "fleet." + dest + ".slot." + strconv.Itoa(i) }

// slotLease is one attempt's slot.
type slotLease struct {
	i     int
	since time.Time // taken
	// idleSince is when it was kept for the next attempt (zero while an
	// attempt holds it); guarded by the slots' mu.
	idleSince time.Time
	mu        sync.Mutex
	rev       uint64
	written   time.Time   // the last write (taken or renewed)
	t         *time.Timer // the next renewal, or the end of a keep
	ended     bool
}

// seen records an entry of the watch: slot i at revision rev, taken or
// freed.
func (s *fleetSlots) seen(i int, rev uint64, taken bool) {
	if i < 0 || i >= s.max {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if rev < s.last[i] {
		return
	}
	s.last[i], s.held[i] = rev, taken
	if !taken {
		close(s.freed)
		s.freed = make(chan struct{})
	}
}

// acquire takes a slot for an attempt, waiting until one is free or ctx
// ends. It returns a nil lease when the bucket cannot be written: the
// attempt then runs under the per-process limit alone (counted).
func (s *fleetSlots) acquire(ctx context.Context, f *fleet, m *metrics) (*slotLease, error) {
	for {
		if l := s.reuse(); l != nil {
			return l, nil
		}
		s.mu.Lock()
		freed := s.freed
		s.mu.Unlock()
		for n := range s.max {
			i := (s.offset + n) % s.max
			s.mu.Lock()
			held, last := s.held[i], s.last[i]
			s.mu.Unlock()
			if held {
				continue
			}
			rev, err := f.writeSlot(ctx, slotKey(s.dest, i), last)
			if err == nil {
				s.mu.Lock()
				if rev > s.last[i] {
					s.last[i], s.held[i] = rev, true
				}
				s.mine++
				s.mu.Unlock()
				now := time.Now()
				l := &slotLease{i: i, rev: rev, since: now, written: now}
				l.t = time.AfterFunc(fleetSlotTTL/3, func() { s.renew(f, l, m) })
				return l, nil
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if wrongLastSeq(err) {
				s.mu.Lock()
				if s.last[i] == last {
					s.held[i] = true // taken meanwhile; the watch tells when it is free
				}
				s.mu.Unlock()
				continue
			}
			m.fleetError(s.dest, "concurrency")
			return nil, nil
		}
		t := time.NewTimer(fleetSlotRetry)
		select {
		case <-freed:
		case <-t.C: // (the watch tells of every slot freed; this is a second look)
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
		t.Stop()
	}
}

// renew runs on l's timer: it gives back a lease kept and not used for
// fleetSlotIdle, and renews a lease in use (or kept) a third of the TTL
// after its last write.
func (s *fleetSlots) renew(f *fleet, l *slotLease, m *metrics) {
	s.mu.Lock()
	idle := time.Duration(0)
	if !l.idleSince.IsZero() {
		idle = time.Since(l.idleSince)
		if idle >= fleetSlotIdle {
			s.unkeepLocked(l)
		}
	}
	s.mu.Unlock()
	if idle >= fleetSlotIdle { // kept and not used: give it back
		s.drop(f, l, m)
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	if due := fleetSlotTTL/3 - time.Since(l.written); due > 0 {
		if idle > 0 {
			due = min(due, fleetSlotIdle-idle)
		}
		l.t.Reset(due)
		return
	}
	rev, err := f.writeSlot(context.Background(), slotKey(s.dest, l.i), l.rev)
	if err != nil {
		m.fleetError(s.dest, "concurrency")
	} else {
		l.rev, l.written = rev, time.Now()
	}
	next := fleetSlotTTL / 3
	if idle > 0 {
		next = min(next, fleetSlotIdle-idle)
	}
	l.t.Reset(next)
}

// release ends an attempt's hold on l. A lease younger than
// fleetSlotHold is kept for the next attempt of this replica, for at most
// fleetSlotIdle, instead of given back at once: a busy replica then pays
// no round trip per attempt. Older leases are given back, so that the
// replicas take turns.
func (s *fleetSlots) release(f *fleet, l *slotLease, m *metrics) {
	if time.Since(l.since) < fleetSlotHold {
		l.mu.Lock()
		if !l.ended {
			l.t.Reset(fleetSlotIdle)
		}
		l.mu.Unlock()
		s.mu.Lock()
		l.idleSince = time.Now()
		s.idle = append(s.idle, l)
		s.mu.Unlock()
		return
	}
	s.drop(f, l, m)
}

// reuse takes a kept lease, nil when none.
func (s *fleetSlots) reuse() *slotLease {
	for {
		s.mu.Lock()
		n := len(s.idle)
		if n == 0 {
			s.mu.Unlock()
			return nil
		}
		l := s.idle[n-1]
		s.idle = s.idle[:n-1]
		l.idleSince = time.Time{}
		s.mu.Unlock()
		l.mu.Lock()
		ended := l.ended
		if !ended {
			l.t.Reset(max(fleetSlotTTL/3-time.Since(l.written), 0))
		}
		l.mu.Unlock()
		if !ended {
			return l
		}
	}
}

// unkeepLocked removes l from the kept leases. Called with mu held.
func (s *fleetSlots) unkeepLocked(l *slotLease) {
	if i := slices.Index(s.idle, l); i >= 0 {
		s.idle = slices.Delete(s.idle, i, i+1)
	}
	l.idleSince = time.Time{}
}

// drop gives l's slot back to the fleet.
func (s *fleetSlots) drop(f *fleet, l *slotLease, m *metrics) {
	l.mu.Lock()
	if l.ended {
		l.mu.Unlock()
		return
	}
	l.ended = true
	l.t.Stop()
	rev := l.rev
	l.mu.Unlock()
	s.mu.Lock()
	s.mine--
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), fleetCallTimeout)
	defer cancel()
	// A KV delete (its marker), published directly for its revision: the
	// slot is free here at once, before the watch tells.
	msg := &nats.Msg{Subject: "$KV." + fleetBucketName(f.stream) + "." + slotKey(s.dest, l.i), Header: nats.Header{"KV-Operation": []string{"DEL"}}}
	ack, err := f.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(rev))
	if err != nil {
		m.fleetError(s.dest, "concurrency") // its TTL frees it
		return
	}
	s.seen(l.i, ack.Sequence, false)
}

// heldHere is how many slots this replica holds.
func (s *fleetSlots) heldHere() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mine
}

// writeSlot writes key if its last revision is last (0: never written),
// with the slot TTL, and returns the new revision.
func (f *fleet) writeSlot(ctx context.Context, key string, last uint64) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, fleetCallTimeout)
	defer cancel()
	msg := &nats.Msg{Subject: "$KV." + fleetBucketName(f.stream) + "." + key, Data: []byte(f.replica)}
	ack, err := f.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(last), jetstream.WithMsgTTL(fleetSlotTTL))
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// wrongLastSeq reports a write refused because the key changed.
func wrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return false
}

package bridge

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// This file is the key table of an ordered route: the messages the
// process holds, queued per key, and the keys whose head may be attempted
// now (docs/delivery.md#ordered-delivery); ordered_route.go feeds and drains it.
//
// Invariants, all under keyTable.mu:
//
//   - A key's messages are in copy-sequence order; msgs[0] is its head.
//     Only a head is ever handed out, and at most one at a time per key
//     (busy), so a message of a key is sent only after the previous one
//     was settled.
//   - A head whose attempt must be retried later stays the head, in the
//     process, until its backoff passes (notBefore): it is never handed
//     back to JetStream with a delay, which would let a later message of
//     the key be delivered first (to this replica or another). Only its
//     key waits: the others stay in the ready FIFO.
//   - A key is in the ready FIFO at most once, and only when it is not
//     busy, not blocked (a dead letter stopped it), has a head and its
//     backoff has passed.
//   - held counts the messages in the table and never exceeds its
//     capacity (B, orderedBuffer): the pull stops when the table is full,
//     not when the workers are, so a key in backoff never stops other
//     keys from being pulled.
//
// Every held message, the heads in backoff included, is kept alive with
// progress acks by the route (heldMsgs gives them); handing a key back
// (shutdown, a partition lost) returns its messages in copy order.

// heldMsg is one message of an ordered route held in the process.
type heldMsg struct {
	msg       jetstream.Msg // the copy's message; acks go to it
	key       string
	partition int
	copySeq   uint64
	// attempts is the number of attempts made or started so far.
	attempts int
	// first: a replayed dead letter that re-opens its blocked key; it
	// goes before the key's held messages whatever its copy sequence.
	first bool

	// What the ordered route (ordered_route.go) knows of it.
	cm       *copyMsg // msg read as the original event
	base     uint64   // the JetStream delivery count at receipt
	epoch    uint64   // the partition's ownership when it was pulled
	replayOf uint64   // Bridge-Replayed-From, 0 when absent

	// mu guards keep and gone: progress acks stop for good (gone) before
	// the message is handed back or settled.
	mu   sync.Mutex
	keep time.Time
	gone bool
}

// seq is h's place in its key: a replay that re-opens a key comes first.
func (h *heldMsg) seq() uint64 {
	if h.first {
		return 0
	}
	return h.copySeq
}

// keyQueue is one key's messages in the process.
type keyQueue struct {
	key       string
	msgs      []*heldMsg // copy-sequence order; msgs[0] is the head
	busy      bool       // a worker has the head
	queued    bool       // in the ready FIFO
	notBefore time.Time  // the head's backoff
	timer     *time.Timer
	// blocked: a dead letter stopped the key (on_dead_letter: block); its
	// messages stay held until a replay of that dead letter re-opens it.
	blocked   bool
	blockedBy uint64 // the dead letter's sequence on the dead-letter stream
}

// keyTable is an ordered route's key table. The zero value is not usable:
// see newKeyTable.
type keyTable struct {
	mu     sync.Mutex
	keys   map[string]*keyQueue
	ready  []*keyQueue // FIFO of keys whose head may start now
	held   int
	cap    int
	wake   chan struct{} // signalled (non-blocking) when ready grows
	closed bool
}

// newKeyTable returns a table holding at most capacity messages.
func newKeyTable(capacity int) *keyTable {
	return &keyTable{keys: map[string]*keyQueue{}, cap: capacity, wake: make(chan struct{}, 1)}
}

// room is how many more messages the table accepts.
func (t *keyTable) room() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cap - t.held
}

// add puts m in its key's queue at its copy-sequence place (never before
// a head that is being attempted). It returns false, and keeps the table
// as it is, when the table is full or closed, or when it already holds
// that message (a redelivery of it: the caller drops the new handle; an
// ack through the held one settles the same stream sequence).
func (t *keyTable) add(m *heldMsg) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	q := t.keys[m.key]
	if q != nil {
		i, found := slices.BinarySearchFunc(q.msgs, m.copySeq, func(h *heldMsg, seq uint64) int {
			return cmpSeq(h.seq(), seq)
		})
		if found {
			return false
		}
		if t.held >= t.cap {
			return false
		}
		if i == 0 && q.busy {
			i = 1 // the head being attempted stays the head
		}
		if i == 0 {
			q.notBefore = time.Time{} // an earlier message becomes the head: the backoff was the old head's
			t.stopTimer(q)
		}
		q.msgs = slices.Insert(q.msgs, i, m)
		t.held++
		t.makeReady(q)
		return true
	}
	if t.held >= t.cap {
		return false
	}
	q = &keyQueue{key: m.key, msgs: []*heldMsg{m}}
	t.keys[m.key] = q
	t.held++
	t.makeReady(q)
	return true
}

func cmpSeq(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// makeReady puts q in the ready FIFO if its head may start now.
func (t *keyTable) makeReady(q *keyQueue) {
	if q.busy || q.queued || q.blocked || len(q.msgs) == 0 || time.Now().Before(q.notBefore) {
		return
	}
	q.queued = true
	t.ready = append(t.ready, q)
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// next waits for a key whose head may start, marks the key busy and
// returns its head; the caller must settle it with done, hold or
// handBack. It returns ctx's error when ctx ends first.
func (t *keyTable) next(ctx context.Context) (*heldMsg, error) {
	for {
		t.mu.Lock()
		if len(t.ready) > 0 {
			q := t.ready[0]
			t.ready[0] = nil
			t.ready = t.ready[1:]
			q.queued = false
			q.busy = true
			h := q.msgs[0]
			h.attempts++
			more := len(t.ready) > 0
			t.mu.Unlock()
			if more { // pass the wake-up on to another worker
				select {
				case t.wake <- struct{}{}:
				default:
				}
			}
			return h, nil
		}
		t.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.wake:
		}
	}
}

// done settles head h for good (delivered, or dead-lettered with
// on_dead_letter continue): the key's next message becomes its head and
// the key goes to the back of the ready FIFO.
func (t *keyTable) done(h *heldMsg) {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.pop(h)
	if q == nil {
		return
	}
	if len(q.msgs) == 0 {
		delete(t.keys, h.key)
		return
	}
	t.makeReady(q)
}

// block settles head h (dead-lettered) and stops its key: the key's
// later messages stay held, none is handed out, until reopen.
func (t *keyTable) block(h *heldMsg, dlq uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if q := t.pop(h); q != nil {
		q.blocked, q.blockedBy = true, dlq
	}
}

// pop takes head h off its key's queue (the caller holds t.mu) and returns
// the queue, or nil when h is not its key's head.
func (t *keyTable) pop(h *heldMsg) *keyQueue {
	q := t.keys[h.key]
	if q == nil || len(q.msgs) == 0 || q.msgs[0] != h {
		return nil
	}
	q.msgs[0] = nil
	q.msgs = q.msgs[1:]
	q.busy = false
	q.notBefore = time.Time{}
	t.held--
	return q
}

// blockedKeys returns the blocked keys and how many messages each holds.
func (t *keyTable) blockedKeys() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]int{}
	for k, q := range t.keys {
		if q.blocked {
			out[k] = len(q.msgs)
		}
	}
	return out
}

// reopen puts m before the key's held messages and lets the key go on
// when m is the replay of the dead letter that blocked its key
// (m.replayOf). It returns false, and changes nothing, otherwise, or
// when the table is full or closed.
func (t *keyTable) reopen(m *heldMsg) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.keys[m.key]
	if t.closed || t.held >= t.cap || q == nil || !q.blocked || q.blockedBy != m.replayOf {
		return false
	}
	m.first = true
	q.msgs = slices.Insert(q.msgs, 0, m)
	q.blocked = false
	t.held++
	t.makeReady(q)
	return true
}

// setBlocked blocks key by dead letter dlq (a block another replica
// recorded), whether or not the table holds messages of it.
func (t *keyTable) setBlocked(key string, dlq uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.keys[key]
	if q == nil {
		q = &keyQueue{key: key}
		t.keys[key] = q
	}
	q.blocked, q.blockedBy = true, dlq
	if q.queued {
		t.ready = slices.DeleteFunc(t.ready, func(r *keyQueue) bool { return r == q })
		q.queued = false
	}
}

// unblock lets a blocked key go on with its held messages (its block
// was removed by an operator).
func (t *keyTable) unblock(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.keys[key]
	if q == nil || !q.blocked {
		return
	}
	q.blocked, q.blockedBy = false, 0
	if len(q.msgs) == 0 && !q.busy {
		delete(t.keys, key)
		return
	}
	t.makeReady(q)
}

// keysOf returns the keys holding messages of partition p.
func (t *keyTable) keysOf(p int) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for k, q := range t.keys {
		if len(q.msgs) > 0 && q.msgs[0].partition == p {
			out = append(out, k)
		}
	}
	return out
}

// seqsOf returns the copy sequences of the messages of partition p
// pulled in ownership epoch.
func (t *keyTable) seqsOf(p int, epoch uint64) []uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []uint64
	for _, q := range t.keys {
		for _, h := range q.msgs {
			if h.partition == p && h.epoch == epoch {
				out = append(out, h.copySeq)
			}
		}
	}
	return out
}

// waiting counts the keys with messages held and not being attempted.
func (t *keyTable) waiting() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, q := range t.keys {
		if !q.busy && len(q.msgs) > 0 {
			n++
		}
	}
	return n
}

// hold keeps head h as its key's head for d (a redelivery backoff): the
// key, and only it, waits; then it is ready again with the same head.
func (t *keyTable) hold(h *heldMsg, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.keys[h.key]
	if q == nil || len(q.msgs) == 0 || q.msgs[0] != h || t.closed {
		return
	}
	q.busy = false
	q.notBefore = time.Now().Add(d)
	t.stopTimer(q)
	q.timer = time.AfterFunc(d, func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.keys[q.key] == q && !t.closed {
			t.makeReady(q)
		}
	})
}

func (t *keyTable) stopTimer(q *keyQueue) {
	if q.timer != nil {
		q.timer.Stop()
		q.timer = nil
	}
}

// handBack removes key's messages from the table and returns them in copy
// order (the caller hands them back to JetStream in that order). A head
// that is being attempted is left in place, and returned neither.
func (t *keyTable) handBack(key string) []*heldMsg {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.keys[key]
	if q == nil {
		return nil
	}
	var out []*heldMsg
	switch {
	case q.busy:
		out = slices.Clone(q.msgs[1:])
		q.msgs = q.msgs[:1]
	case q.blocked: // the key stays blocked, empty
		out = q.msgs
		q.msgs = nil
	default:
		out = q.msgs
		q.msgs = nil
		t.stopTimer(q)
		delete(t.keys, key)
		if q.queued {
			t.ready = slices.DeleteFunc(t.ready, func(r *keyQueue) bool { return r == q })
			q.queued = false
		}
	}
	t.held -= len(out)
	return out
}

// heldMsgs returns every message the table holds, for progress acks.
func (t *keyTable) heldMsgs() []*heldMsg {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*heldMsg, 0, t.held)
	for _, q := range t.keys {
		out = append(out, q.msgs...)
	}
	return out
}

// close stops the backoff timers; the table accepts nothing more and no
// key becomes ready again.
func (t *keyTable) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	for _, q := range t.keys {
		t.stopTimer(q)
	}
}

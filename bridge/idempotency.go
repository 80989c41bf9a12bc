package bridge

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/idempotency"
)

// Reservation states, as stored in the bucket.
const (
	stateInFlight = "inflight"
	stateDone     = "done"
)

// reservePoll is how often a message whose event id is in flight on
// another message re-reads the reservation.
const reservePoll = 100 * time.Millisecond

// rereadTimeout bounds the read of a reservation whose refresh failed.
const rereadTimeout = 2 * time.Second

// reservationStore is what a delivery needs of the idempotency store
// (delivery.go): take an event id's reservation, look one up without
// taking it, and close a won one, done or released. reservations, on a
// JetStream key-value bucket, is the bridge's.
type reservationStore interface {
	reserve(ctx context.Context, key string, me holder, stale time.Duration) (*lease, error)
	lookup(ctx context.Context, key string, me holder) error
	done(ctx context.Context, l *lease) error
	doneRecord(l *lease) doneRecord
	release(ctx context.Context, l *lease) error
}

// reservations is the consumer-side idempotency store: one key per route
// and event id in a JetStream key-value bucket, shared by every replica and
// surviving restarts. A key is created (atomically: exactly one of many
// concurrent callers wins) before the first HTTP try, becomes "done" after a
// 2xx, and is deleted on any failure, so that a failed delivery never
// consumes the event id. Entries expire with the bucket TTL.
//
// Every record it writes names the replica that wrote it (this process's
// id and host name, idempotency.Replica), computed once here: "bridge idem
// show" prints it (docs/operating.md#idempotency-records).
type reservations struct {
	kv      jetstream.KeyValue
	replica string
}

func newReservations(kv jetstream.KeyValue) *reservations {
	host, _ := os.Hostname()
	return &reservations{kv: kv, replica: idempotency.Replica(os.Getpid(), host)}
}

// differs is the content rule of a reservation: the same event id is the
// same event only for the same subject and the same SHA-256 of the payload
// bytes. A record without content (written by a previous release, see holder)
// is trusted as before: "" whatever me holds.
func differs(have, me holder) string {
	switch {
	case have.digest == "":
		return ""
	case have.subject != me.subject:
		return ConflictSubject
	case have.digest != me.digest:
		return ConflictPayload
	}
	return ""
}

// takeover is the rule for an in-flight reservation: it is abandoned when
// it is held by an earlier delivery of this same message (the broker
// redelivers a message only once that delivery has lost it), or when it is
// older than stale without a refresh.
func takeover(have, me holder, age, stale time.Duration) bool {
	sameMessage := have.stream == me.stream && have.seq == me.seq
	return sameMessage && have.delivered < me.delivered || age > stale
}

// reservationKey is <route>.<encoding of the event id>, always a valid key
// whatever bytes the id holds (idempotency.Key, which "bridge idem" reads
// with).
func reservationKey(route, eventID string) string { return idempotency.Key(route, eventID) }

// holder identifies the message delivery that holds a reservation, and
// what the reservation is for: the message's subject and the SHA-256 of its
// payload bytes (hex).
//
// Its encoding is four fields separated by spaces, as the previous release
// wrote and reads them (state, stream, stream sequence, delivery count),
// with the content in the second field:
//
//	done EVENTS/<sha256 hex>/<subject> 12 1
//
// Neither a subject nor a stream name holds a space, and a stream name
// holds no "/", so the field splits at its first two "/". After 0.1.0 the
// stream is followed by the writing replica, after a "." that no stream
// name holds ("EVENTS.4242.ops-1/<sha256 hex>/<subject>", see package
// idempotency, which owns the parsing); a reader ignores it. A previous
// release reads such a record with its fields: "done" is a duplicate to it
// (as every done record was), and an in-flight one names a stream that is
// not its message's, so it waits until the reservation is stale (ack_wait
// without a refresh) before taking it over; it never fails to parse it. A
// record of the previous release (stream without "/") has no content.
type holder struct {
	state     string
	stream    string
	seq       uint64
	delivered uint64
	subject   string // "" in a record of the previous release
	digest    string // SHA-256 of the payload, hex; "" in a record of the previous release
	replica   string // written only (reservations.replica); "" when parsed
}

// holderOf is the holder of an event's delivery, with its content.
func holderOf(ev *event) holder {
	sum := sha256.Sum256(ev.Payload)
	return holder{stream: ev.Stream, seq: ev.Seq, delivered: ev.Delivered,
		subject: ev.Subject, digest: hex.EncodeToString(sum[:])}
}

func (h holder) encode() []byte {
	stream := h.stream
	switch {
	case h.digest != "" && h.replica != "":
		stream += "." + h.replica + "/" + h.digest + "/" + h.subject
	case h.digest != "":
		stream += "/" + h.digest + "/" + h.subject
	}
	return []byte(h.state + " " + stream + " " + strconv.FormatUint(h.seq, 10) + " " + strconv.FormatUint(h.delivered, 10))
}

// errUnreadable is parseHolder's error; it never quotes the record, which
// names a subject.
func errUnreadable(b []byte) error {
	return fmt.Errorf("bridge: unreadable reservation (%d bytes)", len(b))
}

// parseHolder reads a record with idempotency.ParseValue (the replica it
// names is left out: the delivery does not need it).
func parseHolder(b []byte) (holder, error) {
	v, err := idempotency.ParseValue(b)
	if err != nil {
		return holder{}, errUnreadable(b)
	}
	return holder{state: string(v.State), stream: v.Stream, seq: v.Seq, delivered: v.Delivered, subject: v.Subject, digest: v.Digest}, nil
}

// lease is a won reservation. Its owner refreshes it while the attempt runs
// (so that it never looks abandoned), then marks it done or releases it.
type lease struct {
	s      *reservations
	me     holder // the delivery that holds it, with its content
	key    string
	value  []byte
	mu     sync.Mutex
	rev    uint64
	closed bool
}

// reserve tries once to take the reservation of the event for the message
// delivery me. It returns a lease when it wins; an *EventIDConflictError
// when the reservation, done or in flight, was taken for another subject or
// payload (decided at once, without waiting for an in-flight one's
// outcome); a *DuplicateEventError when the event was already delivered
// with the same content; errReserved when another message with the same
// content holds a fresh in-flight reservation. An in-flight reservation is taken over (by
// compare-and-swap, so again exactly one winner) when it is older than
// stale, or when it is held by an earlier delivery of this same message:
// the broker redelivers a message only once that delivery has lost it.
func (s *reservations) reserve(ctx context.Context, key string, me holder, stale time.Duration) (*lease, error) {
	me.state = stateInFlight
	me.replica = s.replica
	value := me.encode()
	for {
		rev, err := s.kv.Create(ctx, key, value)
		if err == nil {
			return &lease{s: s, me: me, key: key, value: value, rev: rev}, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("bridge: reserve: %w", err)
		}
		e, err := s.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // released meanwhile: race for it again
		}
		if err != nil {
			return nil, fmt.Errorf("bridge: read reservation: %w", err)
		}
		h, err := parseHolder(e.Value())
		if err != nil {
			return nil, err
		}
		if err := s.settled(h, me); err != nil {
			return nil, err
		}
		if !takeover(h, me, time.Since(e.Created()), stale) {
			return nil, errReserved
		}
		rev, err = s.kv.Update(ctx, key, value, e.Revision())
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
			continue // someone else moved first: look again
		}
		if err != nil {
			return nil, fmt.Errorf("bridge: take over reservation: %w", err)
		}
		return &lease{s: s, me: me, key: key, value: value, rev: rev}, nil
	}
}

// settled is what an existing reservation h says of the delivery me: an
// *EventIDConflictError when it was taken for other content, whatever its
// state; a *DuplicateEventError when it is done; nil when it is in flight
// for the same content.
func (s *reservations) settled(h, me holder) error {
	if part := differs(h, me); part != "" {
		return &EventIDConflictError{Part: part, State: h.state, Stream: h.stream, Seq: h.seq}
	}
	if h.state == stateDone {
		return &DuplicateEventError{}
	}
	return nil
}

// refresh rewrites the in-flight value so the reservation stays fresh.
// When the update fails, the reservation is read back: an update that
// timed out after the server applied it left a newer revision that still
// holds this lease's value, and that revision is adopted (else every later
// refresh, and the final done or release, would fail on a stale
// revision).
func (l *lease) refresh(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	rev, err := l.s.kv.Update(ctx, l.key, l.value, l.rev)
	if err == nil {
		l.rev = rev
		return nil
	}
	if rev, ok := l.reread(); ok {
		l.rev = rev
		return nil
	}
	return err
}

// reread reads the reservation with a fresh timeout and returns its
// revision when it still holds this lease's value. Called with l.mu held.
func (l *lease) reread() (uint64, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), rereadTimeout)
	defer cancel()
	e, err := l.s.kv.Get(ctx, l.key)
	if err != nil || e.Revision() == l.rev || !bytes.Equal(e.Value(), l.value) {
		return 0, false
	}
	return e.Revision(), true
}

// lookup reads the reservation under key for the delivery me without
// taking it: a *DuplicateEventError when it says the event was delivered
// with the same content, an *EventIDConflictError when it was taken (done
// or in flight) for other content, nil when there is none or it is in
// flight for the same content.
func (s *reservations) lookup(ctx context.Context, key string, me holder) error {
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("bridge: read reservation: %w", err)
	}
	h, err := parseHolder(e.Value())
	if err != nil {
		return err
	}
	return s.settled(h, me)
}

// done records the lease's delivery as done: later deliveries of the event
// with the same content are skipped, others are conflicts.
func (s *reservations) done(ctx context.Context, l *lease) error { return l.done(ctx, l.me) }

// doneRecord closes the lease and returns its done record, for the route's
// completer to publish (acks.go): what done writes, as a KV Update does
// (the expected last revision of the key is the lease's).
func (s *reservations) doneRecord(l *lease) doneRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	h := l.me
	h.state = stateDone
	return doneRecord{subject: "$KV." + s.kv.Bucket() + "." + l.key, value: h.encode(), rev: l.rev}
}

// doneRecord is a reservation's done record, to be published on the
// bucket's subject of its key, accepted only while the key's last revision
// is rev.
type doneRecord struct {
	subject string
	value   []byte
	rev     uint64
}

// release deletes the lease's reservation if it is still the lease's.
func (s *reservations) release(ctx context.Context, l *lease) error { return l.release(ctx) }

// done records the delivery h (with its content): later deliveries of the
// event with the same content are skipped, others are conflicts.
func (l *lease) done(ctx context.Context, h holder) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	h.state = stateDone
	_, err := l.s.kv.Update(ctx, l.key, h.encode(), l.rev)
	return err
}

// release deletes the reservation (only if it is still ours), so that the
// next delivery of the event can reserve it again.
func (l *lease) release(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	return l.s.kv.Delete(ctx, l.key, jetstream.LastRevision(l.rev))
}

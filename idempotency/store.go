package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrNotFound means the bucket holds no record for the event id on the
// route: it was never delivered there, its delivery failed (a failure
// deletes the record), it expired (idempotency.ttl), or it was forgotten.
var ErrNotFound = errors.New("idempotency: no record")

// ErrChanged means the record changed between Get and Forget (a delivery
// took it over, finished or released it): nothing was removed.
var ErrChanged = errors.New("idempotency: record changed since it was read")

// Record is one event's record as stored.
type Record struct {
	Route    string
	EventID  string
	Key      string // Key(Route, EventID)
	Value           // decoded
	Written  time.Time
	Revision uint64 // the bucket revision read; Forget removes only this one
}

// Store reads and removes the records of one bucket. It is safe for
// concurrent use. Make it with Open.
type Store struct {
	kv jetstream.KeyValue
}

// Open binds to the bucket (idempotency.bucket). A missing bucket is an
// error matching jetstream.ErrBucketNotFound.
func Open(ctx context.Context, js jetstream.JetStream, bucket string) (*Store, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("idempotency: bucket %s: %w", bucket, err)
	}
	return &Store{kv: kv}, nil
}

// Bucket is the bucket's name.
func (s *Store) Bucket() string { return s.kv.Bucket() }

// Get reads the record of eventID on route: ErrNotFound when there is
// none, an error matching ErrUnreadable when its value is not a record.
func (s *Store) Get(ctx context.Context, route, eventID string) (Record, error) {
	key := Key(route, eventID)
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Record{}, ErrNotFound
	}
	if err != nil {
		return Record{}, fmt.Errorf("idempotency: read %s: %w", key, err)
	}
	v, err := ParseValue(e.Value())
	if err != nil {
		return Record{}, err
	}
	return Record{Route: route, EventID: eventID, Key: key, Value: v, Written: e.Created(), Revision: e.Revision()}, nil
}

// Forget removes r, only if the bucket still holds the revision that Get
// read (else ErrChanged, and nothing is removed). The next message with
// r's event id on r's route is then delivered as a new event.
func (s *Store) Forget(ctx context.Context, r Record) error {
	err := s.kv.Delete(ctx, r.Key, jetstream.LastRevision(r.Revision))
	if errors.Is(err, jetstream.ErrKeyExists) || isWrongLastSequence(err) {
		return ErrChanged
	}
	if err != nil {
		return fmt.Errorf("idempotency: forget %s: %w", r.Key, err)
	}
	return nil
}

// jsErrWrongLastSequence is JetStream's "wrong last sequence", the answer
// to a delete at a revision that is no longer the key's.
const jsErrWrongLastSequence jetstream.ErrorCode = 10071

func isWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrWrongLastSequence
}

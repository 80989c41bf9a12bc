package idempotency_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/idempotency"
	"github.com/sotercare/jetbridge/internal/natstest"
)

const digest = "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"

// Get reads a record with its revision and time; Forget removes exactly
// the revision read: after the record changed (a delivery took it), it
// removes nothing (the negative control of the revision check: the same
// Forget on the unchanged record removes it).
func TestStoreGetForget(t *testing.T) {
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := idempotency.Open(ctx, js, "NOPE"); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("Open of a missing bucket: %v, want ErrBucketNotFound", err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "B", History: 1})
	if err != nil {
		t.Fatal(err)
	}
	s, err := idempotency.Open(ctx, js, "B")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "ra", "ev-1"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Get of nothing: %v, want ErrNotFound", err)
	}
	before := time.Now()
	rev, err := kv.Put(ctx, idempotency.Key("ra", "ev-1"), []byte("done EVENTS.77.h1/"+digest+"/events.x 3 1"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Get(ctx, "ra", "ev-1")
	want := idempotency.Value{State: idempotency.StateDone, Stream: "EVENTS", Seq: 3, Delivered: 1, Subject: "events.x", Digest: digest, PID: 77, Host: "h1"}
	if err != nil || r.Value != want || r.Revision != rev || r.Key != "ra.b.ZXYtMQ" || r.Route != "ra" || r.EventID != "ev-1" ||
		r.Written.Before(before.Add(-time.Second)) || r.Written.After(time.Now()) {
		t.Fatalf("Get = %+v, %v", r, err)
	}

	// The record changes after it was read: Forget removes nothing
	if _, err := kv.Put(ctx, r.Key, []byte("inflight EVENTS.78.h2/"+digest+"/events.x 9 1")); err != nil {
		t.Fatal(err)
	}
	if err := s.Forget(ctx, r); !errors.Is(err, idempotency.ErrChanged) {
		t.Fatalf("Forget of a changed record: %v, want ErrChanged", err)
	}
	if now, err := s.Get(ctx, "ra", "ev-1"); err != nil || now.PID != 78 {
		t.Fatalf("after a refused Forget: %+v, %v; want the new record kept", now, err)
	}
	// Read again, it goes
	r, err = s.Get(ctx, "ra", "ev-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Forget(ctx, r); err != nil {
		t.Fatalf("Forget: %v", err)
	}
	if _, err := s.Get(ctx, "ra", "ev-1"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Get after Forget: %v, want ErrNotFound", err)
	}
	// An unreadable value is an error, not a record
	if _, err := kv.Put(ctx, idempotency.Key("ra", "ev-2"), []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "ra", "ev-2"); !errors.Is(err, idempotency.ErrUnreadable) {
		t.Fatalf("Get of garbage: %v, want ErrUnreadable", err)
	}
}

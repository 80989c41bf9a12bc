package bridge

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
)

// racyCreate is the deliberately broken store of the negative controls:
// check, then act, with a 1 ms pause between the read and the write. The
// contention tests must catch it (more than one winner).
func racyCreate(kv jetstream.KeyValue) func(ctx context.Context, key string, value []byte) (uint64, error) {
	return func(ctx context.Context, key string, value []byte) (uint64, error) {
		if _, err := kv.Get(ctx, key); err == nil {
			return 0, jetstream.ErrKeyExists
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return 0, err
		}
		time.Sleep(time.Millisecond) // the deliberate window between check and act
		return kv.Put(ctx, key, value)
	}
}

func testBucket(t testing.TB) jetstream.KeyValue {
	t.Helper()
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL())
	kv, err := js.CreateOrUpdateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: "T", History: 1, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// contend makes n goroutines reserve keys[i] at the same moment and returns
// how many won.
func contend(t testing.TB, s *reservations, keys []string) (won int, errs []error) {
	t.Helper()
	var (
		wins  atomic.Int64
		mu    sync.Mutex
		start = make(chan struct{})
		wg    sync.WaitGroup
	)
	for i, key := range keys {
		wg.Go(func() {
			<-start
			me := holder{stream: "EVENTS", seq: uint64(i + 1), delivered: 1}
			_, err := s.reserve(context.Background(), key, me, time.Minute)
			switch {
			case err == nil:
				wins.Add(1)
			case errors.Is(err, errReserved):
			default:
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	return int(wins.Load()), errs
}

func TestReserveSameKeyHasOneWinner(t *testing.T) {
	same := make([]string, 100)
	for i := range same {
		same[i] = reservationKey("r", "evt-1")
	}
	kv := testBucket(t)
	won, errs := contend(t, newReservations(kv), same)
	if won != 1 || len(errs) != 0 {
		t.Fatalf("100 reservations of one key: %d won (errors %v), want exactly 1 winner and 99 losers", won, errs)
	}
	t.Run("negative control: check-then-act store", func(t *testing.T) {
		kv := testBucket(t)
		broken := newReservations(kvFaults{create: racyCreate}.wrap(kv))
		if won, _ := contend(t, broken, same); won <= 1 {
			t.Fatalf("the racy store had %d winner(s): the test cannot catch a check-then-act race", won)
		} else {
			t.Logf("caught, as it should: %d winners", won)
		}
	})
}

func TestReserveDifferentKeysAllWin(t *testing.T) {
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = reservationKey("r", fmt.Sprintf("evt-%d", i))
	}
	won, errs := contend(t, newReservations(testBucket(t)), keys)
	if won != 100 || len(errs) != 0 {
		t.Fatalf("100 different keys: %d won (errors %v), want 100", won, errs)
	}
}

func TestReservationLifecycle(t *testing.T) {
	kv := testBucket(t)
	s := newReservations(kv)
	ctx := context.Background()
	key := reservationKey("r", "e")
	m1 := holder{stream: "EVENTS", seq: 1, delivered: 1}
	l, err := s.reserve(ctx, key, m1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.refresh(ctx); err != nil {
		t.Fatalf("refresh: %v", err)
	}
	// Another message with the same event id waits; a redelivery of the
	// same message takes over at once; a stale reservation is taken over.
	if _, err := s.reserve(ctx, key, holder{stream: "EVENTS", seq: 2, delivered: 1}, time.Minute); !errors.Is(err, errReserved) {
		t.Fatalf("other message: %v, want errReserved", err)
	}
	if _, err := s.reserve(ctx, key, holder{stream: "EVENTS", seq: 2, delivered: 1}, 0); err != nil {
		t.Fatalf("stale takeover: %v", err)
	}
	if err := l.done(ctx, m1); err == nil {
		t.Fatal("the lease that was taken over could still mark the event done")
	}
	l2, err := s.reserve(ctx, key, holder{stream: "EVENTS", seq: 2, delivered: 2}, time.Minute)
	if err != nil {
		t.Fatalf("redelivery takeover: %v", err)
	}
	if err := l2.release(ctx); err != nil {
		t.Fatal(err)
	}
	l3, err := s.reserve(ctx, key, m1, time.Minute)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	if err := l3.done(ctx, m1); err != nil {
		t.Fatal(err)
	}
	var dup *DuplicateEventError
	if _, err := s.reserve(ctx, key, holder{stream: "EVENTS", seq: 9, delivered: 1}, 0); !errors.As(err, &dup) {
		t.Fatalf("after done: %v, want DuplicateEventError", err)
	}
	// Any byte string is an event id.
	for _, id := range []string{"a b/c", "\x00\xff", strings.Repeat("x", 500), "ünï.cødé*>"} {
		if _, err := s.reserve(ctx, reservationKey("r", id), m1, time.Minute); err != nil {
			t.Errorf("event id %q: %v", id, err)
		}
	}
}

const idemRoute = `
idempotency: {bucket: DELIVERED}
destinations:
  d:
    url: %s
    circuit_breaker: {enabled: false}
routes:
  - name: r
    subjects: ["events.>"]
    destination: d
    backoff: [20ms]
    ack_wait: 1s
    idempotency: %t
`

// 100 messages with different Nats-Msg-Id and one Event-Id, consumed by two
// bridges sharing the route's consumer: one request, 99 duplicates skipped.
func TestOneRequestPerEventAcrossTwoBridges(t *testing.T) {
	check := func(t testing.TB, f faults) error {
		sink := sinktest.New(t, func(sinktest.Request) sinktest.Response {
			return sinktest.Response{Status: 200, Delay: 20 * time.Millisecond}
		})
		cfg := testConfig(t, idemRoute, sink.URL(), true)
		srv := natstest.Start(t)
		// The 100 messages are waiting before the bridges start, so that
		// their first pulls take many at once and the reservations race.
		_, js := natstest.Connect(t, srv.URL())
		provisioned(t, cfg, js, f)
		for i := range 100 {
			msg := &nats.Msg{Subject: "events.info.x", Data: []byte(`{}`), Header: nats.Header{}}
			msg.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("msg-%d", i))
			msg.Header.Set("Event-Id", "the-event")
			if _, err := js.PublishMsg(context.Background(), msg); err != nil {
				t.Fatal(err)
			}
		}
		h1 := startBridgeOn(t, srv, cfg, f)
		h2 := startBridgeOn(t, srv, cfg, f)
		all := func() []Settled { return append(h1.outcomes(), h2.outcomes()...) }
		waitUntil(settleWait, func() bool { return len(all()) >= 100 })
		h1.quiet("r")
		dups, delivered := 0, 0
		for _, s := range all() {
			switch s.Outcome {
			case OutcomeDuplicateSkipped:
				dups++
			case OutcomeDelivered:
				delivered++
			}
		}
		if n := sink.Count(); n != 1 {
			return fmt.Errorf("destination received %d requests, want exactly 1", n)
		}
		if delivered != 1 || dups != 99 {
			return fmt.Errorf("%d delivered and %d duplicate_skipped, want 1 and 99", delivered, dups)
		}
		if len(h1.outcomes()) == 0 || len(h2.outcomes()) == 0 {
			t.Logf("note: one bridge settled everything (%d / %d)", len(h1.outcomes()), len(h2.outcomes()))
		}
		return nil
	}
	if err := check(t, faults{}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "check-then-act reservation store", func(t testing.TB) error {
		return check(t, faults{reserveCreate: racyCreate})
	})
}

// The same event id published again after the stream's duplicate window:
// JetStream stores it, the bridge sends nothing the second time.
func TestSameEventAfterTheDuplicateWindow(t *testing.T) {
	check := func(t testing.TB, idempotent bool) error {
		sink := sinktest.New(t, sinktest.Always(200))
		cfg := testConfig(t, "stream: {duplicate_window: 300ms}\n"+idemRoute, sink.URL(), idempotent)
		h := startBridge(t, cfg, faults{})
		h.publish("events.info.x", "e1", []byte(`{}`), nil)
		h.waitOutcomes(1, settleWait, outcomeIs(OutcomeDelivered))
		stored := waitUntil(10*time.Second, func() bool {
			ack, err := h.js.Publish(context.Background(), "events.info.x", []byte(`{}`), jetstream.WithMsgID("e1"))
			return err == nil && !ack.Duplicate
		})
		if !stored {
			t.Fatal("JetStream never stored the id again")
		}
		h.waitOutcomes(2, settleWait, nil)
		h.quiet("r")
		if n := sink.Count(); n != 1 {
			return fmt.Errorf("destination received %d requests, want exactly 1", n)
		}
		if dup := h.waitOutcomes(1, 0, outcomeIs(OutcomeDuplicateSkipped)); len(dup) != 1 {
			return fmt.Errorf("second message not skipped as a duplicate: %+v", h.outcomes())
		}
		return nil
	}
	if err := check(t, true); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "route without idempotency", func(t testing.TB) error { return check(t, false) })
}

// A failed delivery never consumes the event id: 20 rejected events leave
// no reservation behind, and the replayed one is delivered.
func TestFailedDeliveriesReleaseTheirReservations(t *testing.T) {
	check := func(t testing.TB, f faults) error {
		sink := sinktest.New(t, sinktest.Always(400))
		cfg := testConfig(t, idemRoute, sink.URL(), true)
		h := startBridge(t, cfg, f)
		for i := range 20 {
			h.publish("events.info.x", fmt.Sprintf("e%d", i), []byte(`{}`), nil)
		}
		if out := h.waitOutcomes(20, settleWait, outcomeIs(OutcomeDeadLettered)); len(out) != 20 {
			return fmt.Errorf("%d dead-lettered, want 20", len(out))
		}
		h.quiet("r")
		if dl := h.deadLetters(); len(dl) != 20 {
			return fmt.Errorf("%d dead letters, want 20", len(dl))
		}
		kv, err := h.js.KeyValue(context.Background(), "DELIVERED")
		if err != nil {
			t.Fatal(err)
		}
		keys, err := kv.ListKeys(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var left []string
		for k := range keys.Keys() {
			left = append(left, k)
		}
		if len(left) != 0 {
			return fmt.Errorf("%d reservations survived the failed deliveries", len(left))
		}
		// Replay one (same Event-Id, new message id), destination fixed.
		sink.SetScript(sinktest.Always(200))
		h.publish("events.info.x", "e7:replay:1", []byte(`{}`), map[string]string{"Event-Id": "e7"})
		if out := h.waitOutcomes(1, 5*time.Second, outcomeIs(OutcomeDelivered)); len(out) != 1 {
			return fmt.Errorf("the replayed event was not delivered")
		}
		return nil
	}
	if err := check(t, faults{}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "failed delivery keeps its reservation", func(t testing.TB) error {
		return check(t, faults{keepReservationOnFailure: true})
	})
}

// lostAck delivers one event through a bridge whose connection closes
// right after the 2xx was seen (and, with idempotency, recorded as done),
// so its ack is lost; a second bridge then gets the redelivery after
// ack_wait. It returns the destination and the second bridge.
func lostAck(t testing.TB, routeYAML string, idempotent bool) (*sinktest.Sink, *harness) {
	sink := sinktest.New(t, sinktest.Always(200))
	cfg := testConfig(t, routeYAML, sink.URL(), idempotent)
	srv := natstest.Start(t)
	var conn atomic.Pointer[nats.Conn]
	h1 := startBridgeOn(t, srv, cfg, faults{beforeAck: func() {
		if nc := conn.Swap(nil); nc != nil {
			nc.Close()
		}
	}})
	conn.Store(h1.nc)
	h1.publish("events.info.x", "e1", []byte(`{}`), nil)
	sink.WaitCount(t, 1, settleWait)
	h1.waitOutcomes(1, settleWait, nil)
	h2 := startBridgeOn(t, srv, cfg, faults{}) // the redelivery comes after ack_wait
	h2.waitOutcomes(1, settleWait, nil)
	h2.quiet("r")
	return sink, h2
}

// The ack of a 2xx is lost (the bridge's connection closes right after the
// event was recorded as done): the redelivery sends nothing. Without
// idempotency the same loss costs a second request with the same
// Idempotency-Key and X-Event-Id: the documented at-least-once behaviour,
// which shows the test measures the store, not luck.
func TestLostAckAfter2xx(t *testing.T) {
	run := func(t testing.TB, idempotent bool) (*sinktest.Sink, *harness) {
		return lostAck(t, idemRoute, idempotent)
	}
	t.Run("idempotent route", func(t *testing.T) {
		sink, h2 := run(t, true)
		if n := sink.Count(); n != 1 {
			t.Fatalf("destination received %d requests, want exactly 1", n)
		}
		if out := h2.outcomes(); len(out) != 1 || out[0].Outcome != OutcomeDuplicateSkipped || out[0].Delivered != 2 {
			t.Fatalf("redelivery outcome %+v, want duplicate_skipped on delivery 2", out)
		}
	})
	t.Run("without idempotency: at least once", func(t *testing.T) {
		sink, _ := run(t, false)
		reqs := sink.Requests()
		if len(reqs) != 2 {
			t.Fatalf("destination received %d requests, want exactly 2", len(reqs))
		}
		for _, h := range []string{"Idempotency-Key", "X-Event-Id"} {
			if reqs[0].Header.Get(h) != "e1" || reqs[1].Header.Get(h) != "e1" {
				t.Errorf("%s differs between the copies: %q, %q", h, reqs[0].Header.Get(h), reqs[1].Header.Get(h))
			}
		}
	})
}

// A reservation left in flight by a killed bridge process is taken over once
// the broker redelivers the message (after ack_wait), and the event is
// delivered exactly once.
func TestReservationOfAKilledBridgeIsTakenOver(t *testing.T) {
	check := func(t testing.TB, f faults) error {
		sink := sinktest.New(t, func(r sinktest.Request) sinktest.Response {
			if r.N == 1 {
				return sinktest.Response{Hang: true} // the request the killed bridge never sees answered
			}
			return sinktest.Response{Status: 200}
		})
		yaml := fmt.Sprintf(idemRoute, sink.URL(), true)
		srv := natstest.Start(t)
		killChildWhileSending(t, srv, sink, yaml) // reserved and sending

		h := startBridgeOn(t, srv, testConfig(t, "%s", yaml), f)
		out := h.waitOutcomes(1, 5*time.Second, outcomeIs(OutcomeDelivered))
		if len(out) != 1 {
			return fmt.Errorf("the event was not delivered after the takeover (outcomes %+v)", h.outcomes())
		}
		h.quiet("r")
		if n := sink.Count(); n != 2 {
			return fmt.Errorf("destination received %d requests, want 2 (the hung one, then one delivery)", n)
		}
		return nil
	}
	if err := check(t, faults{}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "in-flight reservations never taken over", func(t testing.TB) error {
		return check(t, faults{noTakeover: true})
	})
}

// TestChildBridge is the bridge process of the crash tests: it runs only as
// a child started by natstest.StartChild, until it is killed.
func TestChildBridge(t *testing.T) {
	if natstest.ChildRole() != "bridge" {
		t.Skip("runs only as a child process of a crash test")
	}
	cfg := testConfig(t, "%s", os.Getenv("JETBRIDGE_TEST_CONFIG"))
	_, js := natstest.Connect(t, os.Getenv("JETBRIDGE_TEST_NATS_URL"))
	b, err := New(cfg, js, Options{Logger: zerolog.New(os.Stderr)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	select {
	case <-b.Ready():
		fmt.Println("child bridge ready")
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// The 2xx of the last allowed delivery (max_deliver 1) is recorded as done
// and its ack lost: the broker's redelivery is past max_deliver, and on an
// idempotent route it is a duplicate (acked, nothing sent), not a dead
// letter. Without idempotency the same loss dead-letters the event
// max-deliveries, which shows the test reaches the exhausted path.
func TestDeliveredEventPastMaxDeliverIsADuplicate(t *testing.T) {
	run := func(t testing.TB, idempotent bool) (*sinktest.Sink, *harness) {
		return lostAck(t, idemRoute+"    max_deliver: 1\n", idempotent)
	}
	t.Run("idempotent route", func(t *testing.T) {
		sink, h2 := run(t, true)
		if n := sink.Count(); n != 1 {
			t.Fatalf("destination received %d requests, want exactly 1", n)
		}
		if out := h2.outcomes(); len(out) != 1 || out[0].Outcome != OutcomeDuplicateSkipped || out[0].Delivered != 2 {
			t.Fatalf("redelivery outcome %+v, want duplicate_skipped on delivery 2", out)
		}
		if dl := h2.deadLetters(); len(dl) != 0 {
			t.Fatalf("%d dead letters, want none", len(dl))
		}
	})
	t.Run("without idempotency: dead-lettered", func(t *testing.T) {
		sink, h2 := run(t, false)
		if n := sink.Count(); n != 1 {
			t.Fatalf("destination received %d requests, want exactly 1", n)
		}
		if out := h2.outcomes(); len(out) != 1 || out[0].Outcome != OutcomeDeadLettered || out[0].Reason != deadletter.ReasonMaxDeliveries {
			t.Fatalf("redelivery outcome %+v, want dead_lettered max-deliveries", out)
		}
	})
}

// lostAnswerKV applies an Update on the server, then loses its answer once
// (as a client timeout after the server applied it does).
type lostAnswerKV struct {
	jetstream.KeyValue
	loseNext atomic.Bool
}

func (kv *lostAnswerKV) Update(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	rev, err := kv.KeyValue.Update(ctx, key, value, last)
	if err == nil && kv.loseNext.Swap(false) {
		return 0, context.DeadlineExceeded
	}
	return rev, err
}

// A refresh whose answer was lost after the server applied it does not
// leave the lease on a stale revision: the lease reads the reservation
// back and adopts the revision that holds its value, so the next refresh
// and the final done succeed. A reservation another delivery took over
// meanwhile is never adopted.
func TestRefreshWithALostAnswerKeepsTheLease(t *testing.T) {
	kv := &lostAnswerKV{KeyValue: testBucket(t)}
	s := newReservations(kv)
	ctx := context.Background()
	key := reservationKey("r", "e")
	me := holder{stream: "EVENTS", seq: 1, delivered: 1}
	l, err := s.reserve(ctx, key, me, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	kv.loseNext.Store(true)
	if err := l.refresh(ctx); err != nil {
		t.Fatalf("refresh with a lost answer: %v, want the applied revision adopted", err)
	}
	if err := l.refresh(ctx); err != nil {
		t.Fatalf("next refresh: %v", err)
	}
	if err := l.done(ctx, me); err != nil {
		t.Fatalf("done: %v", err)
	}
	var dup *DuplicateEventError
	if err := s.lookup(ctx, key, me); !errors.As(err, &dup) {
		t.Fatalf("Lookup = %v; want DuplicateEventError", err)
	}

	// Taken over by another delivery: the lease must not adopt its revision.
	key2 := reservationKey("r", "e2")
	l2, err := s.reserve(ctx, key2, me, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.reserve(ctx, key2, holder{stream: "EVENTS", seq: 1, delivered: 2}, time.Minute); err != nil {
		t.Fatalf("takeover: %v", err)
	}
	if err := l2.refresh(ctx); err == nil {
		t.Fatal("a lease refreshed a reservation another delivery had taken over")
	}
}

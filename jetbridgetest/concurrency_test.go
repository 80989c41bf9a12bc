package jetbridgetest_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/jetbridgetest"
	"github.com/sotercare/jetbridge/producer"
)

// Twenty kits at once never see each other: each receiver gets its own
// kit's events, each exactly once, and each server has its own port and
// store. The kits run in 20 subtests started from 20 goroutines, so all of
// them are alive at the same moment whatever -parallel is (t.Parallel
// subtests run at most GOMAXPROCS at a time), and each publishes only
// once all 20 have started.
func TestParallelKits(t *testing.T) {
	t.Parallel()
	const kits, events = 20, 10
	var (
		mu      sync.Mutex
		urls    = map[string]bool{}
		arrived sync.WaitGroup // every kit started (or failed to)
		all     = make(chan struct{})
		runs    sync.WaitGroup
	)
	arrived.Add(kits)
	go func() { arrived.Wait(); close(all) }()
	for k := range kits {
		runs.Go(func() {
			t.Run(fmt.Sprintf("kit%02d", k), func(t *testing.T) {
				var once sync.Once
				arrive := func() { once.Do(arrived.Done) }
				defer arrive() // a kit that fails to start does not block the others
				srv := jetbridgetest.NewServer(t)
				rec := jetbridgetest.NewReceiver(t)
				b := jetbridgetest.StartBridge(t, srv, routeYAML(rec.URL(), ""))
				mu.Lock()
				urls[srv.URL()] = true
				mu.Unlock()
				arrive()
				<-all

				prefix := fmt.Sprintf("k%02d-", k)
				for i := range events {
					srv.Publish(t, producer.Event{ID: fmt.Sprintf("%s%03d", prefix, i), Type: "t", Payload: []byte(`{}`)})
				}
				rec.WaitCount(t, events)
				b.WaitQuiet(t)
				if err := exactlyOnce(rec.Requests(), prefix, events); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
	runs.Wait()
	if len(urls) != kits {
		t.Errorf("%d distinct server URLs for %d kits alive at once", len(urls), kits)
	}
}

// Negative control of TestParallelKits: two tests sharing one server (what
// a global, package-level server would do) are caught by the same check,
// because one test's bridge delivers the other test's events.
func TestParallelKitsCheckCatchesSharedServer(t *testing.T) {
	t.Parallel()
	shared := jetbridgetest.NewServer(t)
	rec := jetbridgetest.NewReceiver(t)
	b := jetbridgetest.StartBridge(t, shared, routeYAML(rec.URL(), ""))
	for _, prefix := range []string{"a-", "b-"} { // b- is the other test's
		for i := range 10 {
			shared.Publish(t, producer.Event{ID: fmt.Sprintf("%s%03d", prefix, i), Type: "t", Payload: []byte(`{}`)})
		}
	}
	rec.WaitCount(t, 20)
	b.WaitQuiet(t)
	if err := exactlyOnce(rec.Requests(), "a-", 10); err == nil {
		t.Fatal("the isolation check passed although the receiver got another test's events")
	}
}

// produce publishes the events id-000 to id-(n-1) in order, as a producer
// service does. A failed publish is retried with the same id when retry
// is set (the broker's duplicate window makes that safe), else dropped.
// Every failure is counted in failures. Before event pauseAt it closes
// paused and waits until resume is closed, so the test can pull the
// server away in the middle of the loop.
func produce(ctx context.Context, js jetstream.JetStream, n int, retry bool, failures *atomic.Int64, pauseAt int, paused, resume chan struct{}) {
	p := producer.NewPublisher(js, "events")
	for i := 0; i < n; {
		if i == pauseAt && paused != nil {
			close(paused)
			paused = nil
			select {
			case <-resume:
			case <-ctx.Done():
				return
			}
		}
		tctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err := p.Publish(tctx, producer.Event{ID: fmt.Sprintf("id-%03d", i), Type: "t", Payload: []byte(`{}`)})
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil || !retry {
			i++
		}
		if err == nil {
			continue
		}
		failures.Add(1)
		select { // the producer's pause between tries, not a test wait
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// restartWhilePublishing runs produce against a server that is shut down
// after 50 events and restarted once the producer has failed while
// it was down, and returns the ids the stream holds, with their counts.
func restartWhilePublishing(t *testing.T, retry bool) map[string]int {
	t.Helper()
	srv := jetbridgetest.NewServer(t)
	jetbridgetest.Provision(t, srv, routeYAML("http://127.0.0.1:1", ""))
	// The producer's own connection, without a reconnect buffer: a
	// publish while the server is away fails at once.
	_, js := srv.Connect(t, nats.ReconnectBufSize(-1))
	var failures atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan struct{})
	paused, resume := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); produce(ctx, js, 200, retry, &failures, 50, paused, resume) }()

	select {
	case <-paused:
	case <-done:
		t.Fatal("the producer ended before event 50")
	}
	srv.Shutdown()
	// Every attempt from here on begins while the server is down: nothing
	// of it is stored. (A publish that failed before is not counted.)
	base := failures.Load()
	close(resume)
	natstest.Eventually(t, 10*time.Second, func() error {
		if n := failures.Load() - base; n < 1 {
			return fmt.Errorf("%d failures while down", n)
		}
		return nil
	})
	srv.Restart(t)
	<-done
	if ctx.Err() != nil {
		t.Fatalf("the producer did not finish: %v", ctx.Err())
	}
	ids := map[string]int{}
	for _, m := range srv.Messages(t, "EVENTS") {
		ids[m.Header.Get(producer.HeaderEventID)]++
	}
	return ids
}

// checkStored reports an event of id-000 to id-(n-1) that the stream does
// not hold exactly once.
func checkStored(ids map[string]int, n int) error {
	var errs []error
	for i := range n {
		if id := fmt.Sprintf("id-%03d", i); ids[id] != 1 {
			errs = append(errs, fmt.Errorf("%s stored %d times", id, ids[id]))
		}
	}
	if len(ids) != n {
		errs = append(errs, fmt.Errorf("%d distinct ids stored, want %d", len(ids), n))
	}
	return errors.Join(errs...)
}

// A server restart in the middle of a producer's publishing loop: a
// producer that retries with the same id ends with every event stored
// exactly once.
func TestRestartDuringPublishing(t *testing.T) {
	t.Parallel()
	if err := checkStored(restartWhilePublishing(t, true), 200); err != nil {
		t.Fatal(err)
	}
}

// Negative control: a producer that drops a failed publish loses events
// across the same restart, and the same check says so.
func TestRestartDuringPublishingCatchesDroppingProducer(t *testing.T) {
	t.Parallel()
	if err := checkStored(restartWhilePublishing(t, false), 200); err == nil {
		t.Fatal("a producer dropping failed publishes passed the check")
	}
}

// signedYAML is routeYAML with every request signed with secret.
func signedYAML(url, secret string) string {
	return routeYAML(url, fmt.Sprintf("    signing: {secret: [%q]}\n", secret))
}

const (
	secretA = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	secretB = "whsec_c2VjcmV0LWJlbG9uZ2luZy10by1zb21lb25lLWVsc2U="
)

// A receiver given the wrong secret fails every signature: the request is
// recorded as not verified and answered 401, so the bridge dead-letters
// it as rejected.
func TestReceiverWrongSecret(t *testing.T) {
	t.Parallel()
	srv := jetbridgetest.NewServer(t)
	rec := jetbridgetest.NewReceiver(t, jetbridgetest.WithSecret(secretB))
	b := jetbridgetest.StartBridge(t, srv, signedYAML(rec.URL(), secretA))
	srv.Publish(t, producer.Event{ID: "s-1", Type: "t", Payload: []byte(`{}`)})

	r := rec.WaitEvent(t, "s-1")
	if r.Verified || !errors.Is(r.SignatureErr, jetbridgetest.ErrSignatureMismatch) {
		t.Fatalf("verified %t, error %v; want a signature mismatch", r.Verified, r.SignatureErr)
	}
	if s := b.WaitEvent(t, "s-1"); s.Outcome != bridge.OutcomeDeadLettered || s.Reason != deadletter.ReasonRejected {
		t.Fatalf("settled %s/%s, want dead-lettered/rejected", s.Outcome, s.Reason)
	}
	if dl := b.WaitDeadLetters(t, 1); dl[0].Status != http.StatusUnauthorized {
		t.Fatalf("dead letter status %d, want 401", dl[0].Status)
	}
}

// Control of TestReceiverWrongSecret: with the bridge's secret, or with it
// among rotated secrets, the same requests verify and are delivered; an
// unsigned request is refused.
func TestReceiverRightSecret(t *testing.T) {
	t.Parallel()
	srv := jetbridgetest.NewServer(t)
	rec := jetbridgetest.NewReceiver(t, jetbridgetest.WithSecret(secretB, secretA))
	b := jetbridgetest.StartBridge(t, srv, signedYAML(rec.URL(), secretA))
	srv.Publish(t, producer.Event{ID: "s-1", Type: "t", Payload: []byte(`{}`)})
	if r := rec.WaitEvent(t, "s-1"); !r.Verified || r.SignatureErr != nil {
		t.Fatalf("verified %t, error %v; want verified", r.Verified, r.SignatureErr)
	}
	if s := b.WaitEvent(t, "s-1"); s.Outcome != bridge.OutcomeDelivered {
		t.Fatalf("settled %s, want delivered", s.Outcome)
	}

	resp, err := http.Post(rec.URL()+"/events", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	last := rec.Requests()[rec.Count()-1]
	if resp.StatusCode != http.StatusUnauthorized || !errors.Is(last.SignatureErr, jetbridgetest.ErrUnsigned) {
		t.Fatalf("unsigned request answered %d with error %v, want 401 and ErrUnsigned", resp.StatusCode, last.SignatureErr)
	}
}

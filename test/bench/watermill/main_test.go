package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestDeliversEachOnce runs the peer against a real JetStream server
// (embedded, on loopback) and a real HTTP server: every published message
// is answered 2xx exactly once, the one whose first POST gets a 500 is
// retried by the Retry middleware, and stopping the peer deletes its
// durable consumer, as docs/performance.md#the-watermill-peer says.
func TestDeliversEachOnce(t *testing.T) {
	const n = 20
	const failFirst = 7 // the first POST of this message is answered 500
	srv := startJetStream(t)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := js.Publish(ctx, "events.info.test", []byte(fmt.Sprintf(`{"seq":%d}`, i))); err != nil {
			t.Fatal(err)
		}
	}

	var mu sync.Mutex
	accepted := map[int]int{}
	posts := 0
	all := make(chan struct{})
	dest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		seq, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(string(body), `{"seq":`), "}"))
		if err != nil || r.Method != http.MethodPost {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		posts++
		if seq == failFirst && !failed[seq] {
			failed[seq] = true
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		accepted[seq]++
		if len(accepted) == n && accepted[seq] == 1 {
			close(all)
		}
		w.WriteHeader(http.StatusAccepted)
	}))
	defer dest.Close()

	runCtx, stop := context.WithCancel(ctx)
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, config{natsURL: srv.ClientURL(), dest: dest.URL + "/events", subject: "events.>", durable: "wmtest"},
			watermill.NopLogger{}, func() { close(ready) })
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("run ended before it was ready: %v", err)
	case <-ctx.Done():
		t.Fatal("not ready in time")
	}
	if !hasConsumer(ctx, t, stream, "wmtest") {
		t.Fatal("no durable consumer wmtest while the peer runs")
	}
	select {
	case <-all:
	case <-ctx.Done():
		mu.Lock()
		t.Fatalf("accepted %d of %d messages", len(accepted), n)
	}
	// Every message acknowledged: JetStream has nothing left to deliver
	// again, so any duplicate would already have been posted.
	allAcked(ctx, t, stream, "wmtest", n)
	stop()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return after its context ended")
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		if accepted[i] != 1 {
			t.Errorf("message %d accepted %d times, want 1", i, accepted[i])
		}
	}
	if !failed[failFirst] {
		t.Errorf("message %d was never answered 500", failFirst)
	}
	if hasConsumer(ctx, t, stream, "wmtest") {
		t.Error("the durable consumer wmtest is still there after the peer stopped: docs/performance.md says it deletes it")
	}
}

// failed records the messages answered 500 once (TestDeliversEachOnce).
var failed = map[int]bool{}

// TestAllocMetrics reads the allocation counters as the benchmark does.
func TestAllocMetrics(t *testing.T) {
	rec := httptest.NewRecorder()
	writeAllocMetrics(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := rec.Body.String()
	for _, name := range []string{"go_memstats_mallocs_total ", "go_memstats_alloc_bytes_total "} {
		i := strings.Index(body, name)
		if i < 0 {
			t.Fatalf("no %s in %q", name, body)
		}
		v, err := strconv.ParseUint(strings.Fields(body[i+len(name):])[0], 10, 64)
		if err != nil || v == 0 {
			t.Errorf("%s: %q (%v)", name, body, err)
		}
	}
}

// hasConsumer reports whether stream has a consumer named name.
// allAcked waits until the consumer name has delivered n messages and
// JetStream holds an ack for each (nothing pending, nothing unacknowledged).
func allAcked(ctx context.Context, t *testing.T, stream jetstream.Stream, name string, n uint64) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		cons, err := stream.PushConsumer(ctx, name)
		if err != nil {
			t.Fatalf("consumer %s: %v", name, err)
		}
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatalf("consumer %s info: %v", name, err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 && info.AckFloor.Stream >= n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("consumer %s: %d pending, %d unacknowledged, ack floor %d of %d", name, info.NumPending, info.NumAckPending, info.AckFloor.Stream, n)
		case <-tick.C:
		}
	}
}

func hasConsumer(ctx context.Context, t *testing.T, stream jetstream.Stream, name string) bool {
	t.Helper()
	names := stream.ConsumerNames(ctx)
	found := false
	for n := range names.Name() {
		found = found || n == name
	}
	if err := names.Err(); err != nil {
		t.Fatalf("consumer names: %v", err)
	}
	return found
}

// startJetStream starts an embedded JetStream server on a random loopback
// port, its store in a temp dir; it is shut down when the test ends.
func startJetStream(t *testing.T) *server.Server {
	t.Helper()
	srv, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      -1,
		JetStream: true,
		StoreDir:  t.TempDir(),
		NoSigs:    true,
	})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		t.Fatal("JetStream server not ready")
	}
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	return srv
}

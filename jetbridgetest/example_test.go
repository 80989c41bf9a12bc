package jetbridgetest_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/jetbridgetest"
	"github.com/sotercare/jetbridge/producer"
)

// A producer test: the code under test publishes with producer.Publisher
// on the kit's JetStream; the real bridge delivers to a recording
// receiver, and the test asserts what arrived.
func Example_producerTest() {
	t := newExampleT() // in a real test: func TestOrders(t *testing.T)
	defer t.finish()

	srv := jetbridgetest.NewServer(t)
	rec := jetbridgetest.NewReceiver(t)
	jetbridgetest.StartBridge(t, srv, fmt.Sprintf(`
destinations:
  orders: {url: %s/orders}
routes:
  - {name: orders, subjects: ["events.>"], destination: orders}
`, rec.URL()))

	// The producer under test.
	pub := producer.NewPublisher(srv.JetStream(), "events")
	if _, err := pub.Publish(context.Background(), producer.Event{
		ID: "order-42", Type: "order.created", Payload: []byte(`{"order":42}`),
	}); err != nil {
		t.Fatal(err)
	}

	got := rec.WaitEvent(t, "order-42")
	fmt.Println(got.Method, got.Path, got.Header.Get("X-Event-Type"), got.Attempt())
	// Output: POST /orders order.created 1
}

// A receiver test: the receiver under test is an http.Handler; the bridge
// delivers real requests to it.
func Example_receiverTest() {
	t := newExampleT() // in a real test: func TestReceiver(t *testing.T)
	defer t.finish()

	// The receiver under test: it counts the events it accepts.
	accepted := make(chan string, 10)
	receiver := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		accepted <- r.Header.Get("X-Event-Id")
		w.WriteHeader(http.StatusAccepted)
	})
	hs := httptest.NewServer(receiver)
	t.Cleanup(hs.Close)

	srv := jetbridgetest.NewServer(t)
	b := jetbridgetest.StartBridge(t, srv, fmt.Sprintf(`
destinations:
  mine: {url: %s}
routes:
  - {name: mine, subjects: ["events.>"], destination: mine}
`, hs.URL))
	srv.Publish(t, producer.Event{ID: "e-1", Type: "sensor.fall", Payload: []byte(`{}`)})

	s := b.WaitEvent(t, "e-1")
	fmt.Println(<-accepted, s.Outcome)
	// Output: e-1 delivered
}

// A dead-letter test: a destination that rejects an event gets it once;
// the dead letter keeps the payload and says why.
func Example_deadLetterTest() {
	t := newExampleT() // in a real test: func TestRejected(t *testing.T)
	defer t.finish()

	srv := jetbridgetest.NewServer(t)
	rec := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(jetbridgetest.Always(http.StatusUnprocessableEntity)))
	b := jetbridgetest.StartBridge(t, srv, fmt.Sprintf(`
destinations:
  strict: {url: %s}
routes:
  - {name: strict, subjects: ["events.>"], destination: strict}
`, rec.URL()))
	srv.Publish(t, producer.Event{ID: "bad-1", Type: "order.created", Payload: []byte(`{"order":-1}`)})

	dl := b.WaitDeadLetters(t, 1)[0]
	fmt.Println(dl.EventID, dl.Reason, dl.Status, string(dl.Data), dl.Reason == deadletter.ReasonRejected, rec.Count())
	// Output: bad-1 rejected 422 {"order":-1} true 1
}

// A test that something does not arrive: a producer's retry with the
// same event id is stored once (a duplicate) and delivered once. The waits
// fail after 5 s instead of Timeout, and AssertNoneWithin fails the test
// if any request arrives in the next 200 ms.
func Example_nothingArrives() {
	t := newExampleT() // in a real test: func TestRetryIsDeliveredOnce(t *testing.T)
	defer t.finish()

	srv := jetbridgetest.NewServer(t)
	rec := jetbridgetest.NewReceiver(t, jetbridgetest.WithWaitTimeout(5*time.Second))
	jetbridgetest.StartBridge(t, srv, fmt.Sprintf(`
destinations:
  orders: {url: %s/orders}
routes:
  - {name: orders, subjects: ["events.>"], destination: orders}
`, rec.URL()), jetbridgetest.WithBridgeWaitTimeout(5*time.Second))

	ev := producer.Event{ID: "order-7", Type: "order.created", Payload: []byte(`{"order":7}`)}
	srv.Publish(t, ev)
	rec.WaitEvent(t, "order-7")
	again := srv.Publish(t, ev) // the producer's retry

	rec.AssertNoneWithin(t, 200*time.Millisecond)
	fmt.Println(again.Duplicate, len(rec.Events("order-7")))
	// Output: true 1
}

// exampleT is the testing.TB the examples run with, because an Example
// function gets none: a real test passes its own *testing.T instead. It
// runs the cleanups at the end and turns a failure into a panic.
type exampleT struct {
	testing.TB // nil: only the methods below are used
	cleanups   []func()
	failed     bool
}

func newExampleT() *exampleT { return &exampleT{} }

func (e *exampleT) Helper()                   {}
func (e *exampleT) Name() string              { return "Example" }
func (e *exampleT) Cleanup(f func())          { e.cleanups = append(e.cleanups, f) }
func (e *exampleT) Failed() bool              { return e.failed }
func (e *exampleT) Context() context.Context  { return context.Background() }
func (e *exampleT) Logf(string, ...any)       {}
func (e *exampleT) Log(...any)                {}
func (e *exampleT) Errorf(f string, a ...any) { e.failed = true; fmt.Fprintf(os.Stderr, f+"\n", a...) }
func (e *exampleT) Error(a ...any)            { e.failed = true; fmt.Fprintln(os.Stderr, a...) }
func (e *exampleT) Fatalf(f string, a ...any) { e.failed = true; panic(fmt.Sprintf(f, a...)) }
func (e *exampleT) Fatal(a ...any)            { e.failed = true; panic(fmt.Sprint(a...)) }

func (e *exampleT) TempDir() string {
	dir, err := os.MkdirTemp("", "jetbridgetest-example-")
	if err != nil {
		e.Fatal(err)
	}
	e.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// finish runs the cleanups, last registered first.
func (e *exampleT) finish() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}

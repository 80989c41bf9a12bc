package deadletter_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/embedded"
	"github.com/sotercare/jetbridge/producer"
)

// List the dead letters of one route, headers only, as "bridge dlq list
// --route orders" does.
func ExampleQueue_List() {
	js, cfg, _, done := rejected("order-1", "order-2", "order-3")
	defer done()
	ctx := context.Background()

	q := deadletter.Open(js, cfg)
	ds, err := q.List(ctx, deadletter.Filter{Route: "orders", Reason: deadletter.ReasonRejected}, false)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, d := range ds {
		fmt.Println(d.Seq, d.EventID, d.Reason, d.Failure, d.Status, d.Subject)
	}
	// Output:
	// 1 order-1 rejected downstream-status 422 orders.info.created
	// 2 order-2 rejected downstream-status 422 orders.info.created
	// 3 order-3 rejected downstream-status 422 orders.info.created
}

// Show one dead letter with its payload, as "bridge dlq show 1 --payload"
// does. Every header is untrusted input: escape it before printing it to a
// terminal.
func ExampleQueue_Get() {
	js, cfg, _, done := rejected("order-1")
	defer done()

	d, err := deadletter.Open(js, cfg).Get(context.Background(), 1)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(d.Route, d.Destination, d.Deliveries, d.OriginalStream, d.OriginalSeq)
	fmt.Println(d.Header.Get(deadletter.HeaderError))
	fmt.Println(string(d.Data))

	_, err = deadletter.Open(js, cfg).Get(context.Background(), 99)
	fmt.Println(errors.Is(err, deadletter.ErrNotFound))
	// Output:
	// orders shop 1 EVENTS 1
	// destination shop answered 422
	// {"order":"order-1"}
	// true
}

// Once the destination is fixed, replay a dead letter: it is republished to
// its original subject, the bridge delivers it again, and the dead letter
// is deleted. Run again, the same replay stores nothing new (Duplicate).
func ExampleQueue_Replay() {
	js, cfg, fix, done := rejected("order-1")
	defer done()
	ctx := context.Background()
	q := deadletter.Open(js, cfg)

	delivered := fix()
	res, err := q.Replay(ctx, 1, true) // keep the dead letter this time
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.EventID, res.Subject, res.Stream, res.Duplicate, res.Kept)
	fmt.Println("delivered", <-delivered)

	res, err = q.Replay(ctx, 1, false) // again: the same replay, then deleted
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.EventID, res.Duplicate, res.Kept)
	_, err = q.Get(ctx, 1)
	fmt.Println(errors.Is(err, deadletter.ErrNotFound))
	// Output:
	// order-1 orders.info.created EVENTS false true
	// delivered order-1
	// order-1 true false
	// true
}

// The replay guard refuses a dead letter that names a subject replay must
// not publish to; nothing is published and the dead letter is kept.
// Anyone allowed to publish on the dead-letter prefix can store one.
func ExampleQueue_CheckReplay() {
	js, cfg, _, done := rejected()
	defer done()

	forged := deadletter.Message{Seq: 7, Subject: "$JS.API.STREAM.PURGE.EVENTS", OriginalStream: "EVENTS", EventID: "x"}
	err := deadletter.Open(js, cfg).CheckReplay(forged)
	fmt.Println(err)
	var refused *deadletter.ReplayRefusedError
	fmt.Println(errors.As(err, &refused), errors.Is(err, deadletter.ErrReplayRefused))
	// Output:
	// deadletter: dead letter 7 refused for replay: Bridge-Original-Subject is a NATS system subject ($JS, the JetStream API)
	// true true
}

// Purge dead letters that need no replay, as "bridge dlq purge" does.
func ExampleQueue_Delete() {
	js, cfg, _, done := rejected("order-1", "order-2")
	defer done()
	ctx := context.Background()
	q := deadletter.Open(js, cfg)

	if err := q.Delete(ctx, 1); err != nil {
		fmt.Println(err)
		return
	}
	left, _ := q.List(ctx, deadletter.Filter{}, false)
	fmt.Println(len(left), left[0].EventID)
	fmt.Println(q.Delete(ctx, 1))
	// Output:
	// 1 order-2
	// deadletter: dead letter 1 not found on EVENTS_DLQ
}

// exampleYAML is one route, orders, on orders.> to the destination shop.
const exampleYAML = `
stream: {name: EVENTS, subjects: ["orders.>"]}
dead_letter: {stream: EVENTS_DLQ, subject_prefix: dlq}
destinations:
  shop: {url: %s, circuit_breaker: {enabled: false}}
routes:
  - {name: orders, subjects: ["orders.>"], destination: shop}
`

// rejected runs what the examples need: an embedded JetStream server, a
// destination that answers 422 until fix is called, and a bridge that has
// dead-lettered one event per id, in order. fix returns the ids the
// destination then accepts; done stops everything.
func rejected(ids ...string) (js jetstream.JetStream, cfg *config.Config, fix func() <-chan string, done func()) {
	var cleanups []func()
	done = func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	fail := func(err error) {
		done()
		panic(err)
	}

	var fixed atomic.Bool
	accepted := make(chan string, 10)
	shop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !fixed.Load() {
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		}
		accepted <- r.Header.Get("X-Event-Id")
	}))
	cleanups = append(cleanups, shop.Close)
	fix = func() <-chan string {
		fixed.Store(true)
		return accepted
	}

	dir, err := os.MkdirTemp("", "deadletter-example-")
	if err != nil {
		fail(err)
	}
	cleanups = append(cleanups, func() { os.RemoveAll(dir) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := embedded.Start(ctx, embedded.Options{StoreDir: dir})
	if err != nil {
		fail(err)
	}
	cleanups = append(cleanups, srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		fail(err)
	}
	cleanups = append(cleanups, nc.Close)
	if js, err = jetstream.New(nc); err != nil {
		fail(err)
	}

	if cfg, err = config.Load(fmt.Appendf(nil, exampleYAML, shop.URL), "example.yaml"); err != nil {
		fail(err)
	}
	b, err := bridge.New(cfg, js, bridge.Options{})
	if err != nil {
		fail(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- b.Run(runCtx) }()
	cleanups = append(cleanups, func() { stop(); <-stopped })
	select {
	case <-b.Ready():
	case err := <-stopped:
		fail(err)
	}

	pub := producer.NewPublisher(js, "orders")
	q := deadletter.Open(js, cfg)
	for i, id := range ids {
		ev := producer.Event{ID: id, Type: "created", Payload: fmt.Appendf(nil, `{"order":%q}`, id)}
		if _, err := pub.Publish(ctx, ev); err != nil {
			fail(err)
		}
		// one at a time, so that the dead letters are in this order
		for {
			ds, err := q.List(ctx, deadletter.Filter{}, false)
			if err == nil && len(ds) == i+1 {
				break
			}
			if ctx.Err() != nil {
				fail(fmt.Errorf("%s not dead-lettered: %w", id, ctx.Err()))
			}
			<-time.After(5 * time.Millisecond)
		}
	}
	return js, cfg, fix, done
}

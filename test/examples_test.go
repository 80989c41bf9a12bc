package test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/embedded"
	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/subjects"
)

// These examples are small applications on jetbridge's public API (config,
// bridge, subjects); internal/embedded only stands in for a NATS server.
// go test runs them and compares their output.

// exampleTimeout bounds every wait in the examples.
const exampleTimeout = 15 * time.Second

// A basic webhook: every order event is POSTed to one endpoint. The broker
// refuses a duplicate event id, an order the endpoint rejects (400) is
// dead-lettered, and a configuration naming an unknown destination is
// rejected before anything runs.
func Example_basicWebhook() {
	ctx := context.Background()
	js, stopJS, err := exampleJetStream(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stopJS()

	// The webhook accepts every order but order-3.
	var mu sync.Mutex
	received := map[string]int{}
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Event-Id")
		mu.Lock()
		received[id]++
		mu.Unlock()
		if id == "order-3" {
			http.Error(w, "unknown customer", http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer hook.Close()

	cfg, err := config.Load([]byte(`
destinations:
  webhook:
    url: `+hook.URL+`/orders
routes:
  - name: orders
    subjects: ["events.>"]
    destination: webhook
`), "webhook.yaml")
	if err != nil {
		fmt.Println(err)
		return
	}
	var outcomes exampleOutcomes
	stopBridge, err := exampleBridge(ctx, cfg, js, &outcomes)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stopBridge()

	p := producer.NewPublisher(js, "events")
	for _, id := range []string{"order-1", "order-1", "order-2", "order-3"} {
		res, err := p.Publish(ctx, producer.Event{ID: id, Type: "order.created", Payload: []byte(`{"total":42}`)})
		if err != nil {
			fmt.Println(err)
			return
		}
		if res.Duplicate {
			fmt.Printf("duplicate %s refused (stored as seq %d)\n", id, res.Seq)
			continue
		}
		fmt.Printf("stored %s on %s seq %d\n", id, res.Subject, res.Seq)
	}

	final, ok := outcomes.waitFinal(3)
	if !ok {
		fmt.Println("not every order was settled in time")
		return
	}
	for _, s := range final {
		fmt.Println(strings.TrimSpace(fmt.Sprintf("%s: %s %s", s.EventID, s.Outcome, s.Reason)))
	}
	mu.Lock()
	fmt.Printf("webhook requests: order-1 %d, order-2 %d, order-3 %d\n", received["order-1"], received["order-2"], received["order-3"])
	mu.Unlock()

	dead, err := exampleDeadLetters(ctx, js, cfg.DeadLetter.Stream)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, m := range dead {
		fmt.Printf("dead letter: %s %s, HTTP %s, from %s\n", m.Header.Get("Event-Id"), m.Header.Get(deadletter.HeaderReason),
			m.Header.Get(deadletter.HeaderStatus), m.Header.Get(deadletter.HeaderOriginalSubject))
	}

	_, err = config.Load([]byte(`
destinations:
  webhook:
    url: `+hook.URL+`/orders
routes:
  - name: orders
    subjects: ["events.>"]
    destination: nowhere
`), "webhook.yaml")
	fmt.Println("invalid config:", err)

	// Output:
	// stored order-1 on events.info.order.created seq 1
	// duplicate order-1 refused (stored as seq 1)
	// stored order-2 on events.info.order.created seq 2
	// stored order-3 on events.info.order.created seq 3
	// order-1: delivered
	// order-2: delivered
	// order-3: dead_lettered rejected
	// webhook requests: order-1 1, order-2 1, order-3 1
	// dead letter: order-3 rejected, HTTP 400, from events.info.order.created
	// invalid config: webhook.yaml:8: routes[0].destination: unknown destination "nowhere" (defined: webhook)
}

// Generic IoT: the producer classifies temperature readings itself (80 °C
// or more critical, 60 or more warning, the rest info) and the subject
// carries the class: critical readings page someone, the rest feed
// telemetry. Routes are independent, so a paging endpoint that hangs and
// then fails does not hold up telemetry; the pages go out once it recovers.
func Example_genericIoT() {
	ctx := context.Background()
	js, stopJS, err := exampleJetStream(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stopJS()

	// The pager hangs on every request until released, then answers 503,
	// until it is up again.
	var pagerUp atomic.Bool
	var pagerWaiting atomic.Int32
	release := make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	defer releaseOnce()
	pager := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if pagerUp.Load() {
			w.WriteHeader(http.StatusOK)
			return
		}
		pagerWaiting.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer pager.Close()
	telemetry := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
	}))
	defer telemetry.Close()

	cfg, err := config.Load([]byte(`
destinations:
  pager:
    url: `+pager.URL+`/page
    timeout: 20s
  telemetry:
    url: `+telemetry.URL+`/ingest
routes:
  - name: paging
    subjects: ["events.critical.>"]
    destination: pager
    backoff: [100ms]
  - name: telemetry
    subjects: ["events.warning.>", "events.info.>"]
    destination: telemetry
`), "iot.yaml")
	if err != nil {
		fmt.Println(err)
		return
	}
	var outcomes exampleOutcomes
	stopBridge, err := exampleBridge(ctx, cfg, js, &outcomes)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stopBridge()

	classify := func(celsius float64) subjects.Severity {
		switch {
		case celsius >= 80:
			return subjects.Critical
		case celsius >= 60:
			return subjects.Warning
		}
		return subjects.Info
	}
	p := producer.NewPublisher(js, "events")
	for i, celsius := range []float64{55, 65, 85, 72, 90, 40} {
		res, err := p.Publish(ctx, producer.Event{
			ID:       fmt.Sprintf("t-%d", i+1),
			Type:     "iot.temperature",
			Severity: classify(celsius),
			Payload:  fmt.Appendf(nil, `{"sensor":"boiler-1","celsius":%g}`, celsius),
		})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s %g °C -> %s\n", res.ID, celsius, res.Subject)
	}

	// Telemetry is delivered while both pages hang at the pager.
	if !exampleWait(func() bool {
		return len(outcomes.ids("telemetry", bridge.OutcomeDelivered)) == 4 && pagerWaiting.Load() == 2
	}) {
		fmt.Println("telemetry was not delivered while the pager hung")
		return
	}
	fmt.Printf("telemetry delivered %s while the pager hung on %d pages\n",
		strings.Join(outcomes.ids("telemetry", bridge.OutcomeDelivered), " "), pagerWaiting.Load())

	// The pager fails them (503), then recovers: the broker redelivers.
	pagerUp.Store(true)
	releaseOnce()
	if !exampleWait(func() bool { return len(outcomes.ids("paging", bridge.OutcomeDelivered)) == 2 }) {
		fmt.Println("the pages were not delivered after the pager recovered")
		return
	}
	fmt.Printf("pages redelivered after a 503: %s\n", strings.Join(outcomes.ids("paging", bridge.OutcomeRedeliveryScheduled), " "))
	fmt.Printf("pages delivered once the pager was back: %s\n", strings.Join(outcomes.ids("paging", bridge.OutcomeDelivered), " "))

	// Output:
	// t-1 55 °C -> events.info.iot.temperature
	// t-2 65 °C -> events.warning.iot.temperature
	// t-3 85 °C -> events.critical.iot.temperature
	// t-4 72 °C -> events.warning.iot.temperature
	// t-5 90 °C -> events.critical.iot.temperature
	// t-6 40 °C -> events.info.iot.temperature
	// telemetry delivered t-1 t-2 t-4 t-6 while the pager hung on 2 pages
	// pages redelivered after a 503: t-3 t-5
	// pages delivered once the pager was back: t-3 t-5
}

// exampleJetStream starts an embedded JetStream server in a temporary
// directory and connects to it.
func exampleJetStream(ctx context.Context) (jetstream.JetStream, func(), error) {
	dir, err := os.MkdirTemp("", "jetbridge-example-")
	if err != nil {
		return nil, nil, err
	}
	srv, err := embedded.Start(ctx, embedded.Options{Listen: "127.0.0.1:0", StoreDir: dir})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	stop := func() {
		srv.Shutdown()
		os.RemoveAll(dir)
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		stop()
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		stop()
		return nil, nil, err
	}
	return js, func() { nc.Close(); stop() }, nil
}

// exampleBridge runs a bridge until the returned stop is called.
func exampleBridge(ctx context.Context, cfg *config.Config, js jetstream.JetStream, o *exampleOutcomes) (func(), error) {
	b, err := bridge.New(cfg, js, bridge.Options{OnSettle: o.add})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	select {
	case <-b.Ready():
	case err := <-done:
		cancel()
		return nil, err
	case <-time.After(exampleTimeout):
		cancel()
		<-done
		return nil, errors.New("the bridge was not ready in time")
	}
	return func() {
		cancel()
		if err := <-done; err != nil {
			fmt.Println("bridge:", err)
		}
	}, nil
}

// exampleOutcomes records the bridge's settlements.
type exampleOutcomes struct {
	mu   sync.Mutex
	list []bridge.Settled
}

func (o *exampleOutcomes) add(s bridge.Settled) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.list = append(o.list, s)
}

// ids returns the event ids settled on route with outcome, sorted.
func (o *exampleOutcomes) ids(route string, outcome bridge.Outcome) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var ids []string
	for _, s := range o.list {
		if s.Route == route && s.Outcome == outcome {
			ids = append(ids, s.EventID)
		}
	}
	slices.Sort(ids)
	return ids
}

// waitFinal waits until n stream messages have a final outcome (delivered
// or dead-lettered) and returns those settlements in stream order.
func (o *exampleOutcomes) waitFinal(n int) ([]bridge.Settled, bool) {
	var final []bridge.Settled
	ok := exampleWait(func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		final = final[:0]
		for _, s := range o.list {
			if s.Outcome == bridge.OutcomeDelivered || s.Outcome == bridge.OutcomeDeadLettered {
				final = append(final, s)
			}
		}
		return len(final) >= n
	})
	slices.SortFunc(final, func(a, b bridge.Settled) int { return int(a.Seq) - int(b.Seq) })
	return final, ok
}

// exampleWait polls cond every 10 ms until it holds or exampleTimeout
// passes.
func exampleWait(cond func() bool) bool {
	deadline := time.Now().Add(exampleTimeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

// exampleDeadLetters reads every message of the dead-letter stream.
func exampleDeadLetters(ctx context.Context, js jetstream.JetStream, name string) ([]*jetstream.RawStreamMsg, error) {
	var out []*jetstream.RawStreamMsg
	ok := exampleWait(func() bool {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		if err != nil || info.State.Msgs == 0 {
			return false
		}
		out = out[:0]
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
			if m, err := s.GetMsg(ctx, seq); err == nil {
				out = append(out, m)
			}
		}
		return true
	})
	if !ok {
		return nil, errors.New("no dead letter in time")
	}
	return out, nil
}

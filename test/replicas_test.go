package test

import (
	"context"
	"fmt"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/jetbridgetest"
)

// Three bridges on one configuration, started at the same moment, share
// the route's consumer: 1,000 events on a destination answering in 0-50 ms
// are each delivered exactly once, and every replica delivers some.
func TestReplicasSplitTheWork(t *testing.T) {
	const n = 1000
	srv := jetbridgetest.NewServer(t)
	_, js := srv.Connect(t)
	sink := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(jitter(50*time.Millisecond)))
	sc := scenario{natsURL: srv.URL(), sinkURL: sink.URL(), maxInFlight: 32, ackWait: 30 * time.Second, shutdownTimeout: 5 * time.Second}
	cfg := sc.config(t)

	// Given three replicas started at once (provisioning concurrently)
	delivered := startReplicas(t, srv, cfg, cfg, cfg)

	// When 1,000 events are published
	l := natstest.NewLedger("replicas", n)
	l.Publish(t, js, "events.info.replicas")
	natstest.WaitQuiet(t, js, streamName, routeName, quietTimeout)

	// Then each event was delivered exactly once, and each replica did some
	r := account(t, js, l, sink.Requests())
	per := make([]int64, len(delivered))
	var sum int64
	for i, d := range delivered {
		per[i] = d.Load()
		sum += per[i]
	}
	t.Logf("delivered per replica %v; %s", per, r)
	if r.DuplicateCount != 0 || r.DeadLettered != 0 {
		t.Errorf("%s; want every event delivered exactly once", r)
	}
	if sum != n {
		t.Errorf("replicas settled %d deliveries in all, want %d", sum, n)
	}
	for i, c := range per {
		if c == 0 {
			t.Errorf("replica %d delivered nothing, want the work split across all three", i+1)
		}
	}
}

// The negative control of the exactly-once assertion: three bridges that do
// not share a consumer (each has its own route name, hence its own durable)
// each deliver every event, and the same accounting reports it.
func TestReplicasWithoutSharedConsumerDuplicate(t *testing.T) {
	const n = 200
	srv := jetbridgetest.NewServer(t)
	_, js := srv.Connect(t)
	sink := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(jitter(5*time.Millisecond)))
	sc := scenario{natsURL: srv.URL(), sinkURL: sink.URL(), maxInFlight: 32, ackWait: 30 * time.Second, shutdownTimeout: 5 * time.Second}
	cfgs := make([]*config.Config, 3)
	for i := range cfgs {
		cfgs[i] = sc.config(t)
		cfgs[i].Routes[0].Name = fmt.Sprintf("%s%d", routeName, i+1)
	}
	startReplicas(t, srv, cfgs...)

	l := natstest.NewLedger("separate", n)
	l.Publish(t, js, "events.info.separate")
	for _, c := range cfgs {
		natstest.WaitQuiet(t, js, streamName, c.Routes[0].Name, quietTimeout)
	}

	l.Delivered(eventIDs(sink.Requests())...)
	r, err := l.Check()
	if err != nil {
		t.Fatal(err)
	}
	if r.DuplicateCount != 2*n {
		t.Fatalf("%s; want %d duplicates (every event three times)", r, 2*n)
	}
}

// startReplicas runs one in-process bridge per configuration, each on its
// own connection, starting them at the same moment, and waits until all
// are ready. It returns each one's count of delivered messages. They stop
// (and drain) when the test ends.
func startReplicas(t *testing.T, srv *jetbridgetest.Server, cfgs ...*config.Config) []*atomic.Int64 {
	t.Helper()
	counts := make([]*atomic.Int64, len(cfgs))
	bridges := make([]*bridge.Bridge, len(cfgs))
	for i, cfg := range cfgs {
		_, js := srv.Connect(t)
		count := new(atomic.Int64)
		b, err := bridge.New(cfg, js, bridge.Options{OnSettle: func(s bridge.Settled) {
			if s.Outcome == bridge.OutcomeDelivered {
				count.Add(1)
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		counts[i], bridges[i] = count, b
	}
	// Registered after the connections' cleanups, so it runs before them:
	// the bridges drain while still connected.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	errs := make(chan error, len(bridges))
	for _, b := range bridges {
		wg.Go(func() {
			if err := b.Run(ctx); err != nil {
				errs <- err
			}
		})
	}
	for i, b := range bridges {
		select {
		case <-b.Ready():
		case err := <-errs:
			t.Fatalf("replica %d: Run: %v", i+1, err)
		case <-time.After(readyTimeout):
			t.Fatalf("replica %d not ready within %s", i+1, readyTimeout)
		}
	}
	return counts
}

// jitter answers 200 after a delay between 0 and max, fixed per event id.
func jitter(max time.Duration) jetbridgetest.Script {
	return func(r jetbridgetest.Request) jetbridgetest.Response {
		h := fnv.New32a()
		h.Write([]byte(r.Header.Get(jetbridgetest.HeaderEventID)))
		return jetbridgetest.Response{Delay: time.Duration(h.Sum32()%uint32(max/time.Millisecond+1)) * time.Millisecond}
	}
}

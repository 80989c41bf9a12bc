package bridge

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/natstest"
)

// Two fenced partitions that hold every token between them end their
// fences (docs/delivery.md#ordered-delivery). Replica A owns both
// partitions of a route with B = 64 (max_in_flight 16) and holds 32
// messages of each (the destination answers 503 until the gate opens);
// then its connection closes (a crash) and both partitions are unpinned
// at once, which is what a NATS restart does (the pin is not kept), so
// replica B gains them while A's 64 messages are not due for redelivery
// before ack_wait. Fenced, B pulls 32 new messages on each partition: the
// route's 64 tokens, while each fence waits for the 32 A held. B must
// still deliver every event, in order per key, once A has given up and
// the gate is open.
//
// Negative control: B without the yield (a fenced partition that finds no
// token once ack_wait has passed is the senior fence; the others hand
// back what they pulled while fenced): both fences wait for tokens the
// other holds, for good, and the same run stalls. This is the stall of
// test/ordering_test.go's TestOrderedAcrossReplicas seen after a NATS
// restart (four of eight partitions fenced with 32 messages each, B = 128).
func TestOrderedFencesEndWhenTheyHoldEveryToken(t *testing.T) {
	const keys, perKey = 20, 30
	run := func(t testing.TB, tweak func(*Bridge)) error {
		srv := natstest.Start(t)
		var open atomic.Bool
		s := newOrderSink(t, func(string, int) int {
			if !open.Load() {
				return 503
			}
			return 0
		})
		cfg := testConfig(t, `
destinations:
  d:
    url: %s
    timeout: 1s
    circuit_breaker: {enabled: false}
routes:
  - {name: r, subjects: ["events.*.ord.>"], destination: d, ack_wait: 2s, max_deliver: 200, backoff: [200ms], max_in_flight: 16, ordering: {key: {tokens: [4]}, partitions: 2}}
`, s.sink.URL())
		a := startHarness(t, srv, cfg, faults{}, nil)
		publishKeys(a, keys, perKey)
		if !waitUntil(20*time.Second, func() bool {
			st := a.b.routes[0].ord.status()
			return len(st.Owned) == 2 && len(st.Fenced) == 0 && st.Held == 64
		}) {
			return fmt.Errorf("replica A does not own both partitions holding 64 messages: %+v", a.b.routes[0].ord.status())
		}
		b := startHarness(t, srv, cfg, faults{}, tweak)
		a.nc.Close()
		_, js := natstest.Connect(t, srv.URL())
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		copyStream, err := js.Stream(ctx, config.CopyStream(cfg.Stream.Name, "r"))
		if err != nil {
			return err
		}
		for p := range 2 {
			if err := copyStream.UnpinConsumer(ctx, partitionConsumerName("r", p), orderingGroup); err != nil {
				return fmt.Errorf("unpin partition %d: %w", p, err)
			}
		}
		if !waitUntil(20*time.Second, func() bool {
			return len(b.b.routes[0].ord.status().Owned) == 2 && len(a.b.routes[0].ord.status().Owned) == 0
		}) {
			return fmt.Errorf("the partitions did not move: A %+v, B %+v", a.b.routes[0].ord.status(), b.b.routes[0].ord.status())
		}
		open.Store(true)
		if !waitUntil(20*time.Second, func() bool { return s.delivered() == keys*perKey }) {
			return fmt.Errorf("%d of %d events delivered; B: %+v", s.delivered(), keys*perKey, b.b.routes[0].ord.status())
		}
		if inv := s.inversions(); inv != 0 {
			return fmt.Errorf("%d inversions", inv)
		}
		return nil
	}
	if err := run(t, nil); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "no yield to a senior fence", func(t testing.TB) error {
		return run(t, func(b *Bridge) { b.routes[0].ord.cfg.yield = false })
	})
}

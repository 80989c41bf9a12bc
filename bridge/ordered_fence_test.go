package bridge

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/natstest"
)

// A replica that gains every partition at once, after a restart of the
// NATS server, each missing the messages it held before (handed back, or
// due ack_wait after the restart): its fences take every token between
// them with new messages before the missing ones come back, and still end
// (the extra places of overdraw), so every event is delivered, in order.
// The control takes the extra places away (an overdraft pool of none):
// the fences then hold every token for ever and the route stalls. Whether
// every token is taken by fences before the first missing message comes
// back depends on the order of the partitions' first pulls after the
// restart (about one run in ten, it is not): the control is caught when
// one of three runs stalls.
func TestOrderedFencesEndWhenTheyHoldEveryToken(t *testing.T) {
	const keys, perKey = 64, 10
	// max_in_flight 2: B = 64 tokens, 16 partitions of 4 each (a batch).
	yaml := `
destinations:
  d: {url: %s, timeout: 1s, circuit_breaker: {enabled: false}}
routes:
  - {name: r, subjects: ["events.*.ord.>"], destination: d, ack_wait: 2s, max_deliver: 1000, backoff: [200ms],
     max_in_flight: 2, ordering: {key: {tokens: [4]}, partitions: 16}}
`
	run := func(t testing.TB, tweak func(*Bridge), wait time.Duration) error {
		srv := natstest.Start(t)
		var open atomic.Bool // until set, the destination answers 503
		s := newOrderSink(t, func(string, int) int {
			if open.Load() {
				return 0
			}
			return 503
		})
		cfg := testConfig(t, yaml, s.sink.URL())
		h := startHarness(t, srv, cfg, faults{}, tweak)
		publishKeys(h, keys, perKey)
		o := h.b.routes[0].ord
		if !waitUntil(30*time.Second, func() bool {
			return o.status().Held >= o.cfg.buffer
		}) {
			return fmt.Errorf("the replica did not fill its buffer: %+v", o.status())
		}
		// The server restarts: every partition gets a new pin.
		srv.Restart(t)
		open.Store(true)
		if !waitUntil(wait, func() bool { return s.delivered() == keys*perKey }) {
			st := o.status()
			return fmt.Errorf("%d of %d events delivered; the replica holds %d, fenced %v", s.delivered(), keys*perKey, st.Held, st.Fenced)
		}
		if inv := s.inversions(); inv != 0 {
			return fmt.Errorf("%d inversions", inv)
		}
		if !waitUntil(10*time.Second, func() bool { return o.status().Held == 0 }) {
			return fmt.Errorf("the replica still holds %d", o.status().Held)
		}
		return nil
	}
	if err := run(t, nil, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "no extra places for fences", func(t testing.TB) error {
		for range 3 {
			// Delivered in 6 s at most when it does not stall (about 3 s
			// without the race detector).
			if err := run(t, func(b *Bridge) { b.routes[0].ord.over = make(chan struct{}) }, 12*time.Second); err != nil {
				return err
			}
		}
		return nil
	})
}

package bridge

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/natstest"
)

// A replica that gains every partition at once, after a restart of the
// NATS server, each missing the messages it held before (handed back when
// the replica saw the new pins): its fences take every token between them
// with new messages before the missing ones are due, and still end (the
// extra places of overdraw). The destination answers 503 until then, so
// no message leaves to free a token; then every event is delivered, in
// order. Each partition pulls up to 8 at once (twice what its share of
// the tokens is), so the fences take every token in their first pulls
// after the restart. The control takes the extra places away (an
// overdraft pool of none): the fences then never end.
func TestOrderedFencesEndWhenTheyHoldEveryToken(t *testing.T) {
	const keys, perKey = 64, 10
	// max_in_flight 2: B = 64 tokens over 16 partitions.
	yaml := `
destinations:
  d: {url: %s, timeout: 1s, circuit_breaker: {enabled: false}}
routes:
  - {name: r, subjects: ["events.*.ord.>"], destination: d, ack_wait: 4s, max_deliver: 1000, backoff: [200ms],
     max_in_flight: 2, ordering: {key: {tokens: [4]}, partitions: 16}}
`
	run := func(t testing.TB, overdraft bool) error {
		srv := natstest.Start(t)
		var open atomic.Bool // until set, the destination answers 503
		s := newOrderSink(t, func(string, int) int {
			if open.Load() {
				return 0
			}
			return 503
		})
		cfg := testConfig(t, yaml, s.sink.URL())
		h := startHarness(t, srv, cfg, faults{}, func(b *Bridge) {
			o := b.routes[0].ord
			o.cfg.batch = 8
			if !overdraft {
				o.over = make(chan struct{})
			}
		})
		publishKeys(h, keys, perKey)
		o := h.b.routes[0].ord
		if !waitUntil(30*time.Second, func() bool { return o.status().Held >= o.cfg.buffer }) {
			return fmt.Errorf("the replica did not fill its buffer: %+v", o.status())
		}
		// The server restarts: every partition gets a new pin.
		srv.Restart(t)
		if !waitUntil(time.Second, func() bool { return len(o.status().Fenced) > 0 }) {
			return fmt.Errorf("no partition fenced after the restart: %+v", o.status())
		}
		// Fenced partitions pull their missing messages 4 s (ack_wait)
		// after their gain. (ack_wait 4 s, not 2 s: with a pinned TTL of
		// 5 s the leases hold through a slow restart on a loaded machine;
		// at 3 s every partition could be lost and fenced again, and a
		// second generation of fences found the extra places spent by the
		// first while this destination refuses everything.)
		if !waitUntil(15*time.Second, func() bool { return len(o.status().Fenced) == 0 }) {
			return fmt.Errorf("fences still waiting 15 s after the restart: %+v", o.status())
		}
		open.Store(true)
		if !waitUntil(30*time.Second, func() bool { return s.delivered() == keys*perKey }) {
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
	if err := run(t, true); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "no extra places for fences", func(t testing.TB) error { return run(t, false) })
}

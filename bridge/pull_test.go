package bridge

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/sinktest"
)

const overlapRoute = `
destinations:
  d:
    url: %s
routes:
  - name: r
    subjects: ["events.>"]
    destination: d
    max_in_flight: 4
`

// A route with room keeps a pull open while an earlier pull still waits
// for messages: once one message of a pull of 4 is delivered, the server
// holds two pull requests of the route (the first, for 3 more, and the
// next, for the slot that was freed), so a message published then is not
// left waiting for a pull's round trip (README "Performance").
func TestRouteWithRoomKeepsAPullOpen(t *testing.T) {
	check := func(t testing.TB, f faults) error {
		sink := sinktest.New(t, sinktest.Always(200))
		h := startBridge(t, testConfig(t, overlapRoute, sink.URL()), f)
		ctx := context.Background()
		cons, err := h.js.Consumer(ctx, h.cfg.Stream.Name, "r")
		if err != nil {
			t.Fatal(err)
		}
		waiting := func() int {
			info, err := cons.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return info.NumWaiting
		}
		if !waitUntil(settleWait, func() bool { return waiting() == 1 }) {
			t.Fatalf("%d pull requests open on an idle route, want 1", waiting())
		}
		h.publish("events.info.x", "first", []byte(`{}`), nil)
		if out := h.waitOutcomes(1, settleWait, outcomeIs(OutcomeDelivered)); len(out) != 1 {
			t.Fatalf("outcomes %+v, want one delivery", h.outcomes())
		}
		var n int
		if !waitUntil(2*time.Second, func() bool { n = waiting(); return n == 2 }) {
			return fmt.Errorf("%d pull requests open after one message of a pull of 4, want 2", n)
		}
		h.publish("events.info.x", "second", []byte(`{}`), nil)
		if out := h.waitOutcomes(2, settleWait, outcomeIs(OutcomeDelivered)); len(out) != 2 {
			t.Fatalf("outcomes %+v, want two deliveries", h.outcomes())
		}
		return nil
	}
	if err := check(t, faults{}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "no pull while another is open", func(t testing.TB) error { return check(t, faults{noOverlap: true}) })
}

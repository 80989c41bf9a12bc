package bridge

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
)

// inFlightRoute is route r to the sink at %s with max_in_flight %d.
const inFlightRoute = `
destinations:
  d:
    url: %s
routes:
  - name: r
    subjects: ["events.>"]
    destination: d
    max_in_flight: %d
`

// A route with room keeps a pull open while an earlier pull still waits
// for messages: once one message of a pull of 4 is delivered, the server
// holds two pull requests of the route (the first, for 3 more, and the
// next, for the slot that was freed), so a message published then is not
// left waiting for a pull's round trip (docs/performance.md).
func TestRouteWithRoomKeepsAPullOpen(t *testing.T) {
	check := func(t testing.TB, f faults) error {
		sink := sinktest.New(t, sinktest.Always(200))
		h := startBridge(t, testConfig(t, inFlightRoute, sink.URL(), 4), f)
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

// pullRequest is what the test reads of a pull request on the wire
// (nats.go's JSON; durations in nanoseconds).
type pullRequest struct {
	Batch     int           `json:"batch"`
	Expires   time.Duration `json:"expires"`
	Heartbeat time.Duration `json:"idle_heartbeat"`
}

// A pull made after one that came back full asks for no idle heartbeat
// and expires within about 2 s (nats.go 1.55 keeps a Fetch's heartbeat
// timer, and the pull with it, alive after the pull ends: under a backlog
// that kept hundreds of dead pulls in the heap); after a pull that came
// back short the heartbeat is asked for again. With max_in_flight 1 the
// sequence is exact: the idle pull (heartbeat), one message fills it, the
// next (none, 2 s), which expires short, and the next (heartbeat). The
// requests are read on the wire, next to the server.
func TestPullAfterAFullPullAsksForNoHeartbeat(t *testing.T) {
	check := func(t testing.TB, f faults) error {
		srv := natstest.Start(t)
		spy, _ := natstest.Connect(t, srv.URL())
		sub, err := spy.SubscribeSync("$JS.API.CONSUMER.MSG.NEXT.*.r")
		if err != nil {
			t.Fatal(err)
		}
		sink := sinktest.New(t, sinktest.Always(200))
		h := startBridgeOn(t, srv, testConfig(t, inFlightRoute, sink.URL(), 1), f)
		next := func() pullRequest {
			t.Helper()
			m, err := sub.NextMsg(settleWait)
			if err != nil {
				t.Fatalf("no pull request: %v", err)
			}
			var pr pullRequest
			if err := json.Unmarshal(m.Data, &pr); err != nil {
				t.Fatalf("pull request %q: %v", m.Data, err)
			}
			return pr
		}
		first := next()
		h.publish("events.info.x", "only", []byte(`{}`), nil)
		if out := h.waitOutcomes(1, settleWait, outcomeIs(OutcomeDelivered)); len(out) != 1 {
			t.Fatalf("outcomes %+v, want one delivery", h.outcomes())
		}
		afterFull, afterShort := next(), next()
		got := []time.Duration{first.Heartbeat, afterFull.Heartbeat, afterShort.Heartbeat}
		if got[0] != fetchHeartbeat || got[1] != 0 || got[2] != fetchHeartbeat {
			return fmt.Errorf("heartbeats of the idle pull, the pull after the full one and the one after that: %v, want [%v 0s %v]", got, fetchHeartbeat, fetchHeartbeat)
		}
		if afterFull.Expires > fetchFullWait || afterFull.Expires < fetchFullWait/2 {
			return fmt.Errorf("the pull after a full one expires after %v, want at most %v", afterFull.Expires, fetchFullWait)
		}
		return nil
	}
	if err := check(t, faults{}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "a heartbeat on every pull", func(t testing.TB) error { return check(t, faults{alwaysPullHeartbeat: true}) })
}

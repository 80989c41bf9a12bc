package bridge

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
)

// An attempt three times longer than ack_wait is kept alive by progress
// acks: one request per event, no redelivery.
func TestProgressAcksKeepSlowAttemptsSingle(t *testing.T) {
	check := func(t testing.TB, f faults) error {
		sink := sinktest.New(t, func(sinktest.Request) sinktest.Response {
			return sinktest.Response{Status: 200, Delay: 3 * time.Second}
		})
		cfg := testConfig(t, `
destinations:
  d:
    url: %s
    timeout: 10s
routes:
  - name: r
    subjects: ["events.>"]
    destination: d
    ack_wait: 1s
`, sink.URL())
		h := startBridge(t, cfg, f)
		for i := range 3 {
			h.publish("events.info.x", fmt.Sprintf("e%d", i), []byte(`{}`), nil)
		}
		out := h.waitOutcomes(3, settleWait, outcomeIs(OutcomeDelivered))
		h.quiet("r")
		if len(out) != 3 {
			return fmt.Errorf("%d delivered, want 3", len(out))
		}
		if n := sink.Count(); n != 3 {
			return fmt.Errorf("destination received %d requests, want exactly 3", n)
		}
		for _, s := range out {
			if s.Delivered != 1 {
				return fmt.Errorf("event %s settled on delivery %d, want 1 (no redelivery)", s.EventID, s.Delivered)
			}
		}
		return nil
	}
	if err := check(t, faults{}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "no progress acks", func(t testing.TB) error { return check(t, faults{noProgress: true}) })
}

// The server's MaxDeliver is one above the bridge's limit: a message whose
// final allowed delivery was never settled (the bridge died, or ack_wait
// ran out) comes back once more, and the bridge dead-letters it without
// sending anything.
func TestUnsettledFinalDeliveryIsDeadLettered(t *testing.T) {
	check := func(t testing.TB, f faults) error {
		sink := sinktest.New(t, sinktest.Always(200))
		cfg := testConfig(t, `
destinations:
  d:
    url: %s
routes:
  - name: r
    subjects: ["events.>"]
    destination: d
    max_deliver: 2
    ack_wait: 1s
`, sink.URL())
		srv := natstest.Start(t)
		_, js := natstest.Connect(t, srv.URL())
		pre, err := newBridge(cfg, js, Options{}, f)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := pre.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		cons := pre.routes[0].consumer()
		if md := cons.CachedInfo().Config.MaxDeliver; md != 3 {
			return fmt.Errorf("consumer MaxDeliver %d, want max_deliver+1 = 3", md)
		}
		if _, err := js.Publish(ctx, "events.info.x", []byte(`{}`), jetstream.WithMsgID("e1")); err != nil {
			t.Fatal(err)
		}
		// Two deliveries that nobody settles, as if two bridges had died
		// while delivering it.
		leaveUnsettled(t, cons, 2)
		h := startBridgeOn(t, srv, cfg, f)
		out := h.waitOutcomes(1, settleWait, nil)
		h.quiet("r")
		if len(out) != 1 || out[0].Outcome != OutcomeDeadLettered || out[0].Reason != ReasonMaxDeliveries || out[0].Delivered != 3 {
			return fmt.Errorf("outcomes %+v, want one dead letter max-deliveries on delivery 3", out)
		}
		if n := sink.Count(); n != 0 {
			return fmt.Errorf("destination received %d requests, want 0", n)
		}
		dl := h.deadLetters()
		if len(dl) != 1 || dl[0].Header.Get(HeaderDeliveries) != "3" || dl[0].Header.Get(HeaderFailure) != "" {
			return fmt.Errorf("%d dead letters, want one with Bridge-Deliveries 3 and no Bridge-Failure", len(dl))
		}
		return nil
	}
	if err := check(t, faults{}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "max_deliver off by one", func(t testing.TB) error { return check(t, faults{maxDeliverOffByOne: true}) })
}

package bridge

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/deadletter"
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
		ctx := context.Background()
		pre := provisioned(t, cfg, js, f)
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
		if len(out) != 1 || out[0].Outcome != OutcomeDeadLettered || out[0].Reason != deadletter.ReasonMaxDeliveries || out[0].Delivered != 3 {
			return fmt.Errorf("outcomes %+v, want one dead letter max-deliveries on delivery 3", out)
		}
		if n := sink.Count(); n != 0 {
			return fmt.Errorf("destination received %d requests, want 0", n)
		}
		dl := h.deadLetters()
		if len(dl) != 1 || dl[0].Header.Get(deadletter.HeaderDeliveries) != "3" || dl[0].Header.Get(deadletter.HeaderFailure) != "" {
			return fmt.Errorf("%d dead letters, want one with Bridge-Deliveries 3 and no Bridge-Failure", len(dl))
		}
		return nil
	}
	if err := check(t, faults{}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "max_deliver off by one", func(t testing.TB) error { return check(t, faults{maxDeliverOffByOne: true}) })
}

// Progress acks stop before the settlement: on the wire, no +WPI for a
// delivery follows its -NAK (one that did would stretch the nak's delay to
// ack_wait). The first attempt outlasts a progress tick, so progress acks
// are sent, then the 503 is nak'ed with a 50 ms delay; the redelivery is
// delivered. The acks are read on the server's ack subjects by a
// connection of the test's own.
func TestNoProgressAckAfterTheSettlement(t *testing.T) {
	check := func(t testing.TB, f faults) error {
		sink := sinktest.New(t, func(r sinktest.Request) sinktest.Response {
			if r.N == 1 {
				return sinktest.Response{Status: 503, Delay: 700 * time.Millisecond} // longer than the first progress ack (at most ack_wait/2)
			}
			return sinktest.Response{Status: 200}
		})
		cfg := testConfig(t, `
destinations:
  d:
    url: %s
    timeout: 5s
    circuit_breaker: {enabled: false}
routes:
  - {name: r, subjects: ["events.>"], destination: d, ack_wait: 1s, backoff: [50ms]}
`, sink.URL())
		srv := natstest.Start(t)
		acks := make(chan *nats.Msg, 64)
		nc, _ := natstest.Connect(t, srv.URL())
		if _, err := nc.ChanSubscribe("$JS.ACK.EVENTS.r.>", acks); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		h := startBridgeOn(t, srv, cfg, f)
		h.publish("events.info.x", "e1", []byte(`{}`), nil)
		if out := h.waitOutcomes(1, settleWait, outcomeIs(OutcomeDelivered)); len(out) != 1 {
			return fmt.Errorf("not delivered: %+v", h.outcomes())
		}
		// Every ack of delivery 1 in order, up to a bound after its nak.
		var kinds []string
		deadline := time.After(600 * time.Millisecond) // longer than one progress interval after the nak
		for done := false; !done; {
			select {
			case m := <-acks:
				if tok := strings.Split(m.Subject, "."); len(tok) > 5 && tok[4] == "1" && tok[5] == "1" { // delivery 1 of stream seq 1
					kinds = append(kinds, strings.Fields(string(m.Data))[0])
				}
			case <-deadline:
				done = true
			}
		}
		nak := slices.Index(kinds, "-NAK")
		switch {
		case nak < 0:
			return fmt.Errorf("delivery 1 was never nak'ed: %v", kinds)
		case !slices.Contains(kinds[:nak], "+WPI"):
			return fmt.Errorf("no progress ack during the attempt: %v (the test did not exercise them)", kinds)
		case slices.Contains(kinds[nak:], "+WPI"):
			return fmt.Errorf("a progress ack followed the nak: %v", kinds)
		}
		return nil
	}
	if err := check(t, faults{}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "progress ack after the settlement", func(t testing.TB) error {
		return check(t, faults{progressAfterSettle: true})
	})
}

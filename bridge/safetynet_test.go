package bridge

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
	"github.com/sotercare/jetbridge/producer"
)

const maxDeliverRoute = `
destinations:
  d:
    url: %s
routes:
  - name: r
    subjects: ["events.>"]
    destination: d
    max_deliver: %d
    ack_wait: 1s
`

// The bridge dies during the final allowed delivery (the destination hangs);
// after ack_wait the restarted bridge receives the extra delivery the
// server keeps (MaxDeliver = max_deliver + 1) and dead-letters it, once.
func TestKilledDuringFinalDeliveryThenRestarted(t *testing.T) {
	sink := sinktest.New(t, func(sinktest.Request) sinktest.Response { return sinktest.Response{Hang: true} })
	yaml := fmt.Sprintf(maxDeliverRoute, sink.URL(), 1)
	srv := natstest.Start(t)
	killChildWhileSending(t, srv, sink, yaml)

	h := startBridgeOn(t, srv, testConfig(t, "%s", yaml), faults{})
	out := h.waitOutcomes(1, settleWait, outcomeIs(OutcomeDeadLettered))
	h.quiet("r")
	if len(out) != 1 || out[0].Reason != deadletter.ReasonMaxDeliveries || out[0].Delivered != 2 {
		t.Fatalf("outcomes %+v, want one dead letter max-deliveries on delivery 2", h.outcomes())
	}
	if n := sink.Count(); n != 1 {
		t.Fatalf("destination received %d requests, want only the hung one", n)
	}
	if dl := h.deadLetters(); len(dl) != 1 || dl[0].Header.Get(deadletter.HeaderReason) != string(deadletter.ReasonMaxDeliveries) {
		t.Fatalf("%d dead letters, want exactly 1 with reason max-deliveries", len(dl))
	}
}

// A message's deliveries all went unsettled while no bridge was there to
// settle them: JetStream gives up on it (on the next pull it announces a
// MAX_DELIVERIES advisory instead of a delivery). The advisory stream keeps
// the advisory and the bridge dead-letters the message, once.
func TestMaxDeliveriesAdvisoryWhileNoBridgeRuns(t *testing.T) {
	check := func(t testing.TB, f faults) error {
		sink := sinktest.New(t, sinktest.Always(200))
		cfg := testConfig(t, maxDeliverRoute, sink.URL(), 2)
		srv := natstest.Start(t)
		_, js := natstest.Connect(t, srv.URL())
		ctx := context.Background()
		pre := provisioned(t, cfg, js, f)
		if _, err := js.Publish(ctx, "events.info.x", []byte(`{"n":1}`), jetstream.WithMsgID("e1")); err != nil {
			t.Fatal(err)
		}
		// Three deliveries (max_deliver + 1) that nobody settles, as if the
		// bridges receiving them had died.
		leaveUnsettled(t, pre.routes[0].consumer(), 3)
		adv, err := js.Stream(ctx, advisoryStreamName(cfg.DeadLetter))
		if err != nil {
			t.Fatal(err)
		}
		h := startBridgeOn(t, srv, cfg, f)
		h.waitOutcomes(1, 5*time.Second, outcomeIs(OutcomeDeadLettered))
		dl := h.deadLetters()
		if len(dl) != 1 {
			return fmt.Errorf("%d dead letters, want exactly 1", len(dl))
		}
		if got := dl[0].Header.Get(deadletter.HeaderReason); got != string(deadletter.ReasonMaxDeliveries) {
			return fmt.Errorf("reason %q, want max-deliveries", got)
		}
		if got := dl[0].Header.Get(deadletter.HeaderDeliveries); got != "3" {
			return fmt.Errorf("Bridge-Deliveries %q, want 3", got)
		}
		if string(dl[0].Data) != `{"n":1}` || dl[0].Header.Get(producer.HeaderEventID) != "e1" {
			return fmt.Errorf("dead letter payload or Event-Id wrong")
		}
		if n := sink.Count(); n != 0 {
			return fmt.Errorf("destination received %d requests, want 0", n)
		}
		natstest.Eventually(t, 5*time.Second, func() error {
			info, err := adv.Info(ctx)
			if err != nil || info.State.Msgs != 0 {
				return fmt.Errorf("advisory still stored after processing")
			}
			return nil
		})
		return nil
	}
	if err := check(t, faults{}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "advisories ignored", func(t testing.TB) error { return check(t, faults{ignoreAdvisories: true}) })
}

// Failed advisory fetches in a row are paused between, 100 ms doubling
// (fetchRetry), and logged at most once per fetchLogEvery: here, once.
func TestAdvisoryFetchFailuresPausedAndLoggedOnce(t *testing.T) {
	sink := sinktest.New(t, sinktest.Always(200))
	fetches := &failingFetches{}
	h := startTweaked(t, natstest.Start(t), testConfig(t, maxDeliverRoute, sink.URL(), 2), func(b *Bridge) {
		wrapAdvisoryConsumer(b, func(c jetstream.Consumer) jetstream.Consumer { fetches.Consumer = c; return fetches })
	})
	if !waitUntil(10*time.Second, func() bool { return len(fetches.calls()) >= 5 }) {
		t.Fatalf("%d advisory fetches, want 5", len(fetches.calls()))
	}
	at := fetches.calls()
	for i, want := range []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond} {
		if gap := at[i+1].Sub(at[i]); gap < want {
			t.Errorf("pause after failed fetch %d: %s, want at least %s", i+1, gap, want)
		}
	}
	lines := logLines(h.logs.String(), `"advisory fetch failed"`)
	first := logLines(h.logs.String(), `"advisory fetch failed"`, `"failures":1,`, `"suppressed":0,`, errFetchRefused.Error())
	if lines != 1 || first != 1 {
		t.Errorf("%d lines about failed fetches (%d of them the first failure's), want exactly 1:\n%s", lines, first, h.logs.String())
	}
}

package bridge

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
)

// With Options.NoDelivery, Run provisions and watches readiness but pulls
// nothing: three events stay pending for readiness rounds that began
// after a full round had passed since the publish, /status shows the
// route not delivering, Readiness is ErrNoDelivery and the destination
// gets nothing. Control: the same bridge without NoDelivery delivers the
// three, is ready and shows the route delivering.
func TestNoDeliveryPullsNothing(t *testing.T) {
	for _, noDelivery := range []bool{true, false} {
		t.Run(fmt.Sprintf("NoDelivery=%t", noDelivery), func(t *testing.T) {
			sink := sinktest.New(t, sinktest.Always(200))
			h := startHarness(t, natstest.Start(t), testConfig(t, maxDeliverRoute, sink.URL(), 5), faults{},
				func(b *Bridge) { b.opts.NoDelivery = noDelivery })
			published := time.Now()
			for i := range 3 {
				h.publish("events.x", fmt.Sprintf("e%d", i), []byte(`{}`), nil)
			}
			if !noDelivery {
				h.waitOutcomes(3, 15*time.Second, outcomeIs(OutcomeDelivered))
			}
			var st routeStatus
			if !waitUntil(15*time.Second, func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				st = h.b.routeStatuses(ctx)[0]
				return st.CheckedAt != nil && st.CheckedAt.After(published.Add(readinessEvery)) && st.AckPending == 0
			}) {
				t.Fatalf("no readiness round after %s: %+v", published.Add(readinessEvery), st)
			}
			err := h.b.Readiness()
			if noDelivery {
				if st.Pending != 3 || st.InFlight != 0 || st.Delivering || sink.Count() != 0 || !errors.Is(err, ErrNoDelivery) {
					t.Fatalf("NoDelivery: route %+v, %d requests, readiness %v; want 3 pending, not delivering, 0 requests, ErrNoDelivery",
						st, sink.Count(), err)
				}
				return
			}
			if st.Pending != 0 || !st.Delivering || sink.Count() != 3 || err != nil {
				t.Fatalf("control: route %+v, %d requests, readiness %v; want 0 pending, delivering, 3 requests, ready", st, sink.Count(), err)
			}
		})
	}
}

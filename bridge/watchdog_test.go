package bridge

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
)

// A replica starting with another configuration for a shared consumer says
// so loudly (replicas have no config owner: they would flip it back and
// forth).
func TestReplicaWithDifferentConsumerConfigIsReported(t *testing.T) {
	sink := sinktest.New(t, sinktest.Always(200))
	srv := natstest.Start(t)
	h1 := startBridgeOn(t, srv, testConfig(t, maxDeliverRoute, sink.URL(), 5), faults{})
	if strings.Count(h1.logs.String(), "consumer configuration differs") != 0 {
		t.Fatal("the first replica reported a difference")
	}
	same := startBridgeOn(t, srv, testConfig(t, maxDeliverRoute, sink.URL(), 5), faults{})
	if strings.Count(same.logs.String(), "consumer configuration differs") != 0 {
		t.Fatal("a replica with the same config reported a difference")
	}
	other := startBridgeOn(t, srv, testConfig(t, maxDeliverRoute, sink.URL(), 7), faults{})
	logs := other.logs.String()
	if !strings.Contains(logs, "consumer configuration differs") || !strings.Contains(logs, "max_deliver(+1) 6 != 8") {
		t.Fatalf("the replica with max_deliver 7 did not report the difference:\n%s", logs)
	}
}

// A consumer deleted by hand is not silently recreated (that would
// redeliver the whole stream); the bridge reports it as not ready.
func TestDeletedConsumerMakesTheBridgeNotReady(t *testing.T) {
	sink := sinktest.New(t, sinktest.Always(200))
	h := startBridge(t, testConfig(t, maxDeliverRoute, sink.URL(), 5), faults{})
	if err := h.b.Readiness(); err != nil {
		t.Fatalf("not ready at start: %v", err)
	}
	if err := h.js.DeleteConsumer(context.Background(), h.cfg.Stream.Name, "r"); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 15*time.Second, func() error {
		err := h.b.Readiness()
		switch {
		case err == nil:
			return errors.New("still ready")
		case !strings.Contains(err.Error(), "consumer deleted"):
			return err
		}
		return nil
	})
	if _, err := h.js.Consumer(context.Background(), h.cfg.Stream.Name, "r"); err == nil {
		t.Fatal("the bridge recreated the deleted consumer")
	}
}

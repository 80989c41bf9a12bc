package bridge

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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

// /healthz fails once the bridge's NATS connection is closed for good:
// nothing will be delivered again, and only a restart helps.
func TestHealthzFailsWhenConnectionClosed(t *testing.T) {
	check := func(t testing.TB, healthy func(*Bridge) func() error) error {
		sink := sinktest.New(t, sinktest.Always(200))
		h := startBridge(t, testConfig(t, maxDeliverRoute, sink.URL(), 5), faults{})
		admin := httptest.NewServer(h.b.adminHandler(nil, healthy(h.b), h.b.Readiness))
		defer admin.Close()
		if code, body := get(t, admin.URL+"/healthz"); code != 200 {
			return fmt.Errorf("/healthz at start = %d %s", code, body)
		}
		h.nc.Close() // as nats.go does when it gives up
		code, body := get(t, admin.URL+"/healthz")
		if code != 503 || !strings.Contains(body, "closed for good") {
			return fmt.Errorf("/healthz with the connection closed = %d %s, want 503 saying so", code, body)
		}
		if code, _ := get(t, admin.URL+"/readyz"); code != 503 {
			return fmt.Errorf("/readyz with the connection closed = %d, want 503", code)
		}
		return nil
	}
	if err := check(t, func(b *Bridge) func() error { return b.Healthy }); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "healthz ignores a closed connection", func(t testing.TB) error {
		return check(t, func(*Bridge) func() error { return func() error { return nil } })
	})
}

// Readiness follows the streams: a deleted source stream, a deleted or
// sealed dead-letter stream make the bridge not ready, naming the stream;
// a source stream created again gets its consumer back and the bridge
// delivers from it.
func TestReadinessFollowsStreams(t *testing.T) {
	notReady := func(ready func() error, want string) error {
		var last error
		if !waitUntil(15*time.Second, func() bool {
			last = ready()
			return last != nil && strings.Contains(last.Error(), want)
		}) {
			return fmt.Errorf("readiness = %v, want an error naming %q", last, want)
		}
		return nil
	}
	isReady := func(ready func() error) error {
		var last error
		if !waitUntil(15*time.Second, func() bool { last = ready(); return last == nil }) {
			return fmt.Errorf("not ready again: %v", last)
		}
		return nil
	}
	check := func(t testing.TB, ready func(*Bridge) func() error) error {
		sink := sinktest.New(t, sinktest.Always(200))
		h := startBridge(t, testConfig(t, maxDeliverRoute, sink.URL(), 5), faults{})
		r := ready(h.b)
		ctx := context.Background()
		if err := isReady(r); err != nil {
			return err
		}
		stream, err := h.js.Stream(ctx, h.cfg.Stream.Name)
		if err != nil {
			t.Fatal(err)
		}
		sc := stream.CachedInfo().Config
		if err := h.js.DeleteStream(ctx, h.cfg.Stream.Name); err != nil {
			t.Fatal(err)
		}
		if err := notReady(r, "stream "+h.cfg.Stream.Name+" does not exist"); err != nil {
			return err
		}
		if _, err := h.js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
		if err := isReady(r); err != nil {
			return err
		}
		h.publish("events.info.x", "after-recreate", []byte(`{}`), nil)
		if out := h.waitOutcomes(1, settleWait, outcomeIs(OutcomeDelivered)); len(out) != 1 {
			return fmt.Errorf("nothing delivered from the recreated stream")
		}

		dl, err := h.js.Stream(ctx, h.cfg.DeadLetter.Stream)
		if err != nil {
			t.Fatal(err)
		}
		dlc := dl.CachedInfo().Config
		dlc.Sealed = true
		if _, err := h.js.UpdateStream(ctx, dlc); err != nil {
			t.Fatal(err)
		}
		if err := notReady(r, "dead-letter stream "+h.cfg.DeadLetter.Stream+" is sealed"); err != nil {
			return err
		}
		// Full, discarding new messages: an operator's limit reached.
		dlc.Sealed = false
		if err := h.js.DeleteStream(ctx, h.cfg.DeadLetter.Stream); err != nil {
			t.Fatal(err)
		}
		fullCfg := dlc
		fullCfg.MaxMsgs, fullCfg.Discard = 1, jetstream.DiscardNew
		if _, err := h.js.CreateStream(ctx, fullCfg); err != nil {
			t.Fatal(err)
		}
		if err := isReady(r); err != nil {
			return err
		}
		if _, err := h.pub.Publish(ctx, h.cfg.DeadLetter.SubjectPrefix+".r.events.info.x", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		if err := notReady(r, "dead-letter stream "+h.cfg.DeadLetter.Stream+" is full"); err != nil {
			return err
		}
		if err := h.js.DeleteStream(ctx, h.cfg.DeadLetter.Stream); err != nil {
			t.Fatal(err)
		}
		return notReady(r, "dead-letter stream "+h.cfg.DeadLetter.Stream+" does not exist")
	}
	if err := check(t, func(b *Bridge) func() error { return b.Readiness }); err != nil {
		t.Fatal(err)
	}
	// Readiness as it was: connection and deleted consumers only.
	expectBroken(t, "readiness ignores the streams", func(t testing.TB) error {
		return check(t, func(b *Bridge) func() error {
			return func() error {
				if err := b.Readiness(); err != nil && !strings.Contains(err.Error(), "stream") {
					return err
				}
				return nil
			}
		})
	})
}

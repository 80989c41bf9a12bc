package bridge

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/natstest"
)

// unansweredFirstAck is a real JetStream message whose first DoubleAck gets
// no answer (as during a stream leader change): nothing is sent, and the
// caller sees a timeout.
type unansweredFirstAck struct {
	jetstream.Msg
	calls atomic.Int32
}

func (m *unansweredFirstAck) DoubleAck(ctx context.Context) error {
	if m.calls.Add(1) == 1 {
		return nats.ErrTimeout
	}
	return m.Msg.DoubleAck(ctx)
}

// An ack whose first confirmation never comes is tried again, so the
// message is acked on the server (no redelivery after ack_wait). The
// single-try ack of the negative control leaves it pending.
func TestAckIsRetriedWhenUnconfirmed(t *testing.T) {
	check := func(t testing.TB, ack func(context.Context, jetstream.Msg, bool) error) error {
		srv := natstest.Start(t)
		_, js := natstest.Connect(t, srv.URL())
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}})
		if err != nil {
			t.Fatal(err)
		}
		c, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "r", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, "events.info.x", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		m, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if err := ack(ctx, &unansweredFirstAck{Msg: m}, true); err != nil {
			return fmt.Errorf("ack: %v", err)
		}
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending != 0 || info.AckFloor.Stream != 1 {
			return fmt.Errorf("ack pending %d, ack floor %d; want 0 and 1", info.NumAckPending, info.AckFloor.Stream)
		}
		return nil
	}
	if err := check(t, ackMsg); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "ack tried once", func(t testing.TB) error {
		return check(t, func(ctx context.Context, m jetstream.Msg, _ bool) error { return m.DoubleAck(ctx) })
	})
}

package bridge

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
)

// The completer's negative controls are injected through the route's ack
// configuration (ackConfig), which a bridge has anyway, like the pull
// loop's (core_faults_test.go), and through the messages the bridge is
// given: lostFirstAck's first reply subject leads nowhere.

// ackRoute redelivers only after a minute: an ack left unconfirmed stays
// pending for the whole test.
const ackRoute = `
destinations:
  d:
    url: %s
    circuit_breaker: {enabled: false}
routes:
  - {name: r, subjects: ["events.>"], destination: d, ack_wait: 1m}
`

// lostFirstAck is a real JetStream message whose first ack goes to to
// instead of JetStream: it is never confirmed (to has a subscriber that
// never answers), or refused at once (to has none: no responders).
type lostFirstAck struct {
	jetstream.Msg
	to    string
	calls *atomic.Int32
}

func (m lostFirstAck) Reply() string {
	if m.calls.Add(1) == 1 {
		return m.to
	}
	return m.Msg.Reply()
}

// An ack that JetStream does not confirm (no answer within ackTimeout, or
// refused) is sent again by the route's completer, so the message is acked
// on the server and settled once, while its worker went on; a completer
// that sends each ack once (the negative control) leaves it pending, with
// the "settlement not confirmed" warning.
func TestUnconfirmedAckIsSentAgain(t *testing.T) {
	check := func(t testing.TB, answered bool, once bool) error {
		sink := sinktest.New(t, sinktest.Always(200))
		cfg := testConfig(t, ackRoute, sink.URL())
		srv := natstest.Start(t)
		nc, _ := natstest.Connect(t, srv.URL())
		to := "lost.ack"
		if !answered {
			to = "nobody.listens"
		} else {
			sub, err := nc.SubscribeSync(to) // takes the ack, never answers
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		calls := new(atomic.Int32)
		h := startHarness(t, srv, cfg, faults{}, func(b *Bridge) {
			b.js = faultyJS{JetStream: b.js, msg: func(m jetstream.Msg) jetstream.Msg { return lostFirstAck{Msg: m, to: to, calls: calls} }}
			if once {
				for _, r := range b.routes {
					r.acks.cfg.tries = 1
				}
			}
		})
		h.publish("events.info.x", "e1", []byte(`{}`), nil)
		out := h.waitOutcomes(1, settleWait, nil)
		if len(out) != 1 || out[0].Outcome != OutcomeDelivered {
			return fmt.Errorf("outcomes %+v, want one delivered", h.outcomes())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		info, err := h.js.Consumer(ctx, cfg.Stream.Name, "r")
		if err != nil {
			t.Fatal(err)
		}
		ci, err := info.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ci.NumAckPending != 0 || ci.AckFloor.Stream != 1 {
			return fmt.Errorf("ack pending %d, ack floor %d; want 0 and 1", ci.NumAckPending, ci.AckFloor.Stream)
		}
		if n := calls.Load(); n != 2 {
			return fmt.Errorf("ack sent %d times, want 2", n)
		}
		if n := sink.Count(); n != 1 {
			return fmt.Errorf("destination received %d requests, want 1", n)
		}
		if strings.Contains(h.logs.String(), "settlement not confirmed") {
			return fmt.Errorf("confirmed settlement logged as not confirmed")
		}
		return nil
	}
	for _, answered := range []bool{true, false} {
		name := "no answer"
		if !answered {
			name = "no responders"
		}
		t.Run(name, func(t *testing.T) {
			if err := check(t, answered, false); err != nil {
				t.Fatal(err)
			}
			expectBroken(t, "each ack sent once", func(t testing.TB) error { return check(t, answered, true) })
		})
	}
}

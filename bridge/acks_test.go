package bridge

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

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

// slowBucket is the idempotency bucket seen through a proxy: its name
// leads the records the bridge publishes to the test's subscriber, which
// stores each in the real bucket, and answers the bridge, only after
// delay. A record's answer never comes before it is stored.
type slowBucket struct {
	jetstream.KeyValue
	name string
}

func (kv slowBucket) Bucket() string { return kv.name }

// proxyRecords stores what is published to the proxy bucket's subjects in
// the real bucket after delay, and answers the bridge with the real
// answer.
func proxyRecords(t testing.TB, nc *nats.Conn, proxy, real string, delay time.Duration, edit func(*nats.Msg)) {
	t.Helper()
	sub, err := nc.Subscribe("$KV."+proxy+".>", func(m *nats.Msg) {
		time.AfterFunc(delay, func() {
			fwd := &nats.Msg{Subject: "$KV." + real + strings.TrimPrefix(m.Subject, "$KV."+proxy), Header: m.Header, Data: m.Data}
			if edit != nil {
				edit(fwd)
			}
			resp, err := nc.RequestMsg(fwd, 5*time.Second)
			if err != nil {
				return // the bridge sees no answer
			}
			_ = m.Respond(resp.Data)
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// With idempotency, the ack of a 2xx goes out only once the reservation's
// done record is stored, though the worker waits for neither: when the
// bridge reads where to send the ack, the record already reads as done.
// The record's answer is held back (proxyRecords) longer than the
// completer's sweep: a completer that acks without waiting for it (the
// negative control: recordWait 0) sends the ack while the reservation is
// still in flight.
func TestDoneRecordIsStoredBeforeTheAck(t *testing.T) {
	check := func(t testing.TB, noWait bool) error {
		sink := sinktest.New(t, sinktest.Always(200))
		cfg := testConfig(t, "idempotency: {bucket: DELIVERED}\n"+strings.Replace(ackRoute, "ack_wait: 1m}", "ack_wait: 1m, idempotency: true}", 1), sink.URL())
		srv := natstest.Start(t)
		nc, js := natstest.Connect(t, srv.URL())
		proxyRecords(t, nc, "SLOW", "DELIVERED", time.Second, nil)
		var states []string
		var mu sync.Mutex
		f := faults{beforeAck: func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			state := "unreadable"
			if kv, err := js.KeyValue(ctx, "DELIVERED"); err == nil {
				if e, err := kv.Get(ctx, reservationKey("r", "e1")); err == nil {
					if h, err := parseHolder(e.Value()); err == nil {
						state = h.state
					}
				}
			}
			mu.Lock()
			states = append(states, state)
			mu.Unlock()
		}}
		h := startHarness(t, srv, cfg, faults{}, func(b *Bridge) {
			b.js = faultyJS{JetStream: b.js, msg: func(m jetstream.Msg) jetstream.Msg { return faultyMsg{Msg: m, f: msgFaults{beforeAck: f.beforeAck}} },
				kv: func(kv jetstream.KeyValue) jetstream.KeyValue { return slowBucket{KeyValue: kv, name: "SLOW"} }}
			if noWait {
				for _, r := range b.routes {
					r.acks.cfg.recordWait = 0
				}
			}
		})
		h.publish("events.info.x", "e1", []byte(`{}`), nil)
		if out := h.waitOutcomes(1, settleWait, nil); len(out) != 1 || out[0].Outcome != OutcomeDelivered {
			return fmt.Errorf("outcomes %+v, want one delivered", h.outcomes())
		}
		mu.Lock()
		defer mu.Unlock()
		if len(states) == 0 || states[0] != stateDone {
			return fmt.Errorf("reservation states when the ack was sent: %v, want %s first", states, stateDone)
		}
		return nil
	}
	if err := check(t, false); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "ack sent without waiting for the done record", func(t testing.TB) error { return check(t, true) })
}

// A done record that JetStream refuses (the reservation changed since the
// lease's revision) is what a failed done was on the worker: counted, the
// "not recorded as done" warning, and the message acked all the same.
func TestRefusedDoneRecordIsAckedAllTheSame(t *testing.T) {
	sink := sinktest.New(t, sinktest.Always(200))
	cfg := testConfig(t, "idempotency: {bucket: DELIVERED}\n"+strings.Replace(ackRoute, "ack_wait: 1m}", "ack_wait: 1m, idempotency: true}", 1), sink.URL())
	srv := natstest.Start(t)
	nc, _ := natstest.Connect(t, srv.URL())
	proxyRecords(t, nc, "SLOW", "DELIVERED", 0, func(m *nats.Msg) {
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "999999") // not the key's last revision
	})
	h := startHarness(t, srv, cfg, faults{}, func(b *Bridge) {
		b.js = faultyJS{JetStream: b.js, kv: func(kv jetstream.KeyValue) jetstream.KeyValue { return slowBucket{KeyValue: kv, name: "SLOW"} }}
	})
	h.publish("events.info.x", "e1", []byte(`{}`), nil)
	if out := h.waitOutcomes(1, settleWait, nil); len(out) != 1 || out[0].Outcome != OutcomeDelivered {
		t.Fatalf("outcomes %+v, want one delivered", h.outcomes())
	}
	h.quiet("r") // acked
	if v := testutil.ToFloat64(h.b.m.idempotencyErrors.WithLabelValues("r")); v != 1 {
		t.Fatalf("bridge_idempotency_errors_total %v, want 1", v)
	}
	if !strings.Contains(h.logs.String(), "delivered, but not recorded as done") {
		t.Fatal("no warning for the refused done record")
	}
}

// Run returns only after every settlement by ack has been reported: a
// report still running on the completer when the sweep finds nothing
// pending would otherwise reach OnSettle (and end the delivery's span)
// after Run returned, when cmd/bridge has already shut its tracer down.
// OnSettle is held until the test lets it go; Run, cancelled meanwhile,
// must still be running. (Before the fix, the place stopped counting as
// pending before its report, and Run returned within a few milliseconds
// here: checked against that build, not kept as a switch.)
func TestRunReturnsAfterEveryAckIsReported(t *testing.T) {
	sink := sinktest.New(t, sinktest.Always(200))
	cfg := testConfig(t, ackRoute, sink.URL())
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL())
	_, pub := natstest.Connect(t, srv.URL())
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b, err := New(cfg, js, Options{OnSettle: func(Settled) {
		once.Do(func() { close(entered) })
		<-release
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	<-b.Ready()
	if _, err := pub.Publish(ctx, "events.info.x", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(settleWait):
		t.Fatal("no settlement reported")
	}
	cancel()
	select {
	case err := <-done:
		close(release)
		t.Fatalf("Run returned (%v) while a settlement was still being reported", err)
	case <-time.After(500 * time.Millisecond):
	}
	close(release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return once the report ended")
	}
}

package bridge

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/natstest"
)

// Many partitions gained at once (docs/delivery.md#ordered-delivery), the
// stall it caused before fences could pull on extra places, made
// deterministic. The straggler
// once seen after a SIGTERM hand-over between two replicas matches it (and
// so did the stalls of a two-process hunt, with each partition's consumer
// at 65 acknowledgements pending: 64 held, 1 never redelivered): the
// stopping replica's open pulls are cancelled, a message the server sent
// to one as it was cancelled is lost until ack_wait, and the replica that
// gains the partitions fences them until that message is back. The test's
// previous owner of both partitions is a test-side client: it takes one
// message of each partition and settles neither, then unpins both. The
// bridge gains both at once with a backlog; each fence waits for that
// message (due ack_wait after it was delivered), and meanwhile the two
// fenced partitions pull new messages until they hold all of the route's B
// places (B = 64 here; a fenced partition holds up to two batches, 2 ×
// 16). Without extra places the message, once due, was never pulled:
// nothing was delivered again, for good (the held messages get progress
// acks, the pins are kept alive). Now the fences pull it on extra places
// (overdraw) and every event is delivered, in order.
//
// Negative control: the previous owner keeps
// its two messages with progress acks, so they never come back; the same
// check must then find events undelivered.
func TestOrderedFencesGainedAtOnce(t *testing.T) {
	if err := fencesGainedAtOnce(t, false); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "the previous owner keeps its messages", func(t testing.TB) error { return fencesGainedAtOnce(t, true) })
}

// fencesGainedAtOnce runs the scenario of TestOrderedFencesGainedAtOnce;
// keep: the previous owner keeps its messages with progress acks.
func fencesGainedAtOnce(t testing.TB, keep bool) error {
	const keys, perKey = 20, 10
	srv := natstest.Start(t)
	s := newOrderSink(t, func(string, int) int { return 0 })
	y := strings.Replace(orderedYAML(s.sink.URL(), true, ", max_in_flight: 8"), "partitions: 8}", "partitions: 2}", 1)
	cfg := testConfig(t, "%s", y)
	_, js := natstest.Connect(t, srv.URL())
	provisioned(t, cfg, js, faults{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	publish := func(k, i int) {
		id := "k" + strconv.Itoa(k) + "-" + strconv.Itoa(i)
		msg := &nats.Msg{Subject: "events.info.ord.k" + strconv.Itoa(k), Data: []byte(`{}`), Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, id)
		msg.Header.Set("Event-Id", id)
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	for k := range keys {
		publish(k, 0)
	}
	// Given the previous owner: pinned to both partitions, one message of
	// each delivered to it and never settled
	stream, err := js.Stream(ctx, config.CopyStream(cfg.Stream.Name, "r"))
	if err != nil {
		t.Fatal(err)
	}
	var held []jetstream.Msg
	for p := range 2 {
		c, err := stream.Consumer(ctx, partitionConsumerName("r", p))
		if err != nil {
			t.Fatal(err)
		}
		if !waitUntil(5*time.Second, func() bool {
			in, err := c.Info(ctx)
			return err == nil && in.NumPending > 0
		}) {
			t.Fatalf("partition %d: nothing copied", p)
		}
		b, err := c.Fetch(1, jetstream.FetchMaxWait(2*time.Second), jetstream.FetchPriorityGroup(orderingGroup))
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			held = append(held, m)
		}
		if len(held) != p+1 {
			t.Fatalf("partition %d: the previous owner got no message (%v)", p, b.Error())
		}
	}
	if keep {
		go func() {
			tick := time.NewTicker(500 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				for _, m := range held {
					_ = m.InProgress()
				}
			}
		}()
	}
	// and a backlog of more than two batches per partition
	for i := 1; i < perKey; i++ {
		for k := range keys {
			publish(k, i)
		}
	}
	h := startHarness(t, srv, cfg, faults{}, nil)
	// When the previous owner releases both partitions at once
	for p := range 2 {
		if err := stream.UnpinConsumer(ctx, partitionConsumerName("r", p), orderingGroup); err != nil {
			t.Fatal(err)
		}
	}
	// Then every event is delivered within ack_wait (the previous owner's
	// messages come back) and a margin, in order.
	wait := cfg.Routes[0].AckWait.D() + 4*time.Second
	if !waitUntil(wait, func() bool { return s.delivered() == keys*perKey }) {
		return fmt.Errorf("%d of %d events delivered after %s; %s", s.delivered(), keys*perKey, wait, fenceReport(h))
	}
	if inv := s.inversions(); inv != 0 {
		return fmt.Errorf("%d inversions", inv)
	}
	return nil
}

// A replica that stops gracefully while it holds keys waiting for a
// backoff, with a backlog in the copy: the same stall, without any
// message lost on its way. The owner of both partitions holds a full
// buffer (B = 64: every key's first event waits for a 10 s backoff, its
// later events behind it) while the backlog builds up, then stops: it
// hands its 64 messages back (due after interruptedDelay) and unpins. The
// other replica gains both partitions at once; its first pulls bring new
// messages of the backlog, and its two fences hold every place before
// they have all of the previous owner's 64; without extra places nothing
// was delivered again. Negative control: the destination keeps
// answering 503, so the same check must find events undelivered.
func TestOrderedStopHoldingKeys(t *testing.T) {
	if err := stopHoldingKeys(t, false); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "the destination keeps failing", func(t testing.TB) error { return stopHoldingKeys(t, true) })
}

// stopHoldingKeys runs the scenario of TestOrderedStopHoldingKeys; failing:
// the destination answers 503 to every try.
func stopHoldingKeys(t testing.TB, failing bool) error {
	const keys, perKey = 10, 20
	srv := natstest.Start(t)
	s := newOrderSink(t, func(id string, attempt int) int {
		if _, i := splitID(id); failing || i == 0 && attempt == 1 {
			return 503 // every key's first event, first try: held 10 s
		}
		return 0
	})
	y := strings.Replace(orderedYAML(s.sink.URL(), true, ", max_in_flight: 8"), "partitions: 8}", "partitions: 2}", 1)
	y = strings.Replace(y, "backoff: [50ms]", "backoff: [10s]", 1)
	cfg := testConfig(t, "%s", y)
	// Given the owner of both partitions holding a full buffer
	a := startHarness(t, srv, cfg, faults{}, nil)
	publishKeys(a, keys, perKey)
	ord := a.b.routes[0].ord
	if !waitUntil(10*time.Second, func() bool {
		st := ord.status()
		return len(st.Owned) == 2 && st.Held == ord.cfg.buffer
	}) {
		t.Fatalf("the first replica: %+v, want both partitions owned and %d held", ord.status(), ord.cfg.buffer)
	}
	// When it stops while another replica runs
	b := startHarness(t, srv, cfg, faults{}, nil)
	a.stop()
	// Then the other delivers every event within ack_wait and a margin,
	// in order
	wait := cfg.Routes[0].AckWait.D() + 4*time.Second
	if !waitUntil(wait, func() bool { return s.delivered() == keys*perKey }) {
		return fmt.Errorf("%d of %d events delivered %s after the owner stopped; %s", s.delivered(), keys*perKey, wait, fenceReport(b))
	}
	if inv := s.inversions(); inv != 0 {
		return fmt.Errorf("%d inversions", inv)
	}
	return nil
}

// fenceReport tells, for a failure, what h's ordered route holds: per
// partition, whether it is owned and fenced, the messages it holds while
// fenced, and its consumer's acknowledgements pending (what a fence waits
// for), and the route's places in use.
func fenceReport(h *harness) string {
	o := h.b.routes[0].ord
	out := fmt.Sprintf("places in use %d of %d", len(o.tokens), cap(o.tokens))
	for _, p := range o.parts {
		p.mu.Lock()
		owned, fenced, held := p.owned, p.fenced, len(p.pending)
		p.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		in, err := p.cons.Info(ctx)
		cancel()
		ack := -1
		if err == nil {
			ack = in.NumAckPending
		}
		out += fmt.Sprintf("; partition %d: owned %t, fenced %t holding %d, ack pending %d", p.n, owned, fenced, held, ack)
	}
	return out
}

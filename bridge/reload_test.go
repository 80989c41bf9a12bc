package bridge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
	"github.com/sotercare/jetbridge/webhook"
)

// reloadWait bounds the waits of the reload tests.
const reloadWait = 60 * time.Second

// eventIDs are the X-Event-Id of every request a sink received, in
// arrival order.
func eventIDs(s *sinktest.Sink) []string {
	var out []string
	for _, r := range s.Requests() {
		out = append(out, r.Header.Get(sinktest.EventIDHeader))
	}
	return out
}

// publishAll publishes every event of evs (subject, id) in order on js
// and reports the first failure.
func publishAll(js jetstream.JetStream, evs [][2]string) error {
	for _, ev := range evs {
		msg := &nats.Msg{Subject: ev[0], Data: []byte(`{}`), Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, ev[1])
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := js.PublishMsg(ctx, msg)
		cancel()
		if err != nil {
			return fmt.Errorf("publish %s: %w", ev[1], err)
		}
	}
	return nil
}

// drainConsumer fetches and acks every message the durable consumer
// still has (pending or handed back), and returns their Nats-Msg-Ids.
func drainConsumer(t testing.TB, js jetstream.JetStream, stream, name string, want int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	cons, err := js.Consumer(ctx, stream, name)
	cancel()
	if err != nil {
		t.Fatalf("consumer %s after the reload: %v (it must be kept)", name, err)
	}
	var ids []string
	natstest.Eventually(t, reloadWait, func() error {
		batch, err := cons.Fetch(want, jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			return err
		}
		for m := range batch.Messages() {
			ids = append(ids, m.Headers().Get(jetstream.MsgIDHeader))
			if err := m.Ack(); err != nil {
				return err
			}
		}
		if len(ids) < want {
			return fmt.Errorf("fetched %d of %d", len(ids), want)
		}
		return nil
	})
	return ids
}

// Reload during delivery: 2,000 events are published while a reload moves
// a destination's URL to a second receiver, raises max_in_flight, adds a
// route and removes another. Every event of the staying route arrives
// exactly once across both receivers; the removed route's deliveries are
// exactly those its receiver got (the rest is handed back or was never
// pulled, and its kept consumer still has every one of them); the new
// route delivers from its first message. The routes that are replaced
// (stay, whose URL moves) or retired (gone) have an ack_wait of 3 s: a
// message the server sends as their open pull is cancelled is dropped by
// nats.go and comes back after ack_wait
// (docs/configuration.md#what-a-reload-applies), which must fall within
// the waits below.
func TestReloadDuringDelivery(t *testing.T) {
	const stay, gone, added = 1000, 500, 500
	check := func(t testing.TB, rl reloader) error {
		// The first receiver is slow, so that attempts are in flight when
		// the reload comes.
		first := sinktest.New(t, func(sinktest.Request) sinktest.Response {
			return sinktest.Response{Delay: 50 * time.Millisecond}
		})
		second, old, fresh := sinktest.New(t, nil), sinktest.New(t, func(sinktest.Request) sinktest.Response {
			return sinktest.Response{Delay: 20 * time.Millisecond}
		}), sinktest.New(t, nil)
		const before = `
destinations:
  main: {url: %s, timeout: 10s}
  old: {url: %s, timeout: 10s}
routes:
  - name: stay
    subjects: ["events.*.stay.>"]
    destination: main
    max_in_flight: 4
    ack_wait: 3s
  - name: gone
    subjects: ["events.*.gone.>"]
    destination: old
    max_in_flight: 4
    ack_wait: 3s
`
		const after = `
destinations:
  main: {url: %s, timeout: 10s}
  fresh: {url: %s, timeout: 10s}
routes:
  - name: stay
    subjects: ["events.*.stay.>"]
    destination: main
    max_in_flight: 16
    ack_wait: 3s
  - name: added
    subjects: ["events.*.added.>"]
    destination: fresh
`
		srv := natstest.Start(t)
		h := startHarness(t, srv, testConfig(t, before, first.URL(), old.URL()), faults{}, withReloader(rl))
		next := testConfig(t, after, second.URL(), fresh.URL())

		var evs [][2]string
		for i := range stay + gone + added {
			switch {
			case i%4 < 2:
				evs = append(evs, [2]string{"events.info.stay.x", fmt.Sprintf("stay-%d", i)})
			case i%4 == 2:
				evs = append(evs, [2]string{"events.info.gone.x", fmt.Sprintf("gone-%d", i)})
			default:
				evs = append(evs, [2]string{"events.info.added.x", fmt.Sprintf("added-%d", i)})
			}
		}
		published := make(chan error, 1)
		go func() { published <- publishAll(h.pub, evs) }()

		first.WaitCount(t, 40, reloadWait)
		old.WaitCount(t, 20, reloadWait)
		if err := h.b.Reload(context.Background(), next); err != nil {
			return fmt.Errorf("reload: %w", err)
		}
		if err := <-published; err != nil {
			t.Fatal(err)
		}
		// The removed route settled everything it held before Reload
		// returned: its receiver's count is final, and so is what its
		// consumer handed out to it.
		goneDelivered := eventIDs(old)
		goneInfo, err := consumerInfo(h, "gone")
		if err != nil {
			t.Fatal(err)
		}

		natstest.Eventually(t, reloadWait, func() error {
			if n := len(first.Requests()) + len(second.Requests()); n < stay {
				return fmt.Errorf("%d requests for the staying route, want %d", n, stay)
			}
			if n := fresh.Count(); n < added {
				return fmt.Errorf("%d requests for the added route, want %d", n, added)
			}
			return nil
		})
		h.quiet("stay")
		h.quiet("added")

		// Exactly once across the two receivers.
		seen := map[string]int{}
		for _, id := range append(eventIDs(first), eventIDs(second)...) {
			seen[id]++
		}
		var dup []string
		for id, n := range seen {
			if n > 1 {
				dup = append(dup, fmt.Sprintf("%s x%d", id, n))
			}
		}
		if len(dup) > 0 || len(seen) != stay {
			slices.Sort(dup)
			return fmt.Errorf("staying route: %d distinct events of %d, duplicated across the receivers: %v", len(seen), stay, dup)
		}
		if second.Count() == 0 {
			return errors.New("the moved URL received nothing")
		}
		// The added route from its first message: each of its events once.
		ids := eventIDs(fresh)
		distinct := map[string]bool{}
		for _, id := range ids {
			distinct[id] = true
		}
		if len(ids) != added || len(distinct) != added || !distinct["added-3"] {
			return fmt.Errorf("added route: %d requests, %d distinct (want %d each), its first event added-3 delivered: %v", len(ids), len(distinct), added, distinct["added-3"])
		}
		// The removed route: what its receiver got, settled as delivered,
		// plus what its kept consumer still has, is each of its events
		// exactly once.
		var settledGone, handedBack int
		for _, s := range h.outcomes() {
			if s.Route != "gone" {
				continue
			}
			switch s.Outcome {
			case OutcomeDelivered:
				settledGone++
			case OutcomeRedeliveryScheduled:
				handedBack++
			}
		}
		if settledGone != len(goneDelivered) {
			return fmt.Errorf("removed route: %d requests, %d settled as delivered", len(goneDelivered), settledGone)
		}
		// Every message its consumer handed out was settled by the retired
		// route (delivered, or handed back), except one the server sent as
		// an open pull was cancelled by the retirement: nats.go drops it
		// (FetchContext stops listening), and JetStream redelivers it after
		// ack_wait, so it is among what the consumer still has (rest,
		// below, counted exactly). At most the route's open pulls' size
		// (max_in_flight 4).
		lost := int(goneInfo.Delivered.Consumer) - (settledGone + handedBack)
		if lost < 0 || lost > 4 {
			return fmt.Errorf("removed route: its consumer handed out %d messages, the route settled %d delivered + %d handed back", goneInfo.Delivered.Consumer, settledGone, handedBack)
		}
		if old.Count() != len(goneDelivered) {
			return fmt.Errorf("removed route: %d requests after its retirement, want %d", old.Count(), len(goneDelivered))
		}
		rest := drainConsumer(t, h.js, h.cfg.Stream.Name, "gone", gone-len(goneDelivered))
		all := map[string]int{}
		for _, id := range append(goneDelivered, rest...) {
			all[id]++
		}
		if len(all) != gone || len(goneDelivered)+len(rest) != gone {
			return fmt.Errorf("removed route: %d delivered + %d left in its consumer (%d handed back) = %d distinct of %d",
				len(goneDelivered), len(rest), handedBack, len(all), gone)
		}
		t.Logf("staying: %d at the first URL, %d at the second; removed: %d delivered, %d handed back, %d lost on their way at the retirement, %d left in its consumer",
			first.Count(), second.Count(), len(goneDelivered), handedBack, lost, len(rest))
		return nil
	}
	if err := check(t, liveReload{}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "retired routes' attempts cut off", func(t testing.TB) error {
		return check(t, brokenReload{cutInFlight: true})
	})
}

// consumerInfo is the current state of route's consumer.
func consumerInfo(h *harness, route string) (*jetstream.ConsumerInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := h.js.Consumer(ctx, h.cfg.Stream.Name, route)
	if err != nil {
		return nil, err
	}
	return c.Info(ctx)
}

// A change that needs a restart is refused whole: the error names the
// key, and neither the route added nor the URL changed in the same file
// takes effect.
func TestReloadRefusesRestartChangesWhole(t *testing.T) {
	check := func(t testing.TB, rl reloader) error {
		first, second := sinktest.New(t, nil), sinktest.New(t, nil)
		const yaml = `
stream:
  max_age: %s
destinations:
  d: {url: %s}
routes:
  - name: r
    subjects: ["events.*.r.>"]
    destination: d
%s`
		srv := natstest.Start(t)
		h := startHarness(t, srv, testConfig(t, yaml, "1h", first.URL(), ""), faults{}, withReloader(rl))
		next := testConfig(t, yaml, "2h", second.URL(), `  - name: extra
    subjects: ["events.*.extra.>"]
    destination: d
`)
		err := h.b.Reload(context.Background(), next)
		var nr *NeedsRestartError
		if !errors.As(err, &nr) || !errors.Is(err, ErrNeedsRestart) {
			return fmt.Errorf("reload: %v, want a *NeedsRestartError", err)
		}
		if !slices.Equal(nr.Keys, []string{"stream.max_age"}) {
			return fmt.Errorf("keys %v, want [stream.max_age]", nr.Keys)
		}
		h.publish("events.info.r.x", "e1", []byte(`{}`), nil)
		h.waitOutcomes(1, settleWait, outcomeIs(OutcomeDelivered))
		if first.Count() != 1 || second.Count() != 0 {
			return fmt.Errorf("requests: %d at the running URL, %d at the refused one; want 1 and 0", first.Count(), second.Count())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := h.js.Consumer(ctx, h.cfg.Stream.Name, "extra"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("the refused file's route has a consumer (lookup: %v)", err)
		}
		return nil
	}
	if err := check(t, liveReload{}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "restart keys ignored", func(t testing.TB) error {
		return check(t, brokenReload{ignoreRestart: true})
	})
}

// paused: true stops a route's pulling and keeps its consumer (/status
// shows it); resuming delivers what waited, once.
func TestReloadPausesAndResumes(t *testing.T) {
	sink := sinktest.New(t, nil)
	const yaml = `
destinations:
  d: {url: %s}
routes:
  - name: r
    subjects: ["events.>"]
    destination: d
    paused: %v
`
	h := startBridge(t, testConfig(t, yaml, sink.URL(), false), faults{})
	h.publish("events.info.x", "e0", []byte(`{}`), nil)
	sink.WaitCount(t, 1, settleWait)
	h.quiet("r")
	if err := h.b.Reload(context.Background(), testConfig(t, yaml, sink.URL(), true)); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 5; i++ {
		h.publish("events.info.x", fmt.Sprintf("e%d", i), []byte(`{}`), nil)
	}
	// Paused: the five wait in the consumer, and nothing is pulled (a
	// readiness round that started after the publishes sees them all).
	st := routeStatusNow(t, h)
	if len(st) != 1 || !st[0].Paused || st[0].Pending != 5 || st[0].AckPending != 0 {
		t.Fatalf("paused route's /status: %+v, want paused with 5 pending and none ack pending", st)
	}
	if n := sink.Count(); n != 1 {
		t.Fatalf("%d requests while paused, want 1 (the event before the pause)", n)
	}
	if err := h.b.Reload(context.Background(), testConfig(t, yaml, sink.URL(), false)); err != nil {
		t.Fatal(err)
	}
	sink.WaitCount(t, 6, settleWait)
	h.quiet("r")
	if n := sink.Count(); n != 6 {
		t.Fatalf("%d requests after resuming, want 6", n)
	}
	if st := routeStatusNow(t, h); st[0].Paused {
		t.Fatalf("resumed route still paused in /status: %+v", st)
	}
}

// routeStatusNow is /status's routes, fresh.
func routeStatusNow(t testing.TB, h *harness) []routeStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return h.b.routeStatuses(ctx)
}

// Signing-secret rotation by reload: the receiver verifies with the old
// secret, the reload adds the new one (both sign during the overlap), the
// receiver moves to the new one, a second reload drops the old one.
// Events flow the whole time, and no signature fails.
func TestReloadRotatesSigningSecret(t *testing.T) {
	oldSecret := "whsec_" + "b2xkLXNlY3JldC1vbGQtc2VjcmV0LW9sZC1zZWNyZXQ="
	newSecret := "whsec_" + "bmV3LXNlY3JldC1uZXctc2VjcmV0LW5ldy1zZWNyZXQ="
	check := func(t testing.TB, overlap string) error {
		var keys atomic.Pointer[[][]byte]
		var mu sync.Mutex
		var failed []string
		recv := sinktest.New(t, func(r sinktest.Request) sinktest.Response {
			if err := webhook.Verify(r.Header, r.Body, *keys.Load(), time.Now(), 5*time.Minute); err != nil {
				mu.Lock()
				failed = append(failed, r.Header.Get(sinktest.EventIDHeader))
				mu.Unlock()
				return sinktest.Response{Status: http.StatusUnauthorized}
			}
			return sinktest.Response{}
		})
		decode := func(s string) []byte {
			k, err := (&config.Signing{Secrets: []config.Secret{config.Secret(s)}}).Keys()
			if err != nil {
				t.Fatal(err)
			}
			return k[0]
		}
		oldKey, newKey := decode(oldSecret), decode(newSecret)
		keys.Store(&[][]byte{oldKey})
		const yaml = `
destinations:
  d:
    url: %s
    signing: {secret: %s}
routes:
  - name: r
    subjects: ["events.>"]
    destination: d
`
		h := startBridge(t, testConfig(t, yaml, recv.URL(), oldSecret), faults{})
		stop := make(chan struct{})
		var published atomic.Int64
		pubDone := make(chan error, 1)
		go func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					pubDone <- nil
					return
				default:
				}
				if err := publishAll(h.pub, [][2]string{{"events.info.x", fmt.Sprintf("e%d", i)}}); err != nil {
					pubDone <- err
					return
				}
				published.Add(1)
			}
		}()
		recv.WaitCount(t, 20, reloadWait)
		if err := h.b.Reload(context.Background(), testConfig(t, yaml, recv.URL(), overlap)); err != nil {
			return err
		}
		mark := recv.Count()
		recv.WaitCount(t, mark+20, reloadWait)
		keys.Store(&[][]byte{newKey})
		mark = recv.Count()
		recv.WaitCount(t, mark+20, reloadWait)
		if err := h.b.Reload(context.Background(), testConfig(t, yaml, recv.URL(), newSecret)); err != nil {
			return err
		}
		mark = recv.Count()
		recv.WaitCount(t, mark+20, reloadWait)
		close(stop)
		if err := <-pubDone; err != nil {
			t.Fatal(err)
		}
		n := int(published.Load())
		h.waitOutcomes(n, reloadWait, nil)
		mu.Lock()
		defer mu.Unlock()
		if len(failed) > 0 {
			return fmt.Errorf("%d requests failed verification across the rotation (of %d), e.g. %s", len(failed), recv.Count(), failed[0])
		}
		if got := len(h.waitOutcomes(n, reloadWait, outcomeIs(OutcomeDelivered))); got != n {
			return fmt.Errorf("%d of %d delivered", got, n)
		}
		return nil
	}
	if err := check(t, fmt.Sprintf("[%s, %s]", newSecret, oldSecret)); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "rotation without an overlap (the new secret alone at once)", func(t testing.TB) error {
		return check(t, newSecret)
	})
}

// A configuration that cannot be built (a route naming an unknown
// destination, which config.Load would have refused) is refused whole, and
// the running configuration keeps delivering. Before Run, and after it
// stopped, Reload answers ErrNotRunning.
func TestReloadRefusesUnbuildableAndNotRunning(t *testing.T) {
	first, second := sinktest.New(t, nil), sinktest.New(t, nil)
	const yaml = `
destinations:
  d: {url: %s}
routes:
  - name: r
    subjects: ["events.>"]
    destination: d
`
	cfg := testConfig(t, yaml, first.URL())
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL())
	if err := provisioned(t, cfg, js, faults{}).Reload(context.Background(), cfg); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("reload of a bridge that does not run: %v, want ErrNotRunning", err)
	}
	h := startBridgeOn(t, srv, cfg, faults{})
	next := testConfig(t, yaml, second.URL())
	next.Routes[0].Destination = "nowhere"
	err := h.b.Reload(context.Background(), next)
	if err == nil || errors.Is(err, ErrNeedsRestart) {
		t.Fatalf("reload naming an unknown destination: %v, want a refusal", err)
	}
	h.publish("events.info.x", "e1", []byte(`{}`), nil)
	h.waitOutcomes(1, settleWait, outcomeIs(OutcomeDelivered))
	if first.Count() != 1 || second.Count() != 0 {
		t.Fatalf("requests: %d at the running URL, %d at the refused one; want 1 and 0", first.Count(), second.Count())
	}
	h.stop()
	if err := h.b.Reload(context.Background(), cfg); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("reload after Run returned: %v, want ErrNotRunning", err)
	}
}

// Apply returns as soon as a configuration is in force, while a route it
// retired still finishes an attempt the destination holds: bridge run
// reports the reload at once, and a retired route retrying against a
// failing destination holds neither the report nor the next reload. Its
// finished channel closes once the retired route is done. The control is
// Reload, which waits for the retired routes: the same check (has it
// returned while the destination holds the attempt?) fails for it.
func TestApplyDoesNotWaitForRetiredRoutes(t *testing.T) {
	for _, waits := range []bool{false, true} {
		check := func(t testing.TB) error {
			release := make(chan struct{})
			var once sync.Once
			arrived := make(chan struct{})
			dest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				once.Do(func() { close(arrived) })
				<-release
			}))
			defer dest.Close()
			const two = `
destinations:
  d: {url: %s, timeout: 1m}
routes:
  - {name: r, subjects: ["events.a.>"], destination: d}
  - {name: s, subjects: ["events.b.>"], destination: d}
`
			const one = `
destinations:
  d: {url: %s, timeout: 1m}
routes:
  - {name: s, subjects: ["events.b.>"], destination: d}
`
			h := startBridge(t, testConfig(t, two, dest.URL), faults{})
			h.publish("events.a.x", "held", []byte(`{}`), nil)
			select {
			case <-arrived:
			case <-time.After(settleWait):
				close(release)
				return fmt.Errorf("the destination never received the attempt")
			}
			returned := make(chan error, 1)
			var finished <-chan struct{}
			go func() {
				if waits {
					returned <- h.b.Reload(context.Background(), testConfig(t, one, dest.URL))
					return
				}
				var err error
				finished, err = h.b.Apply(context.Background(), testConfig(t, one, dest.URL))
				returned <- err
			}()
			select {
			case err := <-returned:
				if err != nil {
					close(release)
					return err
				}
			case <-time.After(2 * time.Second):
				close(release)
				<-returned
				return fmt.Errorf("the reload did not return while a retired route's attempt was held")
			}
			select {
			case <-finished:
				close(release)
				return fmt.Errorf("finished closed while the retired route's attempt was still held")
			default:
			}
			close(release)
			select {
			case <-finished:
			case <-time.After(settleWait):
				return fmt.Errorf("finished not closed after the retired route's attempt ended")
			}
			return nil
		}
		if !waits {
			if err := check(t); err != nil {
				t.Fatal(err)
			}
			continue
		}
		expectBroken(t, "Reload, which waits for the retired routes", check)
	}
}

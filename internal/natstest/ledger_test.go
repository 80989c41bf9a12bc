package natstest_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/natstest"
)

// The ledger publishes its events with their ids as Nats-Msg-Id, and its
// check finds exactly the missing, duplicated, dead-lettered and unknown
// ids it was fed (the negative control of every no-loss test using it).
func TestLedgerCheck(t *testing.T) {
	// Given a stream, a dead-letter stream and a ledger of 10 events,
	// published twice (the second time refused as duplicates)
	s := natstest.Start(t)
	_, js := natstest.Connect(t, s.URL())
	createStream(t, js)
	if _, err := js.CreateOrUpdateStream(t.Context(), jetstream.StreamConfig{Name: "DLQ", Subjects: []string{"dlq.>"}}); err != nil {
		t.Fatal(err)
	}
	l := natstest.NewLedger("evt", 10)
	l.Publish(t, js, "events.a")
	l.Publish(t, js, "events.a")
	if n, err := streamMsgs(js); err != nil || n != 10 {
		t.Fatalf("stream has %d msgs (err %v), want 10", n, err)
	}
	st, err := js.Stream(t.Context(), "EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetMsg(t.Context(), 3)
	if err != nil {
		t.Fatal(err)
	}
	if id, data := m.Header.Get(jetstream.MsgIDHeader), string(m.Data); id != "evt-3" || data != `{"n":3}` {
		t.Fatalf("message 3: Nats-Msg-Id %q, data %s; want evt-3, {\"n\":3}", id, data)
	}

	// When events 5 and 6 are dead-lettered, 9 is never delivered, 7 is
	// delivered twice and 8 three times
	for _, id := range []string{"evt-5", "evt-6"} {
		msg := nats.NewMsg("dlq.r.events.a")
		msg.Header.Set("Event-Id", id)
		if _, err := js.PublishMsg(t.Context(), msg); err != nil {
			t.Fatal(err)
		}
	}
	l.ReadDeadLetters(t, js, "DLQ")
	l.Delivered("evt-1", "evt-2", "evt-3", "evt-4", "evt-7", "evt-7", "evt-8", "evt-8", "evt-8", "evt-10")

	// Then the check reports exactly that, and fails on the missing one
	r, err := l.Check()
	if err == nil || !strings.Contains(err.Error(), "evt-9") {
		t.Fatalf("Check error %v, want one naming the missing evt-9", err)
	}
	if !slices.Equal(r.Missing, []string{"evt-9"}) {
		t.Errorf("missing %v, want [evt-9]", r.Missing)
	}
	if want := map[string]int{"evt-7": 1, "evt-8": 2}; !maps.Equal(r.Duplicates, want) || r.DuplicateCount != 3 {
		t.Errorf("duplicates %v (count %d), want %v (count 3)", r.Duplicates, r.DuplicateCount, want)
	}
	if r.Total != 10 || r.Delivered != 7 || r.DeadLettered != 2 || len(r.Both) != 0 || len(r.Unknown) != 0 {
		t.Errorf("report %s, want total 10, delivered 7, dead-lettered 2, none both or unknown", r)
	}

	// When the missing one arrives, and one that was dead-lettered is
	// delivered too, the check passes and reports the overlap
	l.Delivered("evt-9", "evt-5")
	r, err = l.Check()
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	if len(r.Missing) != 0 || !slices.Equal(r.Both, []string{"evt-5"}) {
		t.Errorf("report %s (both %v), want none missing and evt-5 both delivered and dead-lettered", r, r.Both)
	}

	// And an id the ledger never published fails the check
	l.Delivered("other-1")
	if r, err = l.Check(); err == nil || !slices.Equal(r.Unknown, []string{"other-1"}) {
		t.Fatalf("Check error %v, unknown %v; want a failure naming other-1", err, r.Unknown)
	}
}

// A publish that fails (here: no stream captures the subject yet) is
// repeated with the same id until it is stored, once.
func TestLedgerPublishRetries(t *testing.T) {
	s := natstest.Start(t)
	_, js := natstest.Connect(t, s.URL())
	l := natstest.NewLedger("evt", 3)

	// Given no stream yet: create it once the ledger has had to retry
	created := make(chan error, 1)
	go func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for range tick.C {
			if r, _ := l.Check(); r.PublishRetries > 0 {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}})
				cancel()
				created <- err
				return
			}
		}
	}()

	// When the events are published
	l.Publish(t, js, "events.a")

	// Then each is stored once, after at least one retry
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	if n, err := streamMsgs(js); err != nil || n != 3 {
		t.Fatalf("stream has %d msgs (err %v), want 3", n, err)
	}
	if r, _ := l.Check(); r.PublishRetries == 0 {
		t.Fatal("no publish was retried")
	}
	// And publishing one again is not an error and stores nothing
	l.PublishOne(t, js, "events.a", 2)
	if n, err := streamMsgs(js); err != nil || n != 3 {
		t.Fatalf("stream has %d msgs (err %v), want 3", n, err)
	}
}

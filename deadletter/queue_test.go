package deadletter_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/sinktest"
	"github.com/sotercare/jetbridge/producer"
)

// dlqYAML has two routes to one destination: "ra" on events.info.a.> and
// "rb" on events.critical.b.>.
const dlqYAML = `
destinations:
  d:
    url: %s
    circuit_breaker: {enabled: false}
routes:
  - name: ra
    subjects: ["events.info.a.>"]
    destination: d
    max_deliver: 3
    backoff: [10ms]
  - name: rb
    subjects: ["events.critical.b.>"]
    destination: d
    max_deliver: 3
    backoff: [10ms]
`

// dlqEvent is one event the DLQ tests publish.
type dlqEvent struct {
	id, route, subject string
	data               []byte
}

// rejectAll publishes n events, every third to route rb and the others to
// ra, against a destination that answers 400, and waits until all n are
// dead-lettered and both routes are quiet.
func rejectAll(t *testing.T, n int) (*harness, *sinktest.Sink, []dlqEvent) {
	t.Helper()
	sink := sinktest.New(t, sinktest.Always(400))
	h := startBridge(t, testConfig(t, dlqYAML, sink.URL()))
	var evs []dlqEvent
	for i := range n {
		ev := dlqEvent{id: fmt.Sprintf("ev-%02d", i), route: "ra", subject: fmt.Sprintf("events.info.a.n%d", i)}
		if i%3 == 0 {
			ev.route, ev.subject = "rb", fmt.Sprintf("events.critical.b.n%d", i)
		}
		ev.data = fmt.Appendf(nil, `{"n":%d}`, i)
		h.publish(ev.subject, ev.id, ev.data, map[string]string{producer.HeaderEventID: ev.id, "X-Custom": "c" + ev.id})
		evs = append(evs, ev)
	}
	if got := h.waitOutcomes(n, settleWait, outcomeIs(bridge.OutcomeDeadLettered)); len(got) != n {
		t.Fatalf("%d dead-lettered, want %d", len(got), n)
	}
	h.quiet("ra")
	h.quiet("rb")
	if got := len(h.deadLetters()); got != n {
		t.Fatalf("%d dead letters stored, want %d", got, n)
	}
	return h, sink, evs
}

func dlqCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// dlqConsumers lists the consumers of the dead-letter stream.
func dlqConsumers(t *testing.T, h *harness) []string {
	t.Helper()
	ctx := dlqCtx(t)
	s, err := h.js.Stream(ctx, h.cfg.DeadLetter.Stream)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	l := s.ConsumerNames(ctx)
	for n := range l.Name() {
		names = append(names, n)
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}

// storedByEventID counts the source stream's messages per Event-Id, and
// separately those that are replays (with Bridge-Replayed-From).
func storedByEventID(t *testing.T, h *harness) (all, replays map[string]int) {
	t.Helper()
	ctx := dlqCtx(t)
	s, err := h.js.Stream(ctx, h.cfg.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	all, replays = map[string]int{}, map[string]int{}
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		id := m.Header.Get(producer.HeaderEventID)
		all[id]++
		if m.Header.Get(deadletter.HeaderReplayedFrom) != "" {
			replays[id]++
		}
	}
	return all, replays
}

// requestsByEventID counts the sink's requests per X-Event-Id from the
// from-th request on (0-based).
func requestsByEventID(sink *sinktest.Sink, from int) map[string]int {
	got := map[string]int{}
	for _, r := range sink.Requests()[from:] {
		got[r.Header.Get(sinktest.EventIDHeader)]++
	}
	return got
}

func TestDLQListFiltersAndGet(t *testing.T) {
	// Given 30 events rejected with 400 across two routes
	h, _, evs := rejectAll(t, 30)
	q := deadletter.Open(h.js, h.cfg)
	ctx := dlqCtx(t)
	byID := map[string]dlqEvent{}
	for _, ev := range evs {
		byID[ev.id] = ev
	}

	// When listing everything, headers only
	all, err := q.List(ctx, deadletter.Filter{}, false)
	if err != nil {
		t.Fatal(err)
	}
	// Then each of the 30 is there once, decoded
	if len(all) != 30 {
		t.Fatalf("List returned %d dead letters, want 30", len(all))
	}
	seen := map[string]bool{}
	for i, d := range all {
		ev, ok := byID[d.EventID]
		if !ok || seen[d.EventID] {
			t.Fatalf("dead letter %d: event id %q unknown or listed twice", d.Seq, d.EventID)
		}
		seen[d.EventID] = true
		if i > 0 && d.Seq <= all[i-1].Seq {
			t.Errorf("List not in stream order: %d after %d", d.Seq, all[i-1].Seq)
		}
		if d.Route != ev.route || d.Reason != deadletter.ReasonRejected || d.Failure != deadletter.FailureDownstream || d.Status != 400 ||
			d.Subject != ev.subject || d.Deliveries != 1 || d.Destination != "d" || d.OriginalStream != h.cfg.Stream.Name ||
			d.OriginalSeq == 0 || d.FailedAt.IsZero() || d.DLQSubject != "dlq."+ev.route+"."+ev.subject {
			t.Errorf("dead letter %d decoded as %+v, want route %s, rejected, downstream-status, 400, subject %s, 1 delivery", d.Seq, d, ev.route, ev.subject)
		}
		if d.Data != nil {
			t.Errorf("dead letter %d: List without data returned %d payload bytes", d.Seq, len(d.Data))
		}
		if d.Header.Get("X-Custom") != "c"+ev.id || d.Header.Get("Nats-Msg-Size") != "" {
			t.Errorf("dead letter %d: headers %v, want the original X-Custom and no Nats-Msg-Size", d.Seq, d.Header)
		}
	}
	if got := dlqConsumers(t, h); len(got) != 0 {
		t.Fatalf("List left consumers %v on the dead-letter stream", got)
	}

	count := func(f deadletter.Filter) []deadletter.Message {
		t.Helper()
		got, err := q.List(ctx, f, false)
		if err != nil {
			t.Fatalf("List(%+v): %v", f, err)
		}
		return got
	}
	tests := []struct {
		name  string
		f     deadletter.Filter
		want  int
		check func(deadletter.Message) bool
	}{
		{"route ra", deadletter.Filter{Route: "ra"}, 20, func(d deadletter.Message) bool { return d.Route == "ra" }},
		{"route rb", deadletter.Filter{Route: "rb"}, 10, func(d deadletter.Message) bool { return d.Route == "rb" }},
		{"reason rejected", deadletter.Filter{Reason: deadletter.ReasonRejected}, 30, func(d deadletter.Message) bool { return d.Reason == deadletter.ReasonRejected }},
		{"route and reason", deadletter.Filter{Route: "rb", Reason: deadletter.ReasonRejected}, 10, func(d deadletter.Message) bool { return d.Route == "rb" }},
		{"limit", deadletter.Filter{Limit: 7}, 7, nil},
		{"route with limit", deadletter.Filter{Route: "rb", Limit: 3}, 3, func(d deadletter.Message) bool { return d.Route == "rb" }},
		{"limit above count", deadletter.Filter{Route: "rb", Limit: 50}, 10, nil},
		{"unknown route", deadletter.Filter{Route: "nope"}, 0, nil},
		{"other reason", deadletter.Filter{Reason: deadletter.ReasonMaxDeliveries}, 0, nil},
		{"seqs", deadletter.Filter{Seqs: []uint64{all[5].Seq, all[2].Seq}}, 2, nil},
		{"seqs with route", deadletter.Filter{Seqs: seqsOf(all[:6]), Route: "rb"}, rbIn(all[:6]), func(d deadletter.Message) bool { return d.Route == "rb" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := count(tt.f)
			if len(got) != tt.want {
				t.Fatalf("%d dead letters, want %d", len(got), tt.want)
			}
			for _, d := range got {
				if tt.check != nil && !tt.check(d) {
					t.Errorf("dead letter %d (route %s, reason %s) does not match the filter", d.Seq, d.Route, d.Reason)
				}
			}
		})
	}
	if got := count(deadletter.Filter{Limit: 7}); !slices.Equal(seqsOf(got), seqsOf(all[:7])) {
		t.Errorf("Limit 7 returned %v, want the first seven %v", seqsOf(got), seqsOf(all[:7]))
	}
	if got := count(deadletter.Filter{Seqs: []uint64{all[5].Seq, all[2].Seq}}); !slices.Equal(seqsOf(got), []uint64{all[5].Seq, all[2].Seq}) {
		t.Errorf("Seqs returned %v, want %v in that order", seqsOf(got), []uint64{all[5].Seq, all[2].Seq})
	}
	if _, err := q.List(ctx, deadletter.Filter{Route: "a.>"}, false); err == nil {
		t.Error("List with a wildcard route filter succeeded")
	}

	// With data: the payloads, byte for byte
	withData, err := q.List(ctx, deadletter.Filter{Route: "rb"}, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range withData {
		if !bytes.Equal(d.Data, byID[d.EventID].data) {
			t.Errorf("dead letter %d: data %q, want %q", d.Seq, d.Data, byID[d.EventID].data)
		}
	}

	// Get of each: the same dead letter, payload included
	for _, d := range all {
		g, err := q.Get(ctx, d.Seq)
		if err != nil {
			t.Fatalf("Get(%d): %v", d.Seq, err)
		}
		if g.EventID != d.EventID || g.Route != d.Route || g.Subject != d.Subject || g.Status != 400 || !bytes.Equal(g.Data, byID[d.EventID].data) {
			t.Errorf("Get(%d) = %+v, want the listed dead letter with its payload", d.Seq, g)
		}
	}
	missing := all[len(all)-1].Seq + 100
	if _, err := q.Get(ctx, missing); !errors.Is(err, deadletter.ErrNotFound) {
		t.Errorf("Get(%d) error %v, want deadletter.ErrNotFound", missing, err)
	}
	if err := q.Delete(ctx, missing); !errors.Is(err, deadletter.ErrNotFound) {
		t.Errorf("Delete(%d) error %v, want deadletter.ErrNotFound", missing, err)
	}
	if _, err := q.List(ctx, deadletter.Filter{Seqs: []uint64{all[0].Seq, missing}}, false); !errors.Is(err, deadletter.ErrNotFound) {
		t.Errorf("List of a missing seq: error %v, want deadletter.ErrNotFound", err)
	}
	if got := dlqConsumers(t, h); len(got) != 0 {
		t.Fatalf("List left consumers %v on the dead-letter stream", got)
	}
}

// rbIn counts the dead letters of route rb: the order in which the two
// routes dead-letter is not fixed.
func rbIn(ds []deadletter.Message) int {
	n := 0
	for _, d := range ds {
		if d.Route == "rb" {
			n++
		}
	}
	return n
}

func seqsOf(ds []deadletter.Message) []uint64 {
	out := make([]uint64, len(ds))
	for i, d := range ds {
		out[i] = d.Seq
	}
	return out
}

func TestDLQReplay(t *testing.T) {
	// Given 30 dead letters, and a destination that now accepts
	h, sink, evs := rejectAll(t, 30)
	q := deadletter.Open(h.js, h.cfg)
	ctx := dlqCtx(t)
	before := sink.Count()
	sink.SetScript(sinktest.Always(200))
	all, err := q.List(ctx, deadletter.Filter{}, false)
	if err != nil || len(all) != 30 {
		t.Fatalf("List: %d, %v; want 30", len(all), err)
	}

	// When one is replayed with keep, then again without
	first, err := q.Get(ctx, all[0].Seq)
	if err != nil {
		t.Fatal(err)
	}
	r1, err := q.Replay(ctx, first.Seq, true)
	if err != nil {
		t.Fatal(err)
	}
	if r1.Duplicate || !r1.Kept || r1.Stream != h.cfg.Stream.Name || r1.Subject != first.Subject || r1.EventID != first.EventID || r1.Seq != first.Seq {
		t.Fatalf("replay with keep: %+v", r1)
	}
	if n := len(h.deadLetters()); n != 30 {
		t.Fatalf("after replay with keep: %d dead letters, want 30", n)
	}
	r2, err := q.Replay(ctx, first.Seq, false)
	if err != nil {
		t.Fatal(err)
	}
	// Then the second is a duplicate of the first: stored once, and now deleted
	if !r2.Duplicate || r2.Kept || r2.StreamSeq != r1.StreamSeq {
		t.Fatalf("second replay: %+v, want a duplicate of stream seq %d", r2, r1.StreamSeq)
	}
	if _, err := q.Get(ctx, first.Seq); !errors.Is(err, deadletter.ErrNotFound) {
		t.Fatalf("after replay: Get(%d) error %v, want deadletter.ErrNotFound", first.Seq, err)
	}
	if _, err := q.Replay(ctx, first.Seq, false); !errors.Is(err, deadletter.ErrNotFound) {
		t.Fatalf("replay of a replayed dead letter: error %v, want deadletter.ErrNotFound", err)
	}

	// The republished event: original headers, no Bridge-* but Replayed-From
	s, err := h.js.Stream(ctx, h.cfg.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(ctx, r1.StreamSeq)
	if err != nil {
		t.Fatal(err)
	}
	wantHdr := nats.Header{
		producer.HeaderEventID:        {first.EventID},
		"X-Custom":                    {"c" + first.EventID},
		jetstream.MsgIDHeader:         {deadletter.ReplayMsgID(first)},
		deadletter.HeaderReplayedFrom: {fmt.Sprint(first.Seq)},
		// the expectation that only the configured stream may store it
		jetstream.ExpectedStreamHeader: {h.cfg.Stream.Name},
	}
	if fmt.Sprint(m.Header) != fmt.Sprint(wantHdr) || m.Subject != first.Subject {
		t.Errorf("republished %s with headers %v, want %s with %v", m.Subject, m.Header, first.Subject, wantHdr)
	}

	// When the rest are replayed
	for _, d := range all[1:] {
		r, err := q.Replay(ctx, d.Seq, false)
		if err != nil {
			t.Fatalf("Replay(%d): %v", d.Seq, err)
		}
		if r.Duplicate || r.Kept {
			t.Errorf("Replay(%d) = %+v, want stored and deleted", d.Seq, r)
		}
	}
	// Then every event is delivered exactly once, and the DLQ is empty
	if got := h.waitOutcomes(30, settleWait, outcomeIs(bridge.OutcomeDelivered)); len(got) != 30 {
		t.Fatalf("%d delivered after replay, want 30", len(got))
	}
	h.quiet("ra")
	h.quiet("rb")
	got := requestsByEventID(sink, before)
	for _, ev := range evs {
		if got[ev.id] != 1 {
			t.Errorf("event %s reached the destination %d times after the fix, want 1", ev.id, got[ev.id])
		}
	}
	if len(got) != 30 {
		t.Errorf("destination saw %d event ids after the fix, want 30", len(got))
	}
	if n := len(h.deadLetters()); n != 0 {
		t.Errorf("%d dead letters left, want 0", n)
	}
	allStored, replays := storedByEventID(t, h)
	for _, ev := range evs {
		if allStored[ev.id] != 2 || replays[ev.id] != 1 {
			t.Errorf("event %s stored %d times (%d replays), want the original and one replay", ev.id, allStored[ev.id], replays[ev.id])
		}
	}
	if got := dlqConsumers(t, h); len(got) != 0 {
		t.Fatalf("consumers %v left on the dead-letter stream", got)
	}
}

func TestDLQReplayKeep(t *testing.T) {
	h, sink, _ := rejectAll(t, 6)
	q := deadletter.Open(h.js, h.cfg)
	ctx := dlqCtx(t)
	sink.SetScript(sinktest.Always(200))
	all, err := q.List(ctx, deadletter.Filter{Route: "ra"}, false)
	if err != nil || len(all) != 4 {
		t.Fatalf("List: %d, %v; want 4", len(all), err)
	}
	for _, d := range all {
		if r, err := q.Replay(ctx, d.Seq, true); err != nil || !r.Kept || r.Duplicate {
			t.Fatalf("Replay(%d, keep) = %+v, %v", d.Seq, r, err)
		}
	}
	if got := h.waitOutcomes(4, settleWait, outcomeIs(bridge.OutcomeDelivered)); len(got) != 4 {
		t.Fatalf("%d delivered, want 4", len(got))
	}
	if n := len(h.deadLetters()); n != 6 {
		t.Errorf("%d dead letters after replay with keep, want all 6", n)
	}
}

// A replay killed between the PubAck and the delete, run again, stores
// and delivers every event exactly once and empties the DLQ.
func TestDLQInterruptedReplayRerun(t *testing.T) {
	h, sink, evs := rejectAll(t, 10)
	q := deadletter.Open(h.js, h.cfg)
	ctx := dlqCtx(t)
	before := sink.Count()
	sink.SetScript(sinktest.Always(200))
	all, err := q.List(ctx, deadletter.Filter{}, false)
	if err != nil || len(all) != 10 {
		t.Fatalf("List: %d, %v; want 10", len(all), err)
	}

	// Given half replayed, and the sixth killed after its PubAck
	for _, d := range all[:5] {
		if _, err := q.Replay(ctx, d.Seq, false); err != nil {
			t.Fatal(err)
		}
	}
	d6, err := q.Get(ctx, all[5].Seq)
	if err != nil {
		t.Fatal(err)
	}
	killed, err := q.Republish(ctx, d6)
	if err != nil || killed.Duplicate {
		t.Fatalf("republish: %+v, %v", killed, err)
	}

	// When replay --all runs again
	rest, err := q.List(ctx, deadletter.Filter{}, false)
	if err != nil || len(rest) != 5 {
		t.Fatalf("List after the kill: %d, %v; want 5", len(rest), err)
	}
	dups := 0
	for _, d := range rest {
		r, err := q.Replay(ctx, d.Seq, false)
		if err != nil {
			t.Fatal(err)
		}
		if r.Duplicate {
			dups++
			if d.Seq != d6.Seq || r.StreamSeq != killed.StreamSeq {
				t.Errorf("dead letter %d replayed as a duplicate of %d, want only %d as a duplicate of %d", d.Seq, r.StreamSeq, d6.Seq, killed.StreamSeq)
			}
		}
	}
	if dups != 1 {
		t.Errorf("%d duplicates on the re-run, want 1", dups)
	}

	// Then every event is stored once more and delivered exactly once
	if got := h.waitOutcomes(10, settleWait, outcomeIs(bridge.OutcomeDelivered)); len(got) != 10 {
		t.Fatalf("%d delivered, want 10", len(got))
	}
	h.quiet("ra")
	h.quiet("rb")
	allStored, replays := storedByEventID(t, h)
	got := requestsByEventID(sink, before)
	for _, ev := range evs {
		if allStored[ev.id] != 2 || replays[ev.id] != 1 {
			t.Errorf("event %s stored %d times (%d replays), want the original and exactly one replay", ev.id, allStored[ev.id], replays[ev.id])
		}
		if got[ev.id] != 1 {
			t.Errorf("event %s delivered %d times after the fix, want 1", ev.id, got[ev.id])
		}
	}
	if n := len(h.deadLetters()); n != 0 {
		t.Errorf("%d dead letters left, want 0", n)
	}
}

// A dead letter without the headers replay needs lists fine, fails to
// replay with deadletter.ErrNotReplayable, and stays.
func TestDLQReplayMalformed(t *testing.T) {
	sink := sinktest.New(t, sinktest.Always(200))
	h := startBridge(t, testConfig(t, dlqYAML, sink.URL()))
	ctx := dlqCtx(t)
	crafted := []nats.Header{
		{deadletter.HeaderRoute: {"ra"}, deadletter.HeaderReason: {string(deadletter.ReasonRejected)}, producer.HeaderEventID: {"no-subject"}},
		{deadletter.HeaderRoute: {"ra"}, deadletter.HeaderReason: {string(deadletter.ReasonRejected)}, deadletter.HeaderOriginalSubject: {"events.info.a.x"}},
		{deadletter.HeaderRoute: {"ra"}, deadletter.HeaderReason: {string(deadletter.ReasonRejected)}, producer.HeaderEventID: {"bad-subject"}, deadletter.HeaderOriginalSubject: {"events.info.a.*"}},
	}
	for _, hdr := range crafted {
		if _, err := h.js.PublishMsg(ctx, &nats.Msg{Subject: "dlq.ra.events.info.a.x", Header: hdr, Data: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	q := deadletter.Open(h.js, h.cfg)
	all, err := q.List(ctx, deadletter.Filter{Route: "ra"}, false)
	if err != nil || len(all) != 3 {
		t.Fatalf("List: %d, %v; want 3", len(all), err)
	}
	for _, d := range all {
		if _, err := q.Replay(ctx, d.Seq, false); !errors.Is(err, deadletter.ErrNotReplayable) {
			t.Errorf("Replay(%d) error %v, want deadletter.ErrNotReplayable", d.Seq, err)
		}
	}
	if n := len(h.deadLetters()); n != 3 {
		t.Errorf("%d dead letters, want the 3 that could not be replayed", n)
	}
	if n := sink.Count(); n != 0 {
		t.Errorf("destination received %d requests, want 0", n)
	}
}

func TestDLQMissingStream(t *testing.T) {
	sink := sinktest.New(t, sinktest.Always(200))
	h := startBridge(t, testConfig(t, dlqYAML, sink.URL()))
	cfg := *h.cfg
	cfg.DeadLetter.Stream = "NO_SUCH_DLQ"
	_, err := deadletter.Open(h.js, &cfg).List(dlqCtx(t), deadletter.Filter{}, false)
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("List on a missing stream: error %v, want jetstream.ErrStreamNotFound", err)
	}
}

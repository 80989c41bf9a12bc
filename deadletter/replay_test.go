package deadletter_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
	"github.com/sotercare/jetbridge/producer"
)

// replayGuardYAML: the default stream EVENTS on events.>, dead letters on
// dlq.>, route ra with idempotency (so the EVENTS_DELIVERED bucket exists)
// and route rb.
const replayGuardYAML = `
idempotency: {bucket: EVENTS_DELIVERED}
destinations:
  d:
    url: %s
    circuit_breaker: {enabled: false}
routes:
  - name: ra
    subjects: ["events.info.a.>"]
    destination: d
    idempotency: true
  - name: rb
    subjects: ["events.critical.b.>"]
    destination: d
`

// planted is a dead letter stored by hand on the dead-letter subject, as
// anyone allowed to publish there could.
type planted struct {
	route, subject, id string
	data               []byte
	hdr                map[string]string // extra headers; "" deletes
	want               string            // a substring of the refusal; "" for a legitimate one
}

// forgedKey is the idempotency key of the event legit-1 on route ra: a
// dead letter that writes forgedRecord there makes the bridge skip that
// event. The bridge's own record names the replay's sequence, never 999.
var forgedKey = "ra.b." + base64.RawURLEncoding.EncodeToString([]byte("legit-1")) // <route>.b.<base64url event id>

const forgedRecord = "done EVENTS 999 1"

func dangerousDeadLetters() []planted {
	return []planted{
		{route: "ra", subject: "$JS.API.STREAM.PURGE.EVENTS", id: "x-purge", data: []byte(`{}`), want: "NATS system subject ($JS, the JetStream API)"},
		{route: "ra", subject: "$JS.API.STREAM.DELETE.EVENTS", id: "x-delete", want: "NATS system subject ($JS, the JetStream API)"},
		{route: "ra", subject: "$KV.EVENTS_DELIVERED." + forgedKey, id: "x-kv", data: []byte(forgedRecord), want: "NATS system subject ($KV, a key-value bucket)"},
		{route: "ra", subject: "_INBOX.x", id: "x-inbox", want: "reply inbox (_INBOX)"},
		{route: "ra", subject: "$SYS.x", id: "x-sys", want: "NATS system subject ($SYS, the system account)"},
		{route: "ra", subject: "$O.x", id: "x-obj", want: "NATS system subject ($O, an object store)"},
		{route: "ra", subject: "dlq.ra.events.info.a.loop", id: "x-loop", want: "under the dead-letter prefix dlq"},
		{route: "ra", subject: "orders.created", id: "x-outside", want: "outside stream EVENTS's subjects events.>"},
		{route: "ra", subject: "events.info.a.foreign", id: "x-foreign", hdr: map[string]string{deadletter.HeaderOriginalStream: "OTHER"}, want: "Bridge-Original-Stream is not the configured stream EVENTS"},
		{route: "ra", subject: "events.info.a.big", id: "x-omitted", data: []byte{}, hdr: map[string]string{deadletter.HeaderPayloadOmitted: "2000000", deadletter.HeaderOriginalSequence: "3"},
			want: "stored without its payload (2000000 bytes); read it from EVENTS seq 3 while the stream retains it"},
		{route: "rb", subject: "events.info.a.wrong-route", id: "x-route", want: "outside route rb's subjects events.critical.b.>"},
	}
}

func legitimateDeadLetters() []planted {
	return []planted{
		{route: "ra", subject: "events.info.a.l1", id: "legit-1"},
		{route: "rb", subject: "events.critical.b.l2", id: "legit-2"},
		{route: "gone", subject: "events.info.a.l3", id: "legit-3"}, // a route that no longer exists
	}
}

// plant stores p on the dead-letter stream with the bridge's headers.
func plant(t testing.TB, js jetstream.JetStream, p planted) uint64 {
	t.Helper()
	h := nats.Header{}
	for k, v := range map[string]string{
		producer.HeaderEventID: p.id, "Content-Type": "application/json",
		deadletter.HeaderReason: string(deadletter.ReasonRejected), deadletter.HeaderFailure: string(deadletter.FailureDownstream), deadletter.HeaderStatus: "400",
		deadletter.HeaderRoute: p.route, deadletter.HeaderDestination: "d", deadletter.HeaderDeliveries: "1",
		deadletter.HeaderOriginalSubject: p.subject, deadletter.HeaderOriginalStream: "EVENTS", deadletter.HeaderOriginalSequence: "1",
		deadletter.HeaderFailedAt: "2026-03-01T10:00:00Z",
	} {
		h.Set(k, v)
	}
	for k, v := range p.hdr {
		if v == "" {
			h.Del(k)
		} else {
			h.Set(k, v)
		}
	}
	data := p.data
	if data == nil {
		data = []byte(`{"planted":true}`)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: "dlq." + p.route + "." + p.subject, Header: h, Data: data})
	if err != nil {
		t.Fatalf("plant %s: %v", p.id, err)
	}
	return ack.Sequence
}

// checkReplayRefusals is "dlq replay --all" through the library against a
// running bridge: it plants the dangerous dead letters and the
// legitimate ones, replays every listed dead letter as the variant v does
// may break, and returns what went wrong: a dangerous one published (seen
// on the wire, in the source stream, the idempotency bucket or the
// dead-letter stream), a refusal missing or without its reason, or a
// legitimate one not replayed and delivered.
func checkReplayRefusals(t testing.TB, dangerous []planted, v replayVariant) error {
	sink := sinktest.New(t, sinktest.Always(200))
	h := startBridge(t, testConfig(t, replayGuardYAML, sink.URL()))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)

	// Given two events delivered for real, so the source stream has history
	h.publish("events.info.a.pre1", "pre-1", []byte(`{}`), map[string]string{producer.HeaderEventID: "pre-1"})
	h.publish("events.critical.b.pre2", "pre-2", []byte(`{}`), map[string]string{producer.HeaderEventID: "pre-2"})
	if got := h.waitOutcomes(2, settleWait, outcomeIs(bridge.OutcomeDelivered)); len(got) != 2 {
		return fmt.Errorf("%d of 2 events delivered before the replay", len(got))
	}
	// a spy on every subject a dangerous dead letter names
	spies := map[string]*nats.Subscription{}
	for _, p := range dangerous {
		sub, err := h.nc.SubscribeSync(p.subject)
		if err != nil {
			return err
		}
		defer sub.Unsubscribe()
		spies[p.id] = sub
	}
	if err := h.nc.Flush(); err != nil {
		return err
	}
	// and the dangerous dead letters planted before the legitimate ones
	refusedSeqs := map[uint64]planted{}
	for _, p := range dangerous {
		refusedSeqs[plant(t, h.js, p)] = p
	}
	legit := legitimateDeadLetters()
	for _, p := range legit {
		plant(t, h.js, p)
	}
	src, err := h.js.Stream(ctx, h.cfg.Stream.Name)
	if err != nil {
		return err
	}
	before, err := src.Info(ctx)
	if err != nil {
		return err
	}

	// When every dead letter is replayed
	q := v.js.open(h.js, h.cfg)
	all, err := q.List(ctx, deadletter.Filter{}, false)
	if err != nil {
		return err
	}
	var errs []error
	replayed := 0
	for _, d := range all {
		_, err := v.run(ctx, q, d.Seq)
		p, dangerous := refusedSeqs[d.Seq]
		switch {
		case !dangerous && err != nil:
			errs = append(errs, fmt.Errorf("legitimate dead letter %d: %v", d.Seq, err))
		case !dangerous:
			replayed++
		case err == nil:
			errs = append(errs, fmt.Errorf("dead letter %s (%s) replayed, want refused", p.id, p.subject))
		case !errors.Is(err, deadletter.ErrReplayRefused) || !strings.Contains(err.Error(), p.want):
			errs = append(errs, fmt.Errorf("dead letter %s: error %v, want a refusal containing %q", p.id, err, p.want))
		}
	}
	if replayed != len(legit) {
		errs = append(errs, fmt.Errorf("%d legitimate dead letters replayed, want %d", replayed, len(legit)))
	}

	// Then nothing dangerous reached the wire: after a round trip on the
	// connection that published, anything sent sits in a spy's queue. A
	// replay carries Bridge-Replayed-From (the bridge's own idempotency
	// records on the forged key's subject do not).
	if err := h.nc.Flush(); err != nil {
		return err
	}
	for _, id := range slices.Sorted(maps.Keys(spies)) {
		for n, _, _ := spies[id].Pending(); n > 0; n-- {
			m, err := spies[id].NextMsg(5 * time.Second)
			if err != nil {
				return err
			}
			if m.Header.Get(deadletter.HeaderReplayedFrom) != "" {
				errs = append(errs, fmt.Errorf("dead letter %s republished on its subject", id))
			}
		}
	}
	// the source stream only gained the legitimate replays
	after, err := src.Info(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("source stream after the replay: %w", err))
	} else if after.State.Msgs != before.State.Msgs+uint64(len(legit)) || after.State.FirstSeq != before.State.FirstSeq {
		errs = append(errs, fmt.Errorf("source stream went from %d messages (first seq %d) to %d (first seq %d), want +%d",
			before.State.Msgs, before.State.FirstSeq, after.State.Msgs, after.State.FirstSeq, len(legit)))
	}
	// the idempotency bucket holds no forged record
	if kv, err := h.js.KeyValue(ctx, h.cfg.Idempotency.Bucket); err != nil {
		errs = append(errs, err)
	} else if e, err := kv.Get(ctx, forgedKey); err == nil && string(e.Value()) == forgedRecord {
		errs = append(errs, fmt.Errorf("the idempotency bucket holds the forged key %s", forgedKey))
	}
	// the dead-letter stream holds exactly the refused ones
	var left []uint64
	for _, m := range h.deadLetters() {
		left = append(left, m.Sequence)
	}
	want := slices.Sorted(maps.Keys(refusedSeqs))
	if !slices.Equal(left, want) {
		errs = append(errs, fmt.Errorf("dead-letter stream holds %v, want exactly the refused %v", left, want))
	}
	// and the legitimate ones were delivered, each once (waiting for
	// every settlement, so a skipped one does not wait for the deadline)
	settled := h.waitOutcomes(2+replayed, settleWait, nil)
	seen := requestsByEventID(sink, 0)
	for _, p := range legit {
		if seen[p.id] != 1 {
			errs = append(errs, fmt.Errorf("legitimate event %s delivered %d times, want 1 (%d settlements in all)", p.id, seen[p.id], len(settled)))
		}
	}
	return errors.Join(errs...)
}

func TestReplayRefusesDangerousDeadLetters(t *testing.T) {
	if err := checkReplayRefusals(t, dangerousDeadLetters(), replayVariant{}); err != nil {
		t.Fatal(err)
	}

	// Negative controls, with the purge and the forged idempotency record
	// only (deleting the stream under the running bridge is not needed to
	// show the break).
	cheap := []planted{dangerousDeadLetters()[0], dangerousDeadLetters()[2]}
	expectBroken(t, "a guard that accepts everything", func(t testing.TB) error {
		return checkReplayRefusals(t, cheap, replayVariant{replay: unguarded})
	})
	// Without the guard and the stream expectation, the forged record is
	// stored too, and legit-1 is skipped as already delivered.
	expectBroken(t, "no guard and no stream expectation", func(t testing.TB) error {
		err := checkReplayRefusals(t, cheap[1:], replayVariant{js: noExpect, replay: unguarded})
		if err != nil && !strings.Contains(err.Error(), "forged key") {
			return fmt.Errorf("caught, but not by the forged key: %w", err)
		}
		return err
	})
}

// A subject inside stream.subjects that the server stores in another
// stream (a bound stream narrower than the configuration says) is refused
// by JetStream thanks to the stream expectation: nothing is stored and
// the dead letter is kept.
func TestReplayExpectsTheConfiguredStream(t *testing.T) {
	check := func(t testing.TB, wrap jsVariant) error {
		srv := natstest.Start(t)
		_, js := natstest.Connect(t, srv.URL())
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for name, subj := range map[string]string{"EVENTS": "events.a.>", "OTHER": "events.b.>", "EVENTS_DLQ": "dlq.>"} {
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subj}}); err != nil {
				return err
			}
		}
		cfg := testConfig(t, `
stream: {name: EVENTS, subjects: ["events.>"], create: false}
destinations: {d: {url: "http://127.0.0.1:9/"}}
routes: [{name: r, subjects: ["events.>"], destination: d}]
`)
		seq := plant(t, js, planted{route: "r", subject: "events.b.x", id: "ev-b"})
		q := wrap.open(js, cfg)
		_, err := q.Replay(ctx, seq, false)
		var errs []error
		if !errors.Is(err, deadletter.ErrReplayRefused) || !strings.Contains(err.Error(), "stored by another stream than EVENTS") {
			errs = append(errs, fmt.Errorf("replay error %v, want a refusal: stored by another stream", err))
		}
		other, err := js.Stream(ctx, "OTHER")
		if err != nil {
			return err
		}
		if info, err := other.Info(ctx); err != nil || info.State.Msgs != 0 {
			errs = append(errs, fmt.Errorf("stream OTHER holds %d messages (%v), want 0", info.State.Msgs, err))
		}
		if _, err := q.Get(ctx, seq); err != nil {
			errs = append(errs, fmt.Errorf("the dead letter is gone: %v", err))
		}
		return errors.Join(errs...)
	}
	if err := check(t, nil); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "no stream expectation", func(t testing.TB) error {
		return check(t, noExpect)
	})
}

// attackYAML is the reported setup: one route on events.>, the whole
// namespace a producer may publish on, to a destination that rejects
// until it is fixed.
const attackYAML = `
destinations:
  d:
    url: %s
    circuit_breaker: {enabled: false}
routes:
  - name: r
    subjects: ["events.>"]
    destination: d
`

// The victim's event and the attacker's message.
var (
	fallPayload     = []byte(`{"patient":"p-1","event":"fall"}`)
	attackerPayload = []byte(`{"attacker":true}`)
)

const (
	fallSubject  = "events.critical.sensor.fall"
	noiseSubject = "events.info.noise"
)

// victim is the event fall-7 dead-lettered as dlq seq 1 (its destination
// answered 400), the destination since fixed, and a Queue opened on the
// JetStream that wrap may break.
type victim struct {
	h    *harness
	sink *sinktest.Sink
	q    *deadletter.Queue
	d    deadletter.Message // the dead letter, payload included
}

func newVictim(t testing.TB, wrap jsVariant) (*victim, error) {
	sink := sinktest.New(t, sinktest.Always(400))
	h := startBridge(t, testConfig(t, attackYAML, sink.URL()))
	h.publish(fallSubject, "fall-7", fallPayload, map[string]string{producer.HeaderEventID: "fall-7"})
	if got := h.waitOutcomes(1, settleWait, outcomeIs(bridge.OutcomeDeadLettered)); len(got) != 1 {
		return nil, errors.New("fall-7 was not dead-lettered")
	}
	if err := quietErr(h, "r", 10*time.Second); err != nil {
		return nil, err
	}
	sink.SetScript(sinktest.Always(200))
	q := wrap.open(h.js, h.cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := q.Get(ctx, 1)
	if err != nil {
		return nil, err
	}
	return &victim{h: h, sink: sink, q: q, d: d}, nil
}

// plantEvent is the attacker: a producer allowed on events.> publishes its
// own message with the victim's Event-Id under the given Nats-Msg-Id.
func (v *victim) plantEvent(id string) uint64 {
	return v.h.publish(noiseSubject, id, attackerPayload, map[string]string{producer.HeaderEventID: "fall-7"})
}

// replays returns the source stream's messages that carry
// Bridge-Replayed-From, by sequence.
func (v *victim) replays(ctx context.Context) (map[uint64]*jetstream.RawStreamMsg, error) {
	s, err := v.h.js.Stream(ctx, v.h.cfg.Stream.Name)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	out := map[uint64]*jetstream.RawStreamMsg{}
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			return nil, err
		}
		if m.Header.Get(deadletter.HeaderReplayedFrom) != "" {
			out[seq] = m
		}
	}
	return out, nil
}

// checkVictimKept: the dead letter is still on the dead-letter stream with
// its payload and reason, and no replay of it was stored.
func (v *victim) checkKept(ctx context.Context) []error {
	var errs []error
	if d, err := v.q.Get(ctx, v.d.Seq); err != nil {
		errs = append(errs, fmt.Errorf("the dead letter is gone: %v", err))
	} else if string(d.Data) != string(fallPayload) || d.Reason != deadletter.ReasonRejected || d.EventID != "fall-7" {
		errs = append(errs, errors.New("the dead letter changed"))
	}
	if reps, err := v.replays(ctx); err != nil {
		errs = append(errs, err)
	} else if len(reps) != 0 {
		errs = append(errs, fmt.Errorf("%d replays stored, want none", len(reps)))
	}
	return errs
}

// checkVictimReplayed: the replay at seq was stored as this dead letter's
// replay (the real payload on the original subject) and is the only one,
// and the dead letter is gone.
func (v *victim) checkReplayed(ctx context.Context, seq uint64) []error {
	var errs []error
	if _, err := v.q.Get(ctx, v.d.Seq); !errors.Is(err, deadletter.ErrNotFound) {
		errs = append(errs, fmt.Errorf("the dead letter is still there (%v), want deleted", err))
	}
	reps, err := v.replays(ctx)
	if err != nil {
		return append(errs, err)
	}
	m := reps[seq]
	switch {
	case len(reps) != 1 || m == nil:
		errs = append(errs, fmt.Errorf("replays stored at %v, want exactly seq %d", slices.Sorted(maps.Keys(reps)), seq))
	case m.Subject != fallSubject || string(m.Data) != string(fallPayload) || m.Header.Get(deadletter.HeaderReplayedFrom) != "1" ||
		m.Header.Get(producer.HeaderEventID) != "fall-7" || m.Header.Get(jetstream.MsgIDHeader) != deadletter.ReplayMsgID(v.d):
		errs = append(errs, fmt.Errorf("seq %d is not the replay of dead letter 1", seq))
	}
	return errs
}

// checkPlantedReplayID is the reported attack with the replay's own id: a
// producer's message stored under the Nats-Msg-Id that the replay of
// dead letter 1 carries (as the current scheme makes it, for an attacker
// who somehow learnt it), then "dlq replay 1". The duplicate PubAck must
// be read back: the dead letter is kept, the collision reported, nothing
// stored.
func checkPlantedReplayID(t testing.TB, wrap jsVariant) error {
	v, err := newVictim(t, wrap)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	planted := v.plantEvent(deadletter.ReplayMsgID(v.d))

	res, err := v.q.Replay(ctx, v.d.Seq, false)
	var errs []error
	var c *deadletter.ReplayCollisionError
	wantText := fmt.Sprintf("deadletter: dead letter 1 kept: replay collision: EVENTS seq %d holds another message under this replay's Nats-Msg-Id "+
		"(different subject, %s, payload); nothing was stored", planted, deadletter.HeaderReplayedFrom)
	switch {
	case err == nil:
		errs = append(errs, fmt.Errorf("replay succeeded (%+v), want a collision", res))
	case !errors.As(err, &c) || !errors.Is(err, deadletter.ErrReplayCollision) || c.Seq != 1 || c.Stream != "EVENTS" || c.StreamSeq != planted:
		errs = append(errs, fmt.Errorf("replay error %v, want a *deadletter.ReplayCollisionError naming EVENTS seq %d", err, planted))
	case err.Error() != wantText:
		errs = append(errs, fmt.Errorf("collision text %q, want %q", err, wantText))
	}
	errs = append(errs, v.checkKept(ctx)...)
	return errors.Join(errs...)
}

// checkGuessedReplayIDs is the attack by a producer who guesses: it stores
// messages under the old scheme's id (fall-7:replay:1) and under the
// current scheme computed without the payload and the stored time, or with
// a payload and time it guessed. None of them is the replay's id: the
// replay stores the real event, verified, and deletes the dead letter.
func checkGuessedReplayIDs(t testing.TB, wrap jsVariant) error {
	v, err := newVictim(t, wrap)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	guesses := []string{
		"fall-7:replay:1",
		deadletter.ReplayMsgID(deadletter.Message{Stream: v.d.Stream, Seq: 1}),
		deadletter.ReplayMsgID(deadletter.Message{Stream: v.d.Stream, Seq: 1, Data: []byte(`{"patient":"p-1"}`), Stored: v.d.Stored.Truncate(time.Second)}),
	}
	for _, id := range guesses {
		v.plantEvent(id)
	}
	res, err := v.q.Replay(ctx, v.d.Seq, false)
	if err != nil {
		return errors.Join(fmt.Errorf("replay: %w", err), errors.Join(v.checkKept(ctx)...))
	}
	var errs []error
	if res.Duplicate || res.Kept || res.Stream != "EVENTS" || res.StreamSeq != uint64(2+len(guesses)) {
		errs = append(errs, fmt.Errorf("replay %+v, want stored anew as EVENTS seq %d and deleted", res, 2+len(guesses)))
	}
	errs = append(errs, v.checkReplayed(ctx, res.StreamSeq)...)
	// and the destination gets the real payload
	if !waitUntil(settleWait, func() bool {
		for _, r := range v.sink.Requests() {
			// the envelope carries the payload as its data
			if r.Header.Get(sinktest.EventIDHeader) == "fall-7" && bytes.Contains(r.Body, fallPayload) {
				return true
			}
		}
		return false
	}) {
		errs = append(errs, errors.New("the real fall-7 never reached the fixed destination"))
	}
	return errors.Join(errs...)
}

// checkGenuineDuplicate is a replay that stored its event and died before
// deleting the dead letter (republish, the first half of Replay, through
// the same code path), then run again: the duplicate PubAck is read back,
// recognised as this replay, counted as replayed and the dead letter goes.
func checkGenuineDuplicate(t testing.TB, wrap jsVariant) error {
	v, err := newVictim(t, wrap)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first, err := v.q.Republish(ctx, v.d)
	if err != nil || first.Duplicate {
		return fmt.Errorf("first half of the replay: %+v, %v", first, err)
	}
	res, err := v.q.Replay(ctx, v.d.Seq, false)
	if err != nil {
		return errors.Join(fmt.Errorf("replay after the crash: %w", err), errors.Join(v.checkKept(ctx)...))
	}
	var errs []error
	if !res.Duplicate || res.Kept || res.StreamSeq != first.StreamSeq {
		errs = append(errs, fmt.Errorf("replay after the crash %+v, want a duplicate of EVENTS seq %d, deleted", res, first.StreamSeq))
	}
	return errors.Join(append(errs, v.checkReplayed(ctx, first.StreamSeq)...)...)
}

func TestReplayCollisionKeepsTheDeadLetter(t *testing.T) {
	if err := checkPlantedReplayID(t, nil); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "a duplicate PubAck trusted", func(t testing.TB) error { return checkPlantedReplayID(t, trustDuplicates) })
}

func TestReplayIDCannotBeGuessed(t *testing.T) {
	if err := checkGuessedReplayIDs(t, nil); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "the old <event id>:replay:<seq> id", func(t testing.TB) error { return checkGuessedReplayIDs(t, oldReplayID) })
	expectBroken(t, "an id not bound to the payload and stored time", func(t testing.TB) error { return checkGuessedReplayIDs(t, unboundReplayID) })
}

func TestReplayGenuineDuplicateDeletes(t *testing.T) {
	if err := checkGenuineDuplicate(t, nil); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "every duplicate called a collision", func(t testing.TB) error { return checkGenuineDuplicate(t, distrustDuplicates) })
}

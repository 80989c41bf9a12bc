package bridge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/subjects"
)

// guardConfigs are the configurations of the guard table: "events" is a
// stream on events.> and audit.*.x with three routes; "any" a stream on
// ">" (which config validation would refuse, since it captures the
// dead-letter prefix) to show that system and dead-letter subjects are
// refused whatever the stream captures.
func guardConfigs() map[string]*config.Config {
	routes := []*config.Route{
		{Name: "ra", Subjects: []string{"events.info.a.>"}},
		{Name: "rb", Subjects: []string{"events.critical.b.>", "events.warning.b.*"}},
		{Name: "rc", Subjects: []string{"audit.*.x"}},
	}
	dl := config.DeadLetter{Stream: "EVENTS_DLQ", SubjectPrefix: "dlq"}
	return map[string]*config.Config{
		"events": {Stream: config.Stream{Name: "EVENTS", Subjects: []string{"events.>", "audit.*.x"}}, DeadLetter: dl, Routes: routes},
		"any":    {Stream: config.Stream{Name: "EVENTS", Subjects: []string{">"}}, DeadLetter: config.DeadLetter{Stream: "EVENTS_DLQ", SubjectPrefix: "ops.dlq"}},
	}
}

// guardRow is one dead letter and what the guard must say about it.
type guardRow struct {
	name    string
	cfg     string // key of guardConfigs
	route   string
	subject string
	hdr     map[string]string // extra headers; "" deletes
	// want: "" replayable; otherwise a substring of the reason, and
	// refusal tells whether it must match ErrReplayRefused (every rule
	// but a missing header).
	want     string
	notGuard bool // refused as not replayable, not by the guard
}

func guardRows() []guardRow {
	sys := func(subject, token string) guardRow {
		return guardRow{name: "system " + subject, cfg: "events", route: "ra", subject: subject, want: "is a NATS system subject (" + token}
	}
	rows := []guardRow{
		// replayable
		{name: "route ra", cfg: "events", route: "ra", subject: "events.info.a.x"},
		{name: "route rb second filter", cfg: "events", route: "rb", subject: "events.warning.b.y"},
		{name: "route rc star filter", cfg: "events", route: "rc", subject: "audit.login.x"},
		{name: "route gone", cfg: "events", route: "gone", subject: "events.info.z"},
		{name: "no route header", cfg: "events", route: "", subject: "events.x"},
		{name: "at the length bound", cfg: "events", route: "", subject: "events." + strings.Repeat("a", MaxReplaySubject-len("events."))},
		{name: "printable UTF-8", cfg: "events", route: "", subject: "events.info.café"},
		{name: "stream on > takes anything else", cfg: "any", route: "", subject: "orders.created"},
		{name: "token that only starts like the prefix", cfg: "any", route: "", subject: "ops.dlqx.a"},
		{name: "empty payload is not an omitted one", cfg: "events", route: "ra", subject: "events.info.a.x", hdr: map[string]string{"Content-Length": "0"}},

		// subset matching
		{name: "> needs a token", cfg: "events", route: "", subject: "events", want: "outside stream EVENTS's subjects events.>, audit.*.x"},
		{name: "star is one token", cfg: "events", route: "rc", subject: "audit.a.b.x", want: "outside stream EVENTS"},
		{name: "star needs a token", cfg: "events", route: "rc", subject: "audit.x", want: "outside stream EVENTS"},
		{name: "last literal token", cfg: "events", route: "rc", subject: "audit.a.y", want: "outside stream EVENTS"},
		{name: "outside the stream", cfg: "events", route: "gone", subject: "orders.created", want: "outside stream EVENTS"},
		{name: "case matters", cfg: "events", route: "", subject: "Events.x", want: "outside stream EVENTS"},
		{name: "route filter", cfg: "events", route: "rb", subject: "events.info.a.x", want: "outside route rb's subjects events.critical.b.>, events.warning.b.*"},
		{name: "route star filter is one token", cfg: "events", route: "rb", subject: "events.warning.b.y.z", want: "outside route rb's"},
		{name: "route filter > needs a token", cfg: "events", route: "ra", subject: "events.info.a", want: "outside route ra's"},

		// literal subject
		{name: "no subject", cfg: "events", route: "ra", subject: "", want: "no Bridge-Original-Subject header", notGuard: true},
		{name: "star", cfg: "events", route: "", subject: "events.*.a", want: "contains a wildcard"},
		{name: "gt", cfg: "events", route: "", subject: "events.>", want: "contains a wildcard"},
		{name: "star inside a token", cfg: "events", route: "", subject: "events.a*", want: "contains a wildcard"},
		{name: "empty token", cfg: "events", route: "", subject: "events..x", want: "empty token"},
		{name: "leading dot", cfg: "events", route: "", subject: ".events.x", want: "empty token"},
		{name: "trailing dot", cfg: "events", route: "", subject: "events.x.", want: "empty token"},
		{name: "space", cfg: "events", route: "", subject: "events.a b", want: "whitespace, a control"},
		{name: "tab", cfg: "events", route: "", subject: "events.a\tb", want: "whitespace, a control"},
		{name: "carriage return", cfg: "events", route: "", subject: "events.a\rb", want: "whitespace, a control"},
		{name: "escape", cfg: "events", route: "", subject: "events.\x1b[2J", want: "whitespace, a control"},
		{name: "DEL", cfg: "events", route: "", subject: "events.a\x7f", want: "whitespace, a control"},
		{name: "C1 CSI", cfg: "events", route: "", subject: "events.a\u009b2J", want: "whitespace, a control"},
		{name: "bidi override", cfg: "events", route: "", subject: "events.\u202etxt.exe", want: "whitespace, a control"},
		{name: "zero width space", cfg: "events", route: "", subject: "events.a\u200bb", want: "whitespace, a control"},
		{name: "no-break space", cfg: "events", route: "", subject: "events.a\u00a0b", want: "whitespace, a control"},
		{name: "invalid UTF-8", cfg: "events", route: "", subject: "events.a\xff", want: "not valid UTF-8"},
		{name: "too long", cfg: "events", route: "", subject: "events." + strings.Repeat("a", MaxReplaySubject), want: "longer than 1024 bytes"},

		// system and internal subjects, here and on a stream that takes ">"
		sys("$JS.API.STREAM.PURGE.EVENTS", "$JS, the JetStream API"),
		sys("$JS.API.STREAM.DELETE.EVENTS", "$JS, the JetStream API"),
		sys("$KV.EVENTS_DELIVERED.ra.b.ZXYtMQ", "$KV, a key-value bucket"),
		sys("$O.files.x", "$O, an object store"),
		sys("$SYS.REQ.SERVER.PING", "$SYS, the system account"),
		sys("$JSC.x", "$JSC"),
		sys("$NRG.x", "$NRG"),
		sys("$MQTT.x", "$MQTT"),
		sys("$SRV.PING", "$SRV"),
		sys("$JS", "$JS"),
		sys("$KV", "$KV"),
		sys("$ANY.other", "first token starts with \"$\""),
		{name: "inbox", cfg: "events", route: "", subject: "_INBOX.abc", want: "reply inbox (_INBOX)"},
		{name: "inbox token", cfg: "events", route: "", subject: "_INBOX", want: "reply inbox (_INBOX)"},
		{name: "dead-letter prefix", cfg: "events", route: "ra", subject: "dlq.ra.events.info.a.x", want: "under the dead-letter prefix dlq"},
		{name: "dead-letter prefix token", cfg: "events", route: "ra", subject: "dlq", want: "under the dead-letter prefix dlq"},
		{name: "any: $JS", cfg: "any", subject: "$JS.API.STREAM.PURGE.EVENTS", want: "NATS system subject ($JS"},
		{name: "any: $KV", cfg: "any", subject: "$KV.EVENTS_DELIVERED.ra.b.x", want: "NATS system subject ($KV"},
		{name: "any: $O", cfg: "any", subject: "$O.x", want: "NATS system subject ($O"},
		{name: "any: $SYS", cfg: "any", subject: "$SYS.x", want: "NATS system subject ($SYS"},
		{name: "any: _INBOX", cfg: "any", subject: "_INBOX.x", want: "reply inbox"},
		{name: "any: two-token prefix", cfg: "any", subject: "ops.dlq.ra.events.x", want: "under the dead-letter prefix ops.dlq"},
		{name: "any: prefix itself", cfg: "any", subject: "ops.dlq", want: "under the dead-letter prefix ops.dlq"},

		// origin stream
		{name: "foreign stream", cfg: "events", route: "ra", subject: "events.info.a.x", hdr: map[string]string{deadletter.HeaderOriginalStream: "OTHER"}, want: "Bridge-Original-Stream is not the configured stream EVENTS"},
		{name: "stream name case", cfg: "events", route: "ra", subject: "events.info.a.x", hdr: map[string]string{deadletter.HeaderOriginalStream: "events"}, want: "not the configured stream EVENTS"},
		{name: "no stream header", cfg: "events", route: "ra", subject: "events.info.a.x", hdr: map[string]string{deadletter.HeaderOriginalStream: ""}, want: "no Bridge-Original-Stream header"},

		// omitted payload
		{name: "payload omitted", cfg: "events", route: "ra", subject: "events.info.a.x", hdr: map[string]string{deadletter.HeaderPayloadOmitted: "2000000"},
			want: "stored without its payload (2000000 bytes); read it from EVENTS seq 42 while the stream retains it"},
		{name: "payload omitted, garbage size", cfg: "events", route: "ra", subject: "events.info.a.x", hdr: map[string]string{deadletter.HeaderPayloadOmitted: "x\x1b[2J"},
			want: "stored without its payload (size unknown); read it from EVENTS seq 42"},

		// a header replay needs, after the guard
		{name: "no event id", cfg: "events", route: "ra", subject: "events.info.a.x", hdr: map[string]string{producer.HeaderEventID: ""}, want: "no Event-Id header", notGuard: true},
	}
	return rows
}

// guardDeadLetter builds the dead letter of a row, as decoded from the
// dead-letter stream.
func guardDeadLetter(r guardRow) DLQMessage {
	h := nats.Header{}
	h.Set(producer.HeaderEventID, "ev-1")
	h.Set(deadletter.HeaderOriginalStream, "EVENTS")
	h.Set(deadletter.HeaderOriginalSequence, "42")
	h.Set(deadletter.HeaderReason, string(deadletter.ReasonRejected))
	if r.route != "" {
		h.Set(deadletter.HeaderRoute, r.route)
	}
	if r.subject != "" {
		h.Set(deadletter.HeaderOriginalSubject, r.subject)
	}
	for k, v := range r.hdr {
		if v == "" {
			h.Del(k)
		} else {
			h.Set(k, v)
		}
	}
	return decodeDeadLetter(7, "dlq.x", time.Now(), h)
}

// guardFor makes the guard function a DLQ uses from the real guard of a
// configuration; the real one is replayGuard.check, negative controls
// pass broken variants.
type guardFor func(g replayGuard) func(DLQMessage) error

func realGuard(g replayGuard) func(DLQMessage) error { return g.check }

// configText is every name and filter of guardConfigs, and _INBOX: a refusal may
// name them.
const configText = "EVENTS events.> audit.*.x events.info.a.> events.critical.b.> events.warning.b.* audit.*.x ops.dlq dlq _INBOX"

// checkGuardTable runs every row through DLQ.CheckReplay with the guard
// that mk makes, and returns every row it got wrong.
func checkGuardTable(t testing.TB, mk guardFor) error {
	cfgs := guardConfigs()
	var errs []error
	for _, r := range guardRows() {
		q := &DLQ{guard: mk(newReplayGuard(cfgs[r.cfg]))}
		err := q.CheckReplay(guardDeadLetter(r))
		switch {
		case r.want == "" && err != nil:
			errs = append(errs, fmt.Errorf("%s: refused (%v), want replayable", r.name, err))
		case r.want == "":
		case err == nil:
			errs = append(errs, fmt.Errorf("%s: replayable, want refused with %q", r.name, r.want))
		case !strings.Contains(err.Error(), r.want):
			errs = append(errs, fmt.Errorf("%s: error %q, want it to contain %q", r.name, err, r.want))
		case !errors.Is(err, ErrNotReplayable) || errors.Is(err, ErrReplayRefused) == r.notGuard:
			errs = append(errs, fmt.Errorf("%s: error %v: Is(ErrNotReplayable) %v, Is(ErrReplayRefused) %v, want true, %v",
				r.name, err, errors.Is(err, ErrNotReplayable), errors.Is(err, ErrReplayRefused), !r.notGuard))
		}
		// A refusal never carries the subject (a header value) in its text.
		if err != nil && r.subject != "" && !strings.Contains(configText, r.subject) && systemTokens[r.subject] == "" && strings.Contains(err.Error(), r.subject) {
			errs = append(errs, fmt.Errorf("%s: error text %q carries the subject", r.name, err))
		}
	}
	return errors.Join(errs...)
}

func TestReplayGuardTable(t *testing.T) {
	if err := checkGuardTable(t, realGuard); err != nil {
		t.Fatal(err)
	}
	// A refusal is typed and survives wrapping.
	q := &DLQ{guard: newReplayGuard(guardConfigs()["events"]).check}
	err := fmt.Errorf("wrapped: %w", q.CheckReplay(guardDeadLetter(guardRow{route: "ra", subject: "$JS.API.STREAM.PURGE.EVENTS"})))
	var refused *ReplayRefusedError
	if !errors.As(err, &refused) || refused.Seq != 7 || refused.Subject != "$JS.API.STREAM.PURGE.EVENTS" || !errors.Is(err, ErrReplayRefused) {
		t.Errorf("refusal %v: want a *ReplayRefusedError for seq 7 naming the subject, matching ErrReplayRefused", err)
	}

	// Negative controls: each broken guard lets some rows through.
	broken := map[string]guardFor{
		"the old guard: any valid subject": func(replayGuard) func(DLQMessage) error {
			return func(d DLQMessage) error {
				if d.Subject == "" {
					return notReplayable(d.Seq, "no "+deadletter.HeaderOriginalSubject+" header")
				}
				return subjects.ValidateSubject(d.Subject)
			}
		},
		"no stream-subjects rule": func(g replayGuard) func(DLQMessage) error {
			g.subjects = []string{">"}
			return g.check
		},
		"no route rule": func(g replayGuard) func(DLQMessage) error {
			g.routes = nil
			return g.check
		},
		"no dead-letter prefix rule": func(g replayGuard) func(DLQMessage) error {
			g.prefix = ""
			return g.check
		},
		"system subjects allowed": func(g replayGuard) func(DLQMessage) error {
			return func(d DLQMessage) error {
				if strings.HasPrefix(d.Subject, "$") || strings.HasPrefix(d.Subject, "_INBOX") {
					return nil
				}
				return g.check(d)
			}
		},
		"origin stream ignored": func(g replayGuard) func(DLQMessage) error {
			return func(d DLQMessage) error {
				d.OriginalStream = g.stream
				return g.check(d)
			}
		},
		"omitted payload allowed": func(g replayGuard) func(DLQMessage) error {
			return func(d DLQMessage) error {
				d.Header = maps.Clone(d.Header)
				d.Header.Del(deadletter.HeaderPayloadOmitted)
				return g.check(d)
			}
		},
		"no length bound": func(g replayGuard) func(DLQMessage) error {
			return func(d DLQMessage) error {
				if len(d.Subject) > MaxReplaySubject && subjects.ValidateSubject(d.Subject) == nil {
					return nil
				}
				return g.check(d)
			}
		},
	}
	for _, name := range slices.Sorted(maps.Keys(broken)) {
		expectBroken(t, name, func(t testing.TB) error { return checkGuardTable(t, broken[name]) })
	}
}

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
var forgedKey = reservationKey("ra", "legit-1")

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
// legitimate ones, replays every listed dead letter with a DLQ that swap
// may break, and returns what went wrong: a dangerous one published (seen
// on the wire, in the source stream, the idempotency bucket or the
// dead-letter stream), a refusal missing or without its reason, or a
// legitimate one not replayed and delivered.
func checkReplayRefusals(t testing.TB, dangerous []planted, swap func(q *DLQ)) error {
	sink := sinktest.New(t, sinktest.Always(200))
	h := startBridge(t, testConfig(t, replayGuardYAML, sink.URL()), faults{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)

	// Given two events delivered for real, so the source stream has history
	h.publish("events.info.a.pre1", "pre-1", []byte(`{}`), map[string]string{producer.HeaderEventID: "pre-1"})
	h.publish("events.critical.b.pre2", "pre-2", []byte(`{}`), map[string]string{producer.HeaderEventID: "pre-2"})
	if got := h.waitOutcomes(2, settleWait, outcomeIs(OutcomeDelivered)); len(got) != 2 {
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
	q := OpenDLQ(h.js, h.cfg)
	swap(q)
	all, err := q.List(ctx, DLQFilter{}, false)
	if err != nil {
		return err
	}
	var errs []error
	replayed := 0
	for _, d := range all {
		_, err := q.Replay(ctx, d.Seq, false)
		p, dangerous := refusedSeqs[d.Seq]
		switch {
		case !dangerous && err != nil:
			errs = append(errs, fmt.Errorf("legitimate dead letter %d: %v", d.Seq, err))
		case !dangerous:
			replayed++
		case err == nil:
			errs = append(errs, fmt.Errorf("dead letter %s (%s) replayed, want refused", p.id, p.subject))
		case !errors.Is(err, ErrReplayRefused) || !strings.Contains(err.Error(), p.want):
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
	if err := checkReplayRefusals(t, dangerousDeadLetters(), func(*DLQ) {}); err != nil {
		t.Fatal(err)
	}

	// Negative controls, with the purge and the forged idempotency record
	// only (deleting the stream under the running bridge is not needed to
	// show the break).
	cheap := []planted{dangerousDeadLetters()[0], dangerousDeadLetters()[2]}
	permissive := func(DLQMessage) error { return nil }
	expectBroken(t, "a guard that accepts everything", func(t testing.TB) error {
		return checkReplayRefusals(t, cheap, func(q *DLQ) { q.guard = permissive })
	})
	// Without the guard and the stream expectation, the forged record is
	// stored too, and legit-1 is skipped as already delivered.
	expectBroken(t, "no guard and no stream expectation", func(t testing.TB) error {
		err := checkReplayRefusals(t, cheap[1:], func(q *DLQ) { q.guard, q.pubOpts = permissive, nil })
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
	check := func(t testing.TB, swap func(q *DLQ)) error {
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
		q := OpenDLQ(js, cfg)
		swap(q)
		_, err := q.Replay(ctx, seq, false)
		var errs []error
		if !errors.Is(err, ErrReplayRefused) || !strings.Contains(err.Error(), "stored by another stream than EVENTS") {
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
	if err := check(t, func(*DLQ) {}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "no stream expectation", func(t testing.TB) error {
		return check(t, func(q *DLQ) { q.pubOpts = nil })
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
// answered 400), the destination since fixed, and a DLQ that swap may
// break.
type victim struct {
	h    *harness
	sink *sinktest.Sink
	q    *DLQ
	d    DLQMessage // the dead letter, payload included
}

func newVictim(t testing.TB, swap func(q *DLQ)) (*victim, error) {
	sink := sinktest.New(t, sinktest.Always(400))
	h := startBridge(t, testConfig(t, attackYAML, sink.URL()), faults{})
	h.publish(fallSubject, "fall-7", fallPayload, map[string]string{producer.HeaderEventID: "fall-7"})
	if got := h.waitOutcomes(1, settleWait, outcomeIs(OutcomeDeadLettered)); len(got) != 1 {
		return nil, errors.New("fall-7 was not dead-lettered")
	}
	if err := quietErr(h, "r", 10*time.Second); err != nil {
		return nil, err
	}
	sink.SetScript(sinktest.Always(200))
	q := OpenDLQ(h.js, h.cfg)
	swap(q)
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
	if _, err := v.q.Get(ctx, v.d.Seq); !errors.Is(err, ErrDeadLetterNotFound) {
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
		m.Header.Get(producer.HeaderEventID) != "fall-7" || m.Header.Get(jetstream.MsgIDHeader) != ReplayMsgID(v.d):
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
func checkPlantedReplayID(t testing.TB, swap func(q *DLQ)) error {
	v, err := newVictim(t, swap)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msg, err := v.q.replayMsg(v.d)
	if err != nil {
		return err
	}
	planted := v.plantEvent(msg.Header.Get(jetstream.MsgIDHeader))

	res, err := v.q.Replay(ctx, v.d.Seq, false)
	var errs []error
	var c *ReplayCollisionError
	wantText := fmt.Sprintf("bridge: dead letter 1 kept: replay collision: EVENTS seq %d holds another message under this replay's Nats-Msg-Id "+
		"(different subject, %s, payload); nothing was stored", planted, deadletter.HeaderReplayedFrom)
	switch {
	case err == nil:
		errs = append(errs, fmt.Errorf("replay succeeded (%+v), want a collision", res))
	case !errors.As(err, &c) || !errors.Is(err, ErrReplayCollision) || c.Seq != 1 || c.Stream != "EVENTS" || c.StreamSeq != planted:
		errs = append(errs, fmt.Errorf("replay error %v, want a *ReplayCollisionError naming EVENTS seq %d", err, planted))
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
func checkGuessedReplayIDs(t testing.TB, swap func(q *DLQ)) error {
	v, err := newVictim(t, swap)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	guesses := []string{
		"fall-7:replay:1",
		ReplayMsgID(DLQMessage{Stream: v.d.Stream, Seq: 1}),
		ReplayMsgID(DLQMessage{Stream: v.d.Stream, Seq: 1, Data: []byte(`{"patient":"p-1"}`), Stored: v.d.Stored.Truncate(time.Second)}),
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
func checkGenuineDuplicate(t testing.TB, swap func(q *DLQ)) error {
	v, err := newVictim(t, swap)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first, err := v.q.republish(ctx, v.d)
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

// Broken variants of the replay, for the negative controls.
var (
	// trustDuplicates takes a duplicate PubAck as success, as the code
	// before the read-back did.
	trustDuplicates = func(q *DLQ) {
		q.readBack = func(context.Context, *nats.Msg, *jetstream.PubAck) (string, error) { return "", nil }
	}
	// distrustDuplicates calls every duplicate a collision.
	distrustDuplicates = func(q *DLQ) {
		q.readBack = func(context.Context, *nats.Msg, *jetstream.PubAck) (string, error) { return "distrusted", nil }
	}
	// oldReplayID is the guessable scheme before: "<event id>:replay:<seq>".
	oldReplayID = func(q *DLQ) {
		q.replayID = func(d DLQMessage) string { return d.EventID + ":replay:" + fmt.Sprint(d.Seq) }
	}
	// unboundReplayID is a digest of the dead-letter stream and sequence
	// only: not bound to the payload or the stored time.
	unboundReplayID = func(q *DLQ) {
		q.replayID = func(d DLQMessage) string { return ReplayMsgID(DLQMessage{Stream: d.Stream, Seq: d.Seq}) }
	}
)

func TestReplayCollisionKeepsTheDeadLetter(t *testing.T) {
	if err := checkPlantedReplayID(t, func(*DLQ) {}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "a duplicate PubAck trusted", func(t testing.TB) error { return checkPlantedReplayID(t, trustDuplicates) })
}

func TestReplayIDCannotBeGuessed(t *testing.T) {
	if err := checkGuessedReplayIDs(t, func(*DLQ) {}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "the old <event id>:replay:<seq> id", func(t testing.TB) error { return checkGuessedReplayIDs(t, oldReplayID) })
	expectBroken(t, "an id not bound to the payload and stored time", func(t testing.TB) error { return checkGuessedReplayIDs(t, unboundReplayID) })
}

func TestReplayGenuineDuplicateDeletes(t *testing.T) {
	if err := checkGenuineDuplicate(t, func(*DLQ) {}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "every duplicate called a collision", func(t testing.TB) error { return checkGenuineDuplicate(t, distrustDuplicates) })
}

func TestReplayMsgID(t *testing.T) {
	stored := time.Date(2026, 3, 1, 10, 0, 0, 123456789, time.UTC)
	base := DLQMessage{Stream: "EVENTS_DLQ", Seq: 1, Stored: stored, Data: fallPayload, EventID: "fall-7", Subject: fallSubject}
	id := ReplayMsgID(base)
	if len(id) != len("replay:")+22 || !strings.HasPrefix(id, "replay:") || strings.Trim(id[len("replay:"):], "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") != "" {
		t.Fatalf("ReplayMsgID = %q, want replay: and 22 base64url characters", id)
	}
	if ReplayMsgID(base) != id {
		t.Fatal("ReplayMsgID is not deterministic")
	}
	// Header-only fields do not matter; every bound field does.
	other := base
	other.EventID, other.Subject, other.Header = "x", "events.x", nats.Header{"X": {"y"}}
	if ReplayMsgID(other) != id {
		t.Error("ReplayMsgID depends on more than the stream, sequence, stored time and payload")
	}
	for name, change := range map[string]func(d *DLQMessage){
		"stream":      func(d *DLQMessage) { d.Stream = "OTHER_DLQ" },
		"sequence":    func(d *DLQMessage) { d.Seq = 2 },
		"stored time": func(d *DLQMessage) { d.Stored = d.Stored.Add(time.Nanosecond) },
		"payload":     func(d *DLQMessage) { d.Data = []byte(`{"patient":"p-1","event":"fall "}`) },
		"no payload":  func(d *DLQMessage) { d.Data = nil },
	} {
		d := base
		change(&d)
		if ReplayMsgID(d) == id {
			t.Errorf("ReplayMsgID does not change with the %s", name)
		}
	}
}

func TestReplayMismatch(t *testing.T) {
	d := DLQMessage{Stream: "EVENTS_DLQ", Seq: 3, Stored: time.Now(), Data: fallPayload, EventID: "fall-7", Subject: fallSubject,
		Header: nats.Header{producer.HeaderEventID: {"fall-7"}, "X-Custom": {"c"}}}
	want, err := d.ReplayMsg()
	if err != nil {
		t.Fatal(err)
	}
	stored := func() (string, nats.Header, []byte) {
		h := nats.Header{}
		for k, vs := range want.Header {
			h[k] = slices.Clone(vs)
		}
		h.Set(jetstream.ExpectedStreamHeader, "EVENTS") // kept by JetStream
		return want.Subject, h, slices.Clone(want.Data)
	}
	if s, h, data := stored(); replayMismatch(s, h, data, want) != "" {
		t.Fatalf("the stored replay itself: mismatch %q", replayMismatch(s, h, data, want))
	}
	for name, tc := range map[string]struct {
		change func(s *string, h nats.Header, data *[]byte)
		want   string
	}{
		"subject":       {func(s *string, _ nats.Header, _ *[]byte) { *s = noiseSubject }, "different subject"},
		"msg id":        {func(_ *string, h nats.Header, _ *[]byte) { h.Set(jetstream.MsgIDHeader, "x") }, "different Nats-Msg-Id"},
		"event id":      {func(_ *string, h nats.Header, _ *[]byte) { h.Set(producer.HeaderEventID, "fall-8") }, "different Event-Id"},
		"replayed from": {func(_ *string, h nats.Header, _ *[]byte) { h.Set(deadletter.HeaderReplayedFrom, "4") }, "different Bridge-Replayed-From"},
		"no replayed":   {func(_ *string, h nats.Header, _ *[]byte) { h.Del(deadletter.HeaderReplayedFrom) }, "different Bridge-Replayed-From"},
		"two replayed":  {func(_ *string, h nats.Header, _ *[]byte) { h.Add(deadletter.HeaderReplayedFrom, "3") }, "different Bridge-Replayed-From"},
		"payload":       {func(_ *string, _ nats.Header, data *[]byte) { (*data)[0] = '[' }, "different payload"},
		"empty payload": {func(_ *string, _ nats.Header, data *[]byte) { *data = nil }, "different payload"},
		"all but msg id": {func(s *string, h nats.Header, data *[]byte) {
			*s = noiseSubject
			h.Del(deadletter.HeaderReplayedFrom)
			*data = attackerPayload
		}, "different subject, Bridge-Replayed-From, payload"},
	} {
		s, h, data := stored()
		tc.change(&s, h, &data)
		if got := replayMismatch(s, h, data, want); got != tc.want {
			t.Errorf("%s: mismatch %q, want %q", name, got, tc.want)
		}
	}
}

package deadletter

import (
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
	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/subjects"
)

// The replay guard, the replay's Nats-Msg-Id and the read-back's
// comparison, table-tested on their own.

// A dead letter and its attacker, as the replay tests of package
// deadletter_test use them.
var (
	fallPayload     = []byte(`{"patient":"p-1","event":"fall"}`)
	attackerPayload = []byte(`{"attacker":true}`)
)

const (
	fallSubject  = "events.critical.sensor.fall"
	noiseSubject = "events.info.noise"
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
		{name: "at the length bound", cfg: "events", route: "", subject: "events." + strings.Repeat("a", maxReplaySubject-len("events."))},
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
		{name: "too long", cfg: "events", route: "", subject: "events." + strings.Repeat("a", maxReplaySubject), want: "longer than 1024 bytes"},

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
		{name: "foreign stream", cfg: "events", route: "ra", subject: "events.info.a.x", hdr: map[string]string{HeaderOriginalStream: "OTHER"}, want: "Bridge-Original-Stream is not the configured stream EVENTS"},
		{name: "stream name case", cfg: "events", route: "ra", subject: "events.info.a.x", hdr: map[string]string{HeaderOriginalStream: "events"}, want: "not the configured stream EVENTS"},
		{name: "no stream header", cfg: "events", route: "ra", subject: "events.info.a.x", hdr: map[string]string{HeaderOriginalStream: ""}, want: "no Bridge-Original-Stream header"},

		// omitted payload
		{name: "payload omitted", cfg: "events", route: "ra", subject: "events.info.a.x", hdr: map[string]string{HeaderPayloadOmitted: "2000000"},
			want: "stored without its payload (2000000 bytes); read it from EVENTS seq 42 while the stream retains it"},
		{name: "payload omitted, garbage size", cfg: "events", route: "ra", subject: "events.info.a.x", hdr: map[string]string{HeaderPayloadOmitted: "x\x1b[2J"},
			want: "stored without its payload (size unknown); read it from EVENTS seq 42"},

		// a header replay needs, after the guard
		{name: "no event id", cfg: "events", route: "ra", subject: "events.info.a.x", hdr: map[string]string{producer.HeaderEventID: ""}, want: "no Event-Id header", notGuard: true},
	}
	return rows
}

// guardDeadLetter builds the dead letter of a row, as decoded from the
// dead-letter stream.
func guardDeadLetter(r guardRow) Message {
	h := nats.Header{}
	h.Set(producer.HeaderEventID, "ev-1")
	h.Set(HeaderOriginalStream, "EVENTS")
	h.Set(HeaderOriginalSequence, "42")
	h.Set(HeaderReason, string(ReasonRejected))
	if r.route != "" {
		h.Set(HeaderRoute, r.route)
	}
	if r.subject != "" {
		h.Set(HeaderOriginalSubject, r.subject)
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

// guardFor makes, from the real guard of a configuration, the check that
// the table runs on each row: the real one is Queue.CheckReplay with that
// guard; negative controls break the guard's configuration or wrap its
// check (brokenCheck).
type guardFor func(g guard) func(Message) error

func realGuard(g guard) func(Message) error { return (&Queue{guard: g}).CheckReplay }

// brokenCheck is CheckReplay with check in place of the guard's: check,
// then the construction of the replay message from the headers.
func brokenCheck(check func(Message) error) func(Message) error {
	return func(d Message) error {
		if err := check(d); err != nil {
			return err
		}
		_, err := d.replayMsg(ReplayMsgID(d))
		return err
	}
}

// configText is every name and filter of guardConfigs, and _INBOX: a refusal may
// name them.
const configText = "EVENTS events.> audit.*.x events.info.a.> events.critical.b.> events.warning.b.* audit.*.x ops.dlq dlq _INBOX"

// checkGuardTable runs every row through the check that mk makes, and
// returns every row it got wrong.
func checkGuardTable(t testing.TB, mk guardFor) error {
	cfgs := guardConfigs()
	var errs []error
	for _, r := range guardRows() {
		err := mk(newGuard(cfgs[r.cfg]))(guardDeadLetter(r))
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
	q := &Queue{guard: newGuard(guardConfigs()["events"])}
	err := fmt.Errorf("wrapped: %w", q.CheckReplay(guardDeadLetter(guardRow{route: "ra", subject: "$JS.API.STREAM.PURGE.EVENTS"})))
	var refused *ReplayRefusedError
	if !errors.As(err, &refused) || refused.Seq != 7 || refused.Subject != "$JS.API.STREAM.PURGE.EVENTS" || !errors.Is(err, ErrReplayRefused) {
		t.Errorf("refusal %v: want a *ReplayRefusedError for seq 7 naming the subject, matching ErrReplayRefused", err)
	}

	// Negative controls: each broken guard lets some rows through.
	broken := map[string]guardFor{
		"the old guard: any valid subject": func(guard) func(Message) error {
			return brokenCheck(func(d Message) error {
				if d.Subject == "" {
					return notReplayable(d.Seq, "no "+HeaderOriginalSubject+" header")
				}
				return subjects.ValidateSubject(d.Subject)
			})
		},
		"no stream-subjects rule": func(g guard) func(Message) error {
			g.subjects = []string{">"}
			return realGuard(g)
		},
		"no route rule": func(g guard) func(Message) error {
			g.routes = nil
			return realGuard(g)
		},
		"no dead-letter prefix rule": func(g guard) func(Message) error {
			g.prefix = ""
			return realGuard(g)
		},
		"system subjects allowed": func(g guard) func(Message) error {
			return brokenCheck(func(d Message) error {
				if strings.HasPrefix(d.Subject, "$") || strings.HasPrefix(d.Subject, "_INBOX") {
					return nil
				}
				return g.check(d)
			})
		},
		"origin stream ignored": func(g guard) func(Message) error {
			return brokenCheck(func(d Message) error {
				d.OriginalStream = g.stream
				return g.check(d)
			})
		},
		"omitted payload allowed": func(g guard) func(Message) error {
			return brokenCheck(func(d Message) error {
				d.Header = maps.Clone(d.Header)
				d.Header.Del(HeaderPayloadOmitted)
				return g.check(d)
			})
		},
		"no length bound": func(g guard) func(Message) error {
			return brokenCheck(func(d Message) error {
				if len(d.Subject) > maxReplaySubject && subjects.ValidateSubject(d.Subject) == nil {
					return nil
				}
				return g.check(d)
			})
		},
	}
	for _, name := range slices.Sorted(maps.Keys(broken)) {
		expectBroken(t, name, func(t testing.TB) error { return checkGuardTable(t, broken[name]) })
	}
}

func TestReplayMsgID(t *testing.T) {
	stored := time.Date(2026, 3, 1, 10, 0, 0, 123456789, time.UTC)
	base := Message{Stream: "EVENTS_DLQ", Seq: 1, Stored: stored, Data: fallPayload, EventID: "fall-7", Subject: fallSubject}
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
	for name, change := range map[string]func(d *Message){
		"stream":      func(d *Message) { d.Stream = "OTHER_DLQ" },
		"sequence":    func(d *Message) { d.Seq = 2 },
		"stored time": func(d *Message) { d.Stored = d.Stored.Add(time.Nanosecond) },
		"payload":     func(d *Message) { d.Data = []byte(`{"patient":"p-1","event":"fall "}`) },
		"no payload":  func(d *Message) { d.Data = nil },
	} {
		d := base
		change(&d)
		if ReplayMsgID(d) == id {
			t.Errorf("ReplayMsgID does not change with the %s", name)
		}
	}
}

func TestReplayMismatch(t *testing.T) {
	d := Message{Stream: "EVENTS_DLQ", Seq: 3, Stored: time.Now(), Data: fallPayload, EventID: "fall-7", Subject: fallSubject,
		Header: nats.Header{producer.HeaderEventID: {"fall-7"}, "X-Custom": {"c"}}}
	want, err := d.replayMsg(ReplayMsgID(d))
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
		"replayed from": {func(_ *string, h nats.Header, _ *[]byte) { h.Set(HeaderReplayedFrom, "4") }, "different Bridge-Replayed-From"},
		"no replayed":   {func(_ *string, h nats.Header, _ *[]byte) { h.Del(HeaderReplayedFrom) }, "different Bridge-Replayed-From"},
		"two replayed":  {func(_ *string, h nats.Header, _ *[]byte) { h.Add(HeaderReplayedFrom, "3") }, "different Bridge-Replayed-From"},
		"payload":       {func(_ *string, _ nats.Header, data *[]byte) { (*data)[0] = '[' }, "different payload"},
		"empty payload": {func(_ *string, _ nats.Header, data *[]byte) { *data = nil }, "different payload"},
		"all but msg id": {func(s *string, h nats.Header, data *[]byte) {
			*s = noiseSubject
			h.Del(HeaderReplayedFrom)
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

// expectBroken runs check against a deliberately broken variant and
// fails unless the check catches it: a negative control.
func expectBroken(t *testing.T, name string, check func(t testing.TB) error) {
	t.Helper()
	t.Run("negative control: "+name, func(t *testing.T) {
		if err := check(t); err == nil {
			t.Fatalf("the check passed against a deliberately broken variant (%s): it cannot catch that break", name)
		} else {
			t.Logf("caught, as it should: %v", err)
		}
	})
}

package main

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
	"github.com/sotercare/jetbridge/producer"
)

// refusalConfig is dlqConfig with idempotency on route ra, so the
// EVENTS_DELIVERED bucket exists and a forged "done" record would make the
// bridge skip an event.
const refusalConfig = `
nats:
  url: "%s"
  embedded: {listen: "%s", store_dir: "%s"}
admin: {listen: ""}
log: {level: error}
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

// forgedReservation is the bucket key of event id on route: the bridge's
// own encoding (base64url of ids up to 96 bytes), written out here.
func forgedReservation(route, id string) string {
	return route + ".b." + base64.RawURLEncoding.EncodeToString([]byte(id))
}

const forgedDone = "done EVENTS 999 1"

// TestDLQReplayRefusals plants every kind of dangerous dead letter next to
// legitimate ones and runs the real command: dry run, then replay --all.
// (The same assertions, with a permissive guard and without the stream
// expectation swapped in, are the negative controls of
// TestReplayRefusesDangerousDeadLetters in the bridge package.)
func TestDLQReplayRefusals(t *testing.T) {
	// Given two events dead-lettered for real by the running bridge
	e := newDLQEnvFrom(t, 400, refusalConfig)
	id1 := e.reject("events.info.a.r1")
	id2 := e.reject("events.critical.b.r2")
	key := forgedReservation("ra", id1)

	// and dangerous dead letters planted on the dead-letter subject
	type want struct {
		seq           uint64
		subject, line string
	}
	var refused []want
	plant := func(route, subject, reason string, data []byte, extra map[string]string) {
		seq := e.craft(route, subject, fmt.Sprintf("x-%d", len(refused)), data, extra)
		refused = append(refused, want{seq, subject, fmt.Sprintf("bridge: dead letter %d refused (subject %s): %s", seq, subject, reason)})
	}
	sys := "Bridge-Original-Subject is a NATS system subject "
	plant("ra", "$JS.API.STREAM.PURGE.EVENTS", sys+"($JS, the JetStream API)", []byte(`{}`), nil)
	plant("ra", "$JS.API.STREAM.DELETE.EVENTS", sys+"($JS, the JetStream API)", []byte(`{}`), nil)
	plant("ra", "$KV.EVENTS_DELIVERED."+key, sys+"($KV, a key-value bucket)", []byte(forgedDone), nil)
	plant("ra", "_INBOX.x", "Bridge-Original-Subject is a reply inbox (_INBOX)", []byte(`{}`), nil)
	plant("ra", "$SYS.x", sys+"($SYS, the system account)", []byte(`{}`), nil)
	plant("ra", "$O.x", sys+"($O, an object store)", []byte(`{}`), nil)
	plant("ra", "dlq.ra.events.info.a.loop", "Bridge-Original-Subject is under the dead-letter prefix dlq", []byte(`{}`), nil)
	plant("ra", "orders.created", "Bridge-Original-Subject is outside stream EVENTS's subjects events.>", []byte(`{}`), nil)
	plant("ra", "events.info.a.foreign", "Bridge-Original-Stream is not the configured stream EVENTS", []byte(`{}`),
		map[string]string{deadletter.HeaderOriginalStream: "OTHER"})
	plant("ra", "events.info.a.big", "stored without its payload (2000000 bytes); read it from EVENTS seq 77 while the stream retains it", []byte{},
		map[string]string{deadletter.HeaderPayloadOmitted: "2000000", deadletter.HeaderOriginalSequence: "77"})
	plant("rb", "events.info.a.wrong-route", "Bridge-Original-Subject is outside route rb's subjects events.critical.b.>", []byte(`{}`), nil)
	// and one more legitimate dead letter, of a route that no longer exists
	l3 := e.craft("gone", "events.info.a.l3", "legit-3", []byte(`{"l":3}`), nil)
	e.waitDeadLetters(e.dl)

	var wantStderr string
	for _, w := range refused {
		wantStderr += w.line + "\n"
	}
	legit := []struct {
		seq         uint64
		id, subject string
	}{{1, id1, "events.info.a.r1"}, {2, id2, "events.critical.b.r2"}, {l3, "legit-3", "events.info.a.l3"}}

	// a spy on every subject a dangerous dead letter names
	spyNC, _ := natstest.Connect(t, e.srv.URL())
	spies := map[string]*nats.Subscription{}
	for _, w := range refused {
		sub, err := spyNC.SubscribeSync(w.subject)
		if err != nil {
			t.Fatal(err)
		}
		spies[w.subject] = sub
	}
	if err := spyNC.Flush(); err != nil {
		t.Fatal(err)
	}
	sourceBefore := e.streamInfo("EVENTS")
	e.sink.SetScript(sinktest.Always(200))
	sinkBefore := e.sink.Count()

	// When dry-running: every refusal listed, nothing published, exit 1
	r := e.run("dlq", "replay", "--all", "--dry-run")
	wantDry := ""
	for _, l := range legit {
		wantDry += fmt.Sprintf("would replay dlq_seq=%d id=%s -> %s\n", l.seq, l.id, l.subject)
	}
	wantDry += fmt.Sprintf("dry run: would replay 3, failed %d; nothing changed\n", len(refused))
	if r.code != 1 || r.stdout != wantDry || r.stderr != wantStderr {
		t.Fatalf("dry run:\n%s\nwant exit 1, stdout:\n%s--- stderr:\n%s", r, wantDry, wantStderr)
	}
	if n := e.streamMsgs("EVENTS"); n != sourceBefore.State.Msgs {
		t.Fatalf("dry run published: source stream %d messages, want %d", n, sourceBefore.State.Msgs)
	}

	// When replaying everything
	r = e.run("dlq", "replay", "--all")

	// Then the legitimate ones are replayed, each refusal is reported with
	// its reason and counted as failed, and the exit code is 1
	wantOut := ""
	for i, l := range legit {
		wantOut += fmt.Sprintf("replayed dlq_seq=%d id=%s -> %s stream=EVENTS seq=%d\n", l.seq, l.id, l.subject, sourceBefore.State.LastSeq+uint64(i)+1)
	}
	wantOut += fmt.Sprintf("replayed 3, duplicates 0, kept 0, failed %d\n", len(refused))
	if r.code != 1 || r.stdout != wantOut || r.stderr != wantStderr {
		t.Fatalf("replay --all:\n%s\nwant exit 1, stdout:\n%s--- stderr:\n%s", r, wantOut, wantStderr)
	}
	// nothing dangerous reached the wire
	if err := spyNC.Flush(); err != nil {
		t.Fatal(err)
	}
	for subject, sub := range spies {
		for n, _, _ := sub.Pending(); n > 0; n-- {
			m, err := sub.NextMsg(5 * time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if m.Header.Get(deadletter.HeaderReplayedFrom) != "" {
				t.Errorf("a dead letter was republished on %s", subject)
			}
		}
	}
	// the source stream only gained the three replays
	after := e.streamInfo("EVENTS")
	if after.State.Msgs != sourceBefore.State.Msgs+3 || after.State.FirstSeq != sourceBefore.State.FirstSeq {
		t.Errorf("source stream went from %d messages (first %d) to %d (first %d), want +3", sourceBefore.State.Msgs,
			sourceBefore.State.FirstSeq, after.State.Msgs, after.State.FirstSeq)
	}
	// the idempotency bucket holds no forged record
	kv, err := e.js.KeyValue(e.ctx(), "EVENTS_DELIVERED")
	if err != nil {
		t.Fatal(err)
	}
	if en, err := kv.Get(e.ctx(), key); err == nil && string(en.Value()) == forgedDone {
		t.Errorf("the idempotency bucket holds the forged record for %s", id1)
	}
	// the dead-letter stream holds exactly the refused ones
	r = e.run("dlq", "list", "--json")
	var left []uint64
	for _, l := range lines(r.stdout) {
		var d struct{ Seq uint64 }
		if err := json.Unmarshal([]byte(l), &d); err != nil {
			t.Fatalf("dlq list --json: %v\n%s", err, r)
		}
		left = append(left, d.Seq)
	}
	var wantLeft []uint64
	for _, w := range refused {
		wantLeft = append(wantLeft, w.seq)
	}
	if !slices.Equal(left, wantLeft) {
		t.Errorf("dead letters left %v, want exactly the refused %v", left, wantLeft)
	}
	// and the legitimate events are delivered, each once
	e.sink.WaitCount(t, sinkBefore+3, 15*time.Second)
	natstest.WaitQuiet(t, e.js, "EVENTS", "ra", 10*time.Second)
	natstest.WaitQuiet(t, e.js, "EVENTS", "rb", 10*time.Second)
	seen := map[string]int{}
	for _, req := range e.sink.Requests()[sinkBefore:] {
		seen[req.Header.Get("X-Event-Id")]++
	}
	for _, l := range legit {
		if seen[l.id] != 1 {
			t.Errorf("event %s delivered %d times after the replay, want 1", l.id, seen[l.id])
		}
	}
	if len(seen) != 3 {
		t.Errorf("destination saw %v after the replay, want the 3 legitimate events", seen)
	}

	// A second run refuses the same ones again and changes nothing.
	r = e.run("dlq", "replay", "--all")
	if r.code != 1 || r.stderr != wantStderr || r.stdout != fmt.Sprintf("replayed 0, duplicates 0, kept 0, failed %d\n", len(refused)) {
		t.Errorf("second replay --all:\n%s", r)
	}
}

func (e *dlqEnv) streamInfo(name string) *jetstream.StreamInfo {
	e.t.Helper()
	s, err := e.js.Stream(e.ctx(), name)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(e.ctx())
	if err != nil {
		e.t.Fatal(err)
	}
	return info
}

// rawPublish publishes one message over the plain NATS protocol, so
// header values can hold what nats.go would never send (a bare carriage
// return), as a hostile publisher's could.
func rawPublish(t *testing.T, url, subject string, hdr [][2]string, payload string) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(c)
	if l, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(l, "INFO ") {
		t.Fatalf("raw connection: %q, %v", l, err)
	}
	h := "NATS/1.0\r\n"
	for _, kv := range hdr {
		h += kv[0] + ": " + kv[1] + "\r\n"
	}
	h += "\r\n"
	fmt.Fprintf(c, "CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true}\r\nHPUB %s %d %d\r\n%s%s\r\nPING\r\n",
		subject, len(h), len(h)+len(payload), h, payload)
	for {
		l, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("raw publish: %v", err)
		}
		if strings.HasPrefix(l, "-ERR") {
			t.Fatalf("raw publish: %s", l)
		}
		if strings.HasPrefix(l, "PONG") {
			return
		}
	}
}

// terminalUnsafe lists what in s could act on a terminal: C0 controls
// other than newline, DEL, bytes that are not UTF-8, C1 controls and
// invisible format characters.
func terminalUnsafe(s string) error {
	var bad []string
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			bad = append(bad, fmt.Sprintf("byte %#x at %d", s[i], i))
		case r == '\n':
		case unicode.IsControl(r) || unicode.Is(unicode.Cf, r):
			bad = append(bad, fmt.Sprintf("%U at %d", r, i))
		}
		i += n
	}
	if len(bad) > 0 {
		return fmt.Errorf("raw control or invisible characters: %s", strings.Join(bad, ", "))
	}
	return nil
}

// hostile holds what TestDLQTerminalEscaping's dead letter carries.
var hostile = struct {
	subject, dlqSubject, eventID, key, value, payload string
	long                                              string
}{
	subject:    "events.info.a.\x1b[2J\rX\xff",
	dlqSubject: "dlq.ra.ev\x1b[2J.x",
	eventID:    "ev\x1b]0;pwned\x07",
	key:        "X-Evil\x1b[8m",
	value:      "\x1b[31mred\r\xff\u202etxt.exe\u009b1A",
	payload:    "line1\x1b[2J\r\nline2\xff\n\u202e",
	long:       strings.Repeat("\x1b[1A", 1500),
}

func TestDLQTerminalEscaping(t *testing.T) {
	// Given a dead letter with controls, invalid UTF-8 and invisible
	// characters in its subject, header names and values and payload
	e := newDLQEnv(t, 200)
	rawPublish(t, e.srv.URL(), hostile.dlqSubject, [][2]string{
		{deadletter.HeaderOriginalSubject, hostile.subject},
		{deadletter.HeaderOriginalStream, "EVENTS"},
		{deadletter.HeaderRoute, "ra"},
		{producer.HeaderEventID, hostile.eventID},
		{hostile.key, hostile.value},
		{"X-Long", hostile.long},
	}, hostile.payload)
	e.dl++
	e.waitDeadLetters(1)

	// When every dlq command prints it
	outs := map[string]result{
		"show":           e.run("dlq", "show", "1", "--payload"),
		"list":           e.run("dlq", "list"),
		"replay dry run": e.run("dlq", "replay", "--all", "--dry-run"),
		"replay":         e.run("dlq", "replay", "1"),
	}
	outs["purge"] = e.run("dlq", "purge", "1")

	// Then nothing raw reaches the terminal, and what was there is shown
	// escaped
	for name, r := range outs {
		if err := terminalUnsafe(r.stdout + r.stderr); err != nil {
			t.Errorf("dlq %s: %v\n%q", name, err, r.stdout+r.stderr)
		}
	}
	show := outs["show"]
	for _, want := range []string{
		`subject: dlq.ra.ev\x1b[2J.x`,
		`  Bridge-Original-Subject: events.info.a.\x1b[2J\rX\xff`,
		`  Event-Id: ev\x1b]0;pwned\x07`,
		`  X-Evil\x1b[8m: \x1b[31mred\r\xff\u202etxt.exe\u009b1A`,
		"line1\\x1b[2J\\r\nline2\\xff\n\\u202e\n",
	} {
		if !strings.Contains(show.stdout, want) {
			t.Errorf("dlq show lacks %q:\n%s", want, show.stdout)
		}
	}
	// a long header value is cut at 1 KiB with its full size
	for _, l := range lines(show.stdout) {
		if strings.HasPrefix(l, "  X-Long: ") && (!strings.HasSuffix(l, "… (6000 bytes)") || len(l) > 10+4*1024+32) {
			t.Errorf("long header line (%d bytes) not bounded: %.80q…", len(l), l)
		}
	}
	refusal := `bridge: dead letter 1 refused (subject events.info.a.\x1b[2J\rX\xff): Bridge-Original-Subject is not valid UTF-8` + "\n"
	for _, name := range []string{"replay dry run", "replay"} {
		if r := outs[name]; r.code != 1 || r.stderr != refusal {
			t.Errorf("dlq %s:\n%s\nwant exit 1 and stderr %q", name, r, refusal)
		}
	}
	if r := outs["list"]; r.code != 0 || !strings.Contains(r.stdout, `ev\x1b]0;pwned\x07`) {
		t.Errorf("dlq list:\n%s", r)
	}
	if r := outs["purge"]; r.code != 0 || r.stdout != "deleted 1\ndeleted 1, failed 0\n" {
		t.Errorf("dlq purge:\n%s", r)
	}
}

// checkEscaper reports what esc leaves unsafe or unreadable among the
// hostile texts.
func checkEscaper(esc func(string) string) error {
	var errs []error
	for _, in := range []string{hostile.subject, hostile.dlqSubject, hostile.eventID, hostile.key, hostile.value, hostile.long,
		"a\tb", "bell\x07", "nul\x00", "del\x7f", "csi\u009b", "zw\u200b", "ls\u2028", "nbsp\u00a0", "bom\ufeff", "tag\U000e0041"} {
		out := esc(in)
		if err := terminalUnsafe(out); err != nil {
			errs = append(errs, fmt.Errorf("%q -> %q: %w", in, out, err))
		}
		if strings.Contains(out, "\n") {
			errs = append(errs, fmt.Errorf("%q -> %q: a line break", in, out))
		}
	}
	for in, want := range map[string]string{
		"plain events.info.a.x": "plain events.info.a.x",
		"café ✓ 日本":             "café ✓ 日本",
		`json {"a":"\"q\""}`:    `json {"a":"\"q\""}`,
		"\x1b[2J\r\n\t":         `\x1b[2J\r\n\t`,
		"\xff\xfe":              `\xff\xfe`,
		"\u202e\u009b":          `\u202e\u009b`,
		"\U000e0041":            `\U000e0041`,
	} {
		if got := esc(in); got != want {
			errs = append(errs, fmt.Errorf("%q -> %q, want %q", in, got, want))
		}
	}
	return errors.Join(errs...)
}

func TestEscapeTerminal(t *testing.T) {
	if err := checkEscaper(escapeTerminal); err != nil {
		t.Fatal(err)
	}
	if got := shown(strings.Repeat("é", 600)); !strings.HasSuffix(got, "… (1200 bytes)") || !utf8.ValidString(got) || len(got) > maxShown+20 {
		t.Errorf("shown of 1200 bytes: %d bytes, suffix %q", len(got), got[len(got)-20:])
	}
	if got := shown(strings.Repeat("a", maxShown)); got != strings.Repeat("a", maxShown) {
		t.Errorf("shown cut a value of exactly %d bytes", maxShown)
	}

	// Negative controls: printing as is, and the old table cell (which
	// replaced controls with "?" but let invisible format characters and
	// the rest through).
	expectBrokenEscaper(t, "no escaping", func(s string) string { return s })
	expectBrokenEscaper(t, "controls replaced by ?", func(s string) string {
		return strings.Map(func(r rune) rune {
			if unicode.IsControl(r) {
				return '?'
			}
			return r
		}, s)
	})
	// and the output check itself catches raw bytes in a whole output
	if terminalUnsafe("dead letter 1\n  X: "+hostile.value+"\n") == nil {
		t.Error("terminalUnsafe missed raw controls in an output")
	}
}

func expectBrokenEscaper(t *testing.T, name string, esc func(string) string) {
	t.Helper()
	t.Run("negative control: "+name, func(t *testing.T) {
		if err := checkEscaper(esc); err == nil {
			t.Fatalf("checkEscaper passed a broken escaper (%s)", name)
		} else {
			t.Logf("caught, as it should: %.300v", err)
		}
	})
}

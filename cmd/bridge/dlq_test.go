package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
	"github.com/sotercare/jetbridge/producer"
)

// dlqConfig has two routes, "ra" on events.info.a.> and "rb" on
// events.critical.b.>, to one destination. Arguments: the NATS URL (or ""
// for embedded), the embedded listen address, the store dir, the
// destination URL.
const dlqConfig = `
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
  - name: rb
    subjects: ["events.critical.b.>"]
    destination: d
`

// dlqEnv is a NATS server, a destination, a config file naming both and a
// bridge running on it in process.
type dlqEnv struct {
	t    *testing.T
	srv  *natstest.Server
	js   jetstream.JetStream
	sink *sinktest.Sink
	cfg  *config.Config
	path string
	n    int    // events published or crafted so far
	dl   uint64 // dead letters stored so far
}

func newDLQEnv(t *testing.T, status int) *dlqEnv {
	t.Helper()
	return newDLQEnvFrom(t, status, dlqConfig)
}

// newDLQEnvFrom is newDLQEnv with another configuration template (the
// arguments of dlqConfig).
func newDLQEnvFrom(t *testing.T, status int, tmpl string) *dlqEnv {
	t.Helper()
	return newDLQEnvLogging(t, status, tmpl, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
}

// newDLQEnvLogging is newDLQEnvFrom with the bridge's logger.
func newDLQEnvLogging(t *testing.T, status int, tmpl string, logger zerolog.Logger) *dlqEnv {
	t.Helper()
	unsetenv(t, "BRIDGE_CONFIG")
	e := &dlqEnv{t: t, srv: natstest.Start(t), sink: sinktest.New(t, sinktest.Always(status))}
	_, e.js = natstest.Connect(t, e.srv.URL())
	e.path = writeDLQConfigFrom(t, tmpl, e.srv.URL(), "127.0.0.1:4222", e.sink.URL())
	cfg, err := config.LoadFile(e.path)
	if err != nil {
		t.Fatal(err)
	}
	e.cfg = cfg
	b, err := bridge.New(cfg, e.js, bridge.Options{Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("bridge Run: %v", err)
		}
	})
	select {
	case <-b.Ready():
	case err := <-done:
		t.Fatalf("bridge Run: %v", err)
	}
	return e
}

func writeDLQConfig(t *testing.T, natsURL, listen, destURL string) string {
	t.Helper()
	return writeDLQConfigFrom(t, dlqConfig, natsURL, listen, destURL)
}

func writeDLQConfigFrom(t *testing.T, tmpl, natsURL, listen, destURL string) string {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "bridge.yaml")
	yaml := fmt.Sprintf(tmpl, natsURL, listen, filepath.Join(dir, "store"), destURL)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func (e *dlqEnv) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	e.t.Cleanup(cancel)
	return ctx
}

// reject publishes an event that the bridge will dead-letter (with the
// destination answering 400), waits for its dead letter, and returns its
// id. One at a time, so dead letters are stored in publishing order.
func (e *dlqEnv) reject(subject string) string {
	e.t.Helper()
	e.n++
	id := fmt.Sprintf("ev-%d", e.n)
	_, err := producer.NewPublisher(e.js, "events").Publish(e.ctx(), producer.Event{ID: id, Subject: subject, Payload: []byte(`{"n":1}`)})
	if err != nil {
		e.t.Fatal(err)
	}
	e.dl++
	e.waitDeadLetters(e.dl)
	return id
}

// craft stores a dead letter directly, with the headers of docs/operating.md#dead-letters.
func (e *dlqEnv) craft(route, subject, id string, data []byte, extra map[string]string) uint64 {
	e.t.Helper()
	h := nats.Header{}
	for k, v := range map[string]string{
		producer.HeaderEventID: id, "Event-Type": "a.x", "Event-Severity": "INFO", "Content-Type": "application/json",
		jetstream.MsgIDHeader:             deadletter.MsgID(route, "EVENTS", uint64(1000+e.n)),
		deadletter.HeaderReason:           string(deadletter.ReasonMaxDeliveries),
		deadletter.HeaderFailure:          string(deadletter.FailureTransport),
		deadletter.HeaderError:            "transport error to d: connection refused",
		deadletter.HeaderRoute:            route,
		deadletter.HeaderDestination:      "d",
		deadletter.HeaderDeliveries:       "5",
		deadletter.HeaderOriginalSubject:  subject,
		deadletter.HeaderOriginalStream:   "EVENTS",
		deadletter.HeaderOriginalSequence: fmt.Sprint(1000 + e.n),
		deadletter.HeaderFailedAt:         "2026-03-01T10:00:00Z",
	} {
		h.Set(k, v)
	}
	for k, v := range extra {
		if v == "" {
			h.Del(k)
		} else {
			h.Set(k, v)
		}
	}
	e.n++
	e.dl++
	ack, err := e.js.PublishMsg(e.ctx(), &nats.Msg{Subject: "dlq." + route + "." + subject, Header: h, Data: data})
	if err != nil {
		e.t.Fatal(err)
	}
	return ack.Sequence
}

// streamMsgs is the number of messages on a stream.
func (e *dlqEnv) streamMsgs(name string) uint64 {
	e.t.Helper()
	s, err := e.js.Stream(e.ctx(), name)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(e.ctx())
	if err != nil {
		e.t.Fatal(err)
	}
	return info.State.Msgs
}

// waitDeadLetters waits until the dead-letter stream holds n messages.
func (e *dlqEnv) waitDeadLetters(n uint64) {
	e.t.Helper()
	natstest.Eventually(e.t, 15*time.Second, func() error {
		if got := e.streamMsgs("EVENTS_DLQ"); got != n {
			return fmt.Errorf("%d dead letters, want %d", got, n)
		}
		return nil
	})
}

// run runs the command with the environment's configuration. The audit
// line of replay and purge (TestDLQAuditLine checks it) is taken out of
// stderr, so that the other tests compare what they test.
func (e *dlqEnv) run(args ...string) result {
	e.t.Helper()
	return withoutAudit(e.t, runBridge(e.t, append(args, "--config", e.path)...))
}

func TestDLQList(t *testing.T) {
	// Given three rejected events on ra, two on rb, and one crafted
	// max-deliveries dead letter without a status on ra
	e := newDLQEnv(t, 400)
	var ids []string
	for _, s := range []string{"events.info.a.one", "events.critical.b.two", "events.info.a.three", "events.critical.b.four", "events.info.a.five"} {
		ids = append(ids, e.reject(s))
	}
	e.waitDeadLetters(5)
	crafted := e.craft("ra", "events.info.a.six", "ev-crafted", []byte(`{}`), map[string]string{deadletter.HeaderStatus: ""})

	// When listing as JSON
	r := e.run("dlq", "list", "--json")
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("dlq list --json: %s", r)
	}
	// Then one object per dead letter, with exactly the contract's keys
	got := lines(r.stdout)
	if len(got) != 6 {
		t.Fatalf("%d lines, want 6:\n%s", len(got), r)
	}
	wantKeys := []string{"deliveries", "event_id", "failed_at", "failure", "reason", "route", "seq", "status", "subject"}
	routes := map[string]int{}
	for i, l := range got {
		var obj map[string]any
		if err := json.Unmarshal([]byte(l), &obj); err != nil {
			t.Fatalf("line %d is not JSON: %v\n%s", i, err, l)
		}
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, wantKeys) {
			t.Errorf("line %d keys %v, want %v", i, keys, wantKeys)
		}
		routes[obj["route"].(string)]++
		if i < 5 {
			if obj["event_id"] != ids[i] || obj["reason"] != "rejected" || obj["failure"] != "downstream-status" || obj["status"] != 400.0 || obj["deliveries"] != 1.0 || obj["seq"] != float64(i+1) {
				t.Errorf("line %d = %s, want event %s rejected with 400 on delivery 1", i, l, ids[i])
			}
			if _, err := time.Parse(time.RFC3339, obj["failed_at"].(string)); err != nil {
				t.Errorf("line %d failed_at: %v", i, err)
			}
		}
	}
	if routes["ra"] != 4 || routes["rb"] != 2 {
		t.Errorf("routes %v, want ra 4, rb 2", routes)
	}
	wantCrafted := fmt.Sprintf(`{"seq":%d,"route":"ra","reason":"max-deliveries","failure":"transport","status":0,"event_id":"ev-crafted","subject":"events.info.a.six","deliveries":5,"failed_at":"2026-03-01T10:00:00Z"}`, crafted)
	if got[5] != wantCrafted {
		t.Errorf("crafted dead letter:\n got %s\nwant %s", got[5], wantCrafted)
	}

	// Filters, flags before or after the command, --config from the env
	filters := []struct {
		name string
		args []string
		want int
	}{
		{"route rb", []string{"--route", "rb"}, 2},
		{"route ra", []string{"--route=ra"}, 4},
		{"reason", []string{"--reason", "max-deliveries"}, 1},
		{"route and reason", []string{"--route", "rb", "--reason", "rejected"}, 2},
		{"limit", []string{"--limit", "3"}, 3},
		{"no match route", []string{"--route", "nope"}, 0},
		{"no match reason", []string{"--route", "rb", "--reason", "invalid-event"}, 0},
	}
	for _, f := range filters {
		t.Run(f.name, func(t *testing.T) {
			r := e.run(append([]string{"dlq", "list", "--json"}, f.args...)...)
			if r.code != 0 || len(lines(r.stdout)) != f.want || r.stderr != "" {
				t.Fatalf("want exit 0 and %d lines, got %s", f.want, r)
			}
			for _, l := range lines(r.stdout) {
				for i := 0; i+1 < len(f.args); i += 2 {
					if f.args[i] == "--route" && !strings.Contains(l, `"route":"`+f.args[i+1]+`"`) {
						t.Errorf("line %s does not match --route %s", l, f.args[i+1])
					}
				}
			}
		})
	}
	t.Setenv("BRIDGE_CONFIG", e.path)
	if r := runBridge(t, "dlq", "list", "--json", "--route", "rb"); r.code != 0 || len(lines(r.stdout)) != 2 {
		t.Errorf("dlq list with $BRIDGE_CONFIG: %s", r)
	}

	// The table: a header and one aligned row per dead letter
	r = e.run("dlq", "list")
	tbl := lines(r.stdout)
	if r.code != 0 || len(tbl) != 7 {
		t.Fatalf("dlq list: want exit 0, a header and 6 rows, got %s", r)
	}
	if f := strings.Fields(tbl[0]); strings.Join(f, " ") != "SEQ ROUTE REASON FAILURE STATUS EVENT ID SUBJECT FAILED AT" {
		t.Errorf("header %q", tbl[0])
	}
	col := strings.Index(tbl[0], "EVENT ID")
	for _, row := range tbl[1:] {
		if !strings.HasPrefix(row[col:], "ev-") {
			t.Errorf("row %q: event id not aligned under its header", row)
		}
	}
	if f := strings.Fields(tbl[1]); !slices.Equal(f[:7], []string{"1", "ra", "rejected", "downstream-status", "400", ids[0], "events.info.a.one"}) {
		t.Errorf("row 1 = %q", tbl[1])
	}
	if f := strings.Fields(tbl[6]); !slices.Equal(f, []string{fmt.Sprint(crafted), "ra", "max-deliveries", "transport", "-", "ev-crafted", "events.info.a.six", "2026-03-01T10:00:00Z"}) {
		t.Errorf("crafted row = %q", tbl[6])
	}
	if strings.Contains(r.stdout, `"n":1`) {
		t.Errorf("dlq list printed a payload:\n%s", r)
	}
	// A table that matches nothing: empty stdout, a note on stderr
	if r := e.run("dlq", "list", "--route", "nope"); r.code != 0 || r.stdout != "" || r.stderr != "no dead letters\n" {
		t.Errorf("empty table: %s", r)
	}
}

func TestDLQShow(t *testing.T) {
	e := newDLQEnv(t, 400)
	e.reject("events.info.a.one")
	e.waitDeadLetters(1)
	jsonSeq := e.craft("rb", "events.critical.b.x", "ev-json", []byte(`{"patient":"p-1","readings":[1,2]}`), map[string]string{deadletter.HeaderStatus: "410", "X-Custom": "custom-value"})
	textSeq := e.craft("rb", "events.critical.b.y", "ev-text", []byte("plain text"), nil)

	// The bridge's own dead letter: every dead-letter header, no payload
	r := e.run("dlq", "show", "1")
	if r.code != 0 {
		t.Fatalf("dlq show 1: %s", r)
	}
	for _, h := range []string{"Bridge-Reason: rejected", "Bridge-Failure: downstream-status", "Bridge-Status: 400", "Bridge-Error: ",
		"Bridge-Route: ra", "Bridge-Destination: d", "Bridge-Deliveries: 1", "Bridge-Original-Subject: events.info.a.one",
		"Bridge-Original-Stream: EVENTS", "Bridge-Original-Sequence: 1", "Bridge-Failed-At: ", "Event-Id: ev-1", "Nats-Msg-Id: dlq:ra:EVENTS:1"} {
		if !strings.Contains(r.stdout, "\n  "+h) {
			t.Errorf("dlq show 1 lacks header line %q:\n%s", h, r)
		}
	}
	if strings.Contains(r.stdout, `"n"`) || !strings.Contains(r.stdout, "payload: 7 bytes (--payload to print it)") {
		t.Errorf("dlq show without --payload:\n%s", r)
	}

	// Headers sorted; the payload only with --payload, indented JSON
	r = e.run("dlq", "show", fmt.Sprint(jsonSeq), "--payload")
	if r.code != 0 {
		t.Fatalf("dlq show --payload: %s", r)
	}
	var hdrs []string
	for _, l := range lines(r.stdout) {
		if strings.HasPrefix(l, "  ") && strings.Contains(l, ": ") && !strings.HasPrefix(l, "  \"") {
			hdrs = append(hdrs, l)
		}
	}
	if len(hdrs) != 17 || !slices.IsSorted(hdrs) {
		t.Errorf("want 17 sorted header lines, got %d:\n%s", len(hdrs), strings.Join(hdrs, "\n"))
	}
	if !strings.Contains(r.stdout, "  X-Custom: custom-value\n") || !strings.Contains(r.stdout, "  Bridge-Status: 410\n") {
		t.Errorf("headers missing:\n%s", r)
	}
	wantPayload := "payload (34 bytes):\n{\n  \"patient\": \"p-1\",\n  \"readings\": [\n    1,\n    2\n  ]\n}\n"
	if !strings.HasSuffix(r.stdout, wantPayload) {
		t.Errorf("payload not pretty-printed:\n%s", r)
	}
	r = e.run("dlq", "show", "--payload", fmt.Sprint(textSeq))
	if r.code != 0 || !strings.HasSuffix(r.stdout, "payload (10 bytes):\nplain text\n") {
		t.Errorf("non-JSON payload not printed as is:\n%s", r)
	}

	// Unknown seq: exit 1, a clear message
	r = e.run("dlq", "show", "999")
	if r.code != 1 || r.stderr != "bridge: dead letter 999 not found on EVENTS_DLQ\n" {
		t.Errorf("dlq show 999: %s", r)
	}
}

func TestDLQReplay(t *testing.T) {
	// Given four rejected events, then a destination that accepts
	e := newDLQEnv(t, 400)
	subjects := []string{"events.info.a.one", "events.critical.b.two", "events.info.a.three", "events.critical.b.four"}
	var ids []string
	for _, s := range subjects {
		ids = append(ids, e.reject(s))
	}
	e.waitDeadLetters(4)
	before := e.sink.Count()
	e.sink.SetScript(sinktest.Always(200))
	sourceBefore := e.streamMsgs("EVENTS")

	// --dry-run says what it would do and changes nothing
	r := e.run("dlq", "replay", "--all", "--dry-run")
	want := ""
	for i, s := range subjects {
		want += fmt.Sprintf("would replay dlq_seq=%d id=%s -> %s\n", i+1, ids[i], s)
	}
	want += "dry run: would replay 4, failed 0; nothing changed\n"
	if r.code != 0 || r.stdout != want {
		t.Fatalf("dry run:\n%s\nwant stdout:\n%s", r, want)
	}
	if n := e.streamMsgs("EVENTS_DLQ"); n != 4 {
		t.Errorf("dry run left %d dead letters, want 4", n)
	}
	if n := e.streamMsgs("EVENTS"); n != sourceBefore {
		t.Errorf("dry run published: source stream %d messages, want %d", n, sourceBefore)
	}

	// --keep republishes and leaves the dead letter
	r = e.run("dlq", "replay", "1", "--keep")
	if r.code != 0 || r.stdout != fmt.Sprintf("replayed dlq_seq=1 id=%s -> %s stream=EVENTS seq=5 (kept)\nreplayed 1, duplicates 0, kept 1, failed 0\n", ids[0], subjects[0]) {
		t.Fatalf("replay --keep: %s", r)
	}
	if n := e.streamMsgs("EVENTS_DLQ"); n != 4 {
		t.Errorf("replay --keep left %d dead letters, want 4", n)
	}
	// the same seq again: a duplicate, and now deleted
	r = e.run("dlq", "replay", "1")
	if r.code != 0 || r.stdout != fmt.Sprintf("replayed dlq_seq=1 id=%s -> %s stream=EVENTS seq=5 (duplicate)\nreplayed 1, duplicates 1, kept 0, failed 0\n", ids[0], subjects[0]) {
		t.Fatalf("second replay: %s", r)
	}
	if n := e.streamMsgs("EVENTS"); n != sourceBefore+1 {
		t.Errorf("source stream %d messages after two replays of one dead letter, want %d", n, sourceBefore+1)
	}

	// --all --route, rate-limited, then --all
	r = e.run("dlq", "replay", "--route", "rb", "--all", "--rate", "1000")
	if r.code != 0 || r.stdout != fmt.Sprintf("replayed dlq_seq=2 id=%s -> %s stream=EVENTS seq=6\nreplayed dlq_seq=4 id=%s -> %s stream=EVENTS seq=7\nreplayed 2, duplicates 0, kept 0, failed 0\n", ids[1], subjects[1], ids[3], subjects[3]) {
		t.Fatalf("replay --all --route rb: %s", r)
	}
	r = e.run("dlq", "replay", "--all")
	if r.code != 0 || r.stdout != fmt.Sprintf("replayed dlq_seq=3 id=%s -> %s stream=EVENTS seq=8\nreplayed 1, duplicates 0, kept 0, failed 0\n", ids[2], subjects[2]) {
		t.Fatalf("replay --all: %s", r)
	}
	if n := e.streamMsgs("EVENTS_DLQ"); n != 0 {
		t.Errorf("%d dead letters left, want 0", n)
	}
	// Every event reaches the fixed destination exactly once
	e.sink.WaitCount(t, before+4, 15*time.Second)
	natstest.WaitQuiet(t, e.js, "EVENTS", "ra", 10*time.Second)
	natstest.WaitQuiet(t, e.js, "EVENTS", "rb", 10*time.Second)
	seen := map[string]int{}
	for _, req := range e.sink.Requests()[before:] {
		seen[req.Header.Get(sinktest.EventIDHeader)]++
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Errorf("event %s delivered %d times after the fix, want 1", id, seen[id])
		}
	}
	if len(seen) != 4 {
		t.Errorf("destination saw %v after the fix, want the 4 events once each", seen)
	}

	// Nothing left: a zero count, exit 0; a missing seq: exit 1
	if r := e.run("dlq", "replay", "--all"); r.code != 0 || r.stdout != "replayed 0, duplicates 0, kept 0, failed 0\n" {
		t.Errorf("replay --all of nothing: %s", r)
	}
	if r := e.run("dlq", "replay", "3"); r.code != 1 || r.stderr != "bridge: dead letter 3 not found on EVENTS_DLQ\n" ||
		r.stdout != "replayed 0, duplicates 0, kept 0, failed 1\n" {
		t.Errorf("replay of a replayed seq: %s", r)
	}
}

func TestDLQReplayNotReplayable(t *testing.T) {
	e := newDLQEnv(t, 200)
	bad := e.craft("ra", "events.info.a.x", "ev-bad", []byte(`{}`), map[string]string{deadletter.HeaderOriginalSubject: ""})
	good := e.craft("ra", "events.info.a.y", "ev-good", []byte(`{}`), nil)
	r := e.run("dlq", "replay", "--all", "--dry-run")
	if r.code != 1 || r.stdout != fmt.Sprintf("would replay dlq_seq=%d id=ev-good -> events.info.a.y\ndry run: would replay 1, failed 1; nothing changed\n", good) ||
		r.stderr != fmt.Sprintf("bridge: dead letter %d cannot be replayed: no Bridge-Original-Subject header\n", bad) {
		t.Fatalf("dry run with a bad dead letter: %s", r)
	}
	r = e.run("dlq", "replay", "--all")
	if r.code != 1 || !strings.HasSuffix(r.stdout, "replayed 1, duplicates 0, kept 0, failed 1\n") ||
		r.stderr != fmt.Sprintf("bridge: dead letter %d cannot be replayed: no Bridge-Original-Subject header\n", bad) {
		t.Fatalf("replay with a bad dead letter: %s", r)
	}
	if r := e.run("dlq", "list", "--json"); len(lines(r.stdout)) != 1 || !strings.Contains(r.stdout, fmt.Sprintf(`"seq":%d`, bad)) {
		t.Errorf("want only the bad dead letter left: %s", r)
	}
}

func TestDLQPurge(t *testing.T) {
	e := newDLQEnv(t, 200)
	var ra, rb []uint64
	for i := range 3 {
		ra = append(ra, e.craft("ra", fmt.Sprintf("events.info.a.n%d", i), fmt.Sprintf("a%d", i), []byte(`{}`), nil))
		rb = append(rb, e.craft("rb", fmt.Sprintf("events.critical.b.n%d", i), fmt.Sprintf("b%d", i), []byte(`{}`), nil))
	}
	r := e.run("dlq", "purge", fmt.Sprint(rb[1]))
	if r.code != 0 || r.stdout != fmt.Sprintf("deleted %d\ndeleted 1, failed 0\n", rb[1]) {
		t.Fatalf("purge SEQ: %s", r)
	}
	r = e.run("dlq", "purge", "--all", "--route", "ra")
	if r.code != 0 || r.stdout != fmt.Sprintf("deleted %d\ndeleted %d\ndeleted %d\ndeleted 3, failed 0\n", ra[0], ra[1], ra[2]) {
		t.Fatalf("purge --all --route ra: %s", r)
	}
	r = e.run("dlq", "list", "--json")
	if got := lines(r.stdout); len(got) != 2 || !strings.Contains(got[0], fmt.Sprintf(`"seq":%d,"route":"rb"`, rb[0])) || !strings.Contains(got[1], fmt.Sprintf(`"seq":%d,"route":"rb"`, rb[2])) {
		t.Fatalf("after purges: %s", r)
	}
	// a SEQ outside --route is skipped, a missing one fails
	r = e.run("dlq", "purge", fmt.Sprint(rb[0]), fmt.Sprint(rb[1]), "--route", "ra")
	if r.code != 1 || r.stdout != "deleted 0, failed 1\n" ||
		r.stderr != fmt.Sprintf("bridge: dead letter %d skipped: it does not match --route/--reason\nbridge: dead letter %d not found on EVENTS_DLQ\n", rb[0], rb[1]) {
		t.Fatalf("purge with a skipped and a missing seq: %s", r)
	}
	if r := e.run("dlq", "purge", "--all", "--route", "nope"); r.code != 0 || r.stdout != "deleted 0, failed 0\n" {
		t.Errorf("purge matching nothing: %s", r)
	}
	if r := e.run("dlq", "purge", "--all"); r.code != 0 || len(lines(r.stdout)) != 3 {
		t.Errorf("purge --all: %s", r)
	}
	if n := e.streamMsgs("EVENTS_DLQ"); n != 0 {
		t.Errorf("%d dead letters left, want 0", n)
	}
}

func TestDLQUsage(t *testing.T) {
	unsetenv(t, "BRIDGE_CONFIG")
	// A valid config whose server does not exist: usage errors come first.
	path := writeDLQConfig(t, "nats://127.0.0.1:1", "127.0.0.1:4222", "http://127.0.0.1:9/")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no command", []string{"dlq"}, "dlq needs a command"},
		{"unknown command", []string{"dlq", "drop", "--config", path}, `unknown command "drop"`},
		{"replay without selection", []string{"dlq", "replay", "--config", path}, "needs --all or at least one SEQ"},
		{"replay with both", []string{"dlq", "replay", "--all", "3", "--config", path}, "not both"},
		{"replay bad seq", []string{"dlq", "replay", "abc", "--config", path}, `SEQ "abc" is not a positive integer`},
		{"replay seq zero", []string{"dlq", "replay", "0", "--config", path}, `SEQ "0"`},
		{"replay bad rate", []string{"dlq", "replay", "--all", "--rate", "-1", "--config", path}, "--rate"},
		{"replay bad reason", []string{"dlq", "replay", "--all", "--reason", "bogus", "--config", path}, `--reason "bogus"`},
		{"purge without selection", []string{"dlq", "purge", "--config", path}, "needs --all or at least one SEQ"},
		{"purge with both", []string{"dlq", "purge", "--all", "1", "--config", path}, "not both"},
		{"purge has no reason", []string{"dlq", "purge", "--all", "--reason", "rejected", "--config", path}, "unknown flag: --reason"},
		{"show no seq", []string{"dlq", "show", "--config", path}, "exactly one SEQ"},
		{"show two seqs", []string{"dlq", "show", "1", "2", "--config", path}, "exactly one SEQ"},
		{"show bad seq", []string{"dlq", "show", "-", "--config", path}, `SEQ "-"`},
		{"list argument", []string{"dlq", "list", "extra", "--config", path}, "takes no arguments"},
		{"list negative limit", []string{"dlq", "list", "--limit", "-1", "--config", path}, "--limit"},
		{"list wildcard route", []string{"dlq", "list", "--route", "*", "--config", path}, `--route "*"`},
		{"list unknown flag", []string{"dlq", "list", "--nope", "--config", path}, "unknown flag: --nope"},
		{"no config", []string{"dlq", "list"}, "--config is required"},
		{"missing config file", []string{"dlq", "list", "--config", filepath.Join(t.TempDir(), "none.yaml")}, "none.yaml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runBridge(t, tt.args...)
			if r.code != 2 || r.stdout != "" || !strings.Contains(r.stderr, tt.want) || len(lines(r.stderr)) != 1 || !strings.HasPrefix(r.stderr, "bridge: ") {
				t.Fatalf("want exit 2 and one stderr line containing %q, got %s", tt.want, r)
			}
		})
	}
	if r := runBridge(t, "dlq", "--help"); r.code != 0 || !strings.Contains(r.stdout, "replay      republish dead letters") {
		t.Errorf("dlq help: %s", r)
	}
	// A server that is not there is a runtime failure
	if r := runBridge(t, "dlq", "list", "--config", path); r.code != 1 || !strings.Contains(r.stderr, "cannot reach NATS at nats://127.0.0.1:1: ") || !strings.Contains(r.stderr, "connection refused") || !strings.Contains(r.stderr, "--server") {
		t.Errorf("unreachable server: %s", r)
	}
}

// With no nats.url the commands connect to the running bridge's embedded
// server on nats.embedded.listen. With no bridge and no store there, they
// start no server and create nothing (a stopped bridge's store is served
// privately: test/dlq_stopped_test.go).
func TestDLQEmbeddedListen(t *testing.T) {
	unsetenv(t, "BRIDGE_CONFIG")
	e := newDLQEnv(t, 200)
	seq := e.craft("ra", "events.info.a.x", "ev-1", []byte(`{}`), nil)
	listen := strings.TrimPrefix(e.srv.URL(), "nats://")
	path := writeDLQConfig(t, "", listen, "http://127.0.0.1:9/")
	r := runBridge(t, "dlq", "list", "--json", "--config", path)
	if r.code != 0 || !strings.HasPrefix(r.stdout, fmt.Sprintf(`{"seq":%d,`, seq)) {
		t.Fatalf("dlq list through nats.embedded.listen: %s", r)
	}

	// Nothing listening: exit 1 naming the address, no server started
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free := l.Addr().String()
	l.Close()
	path = writeDLQConfig(t, "", free, "http://127.0.0.1:9/")
	r = runBridge(t, "dlq", "list", "--config", path)
	store := filepath.Join(filepath.Dir(path), "store")
	want := "bridge: nats.embedded.store_dir " + store + " holds no JetStream store, and nats.embedded.listen " + free +
		" does not answer: nats: no servers available for connection (dial tcp " + free + ": connect: connection refused); " +
		"has the bridge run with this configuration, from this directory? Start it with bridge run --config FILE, or point --server at your NATS\n"
	if r.code != 1 || r.stderr != want {
		t.Fatalf("dlq list with no bridge running: %s", r)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(path), "store")); !os.IsNotExist(err) {
		t.Errorf("the dlq command created the embedded store dir (stat: %v): it must not start a server", err)
	}
	if c, err := net.Dial("tcp", free); err == nil {
		c.Close()
		t.Errorf("something listens on %s after the dlq command: it must not start a server", free)
	}
}

func TestDLQMissingStream(t *testing.T) {
	unsetenv(t, "BRIDGE_CONFIG")
	srv := natstest.Start(t) // no bridge ever ran here
	path := writeDLQConfig(t, srv.URL(), "127.0.0.1:4222", "http://127.0.0.1:9/")
	r := runBridge(t, "dlq", "list", "--config", path)
	if r.code != 1 || r.stderr != "bridge: dead-letter stream EVENTS_DLQ does not exist (has the bridge run with this configuration?)\n" {
		t.Fatalf("dlq list without a dead-letter stream: %s", r)
	}
}

// signalWriter sends SIGINT to this process when the first line starting
// with prefix is written: a user pressing Ctrl-C during a replay.
type signalWriter struct {
	mu     sync.Mutex
	b      strings.Builder
	prefix string
	sent   bool
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.sent && strings.HasPrefix(string(p), w.prefix) {
		w.sent = true
		if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
			return 0, err
		}
	}
	return w.b.Write(p)
}

func TestDLQReplayInterrupted(t *testing.T) {
	e := newDLQEnv(t, 200)
	for i := range 5 {
		e.craft("ra", fmt.Sprintf("events.info.a.n%d", i), fmt.Sprintf("ev-%d", i), []byte(`{}`), nil)
	}
	// Given a replay at 2/s, interrupted after the first dead letter: the
	// limiter holds the second for 500 ms, long enough for the signal.
	stdout := &signalWriter{prefix: "replayed "}
	var stderr strings.Builder
	code := run([]string{"dlq", "replay", "--all", "--rate", "2", "--config", e.path}, stdout, &stderr)
	r := withoutAudit(t, result{code: code, stdout: stdout.b.String(), stderr: stderr.String()})
	if r.code != 1 || !strings.HasSuffix(r.stdout, "replayed 1, duplicates 0, kept 0, failed 0\n") || len(lines(r.stdout)) != 2 ||
		r.stderr != "bridge: dlq replay: interrupted after 1 of 5 dead letters\n" {
		t.Fatalf("interrupted replay: %s", r)
	}
	if n := e.streamMsgs("EVENTS_DLQ"); n != 4 {
		t.Fatalf("%d dead letters after the interrupted replay, want 4", n)
	}
	// Then running it again finishes the job
	r = e.run("dlq", "replay", "--all")
	if r.code != 0 || !strings.HasSuffix(r.stdout, "replayed 4, duplicates 0, kept 0, failed 0\n") {
		t.Fatalf("re-run: %s", r)
	}
	if n := e.streamMsgs("EVENTS_DLQ"); n != 0 {
		t.Errorf("%d dead letters left, want 0", n)
	}
}

// dlq show --json and dlq replay --json give scripts the exact values.
func TestDLQShowAndReplayJSON(t *testing.T) {
	e := newDLQEnv(t, 400)
	id := e.reject("events.info.a.one")
	e.sink.SetScript(sinktest.Always(200))

	r := e.run("dlq", "show", "1", "--json", "--payload")
	var show dlqShowJSON
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &show) != nil {
		t.Fatalf("dlq show --json: %s", r)
	}
	if show.Seq != 1 || show.Stream != "EVENTS_DLQ" || show.Headers["Event-Id"][0] != id || show.Payload == nil || *show.Payload != `{"n":1}` || show.PayloadLen != 7 {
		t.Errorf("dlq show --json: %+v", show)
	}

	r = e.run("dlq", "replay", "--all", "--json")
	got := lines(r.stdout)
	if r.code != 0 || len(got) != 2 {
		t.Fatalf("dlq replay --json: %s", r)
	}
	var line replayLine
	var sum replaySummary
	if json.Unmarshal([]byte(got[0]), &line) != nil || line.DLQSeq != 1 || line.EventID != id || line.Stream != "EVENTS" || line.Seq != 2 || line.Kept {
		t.Errorf("replay line %s", got[0])
	}
	if json.Unmarshal([]byte(got[1]), &sum) != nil || sum.Summary.Replayed != 1 || sum.Summary.Failed != 0 {
		t.Errorf("replay summary %s", got[1])
	}
}

// The reported attack through the command: a producer stores its own
// message (another subject and payload, the victim's Event-Id) under the
// Nats-Msg-Id that the replay of dead letter 1 carries, then
// "dlq replay 1": the duplicate is read back, the collision reported, the
// dead letter kept, exit 1. A genuine duplicate (the same replay run again
// after --keep) still counts as replayed and deletes.
func TestDLQReplayCollision(t *testing.T) {
	e := newDLQEnv(t, 400)
	id := e.reject("events.info.a.one")
	e.sink.SetScript(sinktest.Always(200))
	q := deadletter.Open(e.js, e.cfg)
	d, err := q.Get(e.ctx(), 1)
	if err != nil {
		t.Fatal(err)
	}
	h := nats.Header{producer.HeaderEventID: {id}}
	h.Set(jetstream.MsgIDHeader, deadletter.ReplayMsgID(d))
	ack, err := e.js.PublishMsg(e.ctx(), &nats.Msg{Subject: "events.info.a.noise", Header: h, Data: []byte(`{"attacker":true}`)})
	if err != nil {
		t.Fatal(err)
	}
	wantErr := fmt.Sprintf("bridge: dead letter 1 kept: replay collision: EVENTS seq %d holds another message under this replay's Nats-Msg-Id "+
		"(different subject, Bridge-Replayed-From, payload); nothing was stored\n", ack.Sequence)

	r := e.run("dlq", "replay", "1")
	if r.code != 1 || r.stderr != wantErr || r.stdout != "replayed 0, duplicates 0, kept 0, failed 1\n" {
		t.Fatalf("replay onto a planted id: %s\nwant stderr %q", r, wantErr)
	}
	r = e.run("dlq", "replay", "--all", "--json")
	got := lines(r.stdout)
	var line replayLine
	var sum replaySummary
	if r.code != 1 || r.stderr != wantErr || len(got) != 2 || json.Unmarshal([]byte(got[0]), &line) != nil || json.Unmarshal([]byte(got[1]), &sum) != nil {
		t.Fatalf("replay --json onto a planted id: %s", r)
	}
	if want := (replayLine{DLQSeq: 1, EventID: id, Subject: "events.info.a.one", Stream: "EVENTS", Seq: ack.Sequence, Duplicate: true, Kept: true,
		Collision: true, Error: strings.TrimPrefix(strings.TrimSuffix(wantErr, "\n"), "bridge: ")}); line != want {
		t.Errorf("replay --json line %+v, want %+v", line, want)
	}
	if sum.Summary.Replayed != 0 || sum.Summary.Failed != 1 {
		t.Errorf("replay --json summary %s", got[1])
	}
	// the dead letter is still there, with its payload
	if r := e.run("dlq", "show", "1", "--json", "--payload"); r.code != 0 || !strings.Contains(r.stdout, `"payload":"{\"n\":1}"`) {
		t.Errorf("dead letter 1 after the collision: %s", r)
	}
	if n := e.streamMsgs("EVENTS"); n != 2 {
		t.Errorf("source stream holds %d messages, want the event and the planted one", n)
	}
}

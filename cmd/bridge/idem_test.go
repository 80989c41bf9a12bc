package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/idempotency"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/producer"
)

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// thisReplica is the host and pid a record written by this process (the
// in-process bridge) names.
func thisReplica() (host string, pid int) {
	h, _ := os.Hostname()
	r := idempotency.Replica(os.Getpid(), h)
	return r[strings.IndexByte(r, '.')+1:], os.Getpid()
}

// publishEvent publishes event id on subject with payload, under its own
// Nats-Msg-Id msgID (so that the same event id with another payload is
// stored, not deduplicated by JetStream).
func (e *dlqEnv) publishEvent(id, msgID, subject, payload string) {
	e.t.Helper()
	msg, err := producer.NewPublisher(e.js, "events").Message(producer.Event{ID: id, Subject: subject, Payload: []byte(payload)})
	if err != nil {
		e.t.Fatal(err)
	}
	msg.Header.Set(jetstream.MsgIDHeader, msgID)
	if _, err := e.js.PublishMsg(e.ctx(), msg); err != nil {
		e.t.Fatal(err)
	}
}

// doneRecord reads the record of id on route from the bucket, waiting until
// it is done.
func (e *dlqEnv) doneRecord(route, id string) jetstream.KeyValueEntry {
	e.t.Helper()
	kv, err := e.js.KeyValue(e.ctx(), "EVENTS_DELIVERED")
	if err != nil {
		e.t.Fatal(err)
	}
	var entry jetstream.KeyValueEntry
	natstest.Eventually(e.t, 15*time.Second, func() error {
		en, err := kv.Get(e.ctx(), idempotency.Key(route, id))
		if err != nil {
			return err
		}
		if !strings.HasPrefix(string(en.Value()), "done ") {
			return errors.New("not done yet")
		}
		entry = en
		return nil
	})
	return entry
}

// The operator's flow for an event-id-conflict, with exact output at each
// step: an event delivered, a second event under the same id with another
// payload dead-lettered as a conflict; replay skips it; replayed anyway
// (--include) without forgetting, it is a conflict again (the negative
// control: forget is what clears it); idem show names the record, idem
// forget refuses without --yes on a non-terminal stdin, removes it with
// --yes (audit line), and the replay then delivers the second payload. The
// running bridge logs nothing of show and forget.
func TestIdemForgetThenReplayClearsConflict(t *testing.T) {
	var logs natstest.Buffer
	e := newDLQEnvLogging(t, 200, refusalConfig, zerolog.New(&logs).Level(zerolog.DebugLevel))
	payloadA, payloadB := `{"n":"A"}`, `{"n":"B"}`
	e.publishEvent("ev-1", "m-1", "events.info.a.one", payloadA)
	e.sink.WaitCount(t, 1, 15*time.Second)
	entry := e.doneRecord("ra", "ev-1")
	e.publishEvent("ev-1", "m-2", "events.info.a.one", payloadB)
	e.dl++
	e.waitDeadLetters(e.dl)

	// idem show: the record, as text and as JSON
	host, pid := thisReplica()
	written := entry.Created().UTC().Format(time.RFC3339Nano)
	wantShow := fmt.Sprintf(`event ev-1 on route ra
  state:    done
  subject:  events.info.a.one
  payload:  sha256:%s
  written:  %s
  replica:  host %s, pid %d
  message:  EVENTS seq 1, delivery 1
  key:      ra.b.ZXYtMQ (bucket EVENTS_DELIVERED, revision %d)
`, sha256Hex([]byte(payloadA)), written, host, pid, entry.Revision())
	if r := e.run("idem", "show", "ev-1"); r.code != 0 || r.stdout != wantShow || r.stderr != "" {
		t.Fatalf("idem show: %s\nwant stdout:\n%s", r, wantShow)
	}
	wantJSON := fmt.Sprintf(`{"route":"ra","event_id":"ev-1","state":"done","subject":"events.info.a.one","payload_sha256":"%s","written":"%s","host":"%s","pid":%d,"stream":"EVENTS","seq":1,"delivered":1,"bucket":"EVENTS_DELIVERED","key":"ra.b.ZXYtMQ","revision":%d}`+"\n",
		sha256Hex([]byte(payloadA)), written, host, pid, entry.Revision())
	if r := e.run("idem", "show", "ev-1", "--route", "ra", "--json"); r.code != 0 || r.stdout != wantJSON || r.stderr != "" {
		t.Fatalf("idem show --json: %s\nwant stdout:\n%s", r, wantJSON)
	}

	// Replay skips the conflict
	if r := e.run("dlq", "replay", "--all"); r.code != 0 || r.stdout != "replayed 0, duplicates 0, kept 0, failed 0, skipped 1\n" {
		t.Fatalf("replay: %s", r)
	}
	// Negative control: replayed without forgetting, it is a conflict again
	if r := e.run("dlq", "replay", "--all", "--include", "event-id-conflict"); r.code != 0 || !strings.HasSuffix(r.stdout, "replayed 1, duplicates 0, kept 0, failed 0\n") {
		t.Fatalf("replay --include before forget: %s", r)
	}
	natstest.Eventually(t, 15*time.Second, func() error {
		r := e.run("dlq", "list", "--json")
		if !strings.HasPrefix(r.stdout, `{"seq":2,"route":"ra","reason":"event-id-conflict"`) {
			return fmt.Errorf("dead letters: %s", r.stdout)
		}
		return nil
	})
	if n := e.sink.Count(); n != 1 {
		t.Fatalf("%d requests before the forget, want 1", n)
	}
	// (the bridge's lines about the conflict are all out once it names
	// the dead letter; that they reach logs is the control of the check
	// that show and forget log nothing)
	natstest.Eventually(t, 15*time.Second, func() error {
		if !strings.Contains(logs.String(), `"dlq_seq":2`) {
			return errors.New("the second conflict is not logged yet")
		}
		return nil
	})
	logsBefore := logs.String()

	// forget refuses without --yes when stdin is not a terminal
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin := os.Stdin
	os.Stdin = pr
	r := e.run("idem", "forget", "ev-1", "--route", "ra")
	os.Stdin = stdin
	pr.Close()
	pw.Close()
	if r.code != 2 || r.stdout != "" || r.stderr != "bridge: idem forget: stdin is not a terminal: give --yes to forget without a question\n" {
		t.Fatalf("forget without --yes: %s", r)
	}
	if r := e.run("idem", "show", "ev-1"); r.code != 0 || r.stdout != wantShow {
		t.Fatalf("the record after a refused forget: %s", r)
	}

	// forget --yes removes it, with the audit line
	since := time.Now()
	r = runBridge(t, "idem", "forget", "ev-1", "--route", "ra", "--yes", "--config", e.path)
	if r.code != 0 || r.stdout != fmt.Sprintf("forgot event ev-1 on route ra (was done, revision %d)\n", entry.Revision()) {
		t.Fatalf("forget --yes: %s", r)
	}
	wantAudit := fmt.Sprintf("route=ra event_id=ev-1 bucket=EVENTS_DELIVERED key=ra.b.ZXYtMQ revision=%d state=done payload_sha256=%s result=forgotten", entry.Revision(), sha256Hex([]byte(payloadA)))
	if got := auditLine(t, r, "idem forget", since); got != wantAudit || withoutAudit(t, r).stderr != "" {
		t.Fatalf("forget audit:\n got %s\nwant %s\n%s", got, wantAudit, r)
	}
	if l := leaks(r.stderr, "events.info.a.one", `"n"`); l != nil {
		t.Errorf("forget's stderr holds %v", l)
	}
	if r := e.run("idem", "show", "ev-1"); r.code != 1 || r.stdout != "" || r.stderr != "bridge: no idempotency record of event ev-1 on route ra\n" {
		t.Fatalf("idem show after forget: %s", r)
	}
	r = runBridge(t, "idem", "forget", "ev-1", "--route", "ra", "--yes", "--config", e.path)
	if got := auditLine(t, r, "idem forget", since); r.code != 1 || got != "route=ra event_id=ev-1 bucket=EVENTS_DELIVERED result=not-found" ||
		withoutAudit(t, r).stderr != "bridge: no idempotency record of event ev-1 on route ra\n" {
		t.Fatalf("forget of nothing: %s", r)
	}
	if got := logs.String(); got != logsBefore {
		t.Errorf("the running bridge logged during idem show and forget:\n%s", strings.TrimPrefix(got, logsBefore))
	}

	// Then the replay delivers the second payload, and its record stands
	if r := e.run("dlq", "replay", "--all", "--include", "event-id-conflict"); r.code != 0 || r.stdout != "replayed dlq_seq=2 id=ev-1 -> events.info.a.one stream=EVENTS seq=4\nreplayed 1, duplicates 0, kept 0, failed 0\n" {
		t.Fatalf("replay after forget: %s", r)
	}
	e.sink.WaitCount(t, 2, 15*time.Second)
	if got := string(e.sink.Requests()[1].Body); !strings.Contains(got, payloadB) {
		t.Errorf("second request body %s, want payload B", got)
	}
	e.doneRecord("ra", "ev-1")
	if r := e.run("idem", "show", "ev-1", "--json"); r.code != 0 || !strings.Contains(r.stdout, `"payload_sha256":"`+sha256Hex([]byte(payloadB))+`"`) || !strings.Contains(r.stdout, `"seq":4,`) {
		t.Errorf("record after the replay: %s", r)
	}
	if n := e.streamMsgs("EVENTS_DLQ"); n != 0 {
		t.Errorf("%d dead letters left, want 0", n)
	}
}

// Records written by earlier releases show, with what they do not hold
// as "unknown"; without --route, show searches every idempotent route.
func TestIdemShowOldRecords(t *testing.T) {
	e := newDLQEnvFrom(t, 200, refusalConfig)
	e.publishEvent("ev-0", "m-0", "events.info.a.zero", `{}`)
	e.doneRecord("ra", "ev-0") // the bucket exists
	kv, err := e.js.KeyValue(e.ctx(), "EVENTS_DELIVERED")
	if err != nil {
		t.Fatal(err)
	}
	digest := sha256Hex([]byte(`{}`))
	for id, value := range map[string]string{
		"v010": "done EVENTS/" + digest + "/events.info.a.old 5 2",
		"v000": "inflight EVENTS 7 1",
	} {
		if _, err := kv.Put(e.ctx(), idempotency.Key("ra", id), []byte(value)); err != nil {
			t.Fatal(err)
		}
	}
	show := func(id string) (string, jetstream.KeyValueEntry) {
		en, err := kv.Get(e.ctx(), idempotency.Key("ra", id))
		if err != nil {
			t.Fatal(err)
		}
		r := e.run("idem", "show", id)
		if r.code != 0 || r.stderr != "" {
			t.Fatalf("idem show %s: %s", id, r)
		}
		return r.stdout, en
	}
	got, en := show("v010")
	if want := fmt.Sprintf("event v010 on route ra\n  state:    done\n  subject:  events.info.a.old\n  payload:  sha256:%s\n  written:  %s\n  replica:  unknown\n  message:  EVENTS seq 5, delivery 2\n  key:      ra.b.djAxMA (bucket EVENTS_DELIVERED, revision %d)\n",
		digest, en.Created().UTC().Format(time.RFC3339Nano), en.Revision()); got != want {
		t.Errorf("0.1.0 record:\n%s\nwant:\n%s", got, want)
	}
	got, en = show("v000")
	if want := fmt.Sprintf("event v000 on route ra\n  state:    inflight\n  subject:  unknown\n  payload:  unknown\n  written:  %s\n  replica:  unknown\n  message:  EVENTS seq 7, delivery 1\n  key:      ra.b.djAwMA (bucket EVENTS_DELIVERED, revision %d)\n",
		en.Created().UTC().Format(time.RFC3339Nano), en.Revision()); got != want {
		t.Errorf("pre-0.1.0 record:\n%s\nwant:\n%s", got, want)
	}
	if r := e.run("idem", "show", "v000", "--json"); r.code != 0 || !strings.Contains(r.stdout, `"subject":"","payload_sha256":"",`) || !strings.Contains(r.stdout, `"host":"","pid":0,`) {
		t.Errorf("pre-0.1.0 record as JSON: %s", r)
	}
	// An unreadable record is reported without its value
	if _, err := kv.Put(e.ctx(), idempotency.Key("ra", "bad"), []byte("done SECRET-VALUE")); err != nil {
		t.Fatal(err)
	}
	if r := e.run("idem", "show", "bad"); r.code != 1 || r.stderr != "bridge: unreadable record (17 bytes)\n" {
		t.Errorf("unreadable record: %s", r)
	}
}

// Bad usage exits 2 before connecting; a configuration without an
// idempotent route says so.
func TestIdemUsage(t *testing.T) {
	e := newDLQEnvFrom(t, 200, refusalConfig)
	for _, c := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"idem", "show"}, "bridge: idem show takes exactly one EVENT_ID, got 0 arguments\n"},
		{[]string{"idem", "show", "a", "b"}, "bridge: idem show takes exactly one EVENT_ID, got 2 arguments\n"},
		{[]string{"idem", "show", "a", "--route", "a.b"}, "bridge: idem show: --route \"a.b\" is not a route name\n"},
		{[]string{"idem", "show", "a", "--route", "rb"}, "bridge: idem show: --route rb is not a route with idempotency: true (those are: ra)\n"},
		{[]string{"idem", "forget", "a", "--yes"}, "bridge: idem forget needs --route (idem show lists the routes that hold a record)\n"},
	} {
		if r := e.run(c.args...); r.code != 2 || r.stdout != "" || r.stderr != c.stderr {
			t.Errorf("%v: %s\nwant stderr %q", c.args, r, c.stderr)
		}
	}
	path := writeDLQConfig(t, e.srv.URL(), "127.0.0.1:4222", e.sink.URL())
	if r := runBridge(t, "idem", "show", "a", "--config", path); r.code != 2 || r.stderr != "bridge: idem show: no route has idempotency: true in this configuration\n" {
		t.Errorf("no idempotent route: %s", r)
	}
}

// The confirmation prompt: only "y" or "yes" forgets.
func TestConfirm(t *testing.T) {
	for in, want := range map[string]bool{"y\n": true, "YES\n": true, " yes \n": true, "n\n": false, "\n": false, "": false, "yess\n": false,
		strings.Repeat("y", 100) + "\n": false} {
		var out strings.Builder
		got, err := confirm(strings.NewReader(in), &out, "Forget it? [y/N] ")
		if err != nil || got != want || out.String() != "Forget it? [y/N] " {
			t.Errorf("confirm(%q) = %v, %v (prompt %q), want %v", in, got, err, out.String(), want)
		}
	}
}

// "idem show" without --route names every route it searched.
func TestIdemNotFoundText(t *testing.T) {
	for routes, want := range map[string]string{
		"ra":    "no idempotency record of event ev-1 on route ra",
		"ra rc": "no idempotency record of event ev-1 on routes ra, rc",
	} {
		var ee *exitError
		if err := notFound("ev-1", strings.Fields(routes)); !errors.As(err, &ee) || ee.Code != 1 || ee.Msg != want {
			t.Errorf("notFound(%s) = %v, want exit 1 %q", routes, err, want)
		}
	}
}

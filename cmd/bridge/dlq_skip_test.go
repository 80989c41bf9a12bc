package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/deadletter"
)

// permanentEnv is a running bridge whose destination accepts everything,
// with three crafted dead letters on route ra: seq 1 rejected, seq 2
// invalid-event, seq 3 event-id-conflict.
func permanentEnv(t *testing.T) *dlqEnv {
	t.Helper()
	e := newDLQEnv(t, 200)
	e.craft("ra", "events.info.a.one", "ev-ok", []byte(`{}`), map[string]string{deadletter.HeaderReason: string(deadletter.ReasonRejected)})
	e.craft("ra", "events.info.a.two", "ev-invalid", []byte(`{}`), map[string]string{deadletter.HeaderReason: string(deadletter.ReasonInvalidEvent)})
	e.craft("ra", "events.info.a.three", "ev-conflict", []byte(`{}`), map[string]string{deadletter.HeaderReason: string(deadletter.ReasonEventIDConflict)})
	return e
}

// Replay leaves alone the dead letters whose reason is permanent for the
// payload (invalid-event, event-id-conflict), lists them with why on a dry
// run, counts them otherwise, and replays them when --include names their
// reason.
func TestDLQReplaySkipsPermanentReasons(t *testing.T) {
	e := permanentEnv(t)

	// A dry run lists each skipped one with why, and counts it
	r := e.run("dlq", "replay", "--all", "--dry-run")
	want := "would replay dlq_seq=1 id=ev-ok -> events.info.a.one\n" +
		"would skip dlq_seq=2 id=ev-invalid -> events.info.a.two: reason invalid-event is permanent for the payload (--include invalid-event replays it)\n" +
		"would skip dlq_seq=3 id=ev-conflict -> events.info.a.three: reason event-id-conflict is permanent for the payload (--include event-id-conflict replays it)\n" +
		"dry run: would replay 1, failed 0, skipped 2; nothing changed\n"
	if r.code != 0 || r.stdout != want || r.stderr != "" {
		t.Fatalf("dry run: %s\nwant stdout:\n%s", r, want)
	}
	// So does the JSON of a dry run
	r = e.run("dlq", "replay", "--all", "--dry-run", "--json")
	wantJSON := `{"dlq_seq":1,"event_id":"ev-ok","subject":"events.info.a.one","duplicate":false,"kept":false,"dry_run":true}` + "\n" +
		`{"dlq_seq":2,"event_id":"ev-invalid","subject":"events.info.a.two","duplicate":false,"kept":true,"dry_run":true,"skipped":"invalid-event"}` + "\n" +
		`{"dlq_seq":3,"event_id":"ev-conflict","subject":"events.info.a.three","duplicate":false,"kept":true,"dry_run":true,"skipped":"event-id-conflict"}` + "\n" +
		`{"summary":{"replayed":1,"duplicates":0,"kept":0,"failed":0,"skipped":2,"dry_run":true}}` + "\n"
	if r.code != 0 || r.stdout != wantJSON || r.stderr != "" {
		t.Fatalf("dry run --json: %s\nwant stdout:\n%s", r, wantJSON)
	}

	// A replay skips them, counts them, and says how to list and include them
	r = e.run("dlq", "replay", "--all")
	if r.code != 0 || r.stdout != "replayed dlq_seq=1 id=ev-ok -> events.info.a.one stream=EVENTS seq=1\nreplayed 1, duplicates 0, kept 0, failed 0, skipped 2\n" ||
		r.stderr != "bridge: skipped 2: reason permanent for the payload (invalid-event, event-id-conflict); --dry-run lists them, --include REASON replays them\n" {
		t.Fatalf("replay: %s", r)
	}
	if n := e.streamMsgs("EVENTS_DLQ"); n != 2 {
		t.Fatalf("%d dead letters left, want the 2 skipped", n)
	}
	// Named by SEQ, a skipped one is still skipped
	r = e.run("dlq", "replay", "3")
	if r.code != 0 || r.stdout != "replayed 0, duplicates 0, kept 0, failed 0, skipped 1\n" || e.streamMsgs("EVENTS_DLQ") != 2 {
		t.Fatalf("replay 3: %s", r)
	}

	// --include replays the reasons it names, and only those
	r = e.run("dlq", "replay", "--all", "--include", "invalid-event")
	if r.code != 0 || r.stdout != "replayed dlq_seq=2 id=ev-invalid -> events.info.a.two stream=EVENTS seq=2\nreplayed 1, duplicates 0, kept 0, failed 0, skipped 1\n" {
		t.Fatalf("replay --include invalid-event: %s", r)
	}
	r = e.run("dlq", "replay", "--all", "--include", "invalid-event", "--include", "event-id-conflict")
	if r.code != 0 || r.stdout != "replayed dlq_seq=3 id=ev-conflict -> events.info.a.three stream=EVENTS seq=3\nreplayed 1, duplicates 0, kept 0, failed 0\n" || r.stderr != "" {
		t.Fatalf("replay --include both: %s", r)
	}
	e.sink.WaitCount(t, 3, 15*time.Second)

	// --include takes only the reasons that are skipped
	r = e.run("dlq", "replay", "--all", "--include", "rejected")
	if r.code != 2 || r.stderr != `bridge: dlq replay: --include "rejected": only invalid-event and event-id-conflict are skipped (permanent for the payload)`+"\n" {
		t.Errorf("--include rejected: %s", r)
	}
}

// The rule itself, for library users: which reasons are permanent for
// the payload, and what Skip answers.
func TestPermanentForPayload(t *testing.T) {
	for _, r := range deadletter.Reasons {
		want := r == deadletter.ReasonInvalidEvent || r == deadletter.ReasonEventIDConflict
		if r.PermanentForPayload() != want {
			t.Errorf("%s.PermanentForPayload() = %v, want %v", r, !want, want)
		}
	}
	if got := fmt.Sprint(permanentReasons); got != "[invalid-event event-id-conflict]" {
		t.Errorf("permanentReasons = %s", got)
	}
}

// Every dlq replay and purge writes one audit line to stderr: who, when,
// what (filters, counts, sequences), and nothing that came from NATS: a
// dead letter whose payload, headers, event id and subject carry markers
// leaves none of them in stderr. Negative control: the same markers are in
// stdout (the result lines print the event id), so the check sees them
// where they are.
func TestDLQAuditLine(t *testing.T) {
	e := newDLQEnv(t, 200)
	markers := []string{"MARKER-PAYLOAD", "MARKER-HEADER", "MARKER-ID", "MARKERSUBJ", "MARKER-ERROR"}
	e.craft("ra", "events.info.a.MARKERSUBJ", "MARKER-ID", []byte(`{"note":"MARKER-PAYLOAD"}`),
		map[string]string{"X-Note": "MARKER-HEADER", deadletter.HeaderError: "MARKER-ERROR"})
	e.craft("ra", "events.info.a.two", "ev-invalid", []byte(`{}`), map[string]string{deadletter.HeaderReason: string(deadletter.ReasonInvalidEvent)})

	since := time.Now()
	r := runBridge(t, "dlq", "replay", "--all", "--dry-run", "--config", e.path)
	if got, want := auditLine(t, r, "dlq replay", since), "all=true seqs=- route=- reason=- include=- dry_run=true keep=false replayed=1 duplicates=0 kept=0 failed=0 skipped=1 replayed_seqs=- skipped_seqs=2 failed_seqs=-"; got != want {
		t.Errorf("dry run audit:\n got %s\nwant %s", got, want)
	}
	r = runBridge(t, "dlq", "replay", "--all", "--route", "ra", "--reason", "max-deliveries", "--config", e.path)
	if r.code != 0 {
		t.Fatalf("replay: %s", r)
	}
	if got, want := auditLine(t, r, "dlq replay", since), "all=true seqs=- route=ra reason=max-deliveries include=- dry_run=false keep=false replayed=1 duplicates=0 kept=0 failed=0 skipped=0 replayed_seqs=1 skipped_seqs=- failed_seqs=-"; got != want {
		t.Errorf("replay audit:\n got %s\nwant %s", got, want)
	}
	if l := leaks(r.stderr, markers...); l != nil {
		t.Errorf("stderr of replay holds %v:\n%s", l, r.stderr)
	}
	if l := leaks(r.stdout, markers...); len(l) != 2 || l[0] != "MARKER-ID" || l[1] != "MARKERSUBJ" {
		t.Fatalf("negative control: stdout holds %v, want the event id and subject markers: the check cannot see them", l)
	}

	r = runBridge(t, "dlq", "replay", "2", "9", "--include", "invalid-event", "--keep", "--config", e.path)
	if got, want := auditLine(t, r, "dlq replay", since), "all=false seqs=2,9 route=- reason=- include=invalid-event dry_run=false keep=true replayed=1 duplicates=0 kept=1 failed=1 skipped=0 replayed_seqs=2 skipped_seqs=- failed_seqs=9"; r.code != 1 || got != want {
		t.Errorf("replay by SEQ audit (exit %d):\n got %s\nwant %s", r.code, got, want)
	}

	r = runBridge(t, "dlq", "purge", "2", "9", "--route", "ra", "--config", e.path)
	if got, want := auditLine(t, r, "dlq purge", since), "all=false seqs=2,9 route=ra reason=- deleted=1 failed=1 deleted_seqs=2 failed_seqs=9"; r.code != 1 || got != want {
		t.Errorf("purge audit (exit %d):\n got %s\nwant %s", r.code, got, want)
	}

	// Bad usage changes nothing and writes no audit line
	if r := runBridge(t, "dlq", "purge", "--config", e.path); r.code != 2 || withoutAudit(t, r).stderr != r.stderr {
		t.Errorf("purge without a selection: %s", r)
	}
}

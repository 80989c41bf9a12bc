package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/natstest"
)

// stream is the EVENTS stream on events.> of one test's embedded server.
type stream struct {
	url string
	s   jetstream.Stream
}

// startStream starts an embedded JetStream with the stream EVENTS on
// events.> and a one-minute duplicate window.
func startStream(t *testing.T) *stream {
	t.Helper()
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL())
	s, err := js.CreateStream(t.Context(), jetstream.StreamConfig{
		Name: "EVENTS", Subjects: []string{"events.>"}, Duplicates: time.Minute,
	})
	if err != nil {
		t.Fatalf("CreateStream: %v", err)
	}
	return &stream{url: srv.URL(), s: s}
}

// msgs is the number of messages stored.
func (s *stream) msgs(t *testing.T) uint64 {
	t.Helper()
	info, err := s.s.Info(t.Context())
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	return info.State.Msgs
}

// get reads the stored message seq.
func (s *stream) get(t *testing.T, seq uint64) *jetstream.RawStreamMsg {
	t.Helper()
	m, err := s.s.GetMsg(t.Context(), seq)
	if err != nil {
		t.Fatalf("GetMsg %d: %v", seq, err)
	}
	return m
}

// outcome is what one run of the command did.
type outcome struct {
	code           int
	stdout, stderr string
}

// runPublish runs the command in process with stdin as its input.
func runPublish(t *testing.T, stdin string, args ...string) outcome {
	t.Helper()
	var stdout, stderr strings.Builder
	code := run(args, strings.NewReader(stdin), &stdout, &stderr)
	return outcome{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// mustPublish runs the command and fails the test unless it exits 0.
func mustPublish(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	o := runPublish(t, stdin, args...)
	if o.code != 0 || o.stderr != "" {
		t.Fatalf("publish %q: exit %d, stderr %q (want 0, empty)", args, o.code, o.stderr)
	}
	return o.stdout
}

// resultLine matches one text result.
var resultLine = regexp.MustCompile(`^(stored|duplicate) (\S+) id=(\S+) stream=(\S+) seq=(\d+)$`)

// parseLines splits text output into results.
func parseLines(t *testing.T, out string) [][]string {
	t.Helper()
	var rs [][]string
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		m := resultLine.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("output line %q does not match %s", l, resultLine)
		}
		rs = append(rs, m[1:])
	}
	return rs
}

func TestPublishDuplicateInsideWindow(t *testing.T) {
	s := startStream(t)
	args := []string{"--url", s.url, "--type", "sensor.fall", "--severity", "critical", "--id", "fall-1", `{"room":12}`}

	// Given an event stored once, when the same id is published again
	// inside the duplicate window, then it is reported as a duplicate of
	// the same sequence and not stored again.
	first := mustPublish(t, "", args...)
	second := mustPublish(t, "", args...)

	if want := "stored events.critical.sensor.fall id=fall-1 stream=EVENTS seq=1\n"; first != want {
		t.Errorf("first publish printed %q, want %q", first, want)
	}
	if want := "duplicate events.critical.sensor.fall id=fall-1 stream=EVENTS seq=1\n"; second != want {
		t.Errorf("second publish printed %q, want %q", second, want)
	}
	if n := s.msgs(t); n != 1 {
		t.Errorf("stream holds %d messages, want 1", n)
	}
}

func TestPublishHeaders(t *testing.T) {
	s := startStream(t)
	tests := []struct {
		name        string
		args        []string
		wantSubject string
		wantHeaders map[string]string
		wantData    string
	}{
		{
			name:        "type and severity",
			args:        []string{"--type", "sensor.fall", "--severity", "critical", "--id", "h-1", "--meta", "Room=12", "--meta", "ward_id=b", `{"resident":"r-7"}`},
			wantSubject: "events.critical.sensor.fall",
			wantHeaders: map[string]string{
				"Nats-Msg-Id": "h-1", "Event-Id": "h-1", "Event-Type": "sensor.fall",
				"Event-Severity": "CRITICAL", "Event-Meta-Room": "12", "Event-Meta-ward_id": "b",
				"Content-Type": "application/json",
			},
			wantData: `{"resident":"r-7"}`,
		},
		{
			name:        "type derived from the subject",
			args:        []string{"--subject", "events.warning.door.open", "--id", "h-2"},
			wantSubject: "events.warning.door.open",
			wantHeaders: map[string]string{
				"Nats-Msg-Id": "h-2", "Event-Id": "h-2", "Event-Type": "door.open",
				"Event-Severity": "WARNING", "Content-Type": "application/json",
			},
			wantData: "{}",
		},
		{
			name:        "explicit severity wins over the subject's",
			args:        []string{"--subject", "events.info.note", "--severity", "Warning", "--type", "care.note", "--id", "h-3", `"x"`},
			wantSubject: "events.info.note",
			wantHeaders: map[string]string{
				"Event-Id": "h-3", "Event-Type": "care.note", "Event-Severity": "WARNING",
			},
			wantData: `"x"`,
		},
		{
			name:        "default severity info and custom root",
			args:        []string{"--root", "events.home", "--type", "order.created", "--id", "h-4", "[]"},
			wantSubject: "events.home.info.order.created",
			wantHeaders: map[string]string{"Event-Type": "order.created", "Event-Severity": "INFO"},
			wantData:    "[]",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := mustPublish(t, "", append([]string{"--url", s.url}, tt.args...)...)
			r := parseLines(t, out)[0]
			if r[1] != tt.wantSubject {
				t.Errorf("subject %q, want %q", r[1], tt.wantSubject)
			}
			var seq uint64
			fmt.Sscan(r[4], &seq)
			m := s.get(t, seq)
			if m.Subject != tt.wantSubject {
				t.Errorf("stored subject %q, want %q", m.Subject, tt.wantSubject)
			}
			for k, want := range tt.wantHeaders {
				// Index the map: metadata keys are stored as given,
				// not canonicalised.
				if got := m.Header[k]; len(got) != 1 || got[0] != want {
					t.Errorf("header %s = %q, want [%q] (all: %v)", k, got, want, m.Header)
				}
			}
			if string(m.Data) != tt.wantData {
				t.Errorf("data %q, want %q", m.Data, tt.wantData)
			}
		})
	}
}

func TestPublishNoStreamCapturesSubject(t *testing.T) {
	s := startStream(t)
	const payload = `{"secret-payload":"p-123"}`

	o := runPublish(t, "", "--url", s.url, "--subject", "orders.info.created", payload)

	if o.code != 1 {
		t.Errorf("exit %d, want 1", o.code)
	}
	want := "publish: no stream captures subject orders.info.created (is the bridge running, or the stream created?)\n"
	if o.stderr != want {
		t.Errorf("stderr %q, want %q", o.stderr, want)
	}
	if o.stdout != "" {
		t.Errorf("stdout %q, want nothing", o.stdout)
	}
}

func TestPublishJSONOutput(t *testing.T) {
	s := startStream(t)

	out := mustPublish(t, "", "--url", s.url, "--json", "--type", "order.created", "--id", "j-1", "{}")
	dup := mustPublish(t, "", "--json", "--url", s.url, "--type", "order.created", "--id", "j-1", "{}")

	for i, line := range []string{out, dup} {
		var got result
		dec := json.NewDecoder(strings.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&got); err != nil {
			t.Fatalf("output %q is not one JSON result: %v", line, err)
		}
		want := result{ID: "j-1", Subject: "events.info.order.created", Stream: "EVENTS", Seq: 1, Duplicate: i == 1}
		if got != want {
			t.Errorf("result %d = %+v, want %+v", i, got, want)
		}
		if strings.Count(line, "\n") != 1 {
			t.Errorf("output %q is not exactly one line", line)
		}
	}
}

func TestPublishJSONL(t *testing.T) {
	s := startStream(t)
	input := `{"id":"l-1","type":"sensor.fall","severity":"critical","metadata":{"Room":"12"},"payload":{"a": [1, 2]}}

{"id":"l-2","subject":"events.warning.door.open","payload":"text"}
{"id":"l-1","type":"sensor.fall","severity":"critical","payload":{}}
`
	out := mustPublish(t, input, "--url", s.url, "--jsonl", "-")

	want := "stored events.critical.sensor.fall id=l-1 stream=EVENTS seq=1\n" +
		"stored events.warning.door.open id=l-2 stream=EVENTS seq=2\n" +
		"duplicate events.critical.sensor.fall id=l-1 stream=EVENTS seq=1\n"
	if out != want {
		t.Errorf("output:\n%s\nwant:\n%s", out, want)
	}
	if n := s.msgs(t); n != 2 {
		t.Errorf("stream holds %d messages, want 2", n)
	}
	m := s.get(t, 1)
	if got := string(m.Data); got != `{"a": [1, 2]}` {
		t.Errorf("payload %q, want the raw JSON as written", got)
	}
	if got := m.Header["Event-Meta-Room"]; len(got) != 1 || got[0] != "12" {
		t.Errorf("Event-Meta-Room = %q, want [12]", got)
	}
	m = s.get(t, 2)
	if got, want := m.Header.Get("Event-Severity"), "WARNING"; got != want {
		t.Errorf("Event-Severity from the subject = %q, want %q", got, want)
	}
	if got, want := m.Header.Get("Event-Type"), "door.open"; got != want {
		t.Errorf("Event-Type from the subject = %q, want %q", got, want)
	}
}

func TestPublishJSONLFromFileWithJSONOutput(t *testing.T) {
	s := startStream(t)
	path := filepath.Join(t.TempDir(), "events.jsonl")
	if err := os.WriteFile(path, []byte(`{"type":"a.b"}`+"\n"+`{"type":"a.c"}`), 0o600); err != nil {
		t.Fatal(err)
	}

	out := mustPublish(t, "", "--jsonl", path, "--json", "--url", s.url)

	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("output %q: want 2 lines", out)
	}
	for i, l := range lines {
		var r result
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("line %d %q: %v", i+1, l, err)
		}
		if r.Seq != uint64(i+1) || r.ID == "" || r.Duplicate {
			t.Errorf("line %d = %+v, want seq %d, an id, not a duplicate", i+1, r, i+1)
		}
	}
}

func TestPublishJSONLBadLine(t *testing.T) {
	tests := []struct {
		name    string
		bad     string
		wantErr string
	}{
		{"malformed JSON", `{"type":"a.b",`, "invalid JSON"},
		{"not an object", `["a"]`, "not a JSON object"},
		{"unknown field", `{"type":"a.b","serverity":"info"}`, `unknown field "serverity"`},
		{"no type or subject", `{"id":"x"}`, `give "type" or "subject"`},
		{"bad severity", `{"type":"a.b","severity":"loud"}`, `severity "loud" is not one of info, warning, critical`},
		{"bad metadata key", `{"type":"a.b","metadata":{"a b":"c"}}`, `metadata key "a b"`},
		{"metadata not strings", `{"type":"a.b","metadata":{"n":1}}`, `field "metadata": want a string, got a JSON number`},
		{"uncaptured subject", `{"subject":"orders.info.x"}`, "no stream captures subject orders.info.x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startStream(t)
			input := `{"id":"ok-1","type":"a.b"}` + "\n\n" + `{"id":"ok-2","type":"a.b"}` + "\n" + tt.bad + "\n" + `{"id":"after","type":"a.b"}` + "\n"

			o := runPublish(t, input, "--url", s.url, "--jsonl", "-")

			if o.code != 1 {
				t.Errorf("exit %d, want 1", o.code)
			}
			if !strings.HasPrefix(o.stderr, "publish: line 4: ") || !strings.Contains(o.stderr, tt.wantErr) ||
				!strings.HasSuffix(o.stderr, "; 2 events published before it\n") || strings.Count(o.stderr, "\n") != 1 {
				t.Errorf("stderr %q, want one line \"publish: line 4: ...%s...; 2 events published before it\"", o.stderr, tt.wantErr)
			}
			if got := len(parseLines(t, o.stdout)); got != 2 {
				t.Errorf("printed %d results, want 2", got)
			}
			if n := s.msgs(t); n != 2 {
				t.Errorf("stream holds %d messages, want the 2 before the bad line", n)
			}
		})
	}
}

func TestPublishFlagsAfterPayload(t *testing.T) {
	s := startStream(t)

	out := mustPublish(t, "", `{"late":true}`, "--type", "sensor.fall", "--url", s.url, "--id", "late-1")

	if want := "stored events.info.sensor.fall id=late-1 stream=EVENTS seq=1\n"; out != want {
		t.Errorf("printed %q, want %q", out, want)
	}
	if got := string(s.get(t, 1).Data); got != `{"late":true}` {
		t.Errorf("payload %q", got)
	}

	// After "--" everything is the payload, even a leading "-".
	out = mustPublish(t, "", "--url", s.url, "--type", "n", "--id", "late-2", "--", "-5")
	if got := string(s.get(t, 2).Data); got != "-5" || !strings.HasPrefix(out, "stored ") {
		t.Errorf("payload %q, output %q", got, out)
	}
}

func TestPublishPayloadFromFile(t *testing.T) {
	s := startStream(t)
	path := filepath.Join(t.TempDir(), "p.json")
	if err := os.WriteFile(path, []byte(`{"from":"file"}`), 0o600); err != nil {
		t.Fatal(err)
	}

	mustPublish(t, "", "--url", s.url, "--type", "a", "--file", path)
	mustPublish(t, `{"from":"stdin"}`, "--url", s.url, "--type", "a", "--file", "-")

	for seq, want := range map[uint64]string{1: `{"from":"file"}`, 2: `{"from":"stdin"}`} {
		if got := string(s.get(t, seq).Data); got != want {
			t.Errorf("seq %d payload %q, want %q", seq, got, want)
		}
	}

	o := runPublish(t, "", "--url", s.url, "--type", "a", "--file", filepath.Join(t.TempDir(), "missing.json"))
	if o.code != 1 || !strings.HasPrefix(o.stderr, "publish: --file: ") {
		t.Errorf("missing file: exit %d, stderr %q; want 1 and publish: --file: ...", o.code, o.stderr)
	}
}

func TestPublishDefaultIDIsUnique(t *testing.T) {
	s := startStream(t)

	first := parseLines(t, mustPublish(t, "", "--url", s.url, "--type", "a.b"))[0]
	second := parseLines(t, mustPublish(t, "", "--url", s.url, "--type", "a.b"))[0]

	if first[2] == second[2] {
		t.Errorf("both events got id %q", first[2])
	}
	if first[0] != "stored" || second[0] != "stored" || first[4] != "1" || second[4] != "2" {
		t.Errorf("results %v and %v: want two stored events, seq 1 and 2", first, second)
	}
	if got := s.get(t, 2).Header.Get("Nats-Msg-Id"); got != second[2] {
		t.Errorf("Nats-Msg-Id %q, want the printed id %q", got, second[2])
	}
}

func TestPublishURLFromEnvironment(t *testing.T) {
	s := startStream(t)
	t.Setenv("NATS_URL", s.url)

	out := mustPublish(t, "", "--type", "a.b", "--id", "env-1")

	if !strings.HasPrefix(out, "stored events.info.a.b id=env-1 ") {
		t.Errorf("printed %q", out)
	}
}

// The server is -s/--server (or its old spelling --url), else $NATS_URL.
func TestPublishServerPrecedence(t *testing.T) {
	s := startStream(t)
	dead := "nats://127.0.0.1:1"
	t.Setenv("NATS_URL", dead)
	for _, flag := range []string{"--server", "-s", "--url", "-server"} {
		if o := runPublish(t, "", flag, s.url, "--type", "a.b"); o.code != 0 {
			t.Errorf("%s over $NATS_URL: exit %d, stderr %q", flag, o.code, o.stderr)
		}
	}
	o := runPublish(t, "", "--type", "a.b")
	if o.code != 1 || !strings.Contains(o.stderr, "cannot reach NATS at "+dead+": ") {
		t.Errorf("$NATS_URL without a flag: exit %d, stderr %q", o.code, o.stderr)
	}
	t.Setenv("NATS_URL", s.url)
	if o := runPublish(t, "", "--server", dead, "--type", "a.b"); o.code != 1 || !strings.Contains(o.stderr, dead) {
		t.Errorf("--server must win over $NATS_URL: exit %d, stderr %q", o.code, o.stderr)
	}
}

func TestPublishBadUsage(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // in the one-line error
	}{
		{"unknown flag", []string{"--type", "a", "--colour", "red"}, "-colour"},
		{"bad severity", []string{"--type", "a", "--severity", "loud"}, "--severity"},
		{"payload and file", []string{"--type", "a", "--file", "p.json", "{}"}, "--file"},
		{"jsonl and payload", []string{"--jsonl", "-", "{}"}, "--jsonl"},
		{"jsonl and file", []string{"--jsonl", "-", "--file", "p.json"}, "--jsonl"},
		{"jsonl and type", []string{"--jsonl", "-", "--type", "a"}, "--type"},
		{"jsonl and meta", []string{"--meta", "a=b", "--jsonl", "-"}, "--meta"},
		{"meta without =", []string{"--type", "a", "--meta", "room"}, "--meta"},
		{"meta with empty key", []string{"--type", "a", "--meta", "=12"}, "--meta"},
		{"meta key twice", []string{"--type", "a", "--meta", "k=1", "--meta", "k=2"}, "--meta"},
		{"meta key not a header name", []string{"--type", "a", "--meta", "a b=1"}, "--meta"},
		{"meta value with CRLF", []string{"--type", "a", "--meta", "a=1\r\nX-Evil: 1"}, "--meta"},
		{"no type or subject", []string{"{}"}, "--type or --subject"},
		{"two payloads", []string{"--type", "a", "{}", "{}"}, "PAYLOAD"},
		{"bad subject", []string{"--subject", "events.*.x"}, "--subject"},
		{"bad type", []string{"--type", "a..b"}, "--type"},
		{"bad root", []string{"--root", "a b", "--type", "x"}, "--root"},
		{"id with newline", []string{"--type", "a", "--id", "a\nb"}, "--id"},
		{"bad URL", []string{"--type", "a", "--url", "nats://u:p@[::1"}, "--server"},
		{"two auth methods", []string{"--type", "a", "--token", "t", "--user", "u"}, "not --user and --token"},
		{"password without user", []string{"--type", "a", "--password", "p"}, "--password"},
		{"cert without key", []string{"--type", "a", "--tls-cert", "c.pem"}, "--tls-key"},
		{"bad bool", []string{"--type", "a", "--json=maybe"}, "-json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Nothing listens here: bad usage is caught before connecting.
			o := runPublish(t, "", append([]string{"--url", "nats://127.0.0.1:1"}, tt.args...)...)

			if o.code != 2 {
				t.Errorf("exit %d, want 2 (stderr %q)", o.code, o.stderr)
			}
			if !strings.HasPrefix(o.stderr, "publish: ") || strings.Count(o.stderr, "\n") != 1 || !strings.Contains(o.stderr, tt.want) {
				t.Errorf("stderr %q, want one line starting \"publish: \" naming %q", o.stderr, tt.want)
			}
			if o.stdout != "" {
				t.Errorf("stdout %q, want nothing", o.stdout)
			}
		})
	}
}

// A payload that is not JSON is stored, with a warning on stderr that
// envelope destinations will dead-letter it; a JSON one gets no warning.
func TestPublishWarnsOnNonJSONPayload(t *testing.T) {
	s := startStream(t)
	o := runPublish(t, "", "--server", s.url, "--type", "a.b", "--id", "nj-1", "not json")
	if o.code != 0 || !strings.HasPrefix(o.stdout, "stored events.info.a.b id=nj-1 ") {
		t.Fatalf("exit %d, stdout %q, stderr %q: want it stored", o.code, o.stdout, o.stderr)
	}
	if !strings.HasPrefix(o.stderr, "publish: warning: the payload is not JSON") || !strings.Contains(o.stderr, "format: envelope") ||
		!strings.Contains(o.stderr, "format: raw") || strings.Count(o.stderr, "\n") != 1 || strings.Contains(o.stderr, "not json") {
		t.Errorf("stderr %q: want one warning naming the cause and the fix, without the payload", o.stderr)
	}
	if got := string(s.get(t, 1).Data); got != "not json" {
		t.Errorf("stored %q", got)
	}
	if o := runPublish(t, "", "--server", s.url, "--type", "a.b", `{"ok":1}`); o.code != 0 || o.stderr != "" {
		t.Errorf("JSON payload: exit %d, stderr %q", o.code, o.stderr)
	}
}

func TestPublishConnectFailureHidesSecrets(t *testing.T) {
	// Given a URL with credentials and nothing listening, the error names
	// the server without its user info and exits 1.
	tests := []struct {
		name   string
		args   []string
		secret string
	}{
		{"password in URL", []string{"--url", "nats://alice:s3cret-pw@127.0.0.1:1"}, "s3cret-pw"},
		{"token in URL", []string{"--url", "nats://t0ken-value@127.0.0.1:1"}, "t0ken-value"},
		{"token flag", []string{"--url", "127.0.0.1:1", "--token", "t0ken-flag"}, "t0ken-flag"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := runPublish(t, "", append(tt.args, "--type", "a", `{"payload-canary":1}`)...)

			if o.code != 1 {
				t.Errorf("exit %d, want 1", o.code)
			}
			if !strings.HasPrefix(o.stderr, "publish: cannot reach NATS at nats://") || !strings.Contains(o.stderr, "127.0.0.1:1: ") ||
				!strings.Contains(o.stderr, "connection refused") || !strings.Contains(o.stderr, "--server") {
				t.Errorf("stderr %q, want the connection failure naming the server, the cause and the fix", o.stderr)
			}
			for _, leak := range []string{tt.secret, "payload-canary"} {
				if strings.Contains(o.stderr, leak) {
					t.Errorf("stderr %q contains %q", o.stderr, leak)
				}
			}
		})
	}
}

func TestRedactURL(t *testing.T) {
	tests := []struct{ in, want string }{
		{"nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"nats://u:p@h:4222", "nats://xxxxx@h:4222"},
		{"tok@h:4222", "nats://xxxxx@h:4222"},
		{"nats://a:b@h1:4222, tls://h2:4222", "nats://xxxxx@h1:4222,tls://h2:4222"},
	}
	for _, tt := range tests {
		if got := redactURL(tt.in); got != tt.want {
			t.Errorf("redactURL(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// The files the README publishes (examples/) are valid as they are.
func TestPublishExampleFiles(t *testing.T) {
	s := startStream(t)
	out := mustPublish(t, "", "--server", s.url, "--jsonl", "../../examples/events.jsonl")
	if n := len(parseLines(t, out)); n != 4 {
		t.Errorf("examples/events.jsonl published %d events, want 4:\n%s", n, out)
	}
	for _, f := range []string{"order.json", "reading.json"} {
		o := runPublish(t, "", "--server", s.url, "--type", "example.file", "--file", "../../examples/"+f)
		if o.code != 0 || o.stderr != "" {
			t.Errorf("examples/%s: exit %d, stderr %q (want JSON, no warning)", f, o.code, o.stderr)
		}
	}
}

package bridge

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
	"github.com/sotercare/jetbridge/subjects"
)

// sevCanary is an Event-Severity value that is no severity: it must never
// reach a log line (it is named "invalid" there).
const sevCanary = "sev-canary-Q9zX"

// mismatchLog is the message of the line that reports ignored headers.
const mismatchLog = "Event-Severity header ignored"

// counterValue reads one counter series from a registry: name and its
// labels; false when the series does not exist.
func counterValue(reg prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, false
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if len(got) != len(labels) {
				continue
			}
			for k, v := range labels {
				if got[k] != v {
					continue series
				}
			}
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

// A producer allowed only on events.info.> sets Event-Severity: CRITICAL:
// the subject's severity token wins. Five such events reach the
// destination as INFO (X-Event-Severity and the envelope's severity); a
// garbage value on a warning subject is ignored too (WARNING, not a dead
// letter); a header that agrees is not a mismatch; a subject without a
// severity token still takes the header. bridge_event_severity_mismatch_total
// is exactly 6 on the route and exists at 0 on a route without traffic;
// exactly one log line reports the ignored headers, naming the severities,
// never the garbage value. Control: the old precedence (the header wins),
// injected through the messages the bridge receives (headerWins), is caught.
func TestEventSeverityHeaderCannotOverrideSubject(t *testing.T) {
	check := func(t testing.TB, tweak func(*Bridge)) error {
		sink := sinktest.New(t, nil)
		cfg := testConfig(t, `
destinations:
  d: {url: %s}
routes:
  - {name: r, subjects: ["events.*.order.>", "events.order"], destination: d, max_in_flight: 1}
  - {name: quiet, subjects: ["events.*.quiet.>"], destination: d}
`, sink.URL())
		h := startTweaked(t, natstest.Start(t), cfg, tweak)
		want := map[string]string{} // event id -> severity at the destination
		for i := range 5 {
			id := fmt.Sprintf("forged-%d", i)
			h.publish("events.info.order.created", id, []byte(`{}`), map[string]string{"Event-Severity": "CRITICAL"})
			want[id] = "INFO"
		}
		h.publish("events.warning.order.created", "garbage", []byte(`{}`), map[string]string{"Event-Severity": sevCanary})
		want["garbage"] = "WARNING"
		h.publish("events.critical.order.created", "agrees", []byte(`{}`), map[string]string{"Event-Severity": "critical"})
		want["agrees"] = "CRITICAL"
		h.publish("events.order", "no-token", []byte(`{}`), map[string]string{"Event-Severity": "CRITICAL"})
		want["no-token"] = "CRITICAL"

		out := h.waitOutcomes(len(want), settleWait, nil)
		reqs := sink.Requests()
		for _, r := range reqs {
			id := r.Header.Get("X-Event-Id")
			var body struct {
				Severity string `json:"severity"`
			}
			if err := json.Unmarshal(r.Body, &body); err != nil {
				return fmt.Errorf("event %s: envelope: %v", id, err)
			}
			if got := r.Header.Get("X-Event-Severity"); got != want[id] || body.Severity != want[id] {
				return fmt.Errorf("event %s: X-Event-Severity %q, envelope severity %q, want %s", id, got, body.Severity, want[id])
			}
		}
		if len(out) != len(want) {
			return fmt.Errorf("%d settled, want %d", len(out), len(want))
		}
		for _, s := range out {
			if s.Outcome != OutcomeDelivered {
				return fmt.Errorf("event %s: outcome %s (%v), want delivered", s.EventID, s.Outcome, s.Err)
			}
		}
		if len(reqs) != len(want) {
			return fmt.Errorf("the destination got %d requests, want %d", len(reqs), len(want))
		}

		for route, wantN := range map[string]float64{"r": 6, "quiet": 0} {
			n, ok := counterValue(h.reg, "bridge_event_severity_mismatch_total", map[string]string{"route": route})
			if !ok || n != wantN {
				return fmt.Errorf("bridge_event_severity_mismatch_total{route=%q} = %v (present %t), want %v", route, n, ok, wantN)
			}
		}

		logs := h.logs.String()
		if strings.Contains(logs, sevCanary) {
			return fmt.Errorf("a log line carries the Event-Severity value")
		}
		var lines []string
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, mismatchLog) {
				lines = append(lines, l)
			}
		}
		if len(lines) != 1 {
			return fmt.Errorf("%d log lines report ignored Event-Severity headers, want 1 for 6", len(lines))
		}
		for _, field := range []string{`"route":"r"`, `"subject_severity":"INFO"`, `"header_severity":"CRITICAL"`, `"ignored":1`, `"level":"warn"`} {
			if !strings.Contains(lines[0], field) {
				return fmt.Errorf("the log line lacks %s: %s", field, lines[0])
			}
		}
		return nil
	}
	if err := check(t, nil); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "the header wins (the old precedence)", func(t testing.TB) error { return check(t, headerWins) })
}

// gateSink is a destination that records the order of its requests (event
// id and X-Event-Severity) and holds the first one until release is closed.
type gateSink struct {
	srv     *httptest.Server
	release chan struct{}
	once    sync.Once

	mu  sync.Mutex
	got []string // "id severity", in arrival order
}

func newGateSink(t testing.TB) *gateSink {
	s := &gateSink{release: make(chan struct{})}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.got = append(s.got, r.Header.Get("X-Event-Id")+" "+r.Header.Get("X-Event-Severity"))
		first := len(s.got) == 1
		s.mu.Unlock()
		if first {
			select {
			case <-s.release:
			case <-r.Context().Done():
			}
		}
	}))
	t.Cleanup(func() { s.free(); s.srv.Close() })
	return s
}

func (s *gateSink) free() { s.once.Do(func() { close(s.release) }) }

func (s *gateSink) arrivals() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.got...)
}

// The flow-control gate ranks an event by its subject's severity, not by
// a forged Event-Severity: with concurrency 1 and one request in flight,
// an info-subject event with Event-Severity: CRITICAL waits as INFO, and
// a CRITICAL-subject event that arrives after it goes first. Control: the
// old precedence (the header wins) is caught.
func TestEventSeverityHeaderCannotJumpTheGate(t *testing.T) {
	check := func(t testing.TB, tweak func(*Bridge)) error {
		sink := newGateSink(t)
		cfg := testConfig(t, `
destinations:
  d:
    url: %s
    timeout: 1m
    concurrency: {max: 1}
    circuit_breaker: {enabled: false}
routes:
  - {name: r, subjects: ["events.>"], destination: d, max_in_flight: 8}
`, sink.srv.URL)
		h := startTweaked(t, natstest.Start(t), cfg, tweak)
		t.Cleanup(sink.free) // before the bridge stops: a check that failed early leaves the first request held
		g := h.b.dests["d"].gate
		waiting := func() map[string]int { return g.Status().Waiting }
		total := func() int {
			n := 0
			for _, v := range waiting() {
				n += v
			}
			return n
		}

		h.publish("events.info.order.block", "block", []byte(`{}`), nil)
		if !waitUntil(settleWait, func() bool { return len(sink.arrivals()) == 1 }) {
			return fmt.Errorf("the first event never reached the destination")
		}
		h.publish("events.info.order.created", "forged", []byte(`{}`), map[string]string{"Event-Severity": "CRITICAL"})
		if !waitUntil(settleWait, func() bool { return total() == 1 }) {
			return fmt.Errorf("the forged event never waited at the gate: %v", waiting())
		}
		h.publish("events.critical.order.created", "critical", []byte(`{}`), nil)
		if !waitUntil(settleWait, func() bool { return total() == 2 }) {
			return fmt.Errorf("the critical event never waited at the gate: %v", waiting())
		}
		if w := waiting(); w["INFO"] != 1 || w["CRITICAL"] != 1 || w["WARNING"] != 0 {
			return fmt.Errorf("waiting at the gate by severity %v, want INFO 1 (the forged event), CRITICAL 1", w)
		}
		sink.free()
		if out := h.waitOutcomes(3, settleWait, outcomeIs(OutcomeDelivered)); len(out) != 3 {
			return fmt.Errorf("%d delivered, want 3", len(out))
		}
		want := []string{"block INFO", "critical CRITICAL", "forged INFO"}
		if got := sink.arrivals(); strings.Join(got, ",") != strings.Join(want, ",") {
			return fmt.Errorf("arrival order %q, want %q", got, want)
		}
		return nil
	}
	if err := check(t, nil); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "the header wins (the old precedence)", func(t testing.TB) error { return check(t, headerWins) })
}

// The Event-Severity rule, case by case: a subject's severity token
// decides, a disagreeing header is named (its severity, or "invalid"),
// never its value; without a token the header decides, and a value that
// is no severity is an invalid event.
func TestSeverityRule(t *testing.T) {
	for _, tt := range []struct {
		subject, header string
		want            subjects.Severity
		ignored         string
		invalid         bool
	}{
		{"events.info.order.created", "", subjects.Info, "", false},
		{"events.info.order.created", "CRITICAL", subjects.Info, "CRITICAL", false},
		{"events.info.order.created", "warning", subjects.Info, "WARNING", false},
		{"events.info.order.created", "info", subjects.Info, "", false},
		{"events.warning.x", sevCanary, subjects.Warning, severityInvalid, false},
		{"events.critical.x", "INFO", subjects.Critical, "INFO", false},
		{"events.critical.x", "Critical", subjects.Critical, "", false},
		{"events.order", "CRITICAL", subjects.Critical, "", false},
		{"events.order", "", subjects.Info, "", false},
		{"events.order", sevCanary, subjects.Info, "", true},
		{"events.INFO.x", "CRITICAL", subjects.Critical, "", false}, // an upper-case token is no severity token
		{"events.info", "CRITICAL", subjects.Critical, "", false},   // no type after the token: no severity token
	} {
		typ, fromSubject := subjects.Describe(tt.subject)
		sev, ignored, err := severityOf(tt.header, fromSubject, typ != tt.subject)
		if sev != tt.want || ignored != tt.ignored || (err != nil) != tt.invalid {
			t.Errorf("%s with Event-Severity %q: %s, ignored %q, error %v; want %s, ignored %q, invalid %t",
				tt.subject, tt.header, sev, ignored, err, tt.want, tt.ignored, tt.invalid)
		}
	}
}

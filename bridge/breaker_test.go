package bridge

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
)

// While the breaker is open the destination receives nothing but the
// half-open probes, every transition is logged once, and a route to another
// destination keeps delivering meanwhile.
func TestCircuitBreakerIsolatesTheFailingDestination(t *testing.T) {
	check := func(t testing.TB, f faults) error {
		down := sinktest.New(t, sinktest.Always(503))
		up := sinktest.New(t, sinktest.Always(200))
		cfg := testConfig(t, `
destinations:
  down:
    url: %s
    transport_retry: {count: 0}
    circuit_breaker: {failure_rate: 0.5, min_requests: 4, window: 30s, delay: 150ms, statuses: [503]}
  up:
    url: %s
routes:
  - name: a
    subjects: ["events.*.a.>"]
    destination: down
    max_in_flight: 1
    max_deliver: 1000
    backoff: [5ms]
  - name: b
    subjects: ["events.*.b.>"]
    destination: up
`, down.URL(), up.URL())
		h := startBridge(t, cfg, f)
		for i := range 5 {
			h.publish("events.info.a.x", fmt.Sprintf("a%d", i), []byte(`{}`), nil)
		}
		// Let the breaker cycle open -> half-open -> open a few times.
		if !waitUntil(5*time.Second, func() bool { return countOf(h.transitions(), "down:half-open->open") >= 3 }) {
			return fmt.Errorf("the breaker did not open and probe: transitions %v, %d requests", h.transitions(), down.Count())
		}
		for i := range 50 {
			h.publish("events.info.b.x", fmt.Sprintf("b%d", i), []byte(`{}`), nil)
		}
		delivered := h.waitOutcomes(50, settleWait, func(s Settled) bool { return s.Route == "b" && s.Outcome == OutcomeDelivered })
		if len(delivered) != 50 || up.Count() != 50 {
			return fmt.Errorf("route b delivered %d (destination saw %d), want 50 and 50", len(delivered), up.Count())
		}
		// Snapshot at a moment the breaker is open after a failed probe: the
		// probe's request has arrived, the next half-open is 150 ms away.
		var requests int
		var trans []string
		ok := waitUntil(5*time.Second, func() bool {
			before := h.transitions()
			if len(before) == 0 || before[len(before)-1] != "down:half-open->open" {
				return false
			}
			requests = down.Count()
			trans = h.transitions()
			return len(trans) == len(before)
		})
		if !ok {
			return fmt.Errorf("the breaker never settled open after a failed probe; transitions %v", h.transitions())
		}
		if trans[0] != "down:closed->open" {
			return fmt.Errorf("first transition %q, want down:closed->open", trans[0])
		}
		if countOf(trans, "down:half-open->closed") != 0 {
			return fmt.Errorf("breaker closed although every request failed: %v", trans)
		}
		probes := countOf(trans, "down:open->half-open")
		if want := 4 + probes; requests != want {
			return fmt.Errorf("destination received %d requests, want exactly %d (4 before opening + %d probes)", requests, want, probes)
		}
		h.stop()
		// One warning for the outage (the breaker never closed), saying how
		// many messages are held and when the next probe is due; each failed
		// probe at debug level, not one warning per transition.
		logs, all := h.logs.String(), h.transitions()
		opened := logLines(logs, `"level":"warn"`, `"message":"circuit breaker opened`)
		if opened != 1 || !strings.Contains(logs, `"next_probe_in":"`) || !strings.Contains(logs, `"held":`) {
			return fmt.Errorf("%d outage warnings logged (want 1, with held and next_probe_in)", opened)
		}
		if failed := logLines(logs, `"level":"debug"`, `"message":"half-open probe failed`); failed != countOf(all, "down:half-open->open") {
			return fmt.Errorf("%d failed probes logged, want %d", failed, countOf(all, "down:half-open->open"))
		}
		return nil
	}
	if err := check(t, faults{}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "breaker that ignores failing statuses", func(t testing.TB) error {
		return check(t, faults{breakerIgnoresStatuses: true})
	})
}

// An outage far longer than max_deliver × backoff dead-letters nothing:
// messages refused by the open breaker are held, not redelivered.
func TestLongOutageDeadLettersNothing(t *testing.T) {
	check := func(t testing.TB, f faults) error {
		sink := sinktest.New(t, sinktest.Always(503))
		cfg := testConfig(t, `
destinations:
  d:
    url: %s
    transport_retry: {count: 0}
    circuit_breaker: {failure_rate: 0.5, min_requests: 3, window: 30s, delay: 50ms, statuses: [503]}
routes:
  - name: r
    subjects: ["events.>"]
    destination: d
    max_deliver: 2
    backoff: [20ms]
    max_in_flight: 4
`, sink.URL())
		h := startBridge(t, cfg, f)
		for i := range 6 {
			h.publish("events.info.x", fmt.Sprintf("e%d", i), []byte(`{}`), nil)
		}
		// The outage lasts 8 failed probes: far beyond max_deliver × backoff.
		if !waitUntil(5*time.Second, func() bool { return countOf(h.transitions(), "d:half-open->open") >= 8 }) {
			return fmt.Errorf("breaker did not cycle: %v", h.transitions())
		}
		sink.SetScript(sinktest.Always(200))
		h.waitOutcomes(6, 5*time.Second, outcomeIs(OutcomeDelivered))
		if dead := h.waitOutcomes(1, 0, outcomeIs(OutcomeDeadLettered)); len(dead) != 0 {
			return fmt.Errorf("%d messages dead-lettered during the outage, want 0", len(dead))
		}
		if delivered := h.waitOutcomes(6, 0, outcomeIs(OutcomeDelivered)); len(delivered) != 6 {
			return fmt.Errorf("%d of 6 delivered after the outage", len(delivered))
		}
		h.quiet("r")
		return nil
	}
	if err := check(t, faults{}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "open breaker spends the delivery budget", func(t testing.TB) error {
		return check(t, faults{noHold: true})
	})
}

// A dead letter that cannot be stored leaves the message for redelivery;
// once the dead-letter stream is back, it lands exactly once.
func TestDeadLetterStreamUnavailable(t *testing.T) {
	check := func(t testing.TB, f faults) error {
		sink := sinktest.New(t, sinktest.Always(400))
		cfg := testConfig(t, `
destinations:
  d:
    url: %s
`+routeYAML, sink.URL(), 100, "50ms")
		h := startBridge(t, cfg, f)
		ctx := context.Background()
		if err := h.js.DeleteStream(ctx, cfg.DeadLetter.Stream); err != nil {
			t.Fatalf("delete dead-letter stream: %v", err)
		}
		h.publish("events.info.x", "e1", []byte(`{}`), nil)
		if got := h.waitOutcomes(2, 3*time.Second, outcomeIs(OutcomeRedeliveryScheduled)); len(got) != 2 {
			return fmt.Errorf("the message was not kept for redelivery while the dead-letter stream was missing (outcomes %+v)", h.outcomes())
		}
		if _, err := h.js.CreateStream(ctx, deadLetterStreamConfig(cfg.DeadLetter)); err != nil {
			t.Fatalf("recreate dead-letter stream: %v", err)
		}
		h.waitOutcomes(1, 3*time.Second, outcomeIs(OutcomeDeadLettered))
		h.quiet("r")
		if dl := h.deadLetters(); len(dl) != 1 || dl[0].Header.Get(deadletter.HeaderReason) != string(deadletter.ReasonRejected) {
			return fmt.Errorf("%d dead letters after the stream came back, want exactly 1 (rejected)", len(dl))
		}
		return nil
	}
	if err := check(t, faults{}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "terminate without a stored dead letter", func(t testing.TB) error {
		return check(t, faults{termWithoutDeadLetter: true})
	})
}

func countOf(xs []string, x string) int {
	n := 0
	for _, s := range xs {
		if strings.EqualFold(s, x) {
			n++
		}
	}
	return n
}

// Transitions that arrive swapped (failsafe-go calls its listener outside
// its lock) are reported in chain order.
func TestBreakerTransitionsReportedInOrder(t *testing.T) {
	d := &destination{name: "d"}
	var got []string
	report := func(_ string, from, to BreakerState) { got = append(got, from.String()+"->"+to.String()) }
	d.transition(BreakerClosed, BreakerOpen, report)
	d.transition(BreakerHalfOpen, BreakerClosed, report) // arrives before its predecessor
	d.transition(BreakerOpen, BreakerHalfOpen, report)
	want := []string{"closed->open", "open->half-open", "half-open->closed"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("reported %v, want %v", got, want)
	}
}

// While the breaker stays open, a warning repeats at a falling rate (each
// interval at least twice the one before), saying how long the outage has
// lasted, how many messages are held and when the next probe is due; the
// closing says how long it lasted. The intervals are lower bounds: a timer
// never fires early.
func TestOutageRemindersFallInRate(t *testing.T) {
	down := sinktest.New(t, sinktest.Always(503))
	cfg := testConfig(t, `
destinations:
  d:
    url: %s
    transport_retry: {count: 0}
    circuit_breaker: {failure_rate: 0.5, min_requests: 1, window: 30s, delay: 10s, statuses: [503]}
routes:
  - {name: r, subjects: ["events.>"], destination: d, max_in_flight: 1, backoff: [5ms]}
`, down.URL())
	const first = 20 * time.Millisecond
	lines := &stampedLines{}
	h := startTweaked(t, natstest.Start(t), cfg, func(b *Bridge) {
		d := b.dests["d"]
		d.reminders.InitialInterval = first
		d.log = zerolog.New(lines).With().Str("destination", "d").Logger()
	})
	h.publish("events.info.x", "e1", []byte(`{}`), nil)
	reminder := `"message":"circuit breaker still open`
	if !waitUntil(settleWait, func() bool { return len(lines.matching(reminder)) >= 3 }) {
		t.Fatalf("%d reminders logged, want 3", len(lines.matching(reminder)))
	}
	opened := lines.matching(`"message":"circuit breaker opened`)
	if len(opened) != 1 {
		t.Fatalf("%d outage warnings, want 1", len(opened))
	}
	at := []stampedLine{opened[0]}
	for _, l := range lines.matching(reminder)[:3] {
		var rec struct {
			Held    *int   `json:"held"`
			Next    string `json:"next_probe_in"`
			OpenFor string `json:"open_for"`
		}
		if err := json.Unmarshal([]byte(l.text), &rec); err != nil || rec.Held == nil || rec.Next == "" || rec.OpenFor == "" {
			t.Fatalf("reminder without held, next_probe_in or open_for (%v): %s", err, l.text)
		}
		at = append(at, l)
	}
	for i := 1; i < len(at); i++ {
		if gap, want := at[i].at.Sub(at[i-1].at), first<<(i-1); gap < want {
			t.Errorf("reminder %d came %s after the previous line, want at least %s", i, gap, want)
		}
	}
}

// stampedLines records each log line with the time it was written.
type stampedLines struct {
	mu    sync.Mutex
	lines []stampedLine
}

type stampedLine struct {
	at   time.Time
	text string
}

func (s *stampedLines) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lines = append(s.lines, stampedLine{at: time.Now(), text: string(p)})
	return len(p), nil
}

func (s *stampedLines) matching(part string) []stampedLine {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []stampedLine
	for _, l := range s.lines {
		if strings.Contains(l.text, part) {
			out = append(out, l)
		}
	}
	return out
}

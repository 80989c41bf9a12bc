package bridge

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
)

// A destination URL's path may carry its secret (Slack- and
// Discord-style webhooks): the try span's url.full shows scheme://host:port/…
// unless log.url_paths is on, and no span attribute or event carries the
// path. Negative control: with log.url_paths on, the same check finds the
// canary.
func TestSpanURLWithoutPath(t *testing.T) {
	const canary = "T000/B000/CANARY-8e1f"
	check := func(t testing.TB, urlPaths bool) error {
		sink := sinktest.New(t, sinktest.Always(200))
		cfg := testConfig(t, `
log: {url_paths: %t}
destinations:
  d: {url: "%s/services/%s?token=q"}
routes:
  - {name: r, subjects: ["events.>"], destination: d}
`, urlPaths, sink.URL(), canary)
		rec, tp := recorder()
		h := startHarness(t, natstest.Start(t), cfg, faults{}, withTracing(tp, false))
		h.publish("events.info.x", "e1", []byte(`{}`), nil)
		h.waitOutcomes(1, settleWait, nil)
		var tries int
		for _, s := range rec.Ended() {
			all := fmt.Sprint(s.Attributes(), s.Events(), s.Name())
			if strings.Contains(all, "CANARY") {
				return fmt.Errorf("span %q carries the URL path: %s", s.Name(), all)
			}
			if full := attrOf(s, "url.full"); full.AsString() != "" {
				tries++
				if want := sink.URL() + "/…"; full.AsString() != want {
					return fmt.Errorf("url.full = %q, want %q", full.AsString(), want)
				}
			}
		}
		if tries != 1 {
			return fmt.Errorf("%d spans with url.full, want 1", tries)
		}
		return nil
	}
	if err := check(t, false); err != nil {
		t.Error(err)
	}
	expectBroken(t, "log.url_paths on", func(t testing.TB) error { return check(t, true) })
}

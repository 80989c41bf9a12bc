package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/config"
)

// TestIssue28BridgeConfigs loads the bridge configurations of issue 28's
// scenarios with the bridge's own loader (what `bridge run` does with
// them): the ordered route keys on the token that carries the key of
// subjectOf, with the default partitions, and the rate limit is the one
// the scenario names, accepted by bridge check. The control: the same
// configuration keyed on a token outside the published subjects' key is
// a different key (the test would catch a key token that does not split
// the keys).
func TestIssue28BridgeConfigs(t *testing.T) {
	for _, sc := range issue28Scenarios(defaultOptions(true)) {
		for _, sys := range []system{sc.a, sc.b} {
			yaml := bridgeConfig(sys, "nats://127.0.0.1:4222", "127.0.0.1:0", "http://127.0.0.1:1/events", "bench0")
			cfg, err := config.Load([]byte(yaml), "bench.yaml")
			if err != nil {
				t.Fatalf("%s, %s: %v\n%s", sc.name, sys.label(), err, yaml)
			}
			route := cfg.Routes[0]
			if got := route.Ordering != nil; got != sys.ordered {
				t.Errorf("%s, %s: ordered %t, want %t", sc.name, sys.label(), got, sys.ordered)
			}
			if sys.ordered {
				if got := route.Ordering.Key.Tokens; len(got) != 1 || got[0] != keyToken {
					t.Errorf("%s: key tokens %v, want [%d]", sc.name, got, keyToken)
				}
				if route.Ordering.Partitions != 16 {
					t.Errorf("%s: %d partitions, want the default 16", sc.name, route.Ordering.Partitions)
				}
			}
			rl := cfg.Destinations["sink"].RateLimit
			if got := rl != nil; got != sys.rateLimit {
				t.Fatalf("%s, %s: rate limit %t, want %t", sc.name, sys.label(), got, sys.rateLimit)
			}
			if rl != nil && (rl.Requests != 1_000_000 || rl.Per.D() != time.Second || rl.Burst != 1000) {
				t.Errorf("%s: rate limit %+v, want %s", sc.name, *rl, fleetRateYAML)
			}
		}
	}
	// The key token of subjectOf: the third token differs between keys
	// and is the same for one key; the second (the control) is the same
	// for every key.
	token := func(subj string, i int) string { return strings.Split(subj, ".")[i-1] }
	keys := map[string]bool{}
	control := map[string]bool{}
	for seq := range 2 * orderedKeys {
		keys[token(subjectOf(seq, orderedKeys), keyToken)] = true
		control[token(subjectOf(seq, orderedKeys), keyToken-1)] = true
	}
	if len(keys) != orderedKeys || len(control) != 1 {
		t.Errorf("token %d gives %d keys (want %d), token %d gives %d (want 1)", keyToken, len(keys), orderedKeys, keyToken-1, len(control))
	}
	if a, b := subjectOf(0, orderedKeys), subjectOf(1, orderedKeys); a == b {
		t.Errorf("messages 0 and 1 share the key %s: the keys do not interleave", a)
	}
	if a, b := subjectOf(0, 1), subjectOf(7, 1); a != b {
		t.Errorf("one key: %s and %s", a, b)
	}
}

// TestSinkDelay checks the sink's added latency: a reset with delay_us
// makes each answer wait that long, one outside [0, 1 s] is refused, and
// a reset without it answers at once.
func TestSinkDelay(t *testing.T) {
	s := &sink{status: http.StatusAccepted, since: time.Now()}
	dest := httptest.NewServer(http.HandlerFunc(s.serveEvent))
	defer dest.Close()
	ctl := httptest.NewServer(s.controlHandler())
	defer ctl.Close()
	c := &sinkClient{dest: dest.URL + "/events", ctl: ctl.URL, hc: &http.Client{Timeout: 10 * time.Second}}
	post := func() time.Duration {
		t.Helper()
		t0 := time.Now()
		resp, err := http.Post(c.dest, "application/json", strings.NewReader(string(payload(0, 0))))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("status %d", resp.StatusCode)
		}
		return time.Since(t0)
	}
	const delay = 200 * time.Millisecond
	if err := c.resetDelayed(t.Context(), 1, http.StatusAccepted, 1, delay); err != nil {
		t.Fatal(err)
	}
	if d := post(); d < delay {
		t.Errorf("answered after %s with delay_us %d", d, delay.Microseconds())
	}
	for _, bad := range []time.Duration{-time.Microsecond, maxSinkDelay + time.Microsecond} {
		if err := c.resetDelayed(t.Context(), 1, http.StatusAccepted, 1, bad); err == nil {
			t.Errorf("reset with delay %s accepted", bad)
		}
	}
	// The control: without delay_us the same request is answered well
	// within the delay (the bound of the check above means something).
	if err := c.reset(t.Context(), 1, http.StatusAccepted, 1); err != nil {
		t.Fatal(err)
	}
	if d := post(); d >= delay {
		t.Errorf("answered after %s without a delay", d)
	}
}

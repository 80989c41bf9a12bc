package config

import (
	"slices"
	"testing"
)

func TestEditDistance(t *testing.T) {
	for _, tt := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"abc", "", 3}, {"", "abc", 3}, {"timout", "timeout", 1}, {"kitten", "sitting", 3},
		{"subjcts", "subjects", 1}, {"flaw", "lawn", 2}, {"héllo", "hello", 1},
	} {
		if got := editDistance(tt.a, tt.b); got != tt.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
}

// The keys known at a place come from the configuration types (inline
// fields included); a suggestion is made only when a key is close.
func TestDidYouMean(t *testing.T) {
	if got := knownKeys("destinations.any.status_retry"); !slices.Equal(got, []string{"codes", "count", "interval", "backoff_factor", "max_interval", "max_elapsed"}) {
		t.Errorf("status_retry keys: %q", got)
	}
	if got := knownKeys("destinations.any.headers"); got != nil {
		t.Errorf("a header map has no fixed keys, got %q", got)
	}
	if got := knownKeys("routes[3]"); !slices.Contains(got, "max_in_flight") || slices.Contains(got, "name ") {
		t.Errorf("route keys: %q", got)
	}
	for path, want := range map[string]string{
		"destination":                        `; did you mean "destinations"?`,
		"routes[0].maxInFlight":              `; did you mean "max_in_flight"?`,
		"routes[2].ack-wait":                 `; did you mean "ack_wait"?`,
		"destinations.d.signing.secrets":     `; did you mean "secret"?`,
		"nats.embedded.storedir":             `; did you mean "store_dir"?`,
		"destinations.d.transport_retry.cnt": "", // too far for a short key
		"routes[0].colour":                   "",
		"stream.nme":                         `; did you mean "name"?`,
		"destinations.d.headers.X":           "", // any name is allowed there
	} {
		if got := didYouMean(path); got != want {
			t.Errorf("didYouMean(%q) = %q, want %q", path, got, want)
		}
	}
}

// Every problem of a file at once, in line order; a validation problem
// that repeats a decoding one is left out (the misspelt destination is
// not also "required"). Controls: a syntax error stops decoding, so only
// it is reported; a whole list item of the wrong kind is reported alone
// (the routes after it would move), never with a wrong path.
func TestLoadReportsEveryProblem(t *testing.T) {
	yml := "stream:\n  duplicate_window: 2x\nroutes:\n  - name: r\n    subjects: [events.>]\n    destinaton: hook\n    max_deliver: 0\n" +
		"destinations:\n  hook: {url: ftp://x}\n"
	want := "test.yaml:2: stream.duplicate_window: invalid duration \"2x\": want a Go duration such as 250ms or 2m\n" +
		"test.yaml:6: routes[0].destinaton: unknown key \"destinaton\"; did you mean \"destination\"?\n" +
		"test.yaml:7: routes[0].max_deliver: must be at least 1, got 0\n" +
		"test.yaml:9: destinations.hook.url: scheme must be one of http, https"
	if got := loadErr(t, yml, nil); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if got, want := loadErr(t, "stream:\n  nme: x\n  subjects: [a\nroutes: 3\n", nil), "test.yaml:3: a [ list is not closed (did not find the expected ',' or ']')"; got != want {
		t.Errorf("syntax error: got %q, want %q", got, want)
	}
	if got, want := loadErr(t, "routes: [r, {name: x, colour: 1}]\ndestinations: {}\n", nil), "test.yaml:1: routes[0]: want a mapping, got a string\ntest.yaml:1: routes[1].colour: unknown key \"colour\""; got != want {
		t.Errorf("a wrong list item: got %q, want %q", got, want)
	}
}

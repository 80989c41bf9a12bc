package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// canary is in every value these tests resolve; no error may contain it.
const canary = "CANARY-7f3a"

// route1 is minimal with a second route whose keys the cases below add.
const route1 = minimal + `  - name: s
    subjects: ["events.info.>"]
    destination: hook
`

// Every kind of error a resolved value can reach names the key and the
// reference, never the value: decoding (each type), validation (each rule
// that used to quote a value, and the rules that quote another key's
// value), from the environment and from a file.
func TestResolvedValuesNeverInErrors(t *testing.T) {
	tests := []struct {
		name, yml, value, want string
	}{
		// Decoding.
		{"integer", route1 + "    max_in_flight: ${V}\n", canary,
			"test.yaml:11: routes[1].max_in_flight: the value of ${V} is not an integer"},
		{"integer, quoted", route1 + "    max_deliver: \"${V}\"\n", "12",
			"test.yaml:11: routes[1].max_deliver: the value of ${V} is not an integer"},
		{"long value in a flow mapping", "stream: {replicas: 1, max_age: 1h, duplicate_window: \"${V}\"}\n" + minimal, canary + canary,
			"test.yaml:1: stream.duplicate_window: the value of ${V} is not a Go duration such as 250ms or 2m"},
		{"duration", route1 + "    ack_wait: ${V}\n", canary,
			"test.yaml:11: routes[1].ack_wait: the value of ${V} is not a Go duration such as 250ms or 2m"},
		{"duration in a list", route1 + "    backoff: [1s, \"${V}\"]\n", canary,
			"test.yaml:11: routes[1].backoff[1]: the value of ${V} is not a Go duration such as 250ms or 2m"},
		{"boolean", route1 + "    idempotency: ${V}\n", canary,
			"test.yaml:11: routes[1].idempotency: the value of ${V} is not true or false"},
		{"number", "destinations:\n  hook:\n    url: http://h/\n    transport_retry:\n      backoff_factor: ${V}\nroutes: [{name: r, subjects: [events.>], destination: hook}]\n", canary,
			"test.yaml:5: destinations.hook.transport_retry.backoff_factor: the value of ${V} is not a number"},
		{"built from two references", route1 + "    max_in_flight: ${V}${W:-}\n", canary,
			"test.yaml:11: routes[1].max_in_flight: a value built from ${V} and ${W:-} is not an integer"},
		{"through an alias", "stream:\n  max_age: &a ${V}\n" + route1 + "    ack_wait: *a\n", canary,
			"test.yaml:2: stream.max_age: the value of ${V} is not a Go duration such as 250ms or 2m\n" +
				"test.yaml:2: stream.max_age: the value of ${V} is not a Go duration such as 250ms or 2m"}, // once for each use
		{"two candidates on a line", "stream: {max_age: \"${V}\", duplicate_window: \"${V}\"}\n" + minimal, canary,
			"test.yaml:1: invalid duration: want a Go duration such as 250ms or 2m\n" +
				"test.yaml:1: invalid duration: want a Go duration such as 250ms or 2m"},

		// Validation.
		{"destination url", "destinations:\n  hook:\n    url: ${V}\nroutes: [{name: r, subjects: [events.>], destination: hook}]\n", "ftp://" + canary + "@h/",
			"test.yaml:3: destinations.hook.url: scheme must be one of http, https"},
		{"unknown destination", minimal + "  - {name: s, subjects: [events.info.>], destination: \"${V}\"}\n", canary,
			"test.yaml:8: routes[1].destination: unknown destination the value of ${V} (defined: hook)"},
		{"route name", minimal + "  - {name: \"${V}\", subjects: [events.info.>], destination: hook}\n", canary + " x",
			"test.yaml:8: routes[1].name: the value of ${V} must match [A-Za-z0-9_-]+"},
		{"duplicate route name", strings.Replace(minimal, "name: r", "name: "+canary, 1) + "  - {name: \"${V}\", subjects: [events.info.>], destination: hook}\n", canary,
			"test.yaml:8: routes[1].name: duplicate route name the value of ${V} (also routes[0])"},
		{"route subject", minimal + "  - {name: s, subjects: [\"${V}\"], destination: hook}\n", canary + ".>.x",
			"test.yaml:8: routes[1].subjects[0]: the value of ${V} is not a valid subject filter"},
		{"route subject outside the stream", "stream:\n  subjects: [\"${V}\"]\n" + minimal, "x." + canary + ".>",
			`test.yaml:8: routes[0].subjects[0]: "events.>" is outside the stream's subjects [the value of ${V}]`},
		{"stream subjects overlap", "stream:\n  subjects: [\"events.>\", \"${V}\"]\n" + minimal, "events." + canary,
			`test.yaml:2: stream.subjects[1]: the value of ${V} overlaps stream.subjects[0] "events.>"; JetStream refuses overlapping stream subjects`},
		{"stream name", "stream:\n  name: ${V}\n" + minimal, canary + ".x",
			"test.yaml:2: stream.name: the value of ${V} is not a valid stream name: no whitespace, '.', '*', '>', '/' or '\\'"},
		{"stream name quoted by another key", "stream:\n  name: ${V}\ndead_letter:\n  stream: " + canary + "\n" + minimal, canary,
			"test.yaml:4: dead_letter.stream: must differ from stream.name the value of ${V}"},
		{"dead letter prefix", "dead_letter:\n  subject_prefix: ${V}\n" + minimal, canary + ".*",
			"test.yaml:2: dead_letter.subject_prefix: the value of ${V} is not a valid subject"},
		{"dead letter prefix overlap", "stream:\n  subjects: [\"${V}.>\"]\ndead_letter:\n  subject_prefix: ${V}\n" + strings.Replace(minimal, `"events.>"`, `"${V}.x"`, 1), canary,
			"test.yaml:4: dead_letter.subject_prefix: the value of ${V} overlaps stream subject a value built from ${V}: the stream would capture its own dead letters"},
		{"bucket", "idempotency:\n  bucket: ${V}\n" + minimal, canary + ".x",
			"test.yaml:2: idempotency.bucket: the value of ${V} is not a valid bucket name: use [A-Za-z0-9_-]+"},
		{"log level", "log:\n  level: ${V}\n" + minimal, canary,
			"test.yaml:2: log.level: must be one of debug, info, warn, error; got the value of ${V}"},
		{"listen", "admin:\n  listen: ${V}\n" + minimal, canary,
			"test.yaml:2: admin.listen: must be host:port, got the value of ${V}"},
		{"duration out of range", route1 + "    ack_wait: ${V}\n", "7ms",
			"test.yaml:11: routes[1].ack_wait: must be at least 1s, got the value of ${V}"},
		{"integer out of range", route1 + "    max_deliver: ${V}\n", "-7",
			"test.yaml:11: routes[1].max_deliver: must be at least 1, got the value of ${V}"},
		{"number out of range", "destinations:\n  hook:\n    url: http://h/\n    circuit_breaker:\n      failure_rate: ${V}\nroutes: [{name: r, subjects: [events.>], destination: hook}]\n", "7.5",
			"test.yaml:5: destinations.hook.circuit_breaker.failure_rate: must be in (0, 1], got the value of ${V}"},
		{"status", route1 + "    redeliver_statuses: [\"${V}\"]\n", "777",
			"test.yaml:11: routes[1].redeliver_statuses[0]: the value of ${V} is not an integer"},
		{"status, plain", route1 + "    redeliver_statuses:\n      - ${V}\n", "777",
			"test.yaml:12: routes[1].redeliver_statuses[0]: must be an HTTP status (100-599), got the value of ${V}"},
		{"ttl quoted by another key", "stream:\n  duplicate_window: ${V}\nidempotency:\n  ttl: 1m\n" + minimal, "7m",
			"test.yaml:4: idempotency.ttl: must be at least stream.duplicate_window (the value of ${V}), got 1m0s"},
		{"a merged mapping", "destinations:\n  base: &b\n    url: http://h/\n    timeout: ${V}\n  hook:\n    <<: *b\nroutes: [{name: r, subjects: [events.>], destination: hook}]\n", "-7s",
			"test.yaml:4: destinations.base.timeout: must be > 0, got the value of ${V}\n" +
				"test.yaml:5: destinations.hook.timeout: must be > 0, got a value from an alias or merge that holds ${V}"},
		{"signing secret", "destinations:\n  hook:\n    url: http://h/\n    signing: {secret: \"${V}\"}\nroutes: [{name: r, subjects: [events.>], destination: hook}]\n", "whsec_" + canary,
			"test.yaml:4: destinations.hook.signing.secret: is not valid base64 after the whsec_ prefix"},
		{"header", "destinations:\n  hook:\n    url: http://h/\n    headers:\n      X-Tenant: ${V}\nroutes: [{name: r, subjects: [events.>], destination: hook}]\n", canary + "\r\nX: y",
			"test.yaml:5: destinations.hook.headers.X-Tenant: the value contains a line break or NUL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadWith([]byte(tt.yml), "test.yaml", lookupIn(map[string]string{"V": tt.value}))
			if err == nil {
				t.Fatal("load succeeded")
			}
			if err.Error() != tt.want {
				t.Errorf("got  %s\nwant %s", err, tt.want)
			}
			if strings.Contains(err.Error(), tt.value) {
				t.Errorf("the error quotes the value %q", tt.value)
			}
		})
	}
}

// The same through ${file:...}: the error names the file reference.
func TestFileValuesNeverInErrors(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "n"), []byte(canary+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ name, yml, want string }{
		{"type", route1 + "    max_in_flight: ${file:n}\n",
			"routes[1].max_in_flight: the value of ${file:n} is not an integer"},
		{"validation", "log:\n  level: ${file:n}\n" + minimal,
			"log.level: must be one of debug, info, warn, error; got the value of ${file:n}"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			src := filepath.Join(dir, "bridge.yaml")
			_, err := loadWith([]byte(tt.yml), src, lookupIn(nil))
			if err == nil || !strings.HasSuffix(err.Error(), tt.want) || strings.Contains(err.Error(), canary) {
				t.Fatalf("got %v\nwant ...%s", err, tt.want)
			}
		})
	}
}

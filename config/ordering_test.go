package config

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// orderedRoute is a configuration whose route r has the ordering block
// block (indented under the route) and the subjects subj.
func orderedRoute(subj, block string) string {
	return `destinations:
  hook:
    url: http://127.0.0.1:9091/hook
routes:
  - name: r
    subjects: ` + subj + `
    destination: hook
    ordering:
` + block
}

// problems loads yml and returns its error lines.
func problems(t *testing.T, yml string) []string {
	t.Helper()
	_, err := loadWith([]byte(yml), "test.yaml", lookupIn(nil))
	if err == nil {
		return nil
	}
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("error %T is not a *ValidationError: %v", err, err)
	}
	return strings.Split(err.Error(), "\n")
}

// Each problem of an ordering block is reported with its key path and
// line; a valid block loads.
func TestOrderingValidation(t *testing.T) {
	tests := []struct {
		name, subj, block string
		want              []string // in order
	}{
		{"defaults", `["events.>"]`, "      key: subject\n", nil},
		{"tokens", `["events.*.care.>"]`, "      key: {tokens: [4, 2]}\n      partitions: 256\n      on_dead_letter: block\n", nil},
		{"literal in every subject", `["events.a.*", "events.b.*"]`, "      key: {tokens: [2, 3]}\n", nil},
		{"missing in a shorter subject", `["events.a.*", "events.b.*.*"]`, "      key: {tokens: [3, 4]}\n", nil},
		{"bad word", `["events.>"]`, "      key: subjects\n",
			[]string{`test.yaml:9: routes[0].ordering.key: must be subject or {tokens: [i, j, ...]} (1-based subject tokens), got "subjects"`}},
		{"key a list", `["events.>"]`, "      key: [3]\n",
			[]string{"test.yaml:9: routes[0].ordering.key: want subject or {tokens: [i, j, ...]}, got a list"}},
		{"unknown key in key", `["events.>"]`, "      key: {token: [3]}\n",
			[]string{`test.yaml:9: routes[0].ordering.key.token: unknown key "token"`}},
		{"tokens not a list", `["events.>"]`, "      key: {tokens: 3}\n",
			[]string{"test.yaml:9: routes[0].ordering.key.tokens: want a list, got an integer"}},
		{"token not a number", `["events.>"]`, "      key:\n        tokens: [x]\n",
			[]string{"test.yaml:10: routes[0].ordering.key.tokens[0]: want an integer, got a string"}},
		{"no tokens", `["events.>"]`, "      key: {tokens: []}\n",
			[]string{"test.yaml:9: routes[0].ordering.key.tokens: must list at least one token position (or use key: subject)"}},
		{"token range", `["events.>"]`, "      key:\n        tokens: [0, 33]\n",
			[]string{
				"test.yaml:10: routes[0].ordering.key.tokens[0]: must be a token position from 1 to 32, got 0",
				"test.yaml:10: routes[0].ordering.key.tokens[1]: must be a token position from 1 to 32, got 33",
			}},
		{"token repeated", `["events.>"]`, "      key:\n        tokens: [3, 3]\n",
			[]string{"test.yaml:10: routes[0].ordering.key.tokens[1]: repeats token 3"}},
		{"literal and wildcard", `["events.a.x", "events.b.>"]`, "      key:\n        tokens: [3]\n",
			[]string{`test.yaml:10: routes[0].ordering.key.tokens: token 3 is a literal in "events.a.x" and a wildcard in "events.b.>": the same key would go to two partitions; make it a wildcard in every subject, or a literal in every subject`}},
		{"partitions", `["events.>"]`, "      partitions: 0\n",
			[]string{"test.yaml:9: routes[0].ordering.partitions: must be 1 to 256, got 0"}},
		{"partitions high", `["events.>"]`, "      partitions: 257\n",
			[]string{"test.yaml:9: routes[0].ordering.partitions: must be 1 to 256, got 257"}},
		{"on_dead_letter", `["events.>"]`, "      on_dead_letter: stop\n",
			[]string{`test.yaml:9: routes[0].ordering.on_dead_letter: must be one of continue, block; got "stop"`}},
		{"unknown key", `["events.>"]`, "      partition: 4\n",
			[]string{`test.yaml:9: routes[0].ordering.partition: unknown key "partition"; did you mean "partitions"?`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := problems(t, orderedRoute(tt.subj, tt.block))
			want := slices.Clone(tt.want)
			for _, w := range want {
				if !slices.ContainsFunc(got, func(g string) bool { return strings.HasPrefix(g, w) }) {
					t.Errorf("missing %q in:\n%s", w, strings.Join(got, "\n"))
				}
			}
			if len(got) > len(want) {
				t.Errorf("%d problems, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
			}
		})
	}
}

// An ordered route's copy, stream <stream>-<route>, must not be the
// dead-letter stream; the control renames the route.
func TestOrderingCopyNameTaken(t *testing.T) {
	yml := "dead_letter: {stream: EVENTS-r}\n" + orderedRoute(`["events.>"]`, "      key: subject\n")
	got := problems(t, yml)
	want := `test.yaml:9: routes[0].ordering: the route's partitioned copy would be stream "EVENTS-r", which is dead_letter.stream`
	if !slices.ContainsFunc(got, func(g string) bool { return strings.HasPrefix(g, want) }) {
		t.Fatalf("problems:\n%s\nwant %q", strings.Join(got, "\n"), want)
	}
	got = problems(t, strings.Replace(yml, "name: r", "name: r2", 1))
	if slices.ContainsFunc(got, func(g string) bool { return strings.Contains(g, "partitioned copy") }) {
		t.Fatalf("control: %s", strings.Join(got, "\n"))
	}
	if CopyStream("EVENTS", "r") != "EVENTS-r" {
		t.Errorf("CopyStream = %s", CopyStream("EVENTS", "r"))
	}
}

// An ordered route's destination timeout must fit in a partition's lease
// (ack_wait + 1s less a pull and a margin): ack_wait - 0.5s, 1.5s with
// ack_wait 2s.
// The control is the same file with a timeout that fits, which loads.
func TestOrderingTimeoutFitsLease(t *testing.T) {
	yml := strings.Replace(orderedRoute(`["events.>"]`, "      key: {tokens: [3]}\n"), "    url: http://127.0.0.1:9091/hook\n",
		"    url: http://127.0.0.1:9091/hook\n    timeout: 2s\n", 1) + "    ack_wait: 2s\n"
	got := problems(t, yml)
	want := "test.yaml:9: routes[0].ordering: destination hook has timeout 2s, more than 1.5s"
	if len(got) != 1 || !strings.HasPrefix(got[0], want) {
		t.Fatalf("problems:\n%s\nwant only %q", strings.Join(got, "\n"), want)
	}
	c := mustLoad(t, strings.Replace(yml, "timeout: 2s", "timeout: 1500ms", 1), nil)
	if c.Routes[0].Ordering == nil || c.Routes[0].Ordering.Partitions != DefaultPartitions {
		t.Fatalf("ordering = %+v", c.Routes[0].Ordering)
	}
}

// An ordering block decodes over its defaults; key reads both forms.
func TestOrderingDecodes(t *testing.T) {
	for _, tt := range []struct {
		block  string
		want   Ordering
		tokens []int
	}{
		{"      key: subject\n", Ordering{Partitions: 16, OnDeadLetter: "continue"}, nil},
		{"      key: {tokens: [5, 3]}\n      partitions: 4\n      on_dead_letter: block\n", Ordering{Partitions: 4, OnDeadLetter: "block"}, []int{5, 3}},
		{"      partitions: 1\n", Ordering{Partitions: 1, OnDeadLetter: "continue"}, nil},
	} {
		c := defaultConfig()
		dec := yaml.NewDecoder(strings.NewReader(orderedRoute(`["events.>"]`, tt.block)))
		dec.KnownFields(true)
		if err := dec.Decode(&c); err != nil {
			t.Fatalf("%q: %v", tt.block, err)
		}
		o := c.Routes[0].Ordering
		if o == nil || o.Partitions != tt.want.Partitions || o.OnDeadLetter != tt.want.OnDeadLetter || !slices.Equal(o.Key.Tokens, tt.tokens) || o.Key.IsSubject() != (tt.tokens == nil) {
			t.Errorf("%q decoded as %+v", tt.block, o)
		}
	}
}

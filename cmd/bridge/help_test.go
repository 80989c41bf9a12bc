package main

import (
	"strings"
	"testing"

	"github.com/sotercare/jetbridge/internal/cli/clitest"
)

// The help of every command (description, arguments, flags with their
// defaults, examples) is checked against testdata/help; go test -run
// TestHelp -update rewrites it after a deliberate change.
func TestHelp(t *testing.T) {
	unsetenv(t, "BRIDGE_CONFIG")
	for _, path := range clitest.Commands(newRootCmd()) {
		name := strings.ReplaceAll(path, " ", "_")
		if name == "" {
			name = "bridge"
		}
		t.Run(name, func(t *testing.T) {
			args := append(strings.Fields(path), "--help")
			r := runBridge(t, args...)
			if r.code != 0 || r.stderr != "" {
				t.Fatalf("bridge %q: %s", args, r)
			}
			for _, want := range []string{"Usage:", "Flags:", "Examples:"} {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("bridge %q lacks %q", args, want)
				}
			}
			clitest.Golden(t, name, r.stdout)
			// "bridge help CMD" and "-h" say the same.
			for _, alt := range [][]string{append([]string{"help"}, strings.Fields(path)...), append(strings.Fields(path), "-h")} {
				if r2 := runBridge(t, alt...); r2.code != 0 || r2.stdout != r.stdout {
					t.Errorf("bridge %q differs from bridge %q: %s", alt, args, r2)
				}
			}
		})
	}
	// Plain "bridge" (no $BRIDGE_CONFIG) shows the commands.
	if r := runBridge(t); r.code != 0 || r.stdout != runBridge(t, "--help").stdout {
		t.Errorf("bridge without arguments: %s", r)
	}
}

// --version and version both work; version --json is for scripts.
func TestVersionFlagAndJSON(t *testing.T) {
	r := runBridge(t, "--version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "jetbridge ") {
		t.Errorf("--version: %s", r)
	}
	r = runBridge(t, "version", "--json")
	if r.code != 0 || !strings.HasPrefix(r.stdout, `{"version":`) || !strings.Contains(r.stdout, `"go":"go`) || !strings.Contains(r.stdout, `"nats_server":"2.`) {
		t.Errorf("version --json: %s", r)
	}
}

// Mistyped commands and flags get the nearest valid one, in one line.
func TestSuggestions(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"chek"}, `did you mean "check"?`},
		{[]string{"dlq", "lst"}, `did you mean "list"?`},
		{[]string{"check", "--confg", "x"}, "did you mean --config?"},
		{[]string{"dlq", "replay", "--dryrun"}, "did you mean --dry-run?"},
		{[]string{"receive", "--fail_rate", "1"}, "did you mean --fail-rate?"},
		{[]string{"check", "-confg", "x"}, "did you mean --config?"},
		{[]string{"--versoin"}, "did you mean --version?"},
	} {
		r := runBridge(t, tt.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tt.want) || len(lines(r.stderr)) != 1 || r.stdout != "" {
			t.Errorf("bridge %q: want exit 2 and one line with %q, got %s", tt.args, tt.want, r)
		}
	}
}

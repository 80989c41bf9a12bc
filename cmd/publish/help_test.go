package main

import (
	"strings"
	"testing"

	"github.com/sotercare/jetbridge/internal/cli/clitest"
)

// The help (description, PAYLOAD, flags with defaults, examples) is
// checked against testdata/help; go test -run TestHelp -update rewrites it.
func TestHelp(t *testing.T) {
	o := runPublish(t, "", "--help")
	if o.code != 0 || o.stderr != "" || !strings.Contains(o.stdout, "Usage:\n  publish [flags] [PAYLOAD]") || !strings.Contains(o.stdout, "Examples:") {
		t.Fatalf("--help: exit %d, stdout %q, stderr %q", o.code, o.stdout, o.stderr)
	}
	clitest.Golden(t, "publish", o.stdout)
	if h := runPublish(t, "", "-h"); h.stdout != o.stdout {
		t.Errorf("-h differs from --help")
	}
	if strings.Contains(o.stdout, "--url") {
		t.Errorf("the old spelling --url shows in the help")
	}
}

// A mistyped flag gets the nearest valid one.
func TestSuggestions(t *testing.T) {
	o := runPublish(t, "", "--typ", "a")
	if o.code != 2 || !strings.Contains(o.stderr, "did you mean --type?") || strings.Count(o.stderr, "\n") != 1 {
		t.Errorf("--typ: exit %d, stderr %q", o.code, o.stderr)
	}
}

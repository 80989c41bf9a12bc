package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/sotercare/jetbridge/internal/cli/clitest"
)

// The help is checked against testdata/help; go test -run TestHelp
// -update rewrites it.
func TestHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"--help"}, &stdout, &stderr); code != 0 || stderr.Len() > 0 {
		t.Fatalf("--help: exit %d, stderr %q", code, stderr.String())
	}
	for _, want := range []string{"Usage:", "Examples:", "-s, --server"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("help lacks %q", want)
		}
	}
	if strings.Contains(stdout.String(), "nats-url") {
		t.Errorf("the old spelling --nats-url shows in the help")
	}
	clitest.Golden(t, "sotercare", stdout.String())

	stderr.Reset()
	if code := run(t.Context(), []string{"--listn", "x"}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "did you mean --listen?") {
		t.Errorf("--listn: exit %d, stderr %q", code, stderr.String())
	}
}

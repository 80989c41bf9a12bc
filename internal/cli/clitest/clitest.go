// Package clitest checks the commands' help output against golden files.
package clitest

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/cobra"
)

var update = flag.Bool("update", false, "rewrite the golden help files in testdata/help")

// Golden compares got with testdata/help/NAME.golden, or writes it with
// -update.
func Golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", "help", name+".golden")
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update to create it)", err, t.Name())
	}
	if got != string(want) {
		t.Errorf("help differs from %s (go test -run %s -update rewrites it):\n--- got:\n%s--- want:\n%s", path, t.Name(), got, want)
	}
}

// Commands are the command paths of the tree under root ("" for root
// itself, then e.g. "dlq", "dlq list"), the help command left out.
func Commands(root *cobra.Command) []string {
	var out []string
	var walk func(c *cobra.Command, prefix string)
	walk = func(c *cobra.Command, prefix string) {
		out = append(out, prefix)
		for _, s := range c.Commands() {
			if s.Name() == "help" {
				continue
			}
			p := s.Name()
			if prefix != "" {
				p = prefix + " " + s.Name()
			}
			walk(s, p)
		}
	}
	walk(root, "")
	return out
}

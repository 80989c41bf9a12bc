package jetbridgetest_test

import (
	"os"
	"strings"
	"testing"
)

// docs/testing.md's "Testing your producer and receiver" shows code the
// example module really contains: every declaration of its Go block is a verbatim
// part of examples/producer-test/orders/orders_test.go, and .ci/run runs
// that module.
func TestReadmeExampleIsTheExampleModule(t *testing.T) {
	readme := read(t, "../docs/testing.md")
	_, section, ok := strings.Cut(readme, "\n## Testing your producer and receiver\n")
	if !ok {
		t.Fatal("docs/testing.md has no section \"Testing your producer and receiver\"")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	_, block, ok := strings.Cut(section, "```go\n")
	if !ok {
		t.Fatal("the section has no Go code block")
	}
	block, _, _ = strings.Cut(block, "```")
	example := read(t, "../examples/producer-test/orders/orders_test.go")
	parts := 0
	for part := range strings.SplitSeq(strings.TrimSpace(block), "\n\n") {
		if strings.HasPrefix(part, "import ") {
			continue
		}
		parts++
		if !strings.Contains(example, part) {
			t.Errorf("docs/testing.md code not in the example module:\n%s", part)
		}
	}
	if parts < 2 {
		t.Errorf("the docs/testing.md block has %d declarations, want the config and the test", parts)
	}
	if !strings.Contains(read(t, "../.ci/run"), "\nnested examples/producer-test ") {
		t.Error(".ci/run does not run the example module")
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"
)

// root is the repository's root from this package's directory.
const root = "../.."

// The checked-in config/schema.json is what the types give today.
func TestSchemaIsCurrent(t *testing.T) {
	got, err := generate(root)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(root, "config", "schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("config/schema.json is not current: run go run ./config/schemagen (or go generate ./config) and commit it")
	}
}

// compile compiles config/schema.json.
func compile(t *testing.T) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	sch, err := c.Compile(filepath.Join(root, "config", "schema.json"))
	if err != nil {
		t.Fatalf("compile config/schema.json: %v", err)
	}
	return sch
}

// instance reads a YAML configuration as the JSON value the schema sees.
func instance(t *testing.T, data []byte) any {
	t.Helper()
	var v any
	if err := yaml.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return inst
}

// exampleConfigs are the configurations shipped for people to copy, each
// with the modeline that points editors at the schema.
var exampleConfigs = map[string]string{
	"config/quickstart.yaml":       "schema.json",
	"config/signed.yaml":           "schema.json",
	"config/sotercare.yaml":        "schema.json",
	"deploy/systemd/bridge.yaml":   "../../config/schema.json",
	"deploy/container/bridge.yaml": "../../config/schema.json",
}

// Every example configuration, and every valid fixture of the config
// package, is valid under the schema; the examples carry the
// yaml-language-server modeline, pointing at the schema from where they
// are.
func TestExampleConfigsMatchSchema(t *testing.T) {
	sch := compile(t)
	files, err := filepath.Glob(filepath.Join(root, "config", "testdata", "good", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no good fixtures (%v)", err)
	}
	for f := range exampleConfigs {
		files = append(files, filepath.Join(root, f))
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := sch.Validate(instance(t, data)); err != nil {
			t.Errorf("%s does not match config/schema.json: %v", f, err)
		}
		rel, _ := filepath.Rel(root, f)
		if ref, ok := exampleConfigs[filepath.ToSlash(rel)]; ok {
			line := "# yaml-language-server: $schema=" + ref
			first, _, _ := strings.Cut(string(data), "\n")
			if first != line {
				t.Errorf("%s: the first line is %q, want %q", rel, first, line)
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(f), ref)); err != nil {
				t.Errorf("%s: the modeline's schema: %v", rel, err)
			}
		}
	}
}

// Controls: what the bridge refuses for its form, the schema refuses too,
// at the same place.
func TestSchemaRefusesBadConfigs(t *testing.T) {
	sch := compile(t)
	const good = `destinations:
  hook: {url: "http://127.0.0.1:9090/x", timeout: 1s}
routes:
  - {name: r, subjects: ["events.>"], destination: hook, max_deliver: 5}
`
	if err := sch.Validate(instance(t, []byte(good))); err != nil {
		t.Fatalf("the control configuration is refused: %v", err)
	}
	for _, tt := range []struct{ name, yml, at string }{
		{"unknown key", good + "extra: 1\n", "'': additional properties 'extra' not allowed"},
		{"unknown nested key", strings.Replace(good, "timeout: 1s", "timout: 1s", 1), "'/destinations/hook': additional properties 'timout' not allowed"},
		{"wrong type", strings.Replace(good, "max_deliver: 5", "max_deliver: many", 1), "'/routes/0/max_deliver'"},
		{"bad duration", strings.Replace(good, "timeout: 1s", "timeout: 2x", 1), "'/destinations/hook/timeout'"},
		{"no url", strings.Replace(good, `url: "http://127.0.0.1:9090/x", `, "", 1), "'/destinations/hook': missing property 'url'"},
		{"no routes", "destinations: {hook: {url: x}}\nroutes: []\n", "'/routes': minItems"},
		{"route without subjects", strings.Replace(good, `subjects: ["events.>"], `, "", 1), "'/routes/0': missing property 'subjects'"},
		{"bad format", strings.Replace(good, "timeout: 1s", "format: xml", 1), "'/destinations/hook/format'"},
		{"bad destination name", strings.Replace(good, "hook:", "hook.eu:", 1), "invalid propertyName 'hook.eu'"},
		{"secret list of lists", strings.Replace(good, "timeout: 1s", "signing: {secret: [[a]]}", 1), "'/destinations/hook/signing'"},
	} {
		err := sch.Validate(instance(t, []byte(tt.yml)))
		if err == nil || !strings.Contains(err.Error(), tt.at) {
			t.Errorf("%s: want an error at %s, got %v", tt.name, tt.at, err)
		}
	}
	// A ${VAR} reference stands for any scalar; a null pointer block is off.
	const refs = `nats:
  embedded:
    sync_always: ${SYNC:-false}
log:
  format: ${LOG_FORMAT:-json}
destinations:
  hook:
    url: ${HOOK_URL}
    timeout: 0
    status_retry: null
    signing: {secret: [a, b]}
routes:
  - name: r
    subjects: ["events.>"]
    destination: hook
    max_deliver: ${MAX_DELIVER:-5}
    idempotency: ${IDEM}
    ack_wait: ${ACK:-30s}
`
	if err := sch.Validate(instance(t, []byte(refs))); err != nil {
		t.Errorf("references and null blocks: %v", err)
	}
}

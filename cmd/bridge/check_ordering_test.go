package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// bridge check shows each ordered route's key, partitions, copy stream,
// pinned TTL (the hand-over bound, ack_wait + 1s) and on_dead_letter, in
// the table and in --json; the control is an unordered route, which has
// no ordering section and no "ordering" in --json.
func TestCheckShowsOrdering(t *testing.T) {
	setCheckEnv(t)
	path := filepath.Join(t.TempDir(), "bridge.yaml")
	yml := `destinations:
  d:
    url: http://127.0.0.1:9091/hook
routes:
  - {name: plain, subjects: ["events.a.>"], destination: d}
  - name: ord
    subjects: ["events.*.care.>"]
    destination: d
    ack_wait: 10s
    ordering: {key: {tokens: [4]}, partitions: 8, on_dead_letter: block}
`
	if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runBridge(t, "check", "--config", path)
	if r.code != 0 {
		t.Fatalf("check: %s", r)
	}
	_, section, ok := strings.Cut(r.stdout, "\nordering:\n")
	if !ok {
		t.Fatalf("no ordering section:\n%s", r.stdout)
	}
	section, _, _ = strings.Cut(section, "\n\n")
	rows := strings.Split(section, "\n")
	if len(rows) != 2 || strings.Join(strings.Fields(rows[1]), " ") != "ord tokens [4] 8 EVENTS-ord 11s block" {
		t.Fatalf("ordering section:\n%s", section)
	}
	r = runBridge(t, "check", "--json", "--config", path)
	var out struct {
		Routes []struct {
			Name     string          `json:"name"`
			Ordering json.RawMessage `json:"ordering"`
		} `json:"routes"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || len(out.Routes) != 2 {
		t.Fatalf("check --json: %v: %s", err, r.stdout)
	}
	if out.Routes[0].Ordering != nil {
		t.Errorf("control: the unordered route has ordering %s", out.Routes[0].Ordering)
	}
	if want := `{"key":"tokens [4]","partitions":8,"copy":"EVENTS-ord","pinned_ttl":"11s","on_dead_letter":"block"}`; string(out.Routes[1].Ordering) != want {
		t.Errorf("ordering %s, want %s", out.Routes[1].Ordering, want)
	}
}

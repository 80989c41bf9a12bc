package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// bridge check shows, per destination, whether a message's W3C baggage
// goes on to it (forward_baggage): the BAGGAGE column of the table and
// "forward_baggage" in --json.
func TestCheckShowsForwardBaggage(t *testing.T) {
	setCheckEnv(t)
	path := filepath.Join(t.TempDir(), "bridge.yaml")
	yml := `destinations:
  opted:
    url: http://127.0.0.1:9091/opted
    forward_baggage: true
  plain:
    url: http://127.0.0.1:9091/plain
routes:
  - {name: r, subjects: ["events.>"], destination: plain}
  - {name: o, subjects: ["events.o.>"], destination: opted}
`
	if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runBridge(t, "check", "--config", path)
	if r.code != 0 {
		t.Fatalf("check: %s", r)
	}
	var header string
	rows := map[string]string{}
	for _, l := range strings.Split(r.stdout, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) > 0 && f[0] == "DESTINATION":
			header = l
		case len(f) > 0 && (f[0] == "opted" || f[0] == "plain") && header != "":
			rows[f[0]] = l
		}
	}
	col := strings.Index(header, "BAGGAGE")
	if col < 0 {
		t.Fatalf("the destinations table has no BAGGAGE column:\n%s", r.stdout)
	}
	for name, want := range map[string]string{"opted": "forwarded", "plain": "not forwarded"} {
		if row := rows[name]; len(row) <= col || strings.TrimSpace(row[col:]) != want {
			t.Errorf("destination %s: BAGGAGE column of %q, want %q", name, row, want)
		}
	}

	r = runBridge(t, "check", "--json", "--config", path)
	var rep checkReport
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rep) != nil {
		t.Fatalf("check --json: %s", r)
	}
	got := map[string]bool{}
	for _, d := range rep.Destinations {
		got[d.Name] = d.ForwardBaggage
	}
	if len(got) != 2 || !got["opted"] || got["plain"] {
		t.Errorf("forward_baggage by destination %v, want opted true, plain false", got)
	}
	if !strings.Contains(r.stdout, `"forward_baggage":true`) || !strings.Contains(r.stdout, `"forward_baggage":false`) {
		t.Errorf("check --json lacks the forward_baggage key:\n%s", r.stdout)
	}
}

package main

import (
	"context"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/config"
)

// demoTable reads the numbers of the demo's final table and its receiver
// line.
func demoTable(t *testing.T, out string) map[string]int {
	t.Helper()
	got := map[string]int{}
	row := regexp.MustCompile(`(?m)^\s+(published|duplicates refused|delivered|redelivered|dead-lettered|breaker opened|breaker closed|publish errors)\s+(\d+)\s`)
	for _, m := range row.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[2])
		got[m[1]] = n
	}
	recv := regexp.MustCompile(`receiver answered (\d+) requests: (\d+) 2xx, (\d+) 503 \((\d+) during the outage\), (\d+) 400`)
	m := recv.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no receiver line in the output:\n%s", out)
	}
	for i, k := range []string{"requests", "2xx", "503", "outage 503", "400"} {
		got["receiver "+k], _ = strconv.Atoi(m[i+1])
	}
	for _, k := range []string{"published", "duplicates refused", "delivered", "redelivered", "dead-lettered", "breaker opened", "breaker closed"} {
		if _, ok := got[k]; !ok {
			t.Fatalf("the table has no %q row:\n%s", k, out)
		}
	}
	return got
}

// The demo, shortened: it runs everything for real and its table adds up,
// and agrees with what the receiver answered.
func TestDemo(t *testing.T) {
	r := runBridge(t, "demo", "--duration", "3s", "--seed", "7")
	if r.code != 0 {
		t.Fatalf("demo failed:\n%s", r)
	}
	n := demoTable(t, r.stdout)
	t.Logf("table: %v", n)

	if n["published"] == 0 || n["delivered"] == 0 {
		t.Fatalf("nothing happened:\n%s", r.stdout)
	}
	if sum := n["delivered"] + n["dead-lettered"] + n["duplicates refused"] + n["publish errors"]; sum != n["published"] {
		t.Fatalf("published %d != delivered + dead-lettered + duplicates refused + publish errors = %d:\n%s", n["published"], sum, r.stdout)
	}
	want := regexp.MustCompile(`(?m)^  \d+ published = \d+ delivered \+ \d+ dead-lettered \+ \d+ duplicates refused$`)
	if !want.MatchString(r.stdout) {
		t.Errorf("no sum line in the output:\n%s", r.stdout)
	}
	// Each delivered event got exactly one 2xx, and every 400 made a dead
	// letter: the table counts real outcomes.
	if n["receiver 2xx"] != n["delivered"] {
		t.Errorf("receiver answered %d 2xx, the table says %d delivered", n["receiver 2xx"], n["delivered"])
	}
	if rejected := regexp.MustCompile(`(\d+) rejected`).FindStringSubmatch(r.stdout); n["receiver 400"] > 0 &&
		(rejected == nil || rejected[1] != strconv.Itoa(n["receiver 400"])) {
		t.Errorf("receiver answered %d 400s, the table's rejected dead letters: %v", n["receiver 400"], rejected)
	}
	// With seed 7 the first seconds hold duplicates and rejections.
	if n["duplicates refused"] == 0 || n["dead-lettered"] == 0 || n["redelivered"] == 0 {
		t.Errorf("want duplicates, redeliveries and dead letters with seed 7:\n%s", r.stdout)
	}
	if n["dead-lettered"] > 0 && !strings.Contains(r.stdout, "dead letters (stream EVENTS_DLQ, "+strconv.Itoa(n["dead-lettered"])+" in all)") {
		t.Errorf("the dead letters read back from the stream do not match the table:\n%s", r.stdout)
	}
	if !strings.Contains(r.stdout, "temporary directory, removed now") {
		t.Errorf("no word about the temporary store:\n%s", r.stdout)
	}
}

// With --dir the store and demo.yaml stay, and the commands the demo
// prints find the dead letters: bridge run serves the kept store, bridge
// dlq list reads it.
func TestDemoKeep(t *testing.T) {
	dir := t.TempDir()
	r := runBridge(t, "demo", "--duration", "2s", "--seed", "11", "--dir", dir)
	if r.code != 0 {
		t.Fatalf("demo failed:\n%s", r)
	}
	n := demoTable(t, r.stdout)
	path := filepath.Join(dir, "demo.yaml")
	if !strings.Contains(r.stdout, "go run ./cmd/bridge dlq list --config "+path) {
		t.Fatalf("no dlq command for %s in the output:\n%s", path, r.stdout)
	}

	// What "bridge run --config DIR/demo.yaml" starts, on a free port.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	t.Setenv("JETBRIDGE_NATS_LISTEN", addr)
	cfg, err := config.LoadFile(path)
	if err != nil {
		t.Fatalf("the kept config does not load: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	conn, err := openNATS(ctx, cfg, zerolog.Nop())
	if err != nil {
		t.Fatalf("serve the kept store: %v", err)
	}
	defer conn.close()

	list := runBridge(t, "dlq", "list", "--config", path, "--json")
	if list.code != 0 {
		t.Fatalf("dlq list:\n%s", list)
	}
	if got := strings.Count(list.stdout, "\n"); got != n["dead-lettered"] {
		t.Fatalf("dlq list shows %d dead letters, the demo's table %d:\n%s", got, n["dead-lettered"], list.stdout)
	}
}

func TestDemoUsage(t *testing.T) {
	for _, args := range [][]string{
		{"demo", "--duration", "0s"},
		{"demo", "--duration", "11m"},
		{"demo", "extra"},
		{"demo", "--no-such-flag"},
	} {
		if r := runBridge(t, args...); r.code != 2 || r.stderr == "" {
			t.Errorf("%q: want exit 2 with a message:\n%s", args, r)
		}
	}
	// The default run, at its slowest, stays under 30 s.
	if worst := demoDefaultDuration + demoDrainTimeout; worst >= 28*time.Second {
		t.Errorf("default duration %s + drain %s = %s: leaves no room under 30 s", demoDefaultDuration, demoDrainTimeout, worst)
	}
}

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
)

// A secret in a destination URL's path (a Slack- or Discord-style webhook)
// appears nowhere an operator looks: not in bridge check's table or its
// --json, not in the daemon's logs, /status or /metrics after a delivery
// and a failure. With log.url_paths: true, check shows it (the negative
// control of the same search).
func TestURLPathCanaryHidden(t *testing.T) {
	unsetenv(t, "BRIDGE_CONFIG")
	const canary = "CANARY-path-5d0c"
	srv := natstest.Start(t)
	sink := sinktest.New(t, sinktest.Sequence(200, 400))
	admin := freePort(t)
	yaml := func(urlPaths bool) string {
		return fmt.Sprintf(`nats: {url: %s}
admin: {listen: %s}
log: {level: debug, url_paths: %t}
shutdown_timeout: 2s
destinations:
  hook: {url: "%s/services/T01/%s"}
routes:
  - {name: r, subjects: ["events.>"], destination: hook}
`, srv.URL(), admin, urlPaths, sink.URL(), canary)
	}
	write := func(data string) string {
		p := filepath.Join(t.TempDir(), "bridge.yaml")
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	checkOutput := func(t testing.TB, urlPaths bool) error {
		path := write(yaml(urlPaths))
		var out []string
		for _, args := range [][]string{{"check", "--config", path}, {"check", "--config", path, "--json"}} {
			r := runBridge(t.(*testing.T), args...)
			if r.code != 0 {
				t.Fatalf("bridge %q: %s", args, r)
			}
			out = append(out, r.stdout+r.stderr)
		}
		if all := strings.Join(out, "\n"); strings.Contains(all, canary) {
			return errors.New("bridge check shows the URL's path")
		} else if !strings.Contains(all, sink.URL()+"/…") {
			return fmt.Errorf("bridge check does not show %s/…:\n%s", sink.URL(), all)
		}
		return nil
	}
	if err := checkOutput(t, false); err != nil {
		t.Error(err)
	}
	expectBrokenMain(t, "log.url_paths on", func(t testing.TB) error { return checkOutput(t, true) })

	d := startDaemon(t, yaml(false))
	for i, id := range []string{"ok-1", "rejected-2"} {
		if err := publishWith(srv.URL(), natstest.Creds{}, id); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	if err := waitFor(20*time.Second, func() error {
		if code, body := get(admin, "/metrics"); code != 200 || !strings.Contains(body, `bridge_dead_letters_total{reason="rejected",route="r"} 1`) {
			return errors.New("the rejected event is not dead-lettered yet")
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\n%s", err, d.logs.String())
	}
	_, status := get(admin, "/status")
	_, metrics := get(admin, "/metrics")
	for what, text := range map[string]string{"logs": d.logs.String(), "/status": status, "/metrics": metrics} {
		if strings.Contains(text, canary) {
			t.Errorf("%s carry the URL's path", what)
		}
	}
}

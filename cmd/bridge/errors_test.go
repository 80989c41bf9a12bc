package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/embedded"
	"github.com/sotercare/jetbridge/internal/natstest"
)

// Each error a newcomer can provoke at start is triggered for real; each
// must name the cause, the setting or flag, and the next step, and leak no
// secret. (The delivery-side errors, such as a destination nothing listens
// on, are the bridge package's log lines.)

// runFails runs the command line in process, which must fail with code,
// and returns its stderr.
func runFails(t *testing.T, code int, args ...string) string {
	t.Helper()
	done := make(chan result, 1)
	go func() { done <- runBridge(t, args...) }()
	select {
	case r := <-done:
		if r.code != code {
			t.Fatalf("bridge %q: want exit %d, got %s", args, code, r)
		}
		return r.stderr
	case <-time.After(30 * time.Second):
		t.Fatalf("bridge %q still running after 30s; it should have failed", args)
	}
	return ""
}

func wantAll(t *testing.T, what, text string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(text, w) {
			t.Errorf("%s lacks %q:\n%s", what, w, text)
		}
	}
}

// writeRunConfig writes a configuration for bridge run: the embedded
// server on listen with the store dir, or natsURL, no admin endpoints.
func writeRunConfig(t *testing.T, natsURL, listen, store, admin string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bridge.yaml")
	yaml := fmt.Sprintf(`nats:
  url: "%s"
  embedded: {listen: "%s", store_dir: "%s"}
admin: {listen: "%s"}
log: {level: error}
destinations:
  d: {url: "http://127.0.0.1:1/"}
routes:
  - {name: r, subjects: ["events.>"], destination: d}
`, natsURL, listen, store, admin)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The embedded server's port is taken (another bridge, a nats-server): the
// error names the setting and says how to join the running server.
func TestRunEmbeddedListenInUse(t *testing.T) {
	unsetenv(t, "NATS_URL")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	addr := l.Addr().String()
	stderr := runFails(t, 1, "run", "--config", writeRunConfig(t, "", addr, t.TempDir(), ""))
	wantAll(t, "stderr", stderr, "nats.embedded.listen "+addr+" is already in use", "--server nats://"+addr, "nats.embedded.store_dir")
	if strings.Count(stderr, "in use") != 1 || len(lines(stderr)) != 1 {
		t.Errorf("want one line saying it once:\n%s", stderr)
	}
}

// A second embedded server on a store directory that a running one holds
// is refused, naming the directory, the holder and the way out.
func TestRunStoreDirInUse(t *testing.T) {
	unsetenv(t, "NATS_URL")
	store := t.TempDir()
	srv, err := embedded.Start(t.Context(), embedded.Options{StoreDir: store})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	stderr := runFails(t, 1, "run", "--config", writeRunConfig(t, "", freePort(t), store, ""))
	wantAll(t, "stderr", stderr, "nats.embedded.store_dir "+store+" is in use", fmt.Sprintf("process %d", os.Getpid()),
		"its own nats.embedded.store_dir", "--server")
}

// The admin port is taken: the error names admin.listen and how to pick
// another.
func TestRunAdminListenInUse(t *testing.T) {
	unsetenv(t, "NATS_URL")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	stderr := runFails(t, 1, "run", "--config", writeRunConfig(t, "nats://127.0.0.1:1", freePort(t), t.TempDir(), l.Addr().String()))
	wantAll(t, "stderr", stderr, "admin.listen "+l.Addr().String()+" is already in use", "JETBRIDGE_ADMIN_LISTEN", `""`)
}

// tls:// to a server without TLS: exit 1 at once with the class, the
// redacted URL, the cause and what to check; the password never shows.
func TestRunTLSMismatch(t *testing.T) {
	unsetenv(t, "NATS_URL")
	srv := natstest.Start(t)
	url := "tls://tls-user:tls-Secret-pw9@" + strings.TrimPrefix(srv.URL(), "nats://")
	stderr := runFails(t, 1, "run", "--config", writeRunConfig(t, url, "", t.TempDir(), ""))
	wantAll(t, "stderr", stderr, "TLS with NATS failed at tls://xxxxx@", "nats.tls", "scheme")
	if strings.Contains(stderr, "tls-Secret-pw9") || strings.Contains(stderr, "tls-user") {
		t.Errorf("stderr leaks the URL's credentials:\n%s", stderr)
	}
}

// The NATS server is -s/--server, then nats.url, then $NATS_URL, then the
// embedded server (for the dlq commands: the running bridge's).
func TestServerPrecedence(t *testing.T) {
	srv := natstest.Start(t)
	live := srv.URL()
	dead := "nats://" + freePort(t)
	noStream := "dead-letter stream EVENTS_DLQ does not exist" // reached the server
	unreachable := func(url string) string { return "cannot reach NATS at " + url }

	withURL := writeRunConfig(t, dead, "127.0.0.1:4222", t.TempDir(), "")
	withoutURL := writeRunConfig(t, "", freePort(t), t.TempDir(), "")
	tests := []struct {
		name    string
		natsURL string // $NATS_URL; "" unsets it
		args    []string
		want    string
	}{
		{"--server over nats.url", "", []string{"--server", live, "--config", withURL}, noStream},
		{"-s over nats.url", "", []string{"-s", live, "--config", withURL}, noStream},
		{"--server over $NATS_URL", dead, []string{"--server", live, "--config", withoutURL}, noStream},
		{"nats.url over $NATS_URL", live, []string{"--config", withURL}, unreachable(dead)},
		{"$NATS_URL over the embedded server", live, []string{"--config", withoutURL}, noStream},
		{"$NATS_URL dead", dead, []string{"--config", withoutURL}, unreachable(dead)},
		{"the embedded server last", "", []string{"--config", withoutURL}, "holds no JetStream store, and nats.embedded.listen"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.natsURL == "" {
				unsetenv(t, "NATS_URL")
			} else {
				t.Setenv("NATS_URL", tt.natsURL)
			}
			stderr := runFails(t, 1, append([]string{"dlq", "list"}, tt.args...)...)
			wantAll(t, "stderr", stderr, tt.want)
		})
	}

	// bridge run and check resolve it the same way.
	t.Setenv("NATS_URL", live)
	cfg, source, err := loadConfig(withoutURL, "", os.Stderr)
	if err != nil || cfg.Embedded() || cfg.NATS.URL.Value() != live || source != "$NATS_URL" {
		t.Errorf("run with $NATS_URL: %v, url %q, want %s", err, cfg.NATS.URL.Value(), live)
	}
	cfg, source, err = loadConfig(withURL, live, os.Stderr)
	if err != nil || cfg.NATS.URL.Value() != live || source != "--server" {
		t.Errorf("run with --server: %v, url %q, want %s", err, cfg.NATS.URL.Value(), live)
	}
	if _, _, err := loadConfig(withURL, "http://x", os.Stderr); exitCode(err) != 2 || !strings.Contains(err.Error(), "--server") {
		t.Errorf("a bad --server: %v, want exit 2 naming --server", err)
	}
	if r := runBridge(t, "check", "--config", withoutURL); r.code != 0 || !strings.Contains(r.stdout, "nats:        "+live+" (from $NATS_URL)") {
		t.Errorf("check with $NATS_URL: %s", r)
	}
}

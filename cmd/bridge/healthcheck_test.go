package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// bridge healthcheck exits 0 only on a 200 from /healthz, with the address
// from --url, from admin.listen (a wildcard host read as 127.0.0.1), or the
// default; anything else is exit 1 with one line saying what came back.
func TestHealthcheck(t *testing.T) {
	unsetenv(t, "BRIDGE_CONFIG")
	var (
		mu     sync.Mutex
		status = http.StatusOK
		paths  []string
	)
	setStatus := func(s int) { mu.Lock(); status = s; mu.Unlock() }
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		paths = append(paths, r.URL.Path)
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))

	r := runBridge(t, "healthcheck", "--url", srv.URL+"/healthz")
	if r.code != 0 || r.stdout != "healthy: GET "+srv.URL+"/healthz answered 200\n" || r.stderr != "" {
		t.Errorf("healthy: %s", r)
	}
	setStatus(http.StatusServiceUnavailable)
	r = runBridge(t, "healthcheck", "--url", srv.URL+"/healthz")
	if r.code != 1 || r.stderr != "bridge: unhealthy: GET "+srv.URL+"/healthz answered 503\n" || r.stdout != "" {
		t.Errorf("503: %s", r)
	}

	// admin.listen on every interface is checked on loopback.
	setStatus(http.StatusOK)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "bridge.yaml")
	write := func(listen string) {
		yaml := "admin: {listen: \"" + listen + "\"}\ndestinations:\n  d: {url: http://127.0.0.1:1/x}\nroutes:\n  - {name: r, subjects: [\"events.>\"], destination: d}\n"
		if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, listen := range []string{"0.0.0.0:" + port, ":" + port, "[::]:" + port, "127.0.0.1:" + port} {
		write(listen)
		r = runBridge(t, "healthcheck", "--config", cfg)
		if want := "healthy: GET http://127.0.0.1:" + port + "/healthz answered 200\n"; r.code != 0 || r.stdout != want {
			t.Errorf("admin.listen %q: %s", listen, r)
		}
	}
	t.Setenv("BRIDGE_CONFIG", cfg)
	if r = runBridge(t, "healthcheck"); r.code != 0 {
		t.Errorf("$BRIDGE_CONFIG: %s", r)
	}
	write("")
	if r = runBridge(t, "healthcheck"); r.code != 1 || !strings.Contains(r.stderr, "admin.listen is empty") {
		t.Errorf("admin.listen empty: %s", r)
	}
	mu.Lock()
	got := slices.Clone(paths)
	mu.Unlock()
	if want := slices.Repeat([]string{"/healthz"}, 7); !slices.Equal(got, want) {
		t.Errorf("requests %q, want %q", got, want)
	}

	// Nothing listening: exit 1 at once, naming the cause.
	srv.Close()
	r = runBridge(t, "healthcheck", "--url", srv.URL+"/healthz")
	if r.code != 1 || !strings.Contains(r.stderr, "connection refused") || len(lines(r.stderr)) != 1 {
		t.Errorf("nothing listening: %s", r)
	}
	// A configuration that cannot be read fails the check (exit 1: a
	// health check answers 0 or 1 only).
	if r = runBridge(t, "healthcheck", "--config", filepath.Join(dir, "missing.yaml")); r.code != 1 {
		t.Errorf("missing configuration: %s", r)
	}
	// Bad usage is exit 2.
	for _, args := range [][]string{{"--url", "ftp://x"}, {"--url", "http://127.0.0.1:1/healthz", "--timeout", "0s"}} {
		if r = runBridge(t, append([]string{"healthcheck"}, args...)...); r.code != 2 {
			t.Errorf("healthcheck %q: %s", args, r)
		}
	}
}

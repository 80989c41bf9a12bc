package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
)

// adminTokenCanary is the admin token of these tests: it must never show
// in a log line, an error or bridge check's output.
const adminTokenCanary = "adm-CANARY-4c1e9b7d2f05a8e3"

// wrongSameLength is a wrong token of the canary's length.
var wrongSameLength = strings.Repeat("x", len(adminTokenCanary))

// want401Body is the exact body of a refused request.
const want401Body = `{"status":"unauthorized","reason":"missing or wrong bearer token: send Authorization: Bearer followed by admin.token"}` + "\n"

// withAdminToken adds admin.token: ${JB_TEST_ADMIN_TOKEN} (and extra, if
// any, under admin:) to a daemonYAML configuration.
func withAdminToken(yaml, extra string) string {
	return strings.Replace(yaml, "admin:\n", "admin:\n  token: ${JB_TEST_ADMIN_TOKEN}\n"+extra, 1)
}

// adminGet is GET base+path with an optional Authorization header, through
// client (nil: plain HTTP's default).
func adminGet(client *http.Client, base, path, auth string) (code int, wwwAuth, body string, err error) {
	if client == nil {
		client = http.DefaultClient
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	if err != nil {
		return 0, "", "", err
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate"), string(b), err
}

// tokenCheck checks the admin server at base (ready says whether /readyz
// and /status answer 200 there): /status and /metrics refuse a request
// without the token, with a wrong token of the same length and with the
// token under another scheme (401, WWW-Authenticate: Bearer, the exact
// body), and answer the right one; /healthz and /readyz need no token.
func tokenCheck(client *http.Client, base string, ready bool) error {
	readyCode := http.StatusOK
	if !ready {
		readyCode = http.StatusServiceUnavailable
	}
	for _, path := range []string{"/metrics", "/status", "/nowhere"} {
		for _, auth := range []string{"", "Bearer " + wrongSameLength, "Basic " + adminTokenCanary, "Bearer", adminTokenCanary} {
			code, www, body, err := adminGet(client, base, path, auth)
			if err != nil {
				return fmt.Errorf("GET %s: %w", path, err)
			}
			if code != http.StatusUnauthorized || www != "Bearer" || body != want401Body {
				return fmt.Errorf("GET %s with Authorization %q: %d, WWW-Authenticate %q, body %q; want 401, Bearer, %q",
					path, strings.ReplaceAll(auth, adminTokenCanary, "<token>"), code, www, clip(body), want401Body)
			}
		}
	}
	wantOK := map[string]int{"/metrics": http.StatusOK, "/status": readyCode}
	for path, want := range wantOK {
		for _, auth := range []string{"Bearer " + adminTokenCanary, "bearer " + adminTokenCanary} {
			code, _, body, err := adminGet(client, base, path, auth)
			if err != nil {
				return fmt.Errorf("GET %s with the token: %w", path, err)
			}
			if code != want {
				return fmt.Errorf("GET %s with the token: %d %s, want %d", path, code, body, want)
			}
		}
	}
	for path, want := range map[string]int{"/healthz": http.StatusOK, "/readyz": readyCode} {
		code, www, body, err := adminGet(client, base, path, "")
		if err != nil {
			return fmt.Errorf("GET %s: %w", path, err)
		}
		if code != want || www != "" {
			return fmt.Errorf("GET %s without a token: %d (WWW-Authenticate %q) %s, want %d", path, code, www, body, want)
		}
	}
	return nil
}

// With admin.token, /status and /metrics need the bearer token, before
// the bridge is connected and once it runs; /healthz and /readyz never
// do. The token shows in no log line.
func TestAdminTokenGuardsStatusAndMetrics(t *testing.T) {
	t.Setenv("JB_TEST_ADMIN_TOKEN", adminTokenCanary)
	srv := natstest.Start(t)
	sink := sinktest.New(t, sinktest.Always(200))
	d := startDaemon(t, withAdminToken(daemonYAML(srv.URL(), natstest.Creds{}, freePort(t), sink.URL()), ""))
	base := "http://" + d.admin
	if err := waitFor(daemonReady, func() error {
		if code, _ := get(d.admin, "/readyz"); code != 200 {
			return fmt.Errorf("/readyz = %d", code)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := tokenCheck(nil, base, true); err != nil {
		t.Fatal(err)
	}
	// /status with the token is the bridge's, not the early handler's.
	_, _, body, _ := adminGet(nil, base, "/status", "Bearer "+adminTokenCanary)
	var status struct {
		Ready  string `json:"ready"`
		Routes []struct {
			Route string `json:"route"`
		} `json:"routes"`
	}
	if err := json.Unmarshal([]byte(body), &status); err != nil || status.Ready != "ready" || len(status.Routes) != 1 || status.Routes[0].Route != "r" {
		t.Errorf("/status with the token: %v %s", err, body)
	}
	if logs := d.logs.String(); strings.Contains(logs, adminTokenCanary) {
		t.Fatalf("the admin token appears in the logs:\n%s", logs)
	} else if strings.Contains(logs, "is reachable from other hosts") {
		t.Errorf("a loopback admin listener was warned about:\n%s", logs)
	}

	// Negative control through the same server: the bridge's switch served
	// without the token middleware answers the unauthenticated requests.
	expectBrokenMain(t, "admin endpoints without RequireToken", func(t testing.TB) error {
		addr := freePort(t)
		stop, err := serveAdmin(addr, newAdminSwitch(prometheus.NewRegistry()), zerolog.Nop(), defaultAdminTimeouts)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		return tokenCheck(nil, "http://"+addr, false)
	})
}

// Before the first connection to NATS (the early admin handler), the
// token already guards /status and /metrics.
func TestAdminTokenGuardsBeforeConnecting(t *testing.T) {
	t.Setenv("JB_TEST_ADMIN_TOKEN", adminTokenCanary)
	d := startDaemon(t, withAdminToken(daemonYAML("nats://"+freePort(t), natstest.Creds{}, freePort(t), "http://127.0.0.1:1"), ""))
	if err := waitFor(daemonReady, func() error {
		if code, body := get(d.admin, "/readyz"); code != 503 || !strings.Contains(body, "cannot reach NATS") {
			return fmt.Errorf("/readyz = %d %s, want 503 while NATS is unreachable", code, body)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := tokenCheck(nil, "http://"+d.admin, false); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(d.logs.String(), adminTokenCanary) {
		t.Fatal("the admin token appears in the logs")
	}
}

// bridge check: a token silences the admin.listen warning; the token
// never shows in its output (table, --json, warnings, errors).
func TestCheckAdminToken(t *testing.T) {
	t.Setenv("JB_TEST_ADMIN_TOKEN", adminTokenCanary)
	dir := t.TempDir()
	write := func(name, admin string) string {
		p := filepath.Join(dir, name)
		yaml := "admin:\n" + admin + "destinations:\n  hook: {url: http://127.0.0.1:9/x}\nroutes:\n  - {name: r, subjects: [\"events.>\"], destination: hook}\n"
		if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	open := write("open.yaml", "  listen: 0.0.0.0:8088\n")
	r := runBridge(t, "check", "--config", open)
	wantWarn := "bridge: warning: admin.listen: \"0.0.0.0:8088\" is reachable from other hosts and admin.token is not set: /status and /metrics have no authentication; set admin.token (e.g. token: ${ADMIN_TOKEN}), or bind 127.0.0.1 unless a firewall or proxy guards it\n"
	if r.code != 0 || r.stderr != wantWarn {
		t.Errorf("no token on 0.0.0.0: want exit 0 and the warning %q, got %s", wantWarn, r)
	}
	guarded := write("guarded.yaml", "  listen: 0.0.0.0:8088\n  token: ${JB_TEST_ADMIN_TOKEN}\n")
	fromFile := filepath.Join(dir, "token")
	if err := os.WriteFile(fromFile, []byte(adminTokenCanary+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	guardedFile := write("file.yaml", "  listen: 0.0.0.0:8088\n  token: ${file:"+fromFile+"}\n")
	for _, p := range []string{guarded, guardedFile} {
		for _, args := range [][]string{{"check", "--config", p}, {"check", "--json", "--config", p}} {
			r = runBridge(t, args...)
			if r.code != 0 || r.stderr != "" {
				t.Errorf("%q: want exit 0 and no warning, got %s", args, r)
			}
			if strings.Contains(r.stdout+r.stderr, adminTokenCanary) {
				t.Fatalf("%q prints the token:\n%s", args, r)
			}
		}
	}
	// Invalid tokens: errors name the key, never the value.
	t.Setenv("JB_TEST_SHORT", "CANARY-short")
	t.Setenv("JB_TEST_SPACE", "CANARY with a space inside")
	for env, want := range map[string]string{
		"JB_TEST_SHORT": "admin.token: must be at least 16 characters: use a random value, e.g. from openssl rand -hex 32",
		"JB_TEST_SPACE": "admin.token: must be printable ASCII without spaces: it is sent as Authorization: Bearer <token>",
	} {
		p := write(env+".yaml", "  listen: 0.0.0.0:8088\n  token: ${"+env+"}\n")
		r = runBridge(t, "check", "--config", p)
		if want := "bridge: " + p + ":3: " + want + "\n"; r.code != 2 || r.stderr != want {
			t.Errorf("%s: want exit 2 and %q, got %s", env, want, r)
		}
		if strings.Contains(r.stdout+r.stderr, "CANARY") {
			t.Fatalf("%s: the token's value is printed:\n%s", env, r)
		}
	}
}

// clip shortens a response body for an error message.
func clip(body string) string {
	if len(body) > 160 {
		return body[:160] + "..."
	}
	return body
}

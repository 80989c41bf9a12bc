package test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/jetbridgetest"
)

// fatalExitTimeout bounds how long `bridge run` may take to give up on
// credentials or TLS the server rejects.
const fatalExitTimeout = 15 * time.Second

// authYAML is a configuration for the real binary with the nats keys of
// creds, admin from $JETBRIDGE_ADMIN_LISTEN, and route r to the sink.
func authYAML(t *testing.T, url string, creds natstest.Creds, sinkURL string) string {
	t.Helper()
	data := fmt.Sprintf(`nats:
  url: %s
%sadmin:
  listen: ${JETBRIDGE_ADMIN_LISTEN:-}
log:
  format: json
shutdown_timeout: 2s
destinations:
  sink:
    url: %s/events
    timeout: 2s
routes:
  - name: r
    subjects: ["events.>"]
    destination: sink
`, url, creds.YAML(), sinkURL)
	path := filepath.Join(t.TempDir(), "bridge.yaml")
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// publishAuth publishes one event with creds (a producer of the same
// account), retrying while the server restarts.
func publishAuth(t *testing.T, url string, creds natstest.Creds, id string) {
	t.Helper()
	natstest.Eventually(t, 15*time.Second, func() error {
		nc, err := nats.Connect(url, append([]nats.Option{nats.Timeout(time.Second)}, creds.Options()...)...)
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		_, err = js.Publish(ctx, "events.info.auth", []byte(`{}`), jetstream.WithMsgID(id))
		return err
	})
}

// adminGet is the status and body of GET http://admin/path (0 when
// nothing answers).
func adminGet(admin, path string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+path, nil)
	if err != nil {
		return 0, err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// runFatal starts `bridge run` and waits for its exit; it returns the exit
// code and everything the process printed.
func runFatal(t *testing.T, cfgPath string) (int, string) {
	t.Helper()
	c := startBridge(t, bridgeBinary(t), []string{"run", "--config", cfgPath}, "JETBRIDGE_ADMIN_LISTEN="+freeAddr(t))
	start := time.Now()
	code := c.wait(t, fatalExitTimeout)
	t.Logf("bridge exited %d after %s", code, time.Since(start).Round(time.Millisecond))
	return code, c.stdout.String() + c.stderr.String()
}

func assertNoSecret(t *testing.T, out string, secrets ...[]string) {
	t.Helper()
	for _, ss := range secrets {
		for _, s := range ss {
			if s != "" && strings.Contains(out, s) {
				t.Errorf("the output contains a secret (%d bytes):\n%s", len(s), out)
			}
		}
	}
}

// For every authentication method: the right credentials deliver an event
// a producer published with them; wrong ones make `bridge run` exit 1
// within seconds, naming the cause class and the URL, printing no secret.
func TestAuthMethods(t *testing.T) {
	wantCause := map[natstest.AuthMethod]string{
		natstest.AuthToken:        "NATS rejected the credentials",
		natstest.AuthUserPassword: "NATS rejected the credentials",
		natstest.AuthNKey:         "NATS rejected the credentials",
		natstest.AuthJWT:          "NATS rejected the credentials",
		natstest.AuthTLS:          "TLS with NATS failed",
		natstest.AuthMutualTLS:    "TLS with NATS failed",
	}
	for _, m := range natstest.AuthMethods {
		t.Run(string(m), func(t *testing.T) {
			srv := natstest.StartAuth(t, m)
			good, wrong := srv.Creds(), srv.NewCreds(t)
			sink := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(jetbridgetest.Always(200)))

			p := runBridge(t, authYAML(t, srv.URL(), good, sink.URL()))
			publishAuth(t, srv.URL(), good, "auth-"+string(m))
			waitCount(t, sink, 1, countTimeout)
			if got := sink.Requests()[0].Header.Get(jetbridgetest.HeaderEventID); got != "auth-"+string(m) {
				t.Fatalf("delivered event %q", got)
			}
			p.term(t)
			if code := p.wait(t, 30*time.Second); code != 0 {
				t.Fatalf("SIGTERM: exit %d", code)
			}
			assertNoSecret(t, p.stdout.String()+p.stderr.String(), good.Secrets)

			code, out := runFatal(t, authYAML(t, srv.URL(), wrong, sink.URL()))
			if code != 1 || !strings.Contains(out, wantCause[m]) || !strings.Contains(out, srv.URL()) {
				t.Fatalf("wrong credentials: exit %d, want 1 naming %q and %s:\n%s", code, wantCause[m], srv.URL(), out)
			}
			assertNoSecret(t, out, good.Secrets, wrong.Secrets)
		})
	}
}

// Mutual TLS without a client certificate is refused: exit 1, TLS cause.
func TestMutualTLSWithoutClientCertificate(t *testing.T) {
	srv := natstest.StartAuth(t, natstest.AuthMutualTLS)
	creds := srv.Creds()
	creds.CertFile, creds.KeyFile = "", ""
	code, out := runFatal(t, authYAML(t, srv.URL(), creds, "http://127.0.0.1:1"))
	// With TLS 1.3 the server refuses the client after the handshake, so
	// the client sees "certificate required" or a connection closed by
	// the remote after the handshake, depending on timing.
	if code != 1 || !strings.Contains(out, "TLS with NATS failed") || !strings.Contains(out, "tls") {
		t.Fatalf("exit %d, want 1 with the TLS cause:\n%s", code, out)
	}
}

// Missing or garbage creds and nkey files are configuration errors: exit
// 2 naming the key, from `bridge run` and `bridge check`.
func TestCredentialFilesUnusable(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(garbage, []byte("garbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	for _, c := range []struct {
		name  string
		creds natstest.Creds
		key   string
	}{
		{"creds missing", natstest.Creds{CredsFile: missing}, "nats.creds_file"},
		{"creds garbage", natstest.Creds{CredsFile: garbage}, "nats.creds_file"},
		{"nkey missing", natstest.Creds{NKeySeedFile: missing}, "nats.nkey_seed_file"},
		{"nkey garbage", natstest.Creds{NKeySeedFile: garbage}, "nats.nkey_seed_file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := authYAML(t, "nats://"+freeAddr(t), c.creds, "http://127.0.0.1:1")
			for _, cmd := range []string{"run", "check"} {
				ch := startBridge(t, bridgeBinary(t), []string{cmd, "--config", cfg})
				code := ch.wait(t, fatalExitTimeout)
				if out := ch.stderr.String(); code != 2 || !strings.Contains(out, "bridge: "+c.key+": ") {
					t.Errorf("bridge %s: exit %d, want 2 naming %s:\n%s", cmd, code, c.key, out)
				}
			}
		})
	}
}

// The server rejects the bridge's credentials for a while (user+password
// A, then B, then A again): /readyz says so meanwhile, the process stays
// healthy, and once A works again an event published then is delivered.
// The in-process counterpart with its negative control (the zombie) is
// cmd/bridge's TestRunSurvivesAuthChange.
func TestAuthChangeDuringRun(t *testing.T) {
	srv := natstest.StartAuth(t, natstest.AuthUserPassword)
	a, b := srv.Creds(), srv.NewCreds(t)
	sink := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(jetbridgetest.Always(200)))
	p := runBridge(t, authYAML(t, srv.URL(), a, sink.URL()))
	publishAuth(t, srv.URL(), a, "before")
	waitCount(t, sink, 1, countTimeout)

	srv.Restart(t, b)
	rejected := srv.Rejections()
	natstest.Eventually(t, countTimeout, func() error {
		p.failIfExited(t)
		if n := srv.Rejections() - rejected; n < 3 {
			return fmt.Errorf("%d reconnects rejected, want 3 (nats.go gives up on the 2nd by default)", n)
		}
		code, body := adminGet(p.admin, "/readyz")
		if code != 503 || !strings.Contains(body, "NATS rejected the credentials: authorization violation") {
			return fmt.Errorf("/readyz = %d %s, want 503 naming the rejection", code, body)
		}
		if code, body := adminGet(p.admin, "/healthz"); code != 200 {
			return fmt.Errorf("/healthz = %d %s while reconnecting, want 200", code, body)
		}
		return nil
	})

	srv.Restart(t, a)
	publishAuth(t, srv.URL(), a, "after")
	waitCount(t, sink, 2, countTimeout)
	p.waitReadyz(t, http.StatusOK, readyTimeout)
	assertNoSecret(t, p.stdout.String()+p.stderr.String(), a.Secrets, b.Secrets)
	assertJSONLines(t, p.stdout.String())
}

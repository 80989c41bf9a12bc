package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sotercare/jetbridge/internal/embedded"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
)

// bridge check and bridge run apply one rule to the embedded listener: a
// non-loopback nats.embedded.listen is refused by both, with the same line,
// unless nats.embedded.allow_non_loopback is set; that key in turn requires
// a token (or a user and password), which the embedded server then demands
// of every client: an anonymous client on the exposed port is refused, the
// bridge itself (with the token) delivers.
func TestEmbeddedListenCheckAndRunAgree(t *testing.T) {
	unsetenv(t, "BRIDGE_CONFIG")
	unsetenv(t, "NATS_URL")
	sink := sinktest.New(t, sinktest.Always(200))
	_, port, _ := net.SplitHostPort(freePort(t))
	write := func(embeddedYAML, auth string) string {
		t.Helper()
		dir := t.TempDir()
		p := filepath.Join(dir, "bridge.yaml")
		yaml := fmt.Sprintf(`nats:
  embedded:
    listen: "0.0.0.0:%s"
    store_dir: %s
%s%sadmin: {listen: ""}
shutdown_timeout: 2s
destinations:
  sink: {url: %s/events}
routes:
  - {name: r, subjects: ["events.>"], destination: sink}
`, port, filepath.Join(dir, "store"), embeddedYAML, auth, sink.URL())
		if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	for _, tt := range []struct {
		name, embedded, auth, want string
	}{
		{"not on loopback", "", "", `nats.embedded.listen: "0.0.0.0" is not a loopback address: other hosts could use the embedded JetStream; bind 127.0.0.1, or set nats.embedded.allow_non_loopback: true with nats.token (or nats.user and nats.password) to protect it`},
		{"allowed without a token", "    allow_non_loopback: true\n", "", "nats.embedded.allow_non_loopback: requires nats.token, or nats.user and nats.password: the embedded server then accepts only clients that present them"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := write(tt.embedded, tt.auth)
			for _, cmd := range []string{"check", "run"} {
				r := runBridge(t, cmd, "--config", path)
				if r.code != 2 || !strings.Contains(r.stderr, tt.want) || len(lines(r.stderr)) != 1 {
					t.Errorf("bridge %s: want exit 2 and the one line %q, got %s", cmd, tt.want, r)
				}
			}
		})
	}

	// Allowed with a token: check accepts it, and the running server
	// refuses anonymous clients while the bridge (with the token) delivers.
	const token = "s3cret-embedded-token-for-tests"
	path := write("    allow_non_loopback: true\n", "  token: "+token+"\n")
	if r := runBridge(t, "check", "--config", path); r.code != 0 || strings.Contains(r.stdout+r.stderr, token) {
		t.Fatalf("bridge check with a token: %s", r)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, string(data))
	url := "nats://127.0.0.1:" + port
	if err := waitFor(20*time.Second, func() error {
		if code, ok := d.exited(); ok {
			return fmt.Errorf("the daemon exited with %d", code)
		}
		return publishWith(url, natstest.Creds{Token: token}, "e1")
	}); err != nil {
		t.Fatalf("publish with the token: %v\n%s", err, d.logs.String())
	}
	if err := waitFor(20*time.Second, func() error {
		if !delivered(sink, "e1") {
			return errors.New("e1 not delivered yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := refusesAnonymous(url); err != nil {
		t.Error(err)
	}

	// Negative control: an exposed embedded server without a token lets
	// anonymous clients in, and the same check says so.
	expectBrokenMain(t, "exposed embedded server without authorization", func(t testing.TB) error {
		srv, err := embedded.Start(t.Context(), embedded.Options{Listen: "0.0.0.0:0", AllowNonLoopback: true, StoreDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Shutdown()
		_, p, _ := net.SplitHostPort(srv.Addr())
		return refusesAnonymous("nats://127.0.0.1:" + p)
	})
}

// refusesAnonymous connects without credentials: nil when the server says
// Authorization Violation.
func refusesAnonymous(url string) error {
	nc, err := nats.Connect(url, nats.Timeout(2*time.Second))
	if err == nil {
		nc.Close()
		return errors.New("an anonymous client connected to the exposed embedded server")
	}
	if !errors.Is(err, nats.ErrAuthorization) {
		return fmt.Errorf("anonymous connect: %v, want an authorization violation", err)
	}
	return nil
}

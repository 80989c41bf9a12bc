package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/cli"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
)

// Bounds of the in-process daemon tests, sized for 2 loaded cores.
const (
	daemonReady   = 20 * time.Second // first connection and provisioning
	deliveryWait  = 20 * time.Second // an event reaches the sink after a reconnect
	exitWait      = 15 * time.Second // the daemon returns after its connection is closed
	slowClientCap = 3 * time.Second  // an admin connection must be closed by then
)

// expectBrokenMain fails the test if check passes against a deliberately
// broken variant: the check could not catch that break.
func expectBrokenMain(t *testing.T, name string, check func(t testing.TB) error) {
	t.Helper()
	t.Run("negative control: "+name, func(t *testing.T) {
		if err := check(t); err == nil {
			t.Fatalf("the check passed against a deliberately broken variant (%s)", name)
		} else {
			t.Logf("caught, as it should: %v", err)
		}
	})
}

// daemonRun is runDaemon running in process until the test ends.
type daemonRun struct {
	admin  string
	logs   *natstest.Buffer
	done   chan struct{}
	err    error // set before done is closed
	cancel context.CancelFunc
}

func (d *daemonRun) exited() (code int, ok bool) {
	select {
	case <-d.done:
		return exitCode(d.err), true
	default:
		return 0, false
	}
}

func exitCode(err error) int {
	var ee *exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.Code
	}
	return 1
}

// daemonYAML is a configuration with one route r from events.> to sinkURL.
func daemonYAML(natsURL string, creds natstest.Creds, admin, sinkURL string) string {
	return fmt.Sprintf(`nats:
  url: %s
%sadmin:
  listen: %s
log:
  level: debug
shutdown_timeout: 2s
destinations:
  sink:
    url: %s/events
    timeout: 2s
routes:
  - name: r
    subjects: ["events.>"]
    destination: sink
`, natsURL, creds.YAML(), admin, sinkURL)
}

// startDaemon runs the daemon of yaml, built as bridge run builds it and
// then broken by each of breaks (daemon_faults_test.go), until the test
// ends.
func startDaemon(t testing.TB, yaml string, breaks ...daemonBreak) *daemonRun {
	t.Helper()
	cfg, err := config.Load([]byte(yaml), "daemon.yaml")
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	d := &daemonRun{admin: cfg.Admin.Listen, logs: &natstest.Buffer{}, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	log := zerolog.New(d.logs).Level(zerolog.DebugLevel).With().Timestamp().Logger()
	daemon, err := newDaemon(cfg, log, reloadSource{})
	if err != nil {
		t.Fatalf("newDaemon: %v", err)
	}
	for _, b := range breaks {
		b(daemon)
	}
	go func() {
		defer close(d.done)
		d.err = daemon.run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-d.done:
		case <-time.After(40 * time.Second):
			t.Errorf("runDaemon did not return within 40s of cancel")
		}
		if t.Failed() {
			t.Logf("daemon logs:\n%s", d.logs.String())
		}
	})
	return d
}

// get is the status and body of GET http://admin/path; 0 when nothing
// answers.
func get(admin, path string) (int, string) {
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
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// waitFor polls cond every 20 ms until it returns nil or timeout passes,
// and returns cond's last error (for checks that negative controls share).
func waitFor(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		<-time.After(20 * time.Millisecond)
	}
}

// publishWith publishes one event with creds, retrying while the server
// restarts.
func publishWith(url string, creds natstest.Creds, id string) error {
	return waitFor(10*time.Second, func() error {
		nc, err := nats.Connect(url, append([]nats.Option{nats.Timeout(time.Second)}, creds.Options()...)...)
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = js.Publish(ctx, "events.info.auth", []byte(`{}`), jetstream.WithMsgID(id))
		return err
	})
}

func delivered(sink *sinktest.Sink, id string) bool {
	return slices.ContainsFunc(sink.Requests(), func(r sinktest.Request) bool {
		return r.Header.Get(sinktest.EventIDHeader) == id
	})
}

func freePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// authChangeCheck runs the daemon against a server requiring user+password
// A, restarts the server with B, then with A again. It passes when the
// daemon delivers an event published once A is back, after /readyz said
// "NATS rejected the credentials" while B was in force, or when it exits
// non-zero. A zombie (running, /healthz 200, nothing delivered) fails it.
func authChangeCheck(t testing.TB, breaks ...daemonBreak) error {
	srv := natstest.StartAuth(t, natstest.AuthUserPassword)
	a, b := srv.Creds(), srv.NewCreds(t)
	sink := sinktest.New(t, sinktest.Always(200))
	d := startDaemon(t, daemonYAML(srv.URL(), a, freePort(t), sink.URL()), breaks...)
	if err := waitFor(daemonReady, func() error {
		if code, body := get(d.admin, "/readyz"); code != 200 {
			return fmt.Errorf("/readyz %d %s", code, body)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("not ready at start: %w", err)
	}
	if err := publishWith(srv.URL(), a, "before"); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(deliveryWait, func() error {
		if !delivered(sink, "before") {
			return errors.New("event 'before' not delivered")
		}
		return nil
	}); err != nil {
		return err
	}

	srv.Restart(t, b)
	// At least two reconnect attempts with the wrong credentials: nats.go
	// closes the connection for good on the second by default.
	rejected := srv.Rejections()
	if err := waitFor(deliveryWait, func() error {
		if srv.Rejections() < rejected+2 {
			return fmt.Errorf("%d reconnects rejected, want 2", srv.Rejections()-rejected)
		}
		if _, ok := d.exited(); ok {
			return nil
		}
		code, body := get(d.admin, "/readyz")
		if code != 503 || !strings.Contains(body, "NATS rejected the credentials") {
			return fmt.Errorf("/readyz with the wrong credentials = %d %s, want 503 naming the rejection", code, body)
		}
		return nil
	}); err != nil {
		return err
	}

	srv.Restart(t, a)
	if err := publishWith(srv.URL(), a, "after"); err != nil {
		t.Fatal(err)
	}
	var health int
	return waitFor(deliveryWait, func() error {
		if delivered(sink, "after") {
			return nil
		}
		if code, ok := d.exited(); ok {
			if code == 0 {
				return errors.New("the daemon exited 0 after losing its connection")
			}
			return nil
		}
		health, _ = get(d.admin, "/healthz")
		return fmt.Errorf("zombie: running with /healthz %d, event 'after' not delivered although the credentials work again", health)
	})
}

// A server that rejects the bridge's credentials for a while (rotated and
// rotated back) leaves no zombie: the bridge reports it on /readyz,
// reconnects once the credentials work again and delivers.
func TestRunSurvivesAuthChange(t *testing.T) {
	if err := authChangeCheck(t); err != nil {
		t.Fatal(err)
	}
	// The zombie of the hostile review: nats.go closes the connection for
	// good, nothing notices it, and /healthz ignores it.
	expectBrokenMain(t, "closed connection unnoticed, healthz always 200", func(t testing.TB) error {
		return authChangeCheck(t, withOption(closedUnnoticed), healthzAlwaysOK)
	})
}

// closedForGoodCheck makes nats.go close the daemon's connection for good
// (its default abort on a repeated authentication error) and expects the
// daemon to stop with exit 1 naming the cause.
func closedForGoodCheck(t testing.TB, breaks ...daemonBreak) error {
	srv := natstest.StartAuth(t, natstest.AuthUserPassword)
	a, b := srv.Creds(), srv.NewCreds(t)
	d := startDaemon(t, daemonYAML(srv.URL(), a, freePort(t), "http://127.0.0.1:1"), breaks...)
	if err := waitFor(daemonReady, func() error {
		if code, body := get(d.admin, "/readyz"); code != 200 {
			return fmt.Errorf("/readyz %d %s", code, body)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("not ready at start: %w", err)
	}
	srv.Restart(t, b)
	if err := waitFor(exitWait, func() error {
		if _, ok := d.exited(); !ok {
			code, _ := get(d.admin, "/healthz")
			return fmt.Errorf("still running (/healthz %d) after nats.go closed the connection", code)
		}
		return nil
	}); err != nil {
		return err
	}
	if code := exitCode(d.err); code != 1 || !strings.Contains(d.err.Error(), "closed for good") ||
		!strings.Contains(strings.ToLower(d.err.Error()), "authorization violation") {
		return fmt.Errorf("exit %d %q, want 1 naming the closed connection and its cause", code, d.err)
	}
	for _, s := range append(a.Secrets, b.Secrets...) {
		if strings.Contains(d.logs.String()+d.err.Error(), s) {
			return fmt.Errorf("a password appears in the logs or the error")
		}
	}
	return nil
}

// A connection that nats.go closes for good stops the daemon with exit 1
// and the cause (an orchestrator restarts it), never a silent zombie.
func TestRunExitsWhenNATSClosesTheConnection(t *testing.T) {
	if err := closedForGoodCheck(t, withOption(abortOnAuthError)); err != nil {
		t.Fatal(err)
	}
	expectBrokenMain(t, "closed connection unnoticed", func(t testing.TB) error { return closedForGoodCheck(t, withOption(closedUnnoticed)) })
}

// Logs of the auth change are JSON lines only: nats.go's own handlers
// print plain text unless replaced.
func TestNATSCallbacksLogJSON(t *testing.T) {
	check := func(t testing.TB, breaks ...daemonBreak) error {
		srv := natstest.StartAuth(t, natstest.AuthToken)
		a, b := srv.Creds(), srv.NewCreds(t)
		d := startDaemon(t, daemonYAML(srv.URL(), a, freePort(t), "http://127.0.0.1:1"), breaks...)
		if err := waitFor(daemonReady, func() error {
			if !strings.Contains(d.logs.String(), "bridge running") {
				return errors.New("not running")
			}
			return nil
		}); err != nil {
			return err
		}
		srv.Restart(t, b)
		if err := waitFor(deliveryWait, func() error {
			if !strings.Contains(d.logs.String(), `"class":"NATS rejected the credentials"`) {
				return errors.New("no structured log of the rejected credentials")
			}
			return nil
		}); err != nil {
			return err
		}
		for line := range strings.Lines(d.logs.String()) {
			if !json.Valid([]byte(line)) {
				return fmt.Errorf("log line is not JSON: %q", line)
			}
		}
		for _, s := range append(a.Secrets, b.Secrets...) {
			if strings.Contains(d.logs.String(), s) {
				return errors.New("a token appears in the logs")
			}
		}
		return nil
	}
	if err := check(t); err != nil {
		t.Fatal(err)
	}
	// nats.go's defaults: no ErrorHandler (plain text on stderr, nothing in
	// the structured log).
	expectBrokenMain(t, "nats.go default error handler", func(t testing.TB) error {
		return check(t, withOption(func(o *nats.Options) error { o.AsyncErrorCB = nil; return nil }))
	})
}

// Unusable credential and TLS files are configuration errors naming their
// key: exit 2 from bridge check and bridge run, before any connection.
func TestCredentialFilesChecked(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	missing := filepath.Join(dir, "missing")
	garbage := write("garbage", "not a credential\n")
	jwtSrv := natstest.StartAuth(t, natstest.AuthJWT)
	goodCreds := jwtSrv.Creds().CredsFile
	credsData, _ := os.ReadFile(goodCreds)
	jwtOnly := write("jwt-only.creds", strings.Split(string(credsData), "------END NATS USER JWT------")[0]+"------END NATS USER JWT------\n")
	tlsSrv := natstest.StartAuth(t, natstest.AuthMutualTLS)
	tc := tlsSrv.Creds()

	cases := []struct {
		name, nats string
		key, cause string // "" key: valid
	}{
		{"creds missing", "creds_file: " + missing, "nats.creds_file", "no such file"},
		{"creds garbage", "creds_file: " + garbage, "nats.creds_file", "no user JWT"},
		{"creds without seed", "creds_file: " + jwtOnly, "nats.creds_file", "no nkey seed"},
		{"nkey missing", "nkey_seed_file: " + missing, "nats.nkey_seed_file", "no such file"},
		{"nkey garbage", "nkey_seed_file: " + garbage, "nats.nkey_seed_file", "nkeys"},
		{"ca missing", "tls: {ca_file: " + missing + "}", "nats.tls.ca_file", "no such file"},
		{"ca garbage", "tls: {ca_file: " + garbage + "}", "nats.tls.ca_file", "no PEM certificate"},
		{"cert garbage", fmt.Sprintf("tls: {cert_file: %s, key_file: %s}", garbage, tc.KeyFile), "nats.tls.cert_file", "PEM"},
		{"key missing", fmt.Sprintf("tls: {cert_file: %s, key_file: %s}", tc.CertFile, missing), "nats.tls.key_file", "no such file"},
		{"key of another cert", fmt.Sprintf("tls: {cert_file: %s, key_file: %s}", tc.CertFile, tlsSrv.NewCreds(t).KeyFile), "nats.tls.key_file", "key"},
		{"good creds", "creds_file: " + goodCreds, "", ""},
		{"good mtls", fmt.Sprintf("tls: {ca_file: %s, cert_file: %s, key_file: %s}", tc.CAFile, tc.CertFile, tc.KeyFile), "", ""},
	}
	cfgFor := func(t testing.TB, natsYAML string) (*config.Config, string) {
		yaml := fmt.Sprintf("nats:\n  url: nats://127.0.0.1:1\n  %s\nadmin:\n  listen: \"\"\ndestinations:\n  d: {url: http://127.0.0.1:1/x}\nroutes:\n  - {name: r, subjects: [\"events.>\"], destination: d}\n", natsYAML)
		path := filepath.Join(t.TempDir(), "bridge.yaml")
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load([]byte(yaml), path)
		if err != nil {
			t.Fatalf("config: %v", err)
		}
		return cfg, path
	}
	// check runs every case through verify, the file check under test.
	check := func(t testing.TB, verify func(config.NATS) error) error {
		for _, c := range cases {
			cfg, _ := cfgFor(t, c.nats)
			err := verify(cfg.NATS)
			switch {
			case c.key == "" && err != nil:
				return fmt.Errorf("%s: rejected a good file: %v", c.name, err)
			case c.key != "" && (err == nil || !strings.Contains(err.Error(), c.key+": ") || !strings.Contains(err.Error(), c.cause)):
				return fmt.Errorf("%s: got %v, want an error naming %s and %q", c.name, err, c.key, c.cause)
			}
		}
		return nil
	}
	if err := check(t, checkNATSFiles); err != nil {
		t.Fatal(err)
	}
	expectBrokenMain(t, "existence only", func(t testing.TB) error {
		return check(t, func(n config.NATS) error {
			for key, f := range map[string]string{"creds_file": n.CredsFile, "nkey_seed_file": n.NKeySeedFile, "tls.ca_file": n.TLS.CAFile, "tls.cert_file": n.TLS.CertFile, "tls.key_file": n.TLS.KeyFile} {
				if f != "" {
					if _, err := os.Stat(f); err != nil {
						return fmt.Errorf("nats.%s: %w", key, err)
					}
				}
			}
			return nil
		})
	})

	// The commands: exit 2 with the key on stderr, before any connection.
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, path := cfgFor(t, c.nats)
			r := runBridge(t, "check", "--config", path)
			if c.key == "" {
				if r.code != 0 {
					t.Fatalf("bridge check: want exit 0, got %s", r)
				}
				return
			}
			if r.code != 2 || !strings.Contains(r.stderr, "bridge: "+c.key+": ") {
				t.Fatalf("bridge check: want exit 2 naming %s, got %s", c.key, r)
			}
			start := time.Now()
			r = runBridge(t, "run", "--config", path)
			if r.code != 2 || !strings.Contains(r.stderr, "bridge: "+c.key+": ") || time.Since(start) > 5*time.Second {
				t.Fatalf("bridge run: want exit 2 naming %s at once, got %s after %s", c.key, r, time.Since(start))
			}
		})
	}
}

// Connection errors are sorted into fatal classes and "wait for it".
func TestClassifyConnErr(t *testing.T) {
	srvs := map[natstest.AuthMethod]*natstest.AuthServer{}
	for _, m := range []natstest.AuthMethod{natstest.AuthUserPassword, natstest.AuthTLS, natstest.AuthMutualTLS, natstest.AuthJWT} {
		srvs[m] = natstest.StartAuth(t, m)
	}
	connectErr := func(url string, opts ...nats.Option) error {
		nc, err := nats.Connect(url, append(opts, nats.Timeout(2*time.Second))...)
		if err == nil {
			nc.Close()
			return errors.New("connected")
		}
		return err
	}
	up := srvs[natstest.AuthUserPassword]
	mtls := srvs[natstest.AuthMutualTLS]
	cases := []struct {
		name string
		err  error
		want cli.ConnErrClass
	}{
		{"wrong password", connectErr(up.URL(), nats.UserInfo(up.Creds().User, "wrong")), cli.ConnAuth},
		{"no credentials", connectErr(up.URL()), cli.ConnAuth},
		{"jwt of another account", connectErr(srvs[natstest.AuthJWT].URL(), srvs[natstest.AuthJWT].NewCreds(t).Options()...), cli.ConnAuth},
		{"untrusted server", connectErr(srvs[natstest.AuthTLS].URL()), cli.ConnTLS},
		{"other CA", connectErr(srvs[natstest.AuthTLS].URL(), srvs[natstest.AuthTLS].NewCreds(t).Options()...), cli.ConnTLS},
		{"no client certificate", connectErr(mtls.URL(), nats.RootCAs(mtls.Creds().CAFile)), cli.ConnTLS},
		{"refused", connectErr("nats://" + freePort(t)), cli.ConnUnreachable},
		{"dns", connectErr("nats://no-such-host.invalid:4222"), cli.ConnUnreachable},
	}
	for _, c := range cases {
		if got := cli.ClassifyConnErr(c.err); got != c.want {
			t.Errorf("%s: %v classified %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// bridge check warns about destinations without certificate checks and
// an admin listener reachable from other hosts; the exit code stays 0.
func TestCheckWarnings(t *testing.T) {
	yaml := func(admin string, insecure bool) string {
		return fmt.Sprintf(`admin:
  listen: %q
destinations:
  hook:
    url: https://127.0.0.1:9443/x
    tls: {insecure_skip_verify: %t}
routes:
  - {name: r, subjects: ["events.>"], destination: hook}
`, admin, insecure)
	}
	file := func(t *testing.T, data string) string {
		p := filepath.Join(t.TempDir(), "bridge.yaml")
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	r := runBridge(t, "check", "--config", file(t, yaml("0.0.0.0:8088", true)))
	if r.code != 0 {
		t.Fatalf("want exit 0, got %s", r)
	}
	for _, want := range []string{
		"bridge: warning: destinations.hook.tls.insecure_skip_verify: ",
		"bridge: warning: admin.listen: \"0.0.0.0:8088\" is reachable from other hosts",
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r)
		}
	}
	if r = runBridge(t, "check", "--config", file(t, yaml("127.0.0.1:8088", false))); r.code != 0 || r.stderr != "" {
		t.Errorf("a loopback admin and verified TLS: want exit 0 and no warning, got %s", r)
	}

	// Which listen addresses are reachable from other hosts.
	check := func(t testing.TB, loopback func(string) bool) error {
		for addr, want := range map[string]bool{
			"127.0.0.1:8088": true, "[::1]:8088": true, "localhost:8088": true, "127.0.0.2:8088": true,
			"0.0.0.0:8088": false, "[::]:8088": false, ":8088": false, "10.1.2.3:8088": false, "example.com:8088": false,
		} {
			cfg, err := config.Load([]byte(yaml(addr, false)), "w.yaml")
			if err != nil {
				t.Fatal(err)
			}
			warned := len(warningsWith(cfg, loopback)) > 0
			if warned == want {
				return fmt.Errorf("admin.listen %s: warned %t, want %t", addr, warned, !want)
			}
		}
		return nil
	}
	if err := check(t, loopbackListen); err != nil {
		t.Fatal(err)
	}
	expectBrokenMain(t, "empty host taken for loopback", func(t testing.TB) error {
		return check(t, func(hp string) bool { return strings.HasPrefix(hp, ":") || loopbackListen(hp) })
	})
}

// The admin server closes connections of slow and idle clients: a header
// sent byte by byte, a body that never completes, an idle keep-alive.
func TestAdminServerClosesSlowClients(t *testing.T) {
	check := func(t testing.TB, to adminTimeouts) error {
		addr := freePort(t)
		h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
		stop, err := serveAdmin(addr, h, zerolog.Nop(), to)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		for name, send := range map[string]string{
			"slow header": "GET /healthz HTTP/1.1\r\nHost: x\r\n",
			"slow body":   "POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789",
			"idle":        "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
		} {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.WriteString(c, send); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(slowClientCap))
			_, err = io.Copy(io.Discard, c) // returns when the server closes
			c.Close()
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return fmt.Errorf("%s: connection still open after %s", name, slowClientCap)
			}
		}
		return nil
	}
	short := adminTimeouts{readHeader: 200 * time.Millisecond, read: 300 * time.Millisecond, write: time.Second, idle: 300 * time.Millisecond, maxHeaderBytes: 16 << 10}
	if err := check(t, short); err != nil {
		t.Fatal(err)
	}
	expectBrokenMain(t, "no timeouts", func(t testing.TB) error { return check(t, adminTimeouts{}) })

	d := defaultAdminTimeouts
	if d.readHeader <= 0 || d.read <= 0 || d.idle <= 0 || d.maxHeaderBytes <= 0 || d.write <= 5*time.Second {
		t.Errorf("production admin timeouts %+v: every bound must be set, the write timeout above /status's 5s", d)
	}
}

// Credentials the server rejects at the first connection stop `bridge run`
// at once with exit 1, the cause class, the URL and no secret.
func TestRunFailsFastOnRejectedCredentials(t *testing.T) {
	check := func(t testing.TB, breaks ...daemonBreak) error {
		srv := natstest.StartAuth(t, natstest.AuthUserPassword)
		wrong := srv.NewCreds(t)
		d := startDaemon(t, daemonYAML(srv.URL(), wrong, freePort(t), "http://127.0.0.1:1"), breaks...)
		if err := waitFor(exitWait, func() error {
			if _, ok := d.exited(); !ok {
				code, body := get(d.admin, "/readyz")
				return fmt.Errorf("still running with wrong credentials (/readyz %d %s)", code, body)
			}
			return nil
		}); err != nil {
			return err
		}
		msg := fmt.Sprint(d.err)
		if exitCode(d.err) != 1 || !strings.Contains(msg, "NATS rejected the credentials at "+srv.URL()) ||
			!strings.Contains(strings.ToLower(msg), "authorization violation") {
			return fmt.Errorf("exit %d %q, want 1 naming the rejection, the URL and the cause", exitCode(d.err), msg)
		}
		if strings.Contains(msg+d.logs.String(), wrong.Password) {
			return errors.New("the password appears in the error or the logs")
		}
		return nil
	}
	if err := check(t); err != nil {
		t.Fatal(err)
	}
	// The old connection: RetryOnFailedConnect hides the cause and retries.
	expectBrokenMain(t, "retry on failed connect", func(t testing.TB) error { return check(t, withOption(nats.RetryOnFailedConnect(true))) })
}

// An unreachable server is waited for: /readyz names the redacted URL and
// the cause, and the bridge becomes ready once the server is up.
func TestRunWaitsForUnreachableNATS(t *testing.T) {
	addr := freePort(t)
	admin := freePort(t)
	d := startDaemon(t, daemonYAML("nats://u:url-secret-Zq8@"+addr, natstest.Creds{}, admin, "http://127.0.0.1:1"))
	if err := waitFor(daemonReady, func() error {
		code, body := get(d.admin, "/readyz")
		if code != 503 || !strings.Contains(body, "cannot reach NATS at nats://xxxxx@"+addr) || !strings.Contains(body, "refused") {
			return fmt.Errorf("/readyz = %d %s, want 503 naming the URL and the cause", code, body)
		}
		if code, _ := get(d.admin, "/healthz"); code != 200 {
			return fmt.Errorf("/healthz = %d while waiting, want 200", code)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The log said so at once, with the redacted URL, the cause and what
	// to check.
	logs := d.logs.String()
	if !strings.Contains(logs, "cannot reach NATS; retrying") || !strings.Contains(logs, "nats://xxxxx@"+addr) ||
		!strings.Contains(logs, "connection refused") || !strings.Contains(logs, "--server, nats.url or $NATS_URL") {
		t.Errorf("no log line naming the URL, the cause and the fix:\n%s", logs)
	}
	natstest.Start(t, natstest.WithListen(addr))
	if err := waitFor(daemonReady, func() error {
		if code, body := get(d.admin, "/readyz"); code != 200 {
			return fmt.Errorf("/readyz = %d %s", code, body)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(d.logs.String(), "url-secret-Zq8") {
		t.Fatal("the URL's password appears in the logs")
	}
}

// bridge run warns, in its log, where `bridge check` warns: a destination
// with insecure_skip_verify and an admin server reachable from other
// hosts.
func TestRunWarns(t *testing.T) {
	srv := natstest.Start(t)
	yaml := strings.Replace(daemonYAML(srv.URL(), natstest.Creds{}, "0.0.0.0:0", "https://127.0.0.1:1"), "    timeout: 2s\n",
		"    timeout: 2s\n    tls: {insecure_skip_verify: true}\n", 1)
	d := startDaemon(t, yaml)
	for _, want := range []string{`"key":"destinations.sink.tls.insecure_skip_verify"`, `"key":"admin.listen"`} {
		natstest.Eventually(t, 5*time.Second, func() error {
			if !strings.Contains(d.logs.String(), want) {
				return fmt.Errorf("no warning with %s in the log", want)
			}
			return nil
		})
	}
}

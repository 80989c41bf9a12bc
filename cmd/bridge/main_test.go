package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/sotercare/jetbridge/config"
)

// configDir holds the config package's fixtures and the quickstart file.
const configDir = "../../config"

// secretEnv is the environment the check tests load fixtures with. Every
// value is a secret that the fixtures (config/testdata and testdata/) read
// through ${VAR}; none may appear in any output. The values are distinctive
// so that finding one cannot be a coincidence.
var secretEnv = map[string]string{
	// config/testdata/good/full.yaml
	"CAREGIVER_KEY":    "caregiver-api-key-Kq7vZ",
	"CAREGIVER_SECRET": "whsec_" + base64.StdEncoding.EncodeToString([]byte("caregiver-signing-key-0123456789")),
	// testdata/secrets.yaml, testdata/token.yaml
	"TEST_NATS_URL_USER":      "nats-url-user-Fw3p",
	"TEST_NATS_URL_PASSWORD":  "nats-url-password-Hd8s",
	"TEST_NATS_PASSWORD":      "nats-password-Rt2m",
	"TEST_NATS_URL_TOKEN":     "nats-url-token-Lx5c",
	"TEST_NATS_TOKEN":         "nats-token-Gy6b",
	"TEST_HOOK_USER":          "hook-user-Pz4n",
	"TEST_HOOK_PASSWORD":      "hook-password-Wj9e",
	"TEST_HOOK_QUERY_TOKEN":   "hook-query-token-Vc1u",
	"TEST_PAGER_QUERY_KEY":    "pager-query-key-Ns0o",
	"TEST_AUTHORIZATION":      "authorization-Qb3t",
	"TEST_API_KEY":            "api-key-Mk8r",
	"TEST_COOKIE":             "cookie-Dh5y",
	"TEST_PARTNER_TOKEN":      "partner-token-Ea2i",
	"TEST_CLIENT_SECRET":      "client-secret-Ul7w",
	"TEST_SIGNING_SECRET":     "whsec_" + base64.StdEncoding.EncodeToString([]byte("partner-signing-key-0123456789ab")),
	"TEST_SIGNING_SECRET_OLD": "a-raw-rotated-signing-secret-Zo4f",
	// testdata/bad_secrets.yaml, testdata/bad_secret_type.yaml
	"TEST_SHORT_SIGNING_SECRET": "whsec_" + base64.StdEncoding.EncodeToString([]byte("short-Xa9q")),
	"TEST_BROKEN_USER":          "broken-user-Ci6k",
	"TEST_BROKEN_PASSWORD":      "broken-password-Sg1h",
	"TEST_BROKEN_TOKEN":         "broken-token-Yr5j",
}

// result is what one in-process run of the command did.
type result struct {
	code           int
	stdout, stderr string
}

// runBridge runs the command line in process.
func runBridge(t *testing.T, args ...string) result {
	t.Helper()
	var stdout, stderr strings.Builder
	code := run(args, &stdout, &stderr)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout:\n%s--- stderr:\n%s", r.code, r.stdout, r.stderr)
}

// unsetenv removes key for the duration of the test; t.Setenv records the
// previous value and restores it in cleanup.
func unsetenv(t *testing.T, key string) {
	t.Helper()
	t.Setenv(key, "")
	if err := os.Unsetenv(key); err != nil {
		t.Fatal(err)
	}
}

// setCheckEnv gives the test the fixtures' environment: every secret set,
// $BRIDGE_CONFIG and the variables that fixtures expect unset removed.
func setCheckEnv(t *testing.T) {
	t.Helper()
	for k, v := range secretEnv {
		t.Setenv(k, v)
	}
	unsetenv(t, "BRIDGE_CONFIG")
	unsetenv(t, "JETBRIDGE_TEST_UNSET") // config/testdata/bad/env_unset.yaml
}

// fixtureHeader reads the "# want: TEXT" and "# line: N|-" header of a bad
// fixture.
func fixtureHeader(t *testing.T, path string) (want, line string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitN(string(data), "\n", 3)
	if len(lines) < 3 {
		t.Fatalf("%s: too short for a '# want:' and '# line:' header", path)
	}
	want, ok1 := strings.CutPrefix(lines[0], "# want: ")
	line, ok2 := strings.CutPrefix(lines[1], "# line: ")
	if !ok1 || !ok2 || want == "" || line == "" {
		t.Fatalf("%s must start with '# want: TEXT' and '# line: N|-'", path)
	}
	return want, line
}

// checkErrorLines asserts a failed check: exit 2, nothing on stdout, every
// stderr line prefixed "bridge: ", and for each want a line that contains
// it, starting with "bridge: FILE:LINE: " when line is not "-".
func checkErrorLines(t *testing.T, r result, file string, wants map[string]string) {
	t.Helper()
	if r.code != 2 {
		t.Fatalf("want exit 2, got %s", r)
	}
	if r.stdout != "" {
		t.Errorf("stdout is not empty on an invalid configuration:\n%s", r)
	}
	lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
	for _, l := range lines {
		if !strings.HasPrefix(l, "bridge: ") {
			t.Errorf("stderr line %q does not start with %q", l, "bridge: ")
		}
	}
	for want, line := range wants {
		prefix := "bridge: " + file + ":" + line + ": "
		found := false
		for _, l := range lines {
			if strings.Contains(l, want) && (line == "-" || strings.HasPrefix(l, prefix)) {
				found = true
				break
			}
		}
		switch {
		case found:
		case line == "-":
			t.Errorf("no stderr line contains %q:\n%s", want, r)
		default:
			t.Errorf("no stderr line contains %q and starts with %q:\n%s", want, prefix, r)
		}
	}
}

// assertNoSecrets fails the test if out contains any of the secrets.
func assertNoSecrets(t *testing.T, out string, secrets []string) {
	t.Helper()
	for _, s := range secrets {
		if s != "" && strings.Contains(out, s) {
			t.Errorf("output contains the secret %q:\n%s", s, out)
		}
	}
}

// envSecrets is every value of secretEnv.
func envSecrets() []string {
	out := make([]string, 0, len(secretEnv))
	for _, v := range secretEnv {
		out = append(out, v)
	}
	return out
}

// configSecrets collects every secret a loaded configuration holds, as the
// contract lists them: URL user info and query values, NATS passwords and
// tokens, signing secrets, and the values of headers named Authorization,
// Cookie, or containing Key, Token or Secret.
func configSecrets(t *testing.T, cfg *config.Config) []string {
	t.Helper()
	var out []string
	addURL := func(s config.Secret) {
		if s.Value() == "" {
			return
		}
		for _, raw := range strings.Split(s.Value(), ",") {
			u, err := url.Parse(raw)
			if err != nil {
				t.Fatalf("a validated URL does not parse: %v", err)
			}
			if u.User != nil {
				out = append(out, u.User.Username())
				if p, ok := u.User.Password(); ok {
					out = append(out, p)
				}
			}
			for _, vs := range u.Query() {
				out = append(out, vs...)
			}
		}
	}
	addURL(cfg.NATS.URL)
	out = append(out, cfg.NATS.Password.Value(), cfg.NATS.Token.Value())
	for _, d := range cfg.Destinations {
		addURL(d.URL)
		for name, v := range d.Headers {
			if secretHeader(name) {
				out = append(out, v.Value())
			}
		}
		if d.Signing != nil {
			for _, s := range d.Signing.Secrets {
				out = append(out, s.Value())
			}
		}
	}
	return out
}

func secretHeader(name string) bool {
	n := strings.ToLower(name)
	return n == "authorization" || n == "cookie" ||
		strings.Contains(n, "key") || strings.Contains(n, "token") || strings.Contains(n, "secret")
}

// Every bad fixture of the config package fails bridge check with exit 2
// and the error its header announces, at the line it announces.
func TestCheckBadFixtures(t *testing.T) {
	setCheckEnv(t)
	files, err := filepath.Glob(filepath.Join(configDir, "testdata", "bad", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no bad fixtures under %s (err %v)", configDir, err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			want, line := fixtureHeader(t, f)

			r := runBridge(t, "check", "--config", f)

			checkErrorLines(t, r, f, map[string]string{want: line})
			assertNoSecrets(t, r.stderr, envSecrets())
		})
	}
}

// Invalid values that are secrets, or carry them, are reported by key
// path and line, and never printed.
func TestCheckBadSecretsNotPrinted(t *testing.T) {
	setCheckEnv(t)
	tests := []struct {
		name  string
		file  string
		wants map[string]string // error text -> line
	}{
		{
			name: "invalid values",
			file: "testdata/bad_secrets.yaml",
			wants: map[string]string{
				"nats.url: scheme must be one of nats, tls, ws, wss":                                    "5",
				"nats.password: is set without nats.user":                                               "6",
				"destinations.partner.url: scheme must be one of http, https":                           "10",
				"destinations.partner.signing.secret: must be at least 24 bytes after decoding, got 10": "14",
				"destinations.broken.url: is not a valid URL":                                           "16",
			},
		},
		{
			name:  "wrong type",
			file:  "testdata/bad_secret_type.yaml",
			wants: map[string]string{"destinations.partner.headers.X-Api-Key: want a string, got a list": "7"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runBridge(t, "check", "--config", tt.file)

			checkErrorLines(t, r, tt.file, tt.wants)
			assertNoSecrets(t, r.stdout+r.stderr, envSecrets())
		})
	}
}

// Every good fixture, the quickstart file, and fixtures holding every kind
// of secret pass bridge check: exit 0, "configuration OK", the routing
// table, and no secret anywhere in the output.
func TestCheckGoodConfigs(t *testing.T) {
	setCheckEnv(t)
	good, err := filepath.Glob(filepath.Join(configDir, "testdata", "good", "*.yaml"))
	if err != nil || len(good) == 0 {
		t.Fatalf("no good fixtures under %s (err %v)", configDir, err)
	}
	quickstart := filepath.Join(configDir, "quickstart.yaml")

	type testCase struct {
		name    string
		file    string
		env     map[string]string // set for this case; "" unsets
		secrets []string          // besides secretEnv and the loaded config's
	}
	var tests []testCase
	for _, f := range good {
		tests = append(tests, testCase{name: filepath.Base(f), file: f})
	}
	quickstartVars := []string{"JETBRIDGE_NATS_LISTEN", "JETBRIDGE_STORE_DIR", "JETBRIDGE_RECEIVER_URL", "JETBRIDGE_LOG_FORMAT"}
	defaults := map[string]string{}
	for _, k := range quickstartVars {
		defaults[k] = ""
	}
	tests = append(tests,
		testCase{name: "quickstart defaults", file: quickstart, env: defaults},
		testCase{
			name: "quickstart with a secret receiver URL",
			file: quickstart,
			env: map[string]string{
				"JETBRIDGE_NATS_LISTEN":  "127.0.0.1:14222",
				"JETBRIDGE_STORE_DIR":    t.TempDir(),
				"JETBRIDGE_RECEIVER_URL": "https://qs-user-Tn4d:qs-password-Bk7a@receiver.example.com/events?token=qs-token-Ow2x",
				"JETBRIDGE_LOG_FORMAT":   "json",
			},
			secrets: []string{"qs-user-Tn4d", "qs-password-Bk7a", "qs-token-Ow2x"},
		},
		testCase{name: "every kind of secret", file: "testdata/secrets.yaml"},
		testCase{name: "nats token", file: "testdata/token.yaml"},
	)

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				if v == "" {
					unsetenv(t, k)
				} else {
					t.Setenv(k, v)
				}
			}
			cfg, err := config.LoadFile(tt.file)
			if err != nil {
				t.Fatalf("the config package rejects %s: %v", tt.file, err)
			}

			r := runBridge(t, "check", "--config", tt.file)

			if r.code != 0 {
				t.Fatalf("want exit 0, got %s", r)
			}
			if r.stderr != "" {
				t.Errorf("stderr is not empty:\n%s", r)
			}
			if !strings.HasPrefix(r.stdout, "configuration OK\n") {
				t.Errorf("stdout does not start with %q:\n%s", "configuration OK", r)
			}
			for _, route := range cfg.Routes {
				for _, want := range append([]string{route.Name, route.Destination}, route.Subjects...) {
					if !strings.Contains(r.stdout, want) {
						t.Errorf("routing table lacks %q (route %s):\n%s", want, route.Name, r.stdout)
					}
				}
			}
			secrets := append(append(envSecrets(), tt.secrets...), configSecrets(t, cfg)...)
			assertNoSecrets(t, r.stdout+r.stderr, secrets)
		})
	}
}

// Bad usage exits 2 with an error that names the flag, file or argument.
func TestCheckUsage(t *testing.T) {
	minimal := filepath.Join(configDir, "testdata", "good", "minimal.yaml")
	missing := filepath.Join(t.TempDir(), "no-such-config.yaml")
	noRoutes := filepath.Join(configDir, "testdata", "bad", "no_routes.yaml")

	tests := []struct {
		name         string
		bridgeConfig string // $BRIDGE_CONFIG; "" unsets it
		args         []string
		code         int
		stdout       []string // each must appear on stdout
		stderr       []string // each must appear on stderr
		notStderr    []string // none may appear on stderr
	}{
		{
			name:   "no --config and no $BRIDGE_CONFIG",
			args:   []string{"check"},
			code:   2,
			stderr: []string{"--config"},
		},
		{
			name:         "$BRIDGE_CONFIG is honoured",
			bridgeConfig: minimal,
			args:         []string{"check"},
			code:         0,
			stdout:       []string{"configuration OK", "hook"},
		},
		{
			name:         "$BRIDGE_CONFIG with an invalid file",
			bridgeConfig: noRoutes,
			args:         []string{"check"},
			code:         2,
			stderr:       []string{"routes: at least one route is required"},
		},
		{
			name:         "--config wins over $BRIDGE_CONFIG",
			bridgeConfig: missing,
			args:         []string{"check", "--config", minimal},
			code:         0,
			stdout:       []string{"configuration OK"},
		},
		{
			name:   "unknown command",
			args:   []string{"frobnicate", "--config", minimal},
			code:   2,
			stderr: []string{`"frobnicate"`},
		},
		{
			name:   "unknown flag",
			args:   []string{"check", "--config", minimal, "--frobnicate"},
			code:   2,
			stderr: []string{"frobnicate"},
		},
		{
			name:   "unknown flag before a positional argument",
			args:   []string{"check", "--frobnicate", "extra"},
			code:   2,
			stderr: []string{"frobnicate"},
		},
		{
			name:   "--config without a value",
			args:   []string{"check", "--config"},
			code:   2,
			stderr: []string{"config"},
		},
		{
			name:   "missing file",
			args:   []string{"check", "--config", missing},
			code:   2,
			stderr: []string{missing},
		},
		{
			name:   "single-dash flag",
			args:   []string{"check", "-config", minimal},
			code:   0,
			stdout: []string{"configuration OK"},
		},
		{
			name:      "positional argument, --config after it",
			args:      []string{"check", "extra", "--config", minimal},
			code:      2,
			stderr:    []string{`"extra"`},
			notStderr: []string{"--config is required"},
		},
		{
			name:   "positional argument before --config",
			args:   []string{"check", "--config", minimal, "extra"},
			code:   2,
			stderr: []string{`"extra"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.bridgeConfig == "" {
				unsetenv(t, "BRIDGE_CONFIG")
			} else {
				t.Setenv("BRIDGE_CONFIG", tt.bridgeConfig)
			}

			r := runBridge(t, tt.args...)

			if r.code != tt.code {
				t.Fatalf("bridge %q: want exit %d, got %s", tt.args, tt.code, r)
			}
			if tt.code != 0 && r.stdout != "" {
				t.Errorf("bridge %q: stdout is not empty on bad usage:\n%s", tt.args, r)
			}
			for _, want := range tt.stdout {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("bridge %q: stdout lacks %q:\n%s", tt.args, want, r)
				}
			}
			for _, want := range tt.stderr {
				if !strings.Contains(r.stderr, want) {
					t.Errorf("bridge %q: stderr lacks %q:\n%s", tt.args, want, r)
				}
			}
			for _, bad := range tt.notStderr {
				if strings.Contains(r.stderr, bad) {
					t.Errorf("bridge %q: stderr contains %q:\n%s", tt.args, bad, r)
				}
			}
		})
	}
}

// bridge version names jetbridge, the Go version and the nats-server
// version built in.
func TestVersion(t *testing.T) {
	natsServer := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range bi.Deps {
			if dep.Path == "github.com/nats-io/nats-server/v2" {
				natsServer = strings.TrimPrefix(dep.Version, "v")
			}
		}
	}
	if natsServer == "" {
		t.Fatal("the test binary's build info does not list github.com/nats-io/nats-server/v2")
	}

	r := runBridge(t, "version")

	if r.code != 0 || r.stderr != "" {
		t.Fatalf("want exit 0 and an empty stderr, got %s", r)
	}
	for _, want := range []string{"jetbridge ", runtime.Version(), "nats-server " + natsServer} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("version output lacks %q:\n%s", want, r.stdout)
		}
	}
}

// check --json: the routing table for scripts, and the problems of an
// invalid file with exit 2.
func TestCheckJSON(t *testing.T) {
	setCheckEnv(t)
	r := runBridge(t, "check", "--json", "--config", filepath.Join(configDir, "quickstart.yaml"))
	var rep checkReport
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rep) != nil {
		t.Fatalf("check --json: %s", r)
	}
	if !rep.OK || len(rep.Routes) != 1 || rep.Routes[0].Name != "all-events" || rep.Stream.Name != "EVENTS" || len(rep.Destinations) != 1 {
		t.Errorf("report %+v", rep)
	}
	r = runBridge(t, "check", "--json", "--config", filepath.Join(configDir, "testdata", "bad", "no_routes.yaml"))
	rep = checkReport{}
	if r.code != 2 || json.Unmarshal([]byte(r.stdout), &rep) != nil || rep.OK || len(rep.Errors) == 0 || !strings.Contains(rep.Errors[0], "routes") {
		t.Errorf("invalid file: %s", r)
	}
	r = runBridge(t, "check", "--json")
	if r.code != 2 || !strings.Contains(r.stdout, `"ok":false`) || !strings.Contains(r.stdout, "--config is required") {
		t.Errorf("no --config: %s", r)
	}
}

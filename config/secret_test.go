package config

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// Canary secrets: none of these strings may appear in any printed or encoded
// form of a Config, nor in any error.
var canaries = map[string]string{
	"NATS_USER":   "canaryNatsUrlUser",
	"NATS_PASS":   "canaryNatsUrlPass",
	"PASSWORD":    "canaryNatsPassword",
	"URL_USER":    "canaryDestUser",
	"URL_PASS":    "canaryDestPass",
	"QUERY":       "canaryQueryValue",
	"API_KEY":     "canaryApiKeyHeader",
	"AUTH":        "canaryAuthorizationHeader",
	"SIGNING_RAW": "canarySigningSecretRawOf24Bytes",
	"SIGNING_B64": "whsec_" + base64.StdEncoding.EncodeToString([]byte("canarySigningSecretDecoded32b!!")),
}

const canaryConfig = `nats:
  url: nats://${NATS_USER}:${NATS_PASS}@127.0.0.1:4222
  user: bridge
  password: ${PASSWORD}
destinations:
  hook:
    url: https://${URL_USER}:${URL_PASS}@example.com/hook?token=${QUERY}&v=1
    headers:
      X-Api-Key: ${API_KEY}
      Authorization: Bearer ${AUTH}
    signing:
      secret: ["${SIGNING_RAW}", "${SIGNING_B64}"]
routes:
  - name: r
    subjects: ["events.>"]
    destination: hook
`

func assertNoCanary(t *testing.T, what, s string) {
	t.Helper()
	for name, v := range canaries {
		if strings.Contains(s, v) {
			t.Errorf("%s leaks %s:\n%s", what, name, s)
		}
	}
	if b64, ok := strings.CutPrefix(canaries["SIGNING_B64"], "whsec_"); ok && strings.Contains(s, b64) {
		t.Errorf("%s leaks the base64 signing secret", what)
	}
}

func TestSecretsNeverPrinted(t *testing.T) {
	c := mustLoad(t, canaryConfig, canaries)
	c.NATS.Token = "canaryNatsToken" // not combinable with a password in a valid file
	canaries["TOKEN"] = string(c.NATS.Token)
	t.Cleanup(func() { delete(canaries, "TOKEN") })

	d := c.Destinations["hook"]
	if d.Headers["X-Api-Key"].Value() != canaries["API_KEY"] || d.URL.Value() == "" {
		t.Fatal("Value() does not return the secret")
	}

	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%10.3s", "%-8q"} { // not %p: on a non-pointer it bypasses every method (vet reports it)
		for name, v := range map[string]any{
			"config": c, "*config": *c, "destination": d, "*destination": *d,
			"signing": d.Signing, "*signing": *d.Signing, "secrets": d.Signing.Secrets,
			"headers": d.Headers, "nats": c.NATS, "url": d.URL, "destinations": c.Destinations,
			"error": fmt.Errorf("wrapped %v", d.URL),
		} {
			assertNoCanary(t, fmt.Sprintf("fmt %s of %s", verb, name), fmt.Sprintf(verb, v))
		}
	}
	j, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	assertNoCanary(t, "json.Marshal", string(j))
	y, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	assertNoCanary(t, "yaml.Marshal", string(y))
	if !strings.Contains(string(y), "url: '[redacted]'") || !strings.Contains(string(j), `"[redacted]"`) {
		t.Errorf("secrets are not shown as [redacted]:\n%s\n%s", y, j)
	}
	assertNoCanary(t, "RedactedURL", d.URL.RedactedURL()+c.NATS.URL.RedactedURL())
}

func TestSecretsNeverInErrors(t *testing.T) {
	bad := strings.NewReplacer(
		"https://", "ftp://", // bad scheme, URL with user info and query
		"  user: bridge\n", "", // password without user
		`"${SIGNING_RAW}"`, `"short-${QUERY}"`, // signing secret too short... not: 22+ bytes; see below
		"X-Api-Key", "X Api Key", // bad header name
	).Replace(canaryConfig)
	bad += "    max_deliver: 0\n"
	env := map[string]string{}
	for k, v := range canaries {
		env[k] = v
	}
	env["QUERY"] = "x" // makes the first signing secret "short-x", under 24 bytes
	_, err := loadWith([]byte(bad), "c.yaml", lookupIn(env))
	if err == nil {
		t.Fatal("load succeeded")
	}
	for _, want := range []string{"nats.password", "destinations.hook.url", "signing.secret[0]", "headers.X Api Key", "max_deliver"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not report %s:\n%v", want, err)
		}
	}
	assertNoCanary(t, "error", err.Error())

	// A URL that does not parse, and a secret that is not base64.
	bad = strings.NewReplacer("@example.com", "@[::1", `"${SIGNING_B64}"`, `"whsec_${API_KEY}!"`).Replace(canaryConfig)
	_, err = loadWith([]byte(bad), "c.yaml", lookupIn(canaries))
	if err == nil {
		t.Fatal("load succeeded")
	}
	assertNoCanary(t, "error", err.Error())

	// A wrongly typed value that came from a secret.
	_, err = loadWith([]byte(minimal+"    max_deliver: ${API_KEY}\n    max_in_flight: ${AUTH}x\n"), "c.yaml", lookupIn(canaries))
	if err == nil {
		t.Fatal("load succeeded")
	}
	assertNoCanary(t, "type error", err.Error())
}

func TestSecretString(t *testing.T) {
	if got := Secret("").String(); got != "" {
		t.Errorf("empty secret prints %q", got)
	}
	s := Secret("hunter2")
	for _, got := range []string{s.String(), fmt.Sprint(s), fmt.Sprintf("%#v", s), fmt.Sprintf("%d", s), fmt.Sprintf("%t", s), fmt.Sprintf("%x", s)} {
		if strings.Contains(got, "hunter2") || strings.Contains(got, fmt.Sprintf("%x", "hunter2")) {
			t.Errorf("got %q", got)
		}
	}
	if b, _ := s.MarshalText(); string(b) != "[redacted]" {
		t.Errorf("MarshalText = %q", b)
	}
	if b, _ := json.Marshal(Secret("")); string(b) != `""` {
		t.Errorf("empty secret JSON = %s", b)
	}
}

func TestSecretDecodesRealValue(t *testing.T) {
	var v struct {
		S Secret `yaml:"s"`
	}
	if err := yaml.Unmarshal([]byte("s: hunter2"), &v); err != nil || v.S.Value() != "hunter2" {
		t.Fatalf("yaml decode: %q, %v", v.S.Value(), err)
	}
	var j struct{ S Secret }
	if err := json.Unmarshal([]byte(`{"S":"hunter2"}`), &j); err != nil || j.S.Value() != "hunter2" {
		t.Fatalf("json decode: %q, %v", j.S.Value(), err)
	}
}

func TestRedactedURL(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"", ""},
		{"http://127.0.0.1:9091/notifier/alerts", "http://127.0.0.1:9091/notifier/alerts"},
		{"https://user:pass@example.com/hook", "https://xxxxx@example.com/hook"},
		{"nats://tokenonly@127.0.0.1:4222", "nats://xxxxx@127.0.0.1:4222"},
		{"https://example.com/hook?api_key=abc&v=1&v=2", "https://example.com/hook?api_key=xxxxx&v=xxxxx&v=xxxxx"},
		{"https://example.com/hook#access_token=abc", "https://example.com/hook#xxxxx"},
		{"nats://a:b@h1:4222,nats://c:d@h2:4222", "nats://xxxxx@h1:4222,nats://xxxxx@h2:4222"},
		{"https://example.com/hook?ids=1,2", "https://example.com/hook?ids=xxxxx"},
		{"http://[::1", "[redacted]"},
		{"localhost:secret", "[redacted]"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := Secret(tt.in).RedactedURL(); got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestSensitiveHeader(t *testing.T) {
	tests := []struct {
		name string
		want bool
	}{
		{"Authorization", true},
		{"authorization", true},
		{"Proxy-Authorization", true},
		{"Cookie", true},
		{"Set-Cookie", true},
		{"X-Api-Key", true},
		{"X-API-KEY", true},
		{"X-Auth-Token", true},
		{"X-Webhook-Secret", true},
		{"Content-Type", false},
		{"X-Event-Id", false},
		{"User-Agent", false},
	}
	for _, tt := range tests {
		if got := SensitiveHeader(tt.name); got != tt.want {
			t.Errorf("SensitiveHeader(%q) = %v, want %v", tt.name, got, tt.want)
		}
	}
}

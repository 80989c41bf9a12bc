package config

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// The values of the security review: each must come through as exactly the
// scalar's text, and appear in no error.

// natsPassword is a configuration whose nats.password is ${PW}.
const natsPassword = `nats:
  url: nats://127.0.0.1:4222
  user: bridge
  password: ${PW}
` + minimal

// injectionLoad loads yml with env through load (loadWith, or the old
// splice in the negative controls).
type injectionLoad func(data []byte, source string, lookup func(string) (string, bool)) (*Config, error)

// passwordOf loads natsPassword with PW=pw and returns the password, or
// the error text.
func passwordOf(t *testing.T, load injectionLoad, pw string) (string, string) {
	t.Helper()
	c, err := load([]byte(natsPassword), "test.yaml", lookupIn(map[string]string{"PW": pw}))
	if err != nil {
		return "", err.Error()
	}
	return c.NATS.Password.Value(), ""
}

func TestEnvAnchorIsData(t *testing.T) {
	const pw = "*hunter2SECRET"
	if got, errText := passwordOf(t, loadWith, pw); got != pw || errText != "" {
		t.Fatalf("password %q, error %q; want %q and no error", got, errText, pw)
	}
	// In a key that wants an integer, the error names the variable only.
	_, err := loadWith([]byte(minimal+"    max_in_flight: ${PW}\n"), "test.yaml", lookupIn(map[string]string{"PW": pw}))
	const want = "test.yaml:8: routes[0].max_in_flight: the value of ${PW} is not an integer"
	if err == nil || err.Error() != want {
		t.Fatalf("got %v\nwant %s", err, want)
	}

	// Negative control: spliced into the text, the value was an alias, and
	// the parser's error printed it.
	if _, errText := passwordOf(t, loadSpliced, pw); !strings.Contains(errText, "hunter2SECRET") {
		t.Fatalf("the old splice did not leak the anchor name: %q", errText)
	}
}

func TestEnvTagIsData(t *testing.T) {
	const pw = "!!int x"
	if got, errText := passwordOf(t, loadWith, pw); got != pw || errText != "" {
		t.Fatalf("password %q, error %q; want %q and no error", got, errText, pw)
	}
	_, err := loadWith([]byte(minimal+"    max_deliver: ${PW}\n"), "test.yaml", lookupIn(map[string]string{"PW": pw}))
	const want = "test.yaml:8: routes[0].max_deliver: the value of ${PW} is not an integer"
	if err == nil || err.Error() != want {
		t.Fatalf("got %v\nwant %s", err, want)
	}

	// Negative control: spliced, the tag was YAML and the password no
	// longer the value.
	if got, _ := passwordOf(t, loadSpliced, pw); got == pw {
		t.Fatal("the old splice kept the tag as text")
	}
}

func TestEnvCommentIsData(t *testing.T) {
	const pw = "x #y"
	if got, errText := passwordOf(t, loadWith, pw); got != pw || errText != "" {
		t.Fatalf("password %q, error %q; want %q and no error", got, errText, pw)
	}
	// Negative control: spliced, the rest was a comment.
	if got, errText := passwordOf(t, loadSpliced, pw); got != "x" {
		t.Fatalf("the old splice gave %q (%s), want the cut value x", got, errText)
	}
}

// injectionHeaders is a destination whose one header comes from ${KEY}.
const injectionHeaders = `destinations:
  hook:
    url: http://127.0.0.1:9091/hook
    headers: {X-Api-Key: "${KEY}"}
routes:
  - name: r
    subjects: ["events.>"]
    destination: hook
`

// injectedKey breaks out of the quotes it is written in.
const injectedKey = `abc", X-Injected: "yes", Authorization: "Bearer from-env`

// headerCheck returns what is wrong with the headers of the hook
// destination: any header but X-Api-Key, or a value other than want.
func headerCheck(h map[string]Secret, want string) string {
	if names := slices.Sorted(maps.Keys(h)); !reflect.DeepEqual(names, []string{"X-Api-Key"}) {
		return "headers " + strings.Join(names, ", ") + ", want X-Api-Key only"
	}
	if h["X-Api-Key"].Value() != want {
		return "X-Api-Key is not the whole value"
	}
	return ""
}

func TestEnvHeaderInjection(t *testing.T) {
	env := lookupIn(map[string]string{"KEY": injectedKey})
	c, err := loadWith([]byte(injectionHeaders), "test.yaml", env)
	if err != nil {
		t.Fatal(err)
	}
	if why := headerCheck(c.Destinations["hook"].Headers, injectedKey); why != "" {
		t.Fatal(why)
	}

	// Negative control: the same check catches the old splice, which
	// delivered two injected headers.
	c, err = loadSpliced([]byte(injectionHeaders), "test.yaml", env)
	if err != nil {
		t.Fatal(err)
	}
	const want = "headers Authorization, X-Api-Key, X-Injected, want X-Api-Key only"
	if why := headerCheck(c.Destinations["hook"].Headers, injectedKey); why != want {
		t.Fatalf("check of the spliced file: %q, want %q", why, want)
	}
}

// A value that breaks the YAML structure in every way at once stays one
// scalar, whatever the key's type.
func TestEnvValueNeverChangesStructure(t *testing.T) {
	const evil = "x\n  extra: 1\n- item\n&a *b !!map {k: v} [1] # c"
	env := lookupIn(map[string]string{"V": evil})
	c, err := loadWith([]byte(injectionHeaders), "test.yaml", lookupIn(map[string]string{"KEY": evil}))
	if err == nil || err.Error() != "test.yaml:4: destinations.hook.headers.X-Api-Key: the value contains a line break or NUL" {
		t.Fatalf("got %v, %v", c, err)
	}
	c, err = loadWith([]byte(natsPassword), "test.yaml", lookupIn(map[string]string{"PW": evil}))
	if err != nil || c.NATS.Password.Value() != evil {
		t.Fatalf("password: %v", err)
	}
	_, err = loadWith([]byte("stream:\n  subjects: ${V}\n"+minimal), "test.yaml", env)
	if err == nil || err.Error() != "test.yaml:2: stream.subjects: the value of ${V} is not a list" {
		t.Fatalf("got %v", err)
	}
}

// A plain scalar that holds references is read as YAML reads a plain
// scalar's text; a quoted one stays a string; only an empty value is null.
func TestResolvedScalarTypes(t *testing.T) {
	env := lookupIn(map[string]string{"N": "9", "T": "45s", "B": "true", "F": "1.5", "NULL": "null", "EMPTY": ""})
	c, err := loadWith([]byte(`nats:
  url: nats://127.0.0.1:4222
  user: ${NULL}
  password: ${NULL}
  token: ""
log:
  level: ${EMPTY}
`+strings.Replace(minimal, "    url:", "    transport_retry: {backoff_factor: \"${F}\"}\n    url:", 1)+`    max_deliver: ${N}
    ack_wait: ${T}
    idempotency: ${B}
    max_in_flight: ${N}${N}
    backoff: ["${T}", !!str "${T}"]
`), "test.yaml", env)
	if err == nil || err.Error() != "test.yaml:10: destinations.hook.transport_retry.backoff_factor: the value of ${F} is not a number" {
		t.Fatalf("a quoted reference is a string: got %v", err)
	}
	c, err = loadWith([]byte(strings.Replace(minimal, "    url:", "    transport_retry: {backoff_factor: 1.5}\n    url:", 1)+`    max_deliver: ${N}
    ack_wait: ${T}
    idempotency: ${B}
    max_in_flight: ${N}${N}
    backoff: ["${T}", !!str "${T}"]
nats:
  url: nats://127.0.0.1:4222
  user: ${NULL}
  password: ${NULL}
log:
  level: ${EMPTY}
`), "test.yaml", env)
	if err != nil {
		t.Fatal(err)
	}
	r := c.Routes[0]
	if r.MaxDeliver != 9 || r.AckWait.D().String() != "45s" || !r.Idempotency || r.MaxInFlight != 99 || len(r.Backoff) != 2 || r.Backoff[1].D().String() != "45s" {
		t.Errorf("route %+v", r)
	}
	if c.NATS.User != "null" || c.NATS.Password.Value() != "null" {
		t.Errorf("user %q, password %q: want the text null", c.NATS.User, c.NATS.Password.Value())
	}
	if c.Log.Level != "info" {
		t.Errorf("log.level %q: an empty value is null, as `level:` is, and keeps the default", c.Log.Level)
	}
}

// Keys are never resolved, comments need no variable, $${ is a literal ${,
// and every value stays in its place when the document uses anchors.
func TestResolvingLeavesTheRestAlone(t *testing.T) {
	env := lookupIn(map[string]string{"H": "X-Injected", "V": "v"})
	_, err := loadWith([]byte(strings.Replace(minimal, "    url:", "    headers: {\"${H}\": v}\n    url:", 1)), "test.yaml", env)
	if err == nil || err.Error() != `test.yaml:3: destinations.hook.headers.${H}: "${H}" is not a valid header name` {
		t.Fatalf("a key was resolved: %v", err)
	}
	c, err := loadWith([]byte("# ${UNSET_IN_COMMENT}\n"+strings.Replace(minimal, "    url:", "    headers: # ${UNSET_TOO}\n      X-A: &a \"$${V} ${V}\" # ${UNSET_THREE}\n      X-B: *a\n    url:", 1)), "test.yaml", env)
	if err != nil {
		t.Fatal(err)
	}
	h := c.Destinations["hook"].Headers
	if h["X-A"].Value() != "${V} v" || h["X-B"].Value() != "${V} v" || len(h) != 2 {
		t.Fatalf("headers %q %q", h["X-A"].Value(), h["X-B"].Value())
	}
}

// The decoder decodes the tree that was resolved: this fails if yaml.v3
// stops handing an Unmarshaler its own node (see rootNode), and unknown
// keys stay errors beside references.
func TestReferencesAreResolvedBeforeDecoding(t *testing.T) {
	c := mustLoad(t, minimal+"    max_deliver: ${N}\n", map[string]string{"N": "7"})
	if c.Routes[0].MaxDeliver != 7 {
		t.Fatalf("max_deliver = %d, want 7", c.Routes[0].MaxDeliver)
	}
	got := loadErr(t, minimal+"    max_deliver: ${N}\n    extra: ${N}\n", map[string]string{"N": "7"})
	if want := `test.yaml:9: routes[0].extra: unknown key "extra"`; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// Validate on a loaded Config still names references: the origins travel
// with the Config.
func TestValidateAfterLoadNamesReferences(t *testing.T) {
	c := mustLoad(t, minimal+"    max_deliver: ${N}\n", map[string]string{"N": "7"})
	c.Routes[0].MaxDeliver = -7
	if err := c.Validate(); err == nil || err.Error() != "routes[0].max_deliver: must be at least 1, got the value of ${N}" {
		t.Fatalf("got %v", err)
	}
}

// In a flow collection an unquoted reference is a syntax error; the
// message says to quote it.
func TestUnquotedReferenceInFlow(t *testing.T) {
	got := loadErr(t, strings.Replace(injectionHeaders, `"${KEY}"`, "${KEY}", 1), map[string]string{"KEY": "k"})
	want := `test.yaml:4: a { mapping is not closed (did not find the expected ',' or '}'); inside [ ] or { }, quote a reference: "${VAR}"`
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// An explicit tag other than !!str on a value with a reference is refused:
// yaml.v3 would quote the value when it does not fit the tag.
func TestTaggedReference(t *testing.T) {
	env := map[string]string{"N": canary, "S": "5"}
	got := loadErr(t, minimal+"    max_deliver: !!int ${N}\n", env)
	if want := "test.yaml:8: routes[0].max_deliver: the tag !!int on a value with a ${...} reference is not supported (only !!str is): remove it"; got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	c := mustLoad(t, strings.Replace(natsPassword, "${PW}", "!!str ${S}", 1), env)
	if c.NATS.Password.Value() != "5" {
		t.Fatalf("password %q", c.NATS.Password.Value())
	}
	got = loadErr(t, minimal+"    max_deliver: !!str ${S}\n", env)
	if want := "test.yaml:8: routes[0].max_deliver: the value of ${S} is not an integer"; got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

const minimal = `destinations:
  hook:
    url: http://127.0.0.1:9091/hook
routes:
  - name: r
    subjects: ["events.>"]
    destination: hook
`

func mustLoad(t *testing.T, yml string, env map[string]string) *Config {
	t.Helper()
	c, err := loadWith([]byte(yml), "test.yaml", lookupIn(env))
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	return c
}

func loadErr(t *testing.T, yml string, env map[string]string) string {
	t.Helper()
	_, err := loadWith([]byte(yml), "test.yaml", lookupIn(env))
	if err == nil {
		t.Fatal("load succeeded, want an error")
	}
	return err.Error()
}

func TestExpand(t *testing.T) {
	env := map[string]string{"HOST": "example.com", "EMPTY": "", "PASS": "pa$$w${rd", "MULTI": "a\nb"}
	tests := []struct {
		name, in, want string
		refs           []string
	}{
		{"set", "http://${HOST}/x", "http://example.com/x", []string{"${HOST}"}},
		{"default when unset", "${NOPE:-5}", "5", []string{"${NOPE:-5}"}},
		{"default when empty", "${EMPTY:-5}", "5", []string{"${EMPTY:-5}"}},
		{"set beats default", "${HOST:-other}", "example.com", []string{"${HOST:-other}"}},
		{"empty default", "${NOPE:-}", "", []string{"${NOPE:-}"}},
		{"set but empty", "${EMPTY}", "", []string{"${EMPTY}"}},
		{"escape", "$${HOST}", "${HOST}", nil},
		{"bare dollar", "pa$word$", "pa$word$", nil},
		{"double dollar without brace", "a$$b", "a$$b", nil},
		{"value is not expanded again", "${PASS}", "pa$$w${rd", []string{"${PASS}"}},
		{"two in a value", "${HOST}:${NOPE:-80}", "example.com:80", []string{"${HOST}", "${NOPE:-80}"}},
		{"a line break is data", "${MULTI}", "a\nb", []string{"${MULTI}"}},
		{"brace in a default", "${NOPE:-{x}}", "{x}", []string{"${NOPE:-{x}"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := &expander{lookup: lookupIn(env), dir: "."}
			got, refs, problems := x.scalar(tt.in)
			if len(problems) > 0 {
				t.Fatalf("problems: %q", problems)
			}
			if got != tt.want || !reflect.DeepEqual(refs, tt.refs) {
				t.Fatalf("got %q %q, want %q %q", got, refs, tt.want, tt.refs)
			}
		})
	}
}

func TestExpandErrors(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"unset names var and line", "a: 1\nb: ${NOT_SET_VAR}", "f.yaml:2: b: environment variable NOT_SET_VAR is not set"},
		{"unterminated", "a: ${OOPS", "f.yaml:1: a: unterminated ${ (write $${ for a literal ${)"},
		{"invalid name", "a: ${1X}", `f.yaml:1: a: invalid variable name "1X" in ${...}`},
		{"nested", "a: ${A:-${B}}", "f.yaml:1: a: nested ${ in the default of A is not supported"},
		{"in a list item", "a:\n  - x\n  - '${NOT_SET_VAR}'", "f.yaml:3: a[1]: environment variable NOT_SET_VAR is not set"},
		{"in a block scalar", "a: |\n  x\n  ${NOT_SET_VAR}\n", "f.yaml:1: a: environment variable NOT_SET_VAR is not set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadWith([]byte(tt.in), "f.yaml", lookupIn(nil))
			if err == nil || err.Error() != tt.want {
				t.Fatalf("got %v\nwant %s", err, tt.want)
			}
		})
	}
}

func TestLoadReportsEveryUnsetVariable(t *testing.T) {
	got := loadErr(t, "a: ${FIRST_UNSET}\nb: ${SECOND_UNSET}\n", nil)
	for _, want := range []string{"test.yaml:1: a: environment variable FIRST_UNSET", "test.yaml:2: b: environment variable SECOND_UNSET"} {
		if !strings.Contains(got, want) {
			t.Errorf("error %q does not contain %q", got, want)
		}
	}
}

func TestLoadExpandsBeforeParsing(t *testing.T) {
	c := mustLoad(t, minimal+"    max_deliver: ${MAX_DELIVER}\n    ack_wait: ${ACK_WAIT:-45s}\n",
		map[string]string{"MAX_DELIVER": "9"})
	if got := c.Routes[0].MaxDeliver; got != 9 {
		t.Errorf("max_deliver = %d, want 9", got)
	}
	if got := c.Routes[0].AckWait.D(); got != 45*time.Second {
		t.Errorf("ack_wait = %s, want 45s", got)
	}
}

func TestUnknownKeys(t *testing.T) {
	tests := []struct {
		name, yml, want string
	}{
		{"top level", minimal + "extra: 1\n", `test.yaml:8: extra: unknown key "extra"`},
		{"nested struct", "stream:\n  nme: X\n" + minimal, `test.yaml:2: stream.nme: unknown key "nme"; did you mean "name"?`},
		{"inside destination", strings.Replace(minimal, "    url:", "    urls: x\n    url:", 1),
			`test.yaml:3: destinations.hook.urls: unknown key "urls"; did you mean "url"?`},
		{"inside destination struct", strings.Replace(minimal, "    url:", "    transport_retry: {cnt: 1}\n    url:", 1),
			`test.yaml:3: destinations.hook.transport_retry.cnt: unknown key "cnt"`},
		{"inside route", minimal + "    subject: x\n", `test.yaml:8: routes[0].subject: unknown key "subject"; did you mean "subjects"?`},
		{"inside second route", minimal + "  - name: s\n    subjects: [events.info.>]\n    destination: hook\n    retry: 1\n",
			`test.yaml:11: routes[1].retry: unknown key "retry"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := loadErr(t, tt.yml, nil); got != tt.want {
				t.Fatalf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
}

func TestExplicitZeroDiffersFromAbsent(t *testing.T) {
	c := mustLoad(t, `idempotency: {bucket: ""}
stream: {create: false}
admin: {listen: ""}
destinations:
  zero:
    url: http://127.0.0.1/z
    transport_retry: {count: 0}
    status_retry: {count: 0}
    circuit_breaker: {enabled: false}
  dflt:
    url: http://127.0.0.1/d
routes:
  - name: r
    subjects: ["events.>"]
    destination: zero
    max_retry_after: 0s
    redeliver_statuses: []
`, nil)
	zero, dflt := c.Destinations["zero"], c.Destinations["dflt"]
	if zero.TransportRetry.Count != 0 || dflt.TransportRetry.Count != 2 {
		t.Errorf("transport_retry.count: zero %d, default %d; want 0 and 2", zero.TransportRetry.Count, dflt.TransportRetry.Count)
	}
	if zero.TransportRetry.Interval.D() != 50*time.Millisecond {
		t.Errorf("transport_retry.interval = %s, want the default 50ms beside an explicit count", zero.TransportRetry.Interval)
	}
	if zero.StatusRetry == nil || zero.StatusRetry.Count != 0 || zero.StatusRetry.MaxElapsed.D() != 5*time.Second {
		t.Errorf("status_retry = %+v, want count 0 and the other defaults", zero.StatusRetry)
	}
	if dflt.StatusRetry != nil {
		t.Errorf("absent status_retry = %+v, want nil", dflt.StatusRetry)
	}
	if zero.CircuitBreaker.Enabled || zero.CircuitBreaker.MinRequests != 10 {
		t.Errorf("circuit_breaker = %+v, want disabled with default values", zero.CircuitBreaker)
	}
	if c.Idempotency.Bucket != "" || c.Stream.Create || c.Admin.Listen != "" {
		t.Errorf("explicit empty/false values were replaced by defaults: %+v %+v %+v", c.Idempotency, c.Stream, c.Admin)
	}
	r := c.Routes[0]
	if r.MaxRetryAfter != 0 || r.RedeliverStatuses == nil || len(r.RedeliverStatuses) != 0 {
		t.Errorf("route = %+v, want max_retry_after 0 and empty redeliver_statuses", r)
	}
}

func TestDefaultSlicesAreNotShared(t *testing.T) {
	c := mustLoad(t, minimal+"  - name: s\n    subjects: [events.info.>]\n    destination: hook\n", nil)
	c.Routes[0].Backoff[0] = 0
	c.Routes[0].RedeliverStatuses[0] = 0
	if c.Routes[1].Backoff[0] == 0 || c.Routes[1].RedeliverStatuses[0] == 0 {
		t.Fatal("routes share their default slices")
	}
	if defaultRoute().Backoff[0] == 0 {
		t.Fatal("a loaded route shares the default slices")
	}
}

func TestDefaults(t *testing.T) {
	got := mustLoad(t, minimal, nil)
	want := &Config{
		NATS: NATS{
			Name:     "jetbridge",
			Embedded: Embedded{Listen: "127.0.0.1:4222", StoreDir: "data/jetstream"},
		},
		Stream: Stream{
			Name: "EVENTS", Subjects: []string{"events.>"}, Create: true,
			DuplicateWindow: Duration(2 * time.Minute), MaxAge: Duration(168 * time.Hour), Replicas: 1,
		},
		DeadLetter:      DeadLetter{Stream: "EVENTS_DLQ", SubjectPrefix: "dlq", MaxAge: Duration(720 * time.Hour), Replicas: 1},
		Idempotency:     Idempotency{Bucket: "EVENTS_DELIVERED", TTL: Duration(24 * time.Hour)},
		Admin:           Admin{Listen: "127.0.0.1:8088"},
		Log:             Log{Level: "info", Format: "json"},
		ShutdownTimeout: Duration(30 * time.Second),
		Destinations: map[string]*Destination{"hook": {
			Name:    "hook",
			URL:     "http://127.0.0.1:9091/hook",
			Timeout: Duration(time.Second),
			Format:  "envelope",
			TransportRetry: Backoff{
				Count: 2, Interval: Duration(50 * time.Millisecond), BackoffFactor: 2, MaxInterval: Duration(200 * time.Millisecond),
			},
			CircuitBreaker: CircuitBreaker{
				Enabled: true, FailureRate: 0.5, MinRequests: 10, Window: Duration(10 * time.Second),
				Delay: Duration(2 * time.Second), SuccessThreshold: 1, Statuses: []int{500, 502, 503, 504},
			},
		}},
		Routes: []*Route{{
			Name: "r", Subjects: []string{"events.>"}, Destination: "hook",
			MaxDeliver: 5,
			Backoff: []Duration{
				Duration(time.Second), Duration(5 * time.Second), Duration(30 * time.Second), Duration(2 * time.Minute),
			},
			AckWait:           Duration(30 * time.Second),
			MaxInFlight:       32,
			RedeliverStatuses: []int{408, 425, 429, 500, 502, 503, 504},
			MaxRetryAfter:     Duration(5 * time.Minute),
		}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("defaults differ\n got %+v\nwant %+v", got, want)
		for name := range want.Destinations {
			t.Errorf("destination\n got %+v\nwant %+v", got.Destinations[name], want.Destinations[name])
		}
		t.Errorf("route\n got %+v\nwant %+v", got.Routes[0], want.Routes[0])
	}

	c := mustLoad(t, strings.Replace(minimal, "    url:", "    status_retry: {}\n    url:", 1), nil)
	wantSR := &StatusRetry{
		Codes:      []int{502, 503, 504},
		Backoff:    Backoff{Count: 2, Interval: Duration(200 * time.Millisecond), BackoffFactor: 2, MaxInterval: Duration(2 * time.Second)},
		MaxElapsed: Duration(5 * time.Second),
	}
	if got := c.Destinations["hook"].StatusRetry; !reflect.DeepEqual(got, wantSR) {
		t.Errorf("status_retry defaults\n got %+v\nwant %+v", got, wantSR)
	}
}

func TestFullFixtureMatchesContract(t *testing.T) {
	c, err := loadFixture(t, "testdata/good/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	d := c.Destinations["caregiver"]
	if d.Name != "caregiver" {
		t.Errorf("name = %q, want caregiver", d.Name)
	}
	if got := d.Headers["X-Api-Key"].Value(); got != "caregiver-api-key" {
		t.Errorf("X-Api-Key = %q, want the expanded value", got)
	}
	if d.Signing == nil || len(d.Signing.Secrets) != 1 || d.Signing.Secrets[0].Value() != fixtureEnv["CAREGIVER_SECRET"] {
		t.Errorf("signing = %+v, want the one expanded secret", d.Signing)
	}
	if d.StatusRetry == nil || !reflect.DeepEqual(d.StatusRetry.Codes, []int{502, 503, 504}) {
		t.Errorf("status_retry = %+v", d.StatusRetry)
	}
	if got := c.Routes[0].Subjects; !reflect.DeepEqual(got, []string{"events.critical.>", "events.warning.sensor.>"}) {
		t.Errorf("subjects = %q", got)
	}
	if c.Embedded() {
		t.Error("Embedded() = true with a nats.url")
	}
}

func TestDurations(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
	}{
		{"250ms", 250 * time.Millisecond},
		{"2m", 2 * time.Minute},
		{"1h30m", 90 * time.Minute},
		{"1.5s", 1500 * time.Millisecond},
		{`"3s"`, 3 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			c := mustLoad(t, minimal+"    max_retry_after: "+tt.in+"\n", nil)
			if got := c.Routes[0].MaxRetryAfter.D(); got != tt.want {
				t.Fatalf("got %s, want %s", got, tt.want)
			}
		})
	}
}

func TestDurationErrors(t *testing.T) {
	tests := []struct {
		name, yml, want string
	}{
		{"no unit", minimal + "    ack_wait: 30\n", `test.yaml:8: routes[0].ack_wait: invalid duration "30": want a Go duration such as 250ms or 2m`},
		{"bad unit", "shutdown_timeout: 5 minutes\n" + minimal, `test.yaml:1: shutdown_timeout: invalid duration "5 minutes"`},
		{"in a list", minimal + "    backoff: [1s, soon]\n", `test.yaml:8: routes[0].backoff[1]: invalid duration "soon"`},
		{"in a flow mapping", "stream: {max_age: 1d, duplicate_window: 2m}\n" + minimal, `test.yaml:1: stream.max_age: invalid duration "1d"`},
		{"not a scalar", "shutdown_timeout: [1s]\n" + minimal, `test.yaml:1: shutdown_timeout: want a duration such as 250ms or 2m, got a list`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := loadErr(t, tt.yml, nil); !strings.HasPrefix(got, tt.want) {
				t.Fatalf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
}

func TestDurationEncoding(t *testing.T) {
	d := Duration(1500 * time.Millisecond)
	if d.String() != "1.5s" {
		t.Errorf("String() = %q", d.String())
	}
	if v, _ := d.MarshalYAML(); v != "1.5s" {
		t.Errorf("MarshalYAML() = %v", v)
	}
	var back Duration
	if err := back.UnmarshalText([]byte("1.5s")); err != nil || back != d {
		t.Errorf("UnmarshalText = %v, %v", back, err)
	}
	if err := back.UnmarshalText([]byte("x")); err == nil {
		t.Error("UnmarshalText accepted x")
	}
}

func TestSigningSecretForms(t *testing.T) {
	const raw = "a-raw-secret-of-at-least-24-bytes"
	for _, tt := range []struct {
		name, secret string
		want         []string
	}{
		{"string", raw, []string{raw}},
		{"list", "[" + raw + ", whsec_MDEyMzQ1Njc4OWFiY2RlZmdoaWprbG1ub3BxcnN0dXY=]", []string{raw, "0123456789abcdefghijklmnopqrstuv"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := mustLoad(t, strings.Replace(minimal, "    url:", "    signing: {secret: "+tt.secret+"}\n    url:", 1), nil)
			keys, err := c.Destinations["hook"].Signing.Keys()
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, k := range keys {
				got = append(got, string(k))
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("keys %q, want %q", got, tt.want)
			}
		})
	}
}

func TestTypeErrorsNamePath(t *testing.T) {
	tests := []struct {
		name, yml, want string
	}{
		{"scalar for int", minimal + "    max_in_flight: many\n", "test.yaml:8: routes[0].max_in_flight: want an integer, got a string"},
		{"mapping for int", minimal + "    max_deliver:\n      a: 1\n", "test.yaml:9: routes[0].max_deliver: want an integer, got a mapping"},
		{"flow mapping for string", minimal + "  - name: {a: 1}\n", "test.yaml:8: routes[1].name: want a string, got a mapping\n" +
			"test.yaml:8: routes[1].subjects: must list at least one subject\ntest.yaml:8: routes[1].destination: is required"},
		{"scalar for list", "stream: {subjects: events.>}\n" + minimal, "test.yaml:1: stream.subjects: want a list, got a string"},
		{"scalar for route", "routes: [r]\ndestinations: {}\n", "test.yaml:1: routes[0]: want a mapping, got a string"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := loadErr(t, tt.yml, nil); got != tt.want {
				t.Fatalf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
}

func TestEmptyFile(t *testing.T) {
	got := loadErr(t, "", nil)
	if got != "routes: at least one route is required" {
		t.Fatalf("got %q", got)
	}
}

func TestValidationErrorShape(t *testing.T) {
	_, err := loadWith([]byte(minimal+"    max_deliver: 0\n    ack_wait: 10ms\nlog: {level: loud}\n"), "c.yaml", nil)
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("%T is not a *ValidationError", err)
	}
	if len(ve.Errors) != 3 || len(ve.Unwrap()) != 3 {
		t.Fatalf("got %d problems, want 3:\n%v", len(ve.Errors), err)
	}
	if lines := strings.Split(err.Error(), "\n"); len(lines) != 3 {
		t.Fatalf("want one line per problem, got %q", err.Error())
	}
	var fe *FieldError
	if !errors.As(err, &fe) {
		t.Fatal("errors.As finds no *FieldError")
	}
	want := FieldError{File: "c.yaml", Line: 10, Path: "log.level", Msg: `must be one of debug, info, warn, error; got "loud"`}
	if *fe != want {
		t.Fatalf("first problem %+v, want %+v", *fe, want)
	}
}

func TestValidateWithoutLoad(t *testing.T) {
	c := mustLoad(t, minimal, nil)
	if err := c.Validate(); err != nil {
		t.Fatalf("a loaded config does not validate: %v", err)
	}
	c.Routes[0].AckWait = 0
	if err := c.Validate(); err == nil || err.Error() != "routes[0].ack_wait: must be at least 1s, got 0s" {
		t.Fatalf("got %v", err)
	}

	var zero Config // must not panic
	if err := zero.Validate(); err == nil {
		t.Fatal("the zero Config validates")
	}
	nilItems := &Config{Destinations: map[string]*Destination{"d": nil}, Routes: []*Route{nil}}
	if err := nilItems.Validate(); err == nil {
		t.Fatal("nil items validate")
	}
}

func TestLoadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bridge.yaml")
	if err := os.WriteFile(path, []byte(minimal+"    max_deliver: 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadFile(path)
	if err == nil || !strings.HasPrefix(err.Error(), path+":8: routes[0].max_deliver:") {
		t.Fatalf("got %v, want the file name and line", err)
	}
	_, err = LoadFile(filepath.Join(t.TempDir(), "missing.yaml"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("got %v, want fs.ErrNotExist", err)
	}
}

// The fleet-wide flow control keeps its counters under jetbridge.>: with
// a destination limited, stream subjects overlapping it are refused; the
// control is the same stream with no destination limited, which loads.
func TestFleetSubjectsOutsideTheStream(t *testing.T) {
	const file = `stream:
  subjects: ["events.>", "jetbridge.*.x.>"]
dead_letter: {subject_prefix: dlq}
destinations:
  d:
    url: http://127.0.0.1:9/x
%s
routes:
  - {name: r, subjects: ["events.>"], destination: d}
`
	_, err := Load([]byte(fmt.Sprintf(file, "    rate_limit: {requests: 5, per: 1s}")), "test.yaml")
	want := `test.yaml:2: stream.subjects[1]: "jetbridge.*.x.>" overlaps jetbridge.>, where the fleet-wide flow control keeps its counters (a destination has a rate_limit or a concurrency limit)`
	if err == nil || err.Error() != want {
		t.Fatalf("limited destination: %v\nwant %s", err, want)
	}
	if _, err := Load([]byte(fmt.Sprintf(file, "")), "test.yaml"); err != nil {
		t.Fatalf("no destination limited: %v", err)
	}
}

package main

import (
	"context"
	"encoding/json"
	"log"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/stdr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sotercare/jetbridge/internal/natstest"
)

// A malformed OTEL_* variable is the bridge's error, not the SDK's log
// line: bridge run and bridge check exit 2 naming the variable and what is
// wrong with its form, never its value, before anything connects or any
// exporter is built; with tracing off they warn. Every malformed value
// carries otelCanary, which must appear nowhere: not in stdout or stderr,
// and not in what OpenTelemetry's default logger and error handler would
// print (installed, writing to a buffer, before each command: a command
// that reached the SDK with these values would leave the canary there).

const otelCanary = "CANARY-91c2"

const wantPairsText = "want comma-separated key=value pairs with percent-encoded values"

// otelCases are malformed values, each with the line bridge prints.
var otelCases = []struct {
	name, env, value string
	extra            map[string]string // also set
	want             string            // the problem, after "VAR: "
}{
	{"headers", "OTEL_EXPORTER_OTLP_HEADERS", "x-honeycomb-team:" + otelCanary, nil,
		"entry 1 has no '='; " + wantPairsText},
	{"traces headers", "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "a=b,x-api-key=%zz" + otelCanary, nil,
		"entry 2: the value is not percent-encoded correctly (write % as %25); " + wantPairsText},
	{"endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT", "http://user:" + otelCanary + "@[bad", nil,
		"does not parse as a URL; want an http:// or https:// URL with a host, e.g. http://127.0.0.1:4318"},
	{"timeout", "OTEL_EXPORTER_OTLP_TIMEOUT", "10s" + otelCanary, nil,
		"want a whole number of milliseconds, 0 or more"},
	{"protocol", "OTEL_EXPORTER_OTLP_PROTOCOL", "http/" + otelCanary, nil,
		"want http/protobuf or grpc"},
	{"compression", "OTEL_EXPORTER_OTLP_COMPRESSION", "gzip" + otelCanary, nil,
		"want gzip or none"},
	{"insecure", "OTEL_EXPORTER_OTLP_TRACES_INSECURE", "true" + otelCanary, nil,
		"want true or false"},
	{"sampler arg", "OTEL_TRACES_SAMPLER_ARG", "0.5" + otelCanary, map[string]string{"OTEL_TRACES_SAMPLER": "parentbased_traceidratio"},
		"want a number from 0 to 1 (the sampled ratio)"},
}

// clearOTELEnv unsets every OTEL_* variable for the test.
func clearOTELEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "OTEL_") {
			unsetenv(t, k)
		}
	}
}

// sdkDefaults installs OpenTelemetry's default logger and error handler
// as the SDK builds them (stdr, which prints error records with their
// values, and log.Print), writing to the returned buffer instead of
// stderr, until the test ends.
func sdkDefaults(t *testing.T) *natstest.Buffer {
	t.Helper()
	buf := &natstest.Buffer{}
	otel.SetLogger(stdr.New(log.New(buf, "", log.LstdFlags|log.Lshortfile)))
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.New(buf, "", log.LstdFlags).Print(err) }))
	t.Cleanup(func() {
		otel.SetLogger(stdr.New(log.New(os.Stderr, "", log.LstdFlags|log.Lshortfile)))
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Print(err) }))
	})
	return buf
}

// noCanary fails the test if the canary is in any of outs.
func noCanary(t *testing.T, outs map[string]string) {
	t.Helper()
	for what, out := range outs {
		if strings.Contains(out, otelCanary) {
			t.Errorf("%s leaks the malformed value:\n%s", what, out)
		}
	}
}

// setCase sets the case's variables; tracing is on through a well-formed
// endpoint unless the case sets the endpoint itself.
func setCase(t *testing.T, env, value string, extra map[string]string, tracing bool) {
	t.Helper()
	clearOTELEnv(t)
	if tracing {
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
	}
	for k, v := range extra {
		t.Setenv(k, v)
	}
	t.Setenv(env, value)
}

// With tracing on, bridge check exits 2 with one line naming the
// variable; with tracing off (no endpoint) it warns like the other
// configuration warnings, exit 0, and prints the same routing table as
// without the variable.
func TestCheckMalformedOTELEnv(t *testing.T) {
	unsetenv(t, "NATS_URL")
	path := writeRunConfig(t, "nats://127.0.0.1:4222", "", t.TempDir(), "")
	clearOTELEnv(t)
	clean := runBridge(t, "check", "--config", path)
	if clean.code != 0 || clean.stderr != "" || !strings.HasPrefix(clean.stdout, "configuration OK\n") {
		t.Fatalf("check without OTEL_* variables: %s", clean)
	}
	for _, tc := range otelCases {
		t.Run(tc.name, func(t *testing.T) {
			setCase(t, tc.env, tc.value, tc.extra, true)
			sdk := sdkDefaults(t)
			r := runBridge(t, "check", "--config", path)
			if want := "bridge: tracing: " + tc.env + ": " + tc.want + "\n"; r.code != 2 || r.stdout != "" || r.stderr != want {
				t.Errorf("tracing on: want exit 2 and stderr %q, got %s", want, r)
			}
			noCanary(t, map[string]string{"stdout": r.stdout, "stderr": r.stderr, "the SDK's default logger": sdk.String()})
			if sdk.String() != "" {
				t.Errorf("the SDK logged:\n%s", sdk)
			}
			j := runBridge(t, "check", "--json", "--config", path)
			var rep checkReport
			if err := json.Unmarshal([]byte(j.stdout), &rep); err != nil || j.code != 2 || rep.OK ||
				len(rep.Errors) != 1 || rep.Errors[0] != "tracing: "+tc.env+": "+tc.want {
				t.Errorf("check --json, tracing on: %v %s", err, j)
			}
			noCanary(t, map[string]string{"--json stdout": j.stdout, "--json stderr": j.stderr})

			if tc.env == "OTEL_EXPORTER_OTLP_ENDPOINT" {
				return // the endpoint turns tracing on
			}
			setCase(t, tc.env, tc.value, tc.extra, false)
			r = runBridge(t, "check", "--config", path)
			want := "bridge: warning: " + tc.env + ": " + tc.want + "; ignored while tracing is off, an error (exit 2) once it is on\n"
			if r.code != 0 || r.stderr != want || r.stdout != clean.stdout {
				t.Errorf("tracing off: want exit 0, stderr %q and the routing table, got %s", want, r)
			}
			noCanary(t, map[string]string{"stdout": r.stdout, "stderr": r.stderr, "the SDK's default logger": sdk.String()})
		})
	}
}

// natsStandIn is a TCP listener where the bridge's NATS should be: it
// records every connection, in order.
type natsStandIn struct {
	ln       net.Listener
	accepted chan net.Conn
}

func newNATSStandIn(t *testing.T) *natsStandIn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &natsStandIn{ln: ln, accepted: make(chan net.Conn, 64)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepted <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		for {
			select {
			case c := <-s.accepted:
				c.Close()
			default:
				return
			}
		}
	})
	return s
}

// connectedBefore reports whether anything connected before a probe
// connection made now: the listener's backlog is in order, so the first
// connection accepted is the probe's unless another came first.
func (s *natsStandIn) connectedBefore(t *testing.T) bool {
	t.Helper()
	probe, err := net.Dial("tcp", s.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	select {
	case c := <-s.accepted:
		return c.RemoteAddr().String() != probe.LocalAddr().String()
	case <-time.After(10 * time.Second):
		t.Fatal("the probe connection was not accepted")
	}
	return false
}

// With tracing on, bridge run exits 2 with one line naming the variable
// before it connects to NATS (nor builds an exporter: the SDK's default
// logger stays empty), and prints nothing else.
func TestRunMalformedOTELEnv(t *testing.T) {
	unsetenv(t, "NATS_URL")
	for _, tc := range otelCases {
		t.Run(tc.name, func(t *testing.T) {
			nats := newNATSStandIn(t)
			path := writeRunConfig(t, "nats://"+nats.ln.Addr().String(), "", t.TempDir(), "")
			setCase(t, tc.env, tc.value, tc.extra, true)
			sdk := sdkDefaults(t)
			done := make(chan result, 1)
			go func() { done <- runBridge(t, "run", "--config", path) }()
			var r result
			select {
			case r = <-done:
			case <-nats.accepted:
				t.Fatal("bridge run connected to NATS with a malformed " + tc.env)
			case <-time.After(30 * time.Second):
				t.Fatal("bridge run still running after 30s; it should have refused " + tc.env)
			}
			if want := "bridge: tracing: " + tc.env + ": " + tc.want + "\n"; r.code != 2 || r.stdout != "" || r.stderr != want {
				t.Errorf("want exit 2, no stdout and stderr %q, got %s", want, r)
			}
			if nats.connectedBefore(t) {
				t.Error("bridge run connected to NATS before refusing " + tc.env)
			}
			noCanary(t, map[string]string{"stdout": r.stdout, "stderr": r.stderr, "the SDK's default logger": sdk.String()})
			if sdk.String() != "" {
				t.Errorf("the SDK logged:\n%s", sdk)
			}
		})
	}
}

// interruptOn sends SIGINT to this process when a line containing marker
// is written (bridge run catches it: its first log line comes after the
// signal handler is set).
type interruptOn struct {
	mu     sync.Mutex
	b      strings.Builder
	marker string
	sent   bool
}

func (w *interruptOn) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.sent && strings.Contains(string(p), w.marker) {
		w.sent = true
		if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
			return 0, err
		}
	}
	return w.b.Write(p)
}

func (w *interruptOn) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// With tracing off, bridge run logs one warning naming the variable and
// exits 0 at SIGINT (sent at its first log line, "jetbridge starting":
// the configuration warnings follow it whatever the signal); the canary
// is nowhere.
func TestRunMalformedOTELEnvTracingOff(t *testing.T) {
	unsetenv(t, "NATS_URL")
	srv := natstest.Start(t)
	for _, tc := range otelCases {
		if tc.env == "OTEL_EXPORTER_OTLP_ENDPOINT" {
			continue // the endpoint turns tracing on
		}
		t.Run(tc.name, func(t *testing.T) {
			path := writeRunConfig(t, srv.URL(), "", t.TempDir(), "")
			if err := os.WriteFile(path, []byte(strings.Replace(mustRead(t, path), "log: {level: error}", "log: {level: info}", 1)), 0o600); err != nil {
				t.Fatal(err)
			}
			setCase(t, tc.env, tc.value, tc.extra, false)
			sdk := sdkDefaults(t)
			stdout := &interruptOn{marker: `"message":"jetbridge starting"`}
			var stderr strings.Builder
			code := run([]string{"run", "--config", path}, stdout, &stderr)
			if code != 0 || stderr.String() != "" {
				t.Fatalf("want exit 0 and no stderr, got %d:\n%s\nstdout:\n%s", code, stderr.String(), stdout)
			}
			var warnings []map[string]any
			for _, l := range lines(stdout.String()) {
				var rec map[string]any
				if err := json.Unmarshal([]byte(l), &rec); err != nil {
					t.Fatalf("log line %q: %v", l, err)
				}
				if rec["key"] == tc.env {
					delete(rec, "time")
					warnings = append(warnings, rec)
				}
			}
			want := map[string]any{"level": "warn", "service": "jetbridge", "key": tc.env,
				"message": tc.want + "; ignored while tracing is off, an error (exit 2) once it is on"}
			if len(warnings) != 1 || !sameRecord(warnings[0], want) {
				t.Errorf("want one warning %v, got %v; stdout:\n%s", want, warnings, stdout)
			}
			noCanary(t, map[string]string{"stdout": stdout.String(), "stderr": stderr.String(), "the SDK's default logger": sdk.String()})
		})
	}
}

func sameRecord(got, want map[string]any) bool {
	if len(got) != len(want) {
		return false
	}
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Negative control: the SDK left to itself, given the same values,
// prints them through its default logger and error handler. (Protocol,
// compression and insecure it takes silently, falling back to its
// defaults: no leak, but no error either.)
func TestSDKDefaultLoggerLeaksMalformedValues(t *testing.T) {
	for _, tc := range otelCases {
		switch tc.env {
		case "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_TRACES_INSECURE":
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			setCase(t, tc.env, tc.value, tc.extra, true)
			sdk := sdkDefaults(t)
			exp, err := otlptracehttp.New(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
			_ = tp.Shutdown(context.Background())
			if !strings.Contains(sdk.String(), otelCanary) {
				t.Fatalf("negative control: the SDK's default logger printed no canary for %s; the tests above prove nothing:\n%s", tc.env, sdk)
			}
		})
	}
}

package export

import (
	"context"
	"log"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/stdr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sotercare/jetbridge/internal/natstest"
)

// canary is in every malformed value: it must appear in no error, warning
// or log record.
const canary = "CANARY-91c2"

// clearEnv unsets every OTEL_* variable for the test.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "OTEL_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
}

// Each checked variable, malformed, gives exactly one error naming it and
// saying what is wrong with its form, without the value; well-formed
// values give none.
func TestCheckEnv(t *testing.T) {
	dir := t.TempDir()
	ca := natstest.NewCA(t, dir, "ca")
	certFile, keyFile := ca.Issue(t, dir, "client", true)
	notPEM := filepath.Join(dir, "not-pem-"+canary)
	if err := os.WriteFile(notPEM, []byte("not a certificate "+canary), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing-"+canary)
	const pairs = "want comma-separated key=value pairs with percent-encoded values"
	for _, tc := range []struct {
		env   map[string]string
		value string // of the variable named want's prefix
		want  string
	}{
		{map[string]string{"OTEL_SDK_DISABLED": "yes" + canary}, "", "OTEL_SDK_DISABLED: want true or false"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "zipkin" + canary}, "", "OTEL_TRACES_EXPORTER: want otlp, console or none"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://user:" + canary + "@[bad"}, "", "OTEL_EXPORTER_OTLP_ENDPOINT: does not parse as a URL; " + wantURL},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "collector:4318/" + canary}, "", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: " + wantURL},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https:///" + canary}, "", "OTEL_EXPORTER_OTLP_ENDPOINT: " + wantURL},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, "", "OTEL_EXPORTER_OTLP_ENDPOINT: is blank; " + wantURL},
		{map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "x-honeycomb-team:" + canary}, "", "OTEL_EXPORTER_OTLP_HEADERS: entry 1 has no '='; " + pairs},
		{map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "a=b,," + canary + "=c"}, "", "OTEL_EXPORTER_OTLP_HEADERS: entry 2 is empty; " + pairs},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x key=" + canary}, "", "OTEL_EXPORTER_OTLP_TRACES_HEADERS: entry 1: the key is not an HTTP header name; " + pairs},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "k=%zz" + canary}, "", "OTEL_EXPORTER_OTLP_TRACES_HEADERS: entry 1: the value is not percent-encoded correctly (write % as %25); " + pairs},
		{map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "k=a%0A" + canary}, "", "OTEL_EXPORTER_OTLP_HEADERS: entry 1: the value holds a control character once decoded; " + pairs},
		{map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "10s" + canary}, "", "OTEL_EXPORTER_OTLP_TIMEOUT: " + wantMillis},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "-1"}, "", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT: " + wantMillis},
		{map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "", "OTEL_EXPORTER_OTLP_PROTOCOL: want http/protobuf or grpc"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": canary}, "", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: want http/protobuf or grpc"},
		{map[string]string{"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd" + canary}, "", "OTEL_EXPORTER_OTLP_COMPRESSION: want gzip or none"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": canary}, "", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION: want gzip or none"},
		{map[string]string{"OTEL_EXPORTER_OTLP_INSECURE": "1" + canary}, "", "OTEL_EXPORTER_OTLP_INSECURE: want true or false"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_INSECURE": "ture" + canary}, "", "OTEL_EXPORTER_OTLP_TRACES_INSECURE: want true or false"},
		{map[string]string{"OTEL_EXPORTER_OTLP_CERTIFICATE": missing}, "", "OTEL_EXPORTER_OTLP_CERTIFICATE: the file it names does not exist"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": notPEM}, "", "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE: the file it names holds no PEM certificate"},
		{map[string]string{"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": certFile}, "", "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: is set without OTEL_EXPORTER_OTLP_CLIENT_KEY; set both or neither"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE": certFile, "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY": missing}, "", "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY: the file it names does not exist"},
		{map[string]string{"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": certFile, "OTEL_EXPORTER_OTLP_CLIENT_KEY": notPEM}, "", "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: the file it names and that of OTEL_EXPORTER_OTLP_CLIENT_KEY are not a PEM certificate and its private key"},
		{map[string]string{"OTEL_TRACES_SAMPLER": "jaeger_remote" + canary}, "", "OTEL_TRACES_SAMPLER: " + wantSampler},
		{map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5" + canary}, "", "OTEL_TRACES_SAMPLER_ARG: want a number from 0 to 1 (the sampled ratio)"},
		{map[string]string{"OTEL_TRACES_SAMPLER_ARG": "1.5"}, "", "OTEL_TRACES_SAMPLER_ARG: want a number from 0 to 1 (the sampled ratio)"},
		{map[string]string{"OTEL_TRACES_SAMPLER_ARG": "NaN"}, "", "OTEL_TRACES_SAMPLER_ARG: want a number from 0 to 1 (the sampled ratio)"},
		{map[string]string{"OTEL_BSP_SCHEDULE_DELAY": "0"}, "", "OTEL_BSP_SCHEDULE_DELAY: want a whole number of milliseconds, 1 or more"},
		{map[string]string{"OTEL_BSP_EXPORT_TIMEOUT": "30s" + canary}, "", "OTEL_BSP_EXPORT_TIMEOUT: " + wantMillis},
		{map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "-3"}, "", "OTEL_BSP_MAX_QUEUE_SIZE: want a whole number, 1 or more"},
		{map[string]string{"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": " 512"}, "", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE: want a whole number, 1 or more"},
		{map[string]string{"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "many" + canary}, "", "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT: want a whole number (negative: no limit)"},
		{map[string]string{"OTEL_LINK_ATTRIBUTE_COUNT_LIMIT": "1.5"}, "", "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT: want a whole number (negative: no limit)"},
		{map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod," + canary}, "", "OTEL_RESOURCE_ATTRIBUTES: entry 2 has no '='; " + pairs},
		{map[string]string{"OTEL_RESOURCE_ATTRIBUTES": " =" + canary}, "", "OTEL_RESOURCE_ATTRIBUTES: entry 1: the key is empty; " + pairs},
		{map[string]string{"OTEL_SERVICE_NAME": "   "}, "", "OTEL_SERVICE_NAME: is blank; want a service name"},
		{map[string]string{"OTEL_SERVICE_NAME": "svc\x1b" + canary}, "", "OTEL_SERVICE_NAME: has a control character; want a service name"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			clearEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			got := CheckEnv()
			if len(got) != 1 || got[0].Error() != tc.want {
				t.Fatalf("CheckEnv() = %q, want exactly %q", got, tc.want)
			}
			if strings.Contains(got[0].Error(), canary) {
				t.Fatalf("the error quotes the value: %q", got[0])
			}
		})
	}

	t.Run("well formed", func(t *testing.T) {
		clearEnv(t)
		for k, v := range map[string]string{
			"OTEL_SDK_DISABLED":                            "False",
			"OTEL_TRACES_EXPORTER":                         "otlp",
			"OTEL_EXPORTER_OTLP_ENDPOINT":                  " http://127.0.0.1:4318 ",
			"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT":           "https://user:pw@collector.example:4318/custom/v1/traces",
			"OTEL_EXPORTER_OTLP_HEADERS":                   "x-honeycomb-team=abc%2Cdef, Authorization = Bearer%20t0k",
			"OTEL_EXPORTER_OTLP_TRACES_HEADERS":            "a=,b=c=d",
			"OTEL_EXPORTER_OTLP_TIMEOUT":                   "10000",
			"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT":            "0",
			"OTEL_EXPORTER_OTLP_PROTOCOL":                  "grpc",
			"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL":           "http/protobuf",
			"OTEL_EXPORTER_OTLP_COMPRESSION":               "gzip",
			"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION":        "none",
			"OTEL_EXPORTER_OTLP_INSECURE":                  "TRUE",
			"OTEL_EXPORTER_OTLP_TRACES_INSECURE":           "false",
			"OTEL_EXPORTER_OTLP_CERTIFICATE":               ca.File(),
			"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE":        ca.File(),
			"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE":        certFile,
			"OTEL_EXPORTER_OTLP_CLIENT_KEY":                keyFile,
			"OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE": certFile,
			"OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY":         keyFile,
			"OTEL_TRACES_SAMPLER":                          "ParentBased_TraceIDRatio",
			"OTEL_TRACES_SAMPLER_ARG":                      "0.25",
			"OTEL_BSP_SCHEDULE_DELAY":                      "20",
			"OTEL_BSP_EXPORT_TIMEOUT":                      "0",
			"OTEL_BSP_MAX_QUEUE_SIZE":                      "16",
			"OTEL_BSP_MAX_EXPORT_BATCH_SIZE":               "8",
			"OTEL_ATTRIBUTE_COUNT_LIMIT":                   "-1",
			"OTEL_SPAN_EVENT_COUNT_LIMIT":                  "64",
			"OTEL_RESOURCE_ATTRIBUTES":                     "deployment.environment=prod,team=care%20ops",
			"OTEL_SERVICE_NAME":                            "jetbridge-eu1",
		} {
			t.Setenv(k, v)
		}
		if got := CheckEnv(); len(got) != 0 {
			t.Fatalf("CheckEnv() = %q, want none", got)
		}
		os.Unsetenv("OTEL_EXPORTER_OTLP_HEADERS")
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "  ") // the exporters read blank as unset
		if got := CheckEnv(); len(got) != 0 {
			t.Fatalf("CheckEnv() = %q, want none", got)
		}
	})
}

// recorder collects what InstallHandlers passes on.
type recorder struct{ errs, logs natstest.Buffer }

func (r *recorder) install() {
	InstallHandlers(func(err error) { r.errs.Write([]byte(err.Error() + "\n")) }, func(s string) { r.logs.Write([]byte(s + "\n")) })
}

// stdrDefaults installs OpenTelemetry's default logger and error handler
// as the SDK builds them, writing to the returned buffer instead of
// stderr.
func stdrDefaults(t *testing.T) *natstest.Buffer {
	t.Helper()
	buf := &natstest.Buffer{}
	otel.SetLogger(stdr.New(log.New(buf, "", log.LstdFlags|log.Lshortfile)))
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.New(buf, "", log.LstdFlags).Print(err) }))
	t.Cleanup(func() { InstallHandlers(nil, nil) })
	return buf
}

// sdkReached builds an OTLP/HTTP exporter and a tracer provider the way
// the SDK reads the environment, skipping the bridge's checks.
func sdkReached(t *testing.T) {
	t.Helper()
	exp, err := otlptracehttp.New(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_ = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp)).Shutdown(context.Background())
}

var malformedSDKEnv = map[string]string{
	"OTEL_EXPORTER_OTLP_HEADERS":         "x-honeycomb-team:" + canary,
	"OTEL_EXPORTER_OTLP_TRACES_HEADERS":  "k=%zz" + canary,
	"OTEL_EXPORTER_OTLP_ENDPOINT":        "http://user:" + canary + "@[bad",
	"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://user:" + canary + "@[bad",
	"OTEL_EXPORTER_OTLP_TIMEOUT":         "10s" + canary,
	"OTEL_TRACES_SAMPLER":                "traceidratio",
	"OTEL_TRACES_SAMPLER_ARG":            "0.5" + canary,
}

// Even when the SDK is reached with malformed values, the handlers pass on
// only the messages and key names; the SDK's default logger and error
// handler (the negative control) print the values.
func TestInstallHandlersWithholdValues(t *testing.T) {
	clearEnv(t)
	for k, v := range malformedSDKEnv {
		t.Setenv(k, v)
	}
	sdk := stdrDefaults(t)
	sdkReached(t)
	if n := strings.Count(sdk.String(), canary); n < 5 {
		t.Fatalf("negative control: the SDK's default logger printed the canary %d times, want 5 or more; the test proves nothing", n)
	}

	var r recorder
	r.install()
	sdkReached(t)
	wantLogs := "opentelemetry error: parse url [withheld: input]\n" +
		"opentelemetry error: parse url [withheld: input]\n" +
		"opentelemetry error: parse headers [withheld: input]\n" +
		"opentelemetry error: escape header value [withheld: value]\n" +
		"opentelemetry error: parse duration [withheld: input]\n"
	if got := r.logs.String(); got != wantLogs {
		t.Errorf("log summaries:\n%s\nwant:\n%s", got, wantLogs)
	}
	// The sampler's error (it quotes the argument) reduced by safeError.
	if got := r.errs.String(); got != "trace export failed\n" {
		t.Errorf("errors: %q", got)
	}
	if strings.Contains(r.logs.String()+r.errs.String(), canary) {
		t.Error("a handler passed on the canary")
	}
}

// Setup installs the handlers, then refuses a malformed variable before
// building anything: the SDK is never reached, so the handlers receive
// nothing at all, and the error names the variable only.
func TestSetupRefusesBeforeTheSDK(t *testing.T) {
	clearEnv(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
	for _, k := range []string{"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_TRACES_SAMPLER_ARG"} {
		t.Run(k, func(t *testing.T) {
			t.Setenv(k, malformedSDKEnv[k])
			sdk := stdrDefaults(t)
			var errs, logs natstest.Buffer
			p, err := Setup(context.Background(), Settings{
				OnError: func(err error) { errs.Write([]byte(err.Error())) },
				OnLog:   func(s string) { logs.Write([]byte(s)) },
			})
			want := CheckEnv()[0].Error()
			if p != nil || err == nil || err.Error() != want || !strings.HasPrefix(want, k+": ") || strings.Contains(want, canary) {
				t.Fatalf("Setup = %v, %v; want the error %q", p, err, want)
			}
			if errs.String() != "" || logs.String() != "" || sdk.String() != "" {
				t.Fatalf("the SDK was reached: errors %q, logs %q, default logger %q", errs.String(), logs.String(), sdk.String())
			}
		})
	}
}

// docs/tracing.md lists every variable CheckEnv checks
// (OTEL_EXPORTER_OTLP_[TRACES_]X stands for both).
func TestTracingDocListsCheckedVariables(t *testing.T) {
	b, err := os.ReadFile("../../docs/tracing.md")
	if err != nil {
		t.Fatal(err)
	}
	section := string(b)
	var listed []string
	for _, m := range regexp.MustCompile("OTEL_[A-Z_\\[\\]]+").FindAllString(section, -1) {
		if strings.Contains(m, "[TRACES_]") {
			listed = append(listed, strings.Replace(m, "[TRACES_]", "", 1), strings.Replace(m, "[TRACES_]", "TRACES_", 1))
		} else {
			listed = append(listed, m)
		}
	}
	for _, v := range CheckedVariables() {
		if !slices.Contains(listed, v) {
			t.Errorf("docs/tracing.md does not list %s", v)
		}
	}
}

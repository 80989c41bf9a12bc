package export

import (
	"log"
	"regexp"
	"strings"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
)

// InstallHandlers makes OpenTelemetry's error handler and internal logger
// the bridge's, replacing the defaults that print to stderr in full (a
// malformed header is quoted, an endpoint with its password):
//
//   - errors (otel.Handle: failed exports, the SDK's own complaints) go to
//     onError reduced by safeError, or, when onError is nil, to the
//     standard logger, reduced the same way;
//   - log records at error and warning level go to onLog as a summary:
//     the record's message and the names of its keys, never the error's
//     text or any value; when onLog is nil they are dropped. Info and
//     debug records are always dropped.
//
// Setup calls it first, before any exporter or provider is built.
func InstallHandlers(onError func(error), onLog func(summary string)) {
	otel.SetLogger(logr.New(summarySink{onLog: onLog}))
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		if onError != nil {
			onError(safeError(err))
			return
		}
		log.Print(safeError(err))
	}))
}

// summarySink is a logr.LogSink that passes on only what cannot carry a
// value: the message (a constant by logr's convention) and the keys.
type summarySink struct {
	onLog func(string)
	name  string
}

// plainKey is what a key may look like to be named in a summary; other
// keys are left out.
var plainKey = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.-]{0,63}$`)

func (s summarySink) Init(logr.RuntimeInfo) {}

// Enabled admits errors and warnings (OpenTelemetry's V(1)).
func (s summarySink) Enabled(level int) bool { return s.onLog != nil && level <= 1 }

func (s summarySink) Info(level int, msg string, kv ...any) {
	if s.Enabled(level) {
		s.onLog(s.summary("warning", msg, kv))
	}
}

func (s summarySink) Error(_ error, msg string, kv ...any) {
	if s.onLog != nil {
		s.onLog(s.summary("error", msg, kv))
	}
}

func (s summarySink) summary(level, msg string, kv []any) string {
	var keys []string
	for i := 0; i < len(kv); i += 2 {
		if k, ok := kv[i].(string); ok && plainKey.MatchString(k) {
			keys = append(keys, k)
		}
	}
	var b strings.Builder
	b.WriteString("opentelemetry ")
	b.WriteString(level)
	if s.name != "" {
		b.WriteString(" (" + s.name + ")")
	}
	b.WriteString(": ")
	b.WriteString(strings.Join(strings.Fields(msg), " "))
	if len(keys) > 0 {
		b.WriteString(" [withheld: " + strings.Join(keys, ", ") + "]")
	}
	return b.String()
}

// WithValues drops the values.
func (s summarySink) WithValues(...any) logr.LogSink { return s }

func (s summarySink) WithName(name string) logr.LogSink {
	if plainKey.MatchString(name) {
		if s.name != "" {
			name = s.name + "." + name
		}
		s.name = name
	}
	return s
}

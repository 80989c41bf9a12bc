package main

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/throttle"
	"github.com/sotercare/jetbridge/tracing/export"
)

// exportErrorLog logs export errors at most once per every (a dead
// collector fails every batch), with the number of failures since the
// last line.
func exportErrorLog(log zerolog.Logger, every time.Duration) func(error) {
	th := &throttle.Log{Interval: every}
	return func(err error) {
		th.Do("", func(_, suppressed int) { // one key: every failure is the same news
			log.Warn().Str("error", err.Error()).Int("failures", suppressed+1).Str("next_report_in", every.String()).
				Msg("trace export failed; spans are dropped, deliveries are not affected")
		})
	}
}

// tracingOn reports whether bridge run builds a tracer provider for cfg
// and the environment (export.Enabled).
func tracingOn(cfg *config.Config) bool {
	return export.Enabled(export.Settings{Endpoint: cfg.Tracing.Endpoint.Value()})
}

// tracingEnvErr is, when tracing is on, one error per malformed OTEL_*
// variable (export.CheckEnv: "tracing: VAR: what is wrong with its form",
// never its value), for configFileErr to print one per line (exit 2); nil
// when tracing is off or every variable is well formed. bridge run and
// bridge check call it before anything else reads the variables.
func tracingEnvErr(cfg *config.Config) error {
	if !tracingOn(cfg) {
		return nil
	}
	var errs []error
	for _, p := range export.CheckEnv() {
		errs = append(errs, errors.New("tracing: "+p.Error()))
	}
	return errors.Join(errs...)
}

// tracingEnvWarnings are the malformed OTEL_* variables while tracing is
// off: nothing reads them, but they would stop bridge run once tracing is
// on.
func tracingEnvWarnings(cfg *config.Config) []configWarning {
	if tracingOn(cfg) {
		return nil
	}
	var out []configWarning
	for _, p := range export.CheckEnv() {
		out = append(out, configWarning{p.Var, p.Problem + "; ignored while tracing is off, an error (exit 2) once it is on"})
	}
	return out
}

// tracingLine is the start-up line of each exporter (export.Exporter):
// it says where the spans go, or that tracing is off.
var tracingLine = map[string]string{
	export.ExporterNone:    "tracing off (docs/tracing.md)",
	export.ExporterOTLP:    "tracing on: spans exported over OTLP (docs/tracing.md)",
	export.ExporterConsole: "tracing on: spans printed on standard output, one JSON object each (OTEL_TRACES_EXPORTER=console; docs/tracing.md)",
}

// startTracing builds the tracer provider of docs/tracing.md (nil when
// tracing is off). OpenTelemetry's error handler and internal logger are
// the bridge's before anything is built (export.InstallHandlers): errors
// and the SDK's warnings are logged without header values or other
// values (the exporter headers are secrets). A malformed OTEL_* value is
// a configuration error (exit 2); cmdRun has already refused it
// (tracingEnvErr) before connecting to NATS. It logs one line naming the
// exporter in use ("exporter": otlp, console or none).
func startTracing(ctx context.Context, cfg *config.Config, reg prometheus.Registerer, log zerolog.Logger) (*export.Provider, error) {
	p, err := export.Setup(ctx, export.Settings{
		Endpoint:   cfg.Tracing.Endpoint.Value(),
		Registerer: reg,
		OnError:    exportErrorLog(log, 10*time.Second),
		OnLog:      func(summary string) { log.Warn().Msg(summary) },
	})
	if err != nil {
		return nil, &exitError{Code: 2, Msg: "tracing: " + err.Error()}
	}
	log.Info().Str("exporter", p.Exporter()).Msg(tracingLine[p.Exporter()])
	return p, nil
}

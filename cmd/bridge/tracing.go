package main

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/tracing/export"
)

// exportErrorLog logs export errors at most once per every (a dead
// collector fails every batch), with the number of failures since the
// last line.
func exportErrorLog(log zerolog.Logger, every time.Duration) func(error) {
	var (
		mu     sync.Mutex
		last   time.Time
		failed int
	)
	return func(err error) {
		mu.Lock()
		defer mu.Unlock()
		failed++
		if time.Since(last) < every {
			return
		}
		log.Warn().Str("error", err.Error()).Int("failures", failed).Str("next_report_in", every.String()).
			Msg("trace export failed; spans are dropped, deliveries are not affected")
		last, failed = time.Now(), 0
	}
}

// startTracing builds the tracer provider of README "Tracing" (nil when
// tracing is off). A bad OTEL_* value is a configuration error (exit 2).
// Export errors are logged without header values (the exporter headers
// are secrets).
func startTracing(ctx context.Context, cfg *config.Config, reg prometheus.Registerer, log zerolog.Logger) (*export.Provider, error) {
	p, err := export.Setup(ctx, export.Settings{
		Endpoint:   cfg.Tracing.Endpoint.Value(),
		Registerer: reg,
		OnError:    exportErrorLog(log, 10*time.Second),
	})
	if err != nil {
		return nil, &exitError{Code: 2, Msg: "tracing: " + err.Error()}
	}
	if p != nil {
		log.Info().Msg("tracing on: spans exported over OTLP (README \"Tracing\")")
	}
	return p, nil
}

package main

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/tracing/export"
)

// startTracing builds the tracer provider of README "Tracing" (nil when
// tracing is off). A bad OTEL_* value is a configuration error (exit 2).
// Export errors are logged without header values (the exporter headers
// are secrets).
func startTracing(ctx context.Context, cfg *config.Config, reg prometheus.Registerer, log zerolog.Logger) (*export.Provider, error) {
	p, err := export.Setup(ctx, export.Settings{
		Endpoint:   cfg.Tracing.Endpoint.Value(),
		Registerer: reg,
		OnError: func(err error) {
			log.Warn().Str("error", err.Error()).Msg("trace export failed; spans are dropped, deliveries are not affected")
		},
	})
	if err != nil {
		return nil, &exitError{code: 2, msg: "tracing: " + err.Error()}
	}
	if p != nil {
		log.Info().Msg("tracing on: spans exported over OTLP (README \"Tracing\")")
	}
	return p, nil
}

//go:build fatfloor

package main

// Built with -tags fatfloor, the benchmark's own binary also links the
// third-party code that the bridge binary must carry for the contract
// (docs/delivery.md): the embedded JetStream server (already linked here for the
// _natsd role), failsafe-go's policies, the OpenTelemetry SDK with its
// OTLP HTTP and gRPC exporters, Prometheus, the YAML parser, the CLI
// library and the logger. Their package initialisation runs, and the
// pages of the binary it touches stay resident, as they do in the bridge:
// the naive bridge in this binary is the floor of the bridge's peak RSS
// (the rssfloor scenario). None of jetbridge's own packages is linked.
import (
	_ "github.com/failsafe-go/failsafe-go"
	_ "github.com/failsafe-go/failsafe-go/adaptivelimiter"
	_ "github.com/failsafe-go/failsafe-go/bulkhead"
	_ "github.com/failsafe-go/failsafe-go/circuitbreaker"
	_ "github.com/failsafe-go/failsafe-go/ratelimiter"
	_ "github.com/failsafe-go/failsafe-go/retrypolicy"
	_ "github.com/failsafe-go/failsafe-go/timeout"
	_ "github.com/nats-io/nats-server/v2/server"
	_ "github.com/nats-io/nkeys"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/collectors"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/rs/zerolog"
	_ "github.com/schollz/progressbar/v3"
	_ "github.com/spf13/cobra"
	_ "go.opentelemetry.io/otel"
	_ "go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	_ "go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	_ "go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	_ "go.opentelemetry.io/otel/propagation"
	_ "go.opentelemetry.io/otel/sdk/resource"
	_ "go.opentelemetry.io/otel/sdk/trace"
	_ "go.yaml.in/yaml/v3"
	_ "golang.org/x/time/rate"
)

func init() { linkedFat = true }

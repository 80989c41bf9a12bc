// Command sotercare runs the SoterCare API (internal/sotercare): it takes
// sensor readings over HTTP, classifies them and publishes every valid one
// to JetStream, where jetbridge picks up the caregiver alerts
// (config/sotercare.yaml).
//
//	sotercare [--listen 127.0.0.1:8080] [-s URL] [--root events]
//
// It starts even while NATS is unreachable (readings are answered 503
// until it connects) and stops cleanly on SIGINT/SIGTERM: it stops
// accepting requests, lets the ones in progress finish, then drains the
// NATS connection. Exit codes: 0 after a clean stop, 1 on a runtime
// failure, 2 on bad usage.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/cli"
	"github.com/sotercare/jetbridge/internal/cli/logs"
	"github.com/sotercare/jetbridge/internal/sotercare"
	"github.com/sotercare/jetbridge/internal/throttle"
	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/tracing"
)

// shutdownTimeout bounds the wait for requests in progress on shutdown.
const shutdownTimeout = 10 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run serves until ctx ends and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runWith(ctx, args, stdout, stderr, sotercare.DefaultServerLimits)
}

const long = `Run the SoterCare API: it takes sensor readings over HTTP (POST
/api/v1/events, GET /api/v1/health), classifies them and publishes every
valid one to JetStream on <root>.<severity>.care.<route>.<eventType>, where
jetbridge picks up the caregiver alerts (config/sotercare.yaml).

The server is, in this order: -s/--server, $NATS_URL, nats://127.0.0.1:4222.
It starts even while NATS is unreachable (readings are answered 503 until
it connects) and stops cleanly on SIGINT/SIGTERM.`

const example = `  sotercare
  sotercare --listen 127.0.0.1:8080 -s nats://127.0.0.1:4222 --root events
  NATS_URL=nats://nats.internal:4222 sotercare --log-format json`

// options are the flags of sotercare.
type options struct {
	listen, server, root, logFormat string
	timeout                         time.Duration
}

// runWith is run with the HTTP server limits that limits gives for the
// publish timeout.
func runWith(ctx context.Context, args []string, stdout, stderr io.Writer, limits func(publishTimeout time.Duration) sotercare.ServerLimits) int {
	var o options
	c := cli.NewRoot("sotercare", "the SoterCare API: sensor readings in, events to JetStream", long)
	c.Example = example
	c.Args = cli.NoArgs
	c.RunE = func(c *cobra.Command, _ []string) error {
		switch {
		case o.logFormat != "console" && o.logFormat != "json":
			return cli.Usagef("--log-format %q: want console or json", o.logFormat)
		case o.timeout <= 0:
			return cli.Usagef("--publish-timeout %s: must be positive", o.timeout)
		}
		if err := validRoot(o.root); err != nil {
			return cli.Usagef("%v", err)
		}
		log, _ := logs.New(o.logFormat, "info", "sotercare", c.OutOrStdout())
		url, _ := cli.Server(o.server, "", nats.DefaultURL)
		return serve(ctx, o.listen, url, o.root, o.timeout, limits(o.timeout), log)
	}
	f := c.Flags()
	f.StringVarP(&o.listen, "listen", "l", "127.0.0.1:8080", "address of the HTTP API")
	cli.ServerFlag(f, &o.server, cli.ServerUsage+" (default $NATS_URL, else "+nats.DefaultURL+")", "nats-url")
	f.StringVar(&o.root, "root", "events", "subject root: subjects are <root>.<severity>.care.<route>.<eventType>")
	f.DurationVar(&o.timeout, "publish-timeout", sotercare.DefaultPublishTimeout, "how long to wait for JetStream to store a reading")
	f.StringVar(&o.logFormat, "log-format", "console", "console | json")
	return cli.Execute(c, args, stdout, stderr)
}

func serve(ctx context.Context, listen, natsURL, root string, timeout time.Duration, limits sotercare.ServerLimits, log zerolog.Logger) error {
	shown := config.Secret(natsURL).RedactedURL()
	unreachable := &throttle.Log{}
	nc, err := nats.Connect(natsURL,
		nats.Name("sotercare"),
		nats.RetryOnFailedConnect(true), // start without NATS; readings get 503 until it is there
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500*time.Millisecond),
		// No reconnect buffer: a reading published while disconnected fails
		// at once (503) instead of being sent later behind the caller's back.
		nats.ReconnectBufSize(-1),
		nats.ConnectHandler(func(*nats.Conn) { unreachable.Reset(); log.Info().Str("nats", shown).Msg("connected to NATS") }),
		// While NATS cannot be reached (at start or after a loss), say so
		// at once and then every throttle.DefaultInterval, with the cause.
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			cause := cli.ConnectCause(err, natsURL)
			unreachable.Do(cause, func(n, _ int) {
				log.Warn().Str("nats", shown).Str("error", cause).Int("attempts", n).
					Msg("cannot reach NATS; readings are answered 503 until it connects (set the server with -s/--server or $NATS_URL)")
			})
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn().Str("error", err.Error()).Msg("disconnected from NATS; reconnecting")
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { unreachable.Reset(); log.Info().Str("nats", shown).Msg("reconnected to NATS") }),
	)
	if err != nil {
		return fmt.Errorf("--server %s: %w", shown, err)
	}
	defer func() {
		if err := nc.Drain(); err != nil {
			nc.Close()
		}
	}()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	h := sotercare.NewHandler(producer.NewPublisher(js, root, producer.WithHeaders(tracing.Inject)), sotercare.Options{Logger: log, PublishTimeout: timeout})

	ln, err := net.Listen("tcp", listen)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("--listen %s: the address is already in use (another sotercare?); stop it or pick another address with --listen", listen)
		}
		return fmt.Errorf("--listen %s: %w", listen, err)
	}
	// Slow or idle clients are cut off (see docs/security.md).
	srv := sotercare.NewServer(h, limits)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info().Str("addr", ln.Addr().String()).Str("nats", shown).Str("root", root).
		Msg("SoterCare API listening: POST /api/v1/events, GET /api/v1/health")

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info().Msg("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn().Str("error", err.Error()).Msg("requests cut off by the shutdown timeout")
	}
	<-errc
	log.Info().Msg("stopped")
	return nil
}

// validRoot checks the subject root the same way the Publisher will.
func validRoot(root string) error {
	c := sotercare.Classification{Severity: sotercare.Normal, Route: sotercare.EventLog}
	if _, err := c.Subject(root, sotercare.Reading{DeviceID: "bed-3", EventType: sotercare.TypeFall}); err != nil {
		return fmt.Errorf("--root %q: %w", root, err)
	}
	return nil
}

// Command sotercare runs the SoterCare API (internal/sotercare): it takes
// sensor readings over HTTP, classifies them and publishes every valid one
// to JetStream, where jetbridge picks up the caregiver alerts
// (config/sotercare.yaml).
//
//	sotercare [--listen 127.0.0.1:8080] [--nats-url URL] [--root events]
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
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/internal/sotercare"
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

// runWith is run with the HTTP server limits that limits gives for the
// publish timeout.
func runWith(ctx context.Context, args []string, stdout, stderr io.Writer, limits func(publishTimeout time.Duration) sotercare.ServerLimits) int {
	fs := flag.NewFlagSet("sotercare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	defaultURL := os.Getenv("NATS_URL")
	if defaultURL == "" {
		defaultURL = nats.DefaultURL
	}
	listen := fs.String("listen", "127.0.0.1:8080", "address of the HTTP API")
	natsURL := fs.String("nats-url", defaultURL, "NATS server ($NATS_URL when set)")
	root := fs.String("root", "events", "subject root: subjects are <root>.<severity>.care.<route>.<eventType>")
	timeout := fs.Duration("publish-timeout", sotercare.DefaultPublishTimeout, "how long to wait for JetStream to store a reading")
	logFormat := fs.String("log-format", "console", "console | json")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "sotercare: no arguments expected, got %q\n", fs.Arg(0))
		return 2
	case *logFormat != "console" && *logFormat != "json":
		fmt.Fprintf(stderr, "sotercare: --log-format %q: want console or json\n", *logFormat)
		return 2
	case *timeout <= 0:
		fmt.Fprintf(stderr, "sotercare: --publish-timeout %s: must be positive\n", *timeout)
		return 2
	}
	if err := validRoot(*root); err != nil {
		fmt.Fprintln(stderr, "sotercare: "+err.Error())
		return 2
	}
	log := newLogger(*logFormat, stdout)
	if err := serve(ctx, *listen, *natsURL, *root, *timeout, limits(*timeout), log); err != nil {
		fmt.Fprintln(stderr, "sotercare: "+err.Error())
		return 1
	}
	return 0
}

func serve(ctx context.Context, listen, natsURL, root string, timeout time.Duration, limits sotercare.ServerLimits, log zerolog.Logger) error {
	nc, err := nats.Connect(natsURL,
		nats.Name("sotercare"),
		nats.RetryOnFailedConnect(true), // start without NATS; readings get 503 until it is there
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500*time.Millisecond),
		// No reconnect buffer: a reading published while disconnected fails
		// at once (503) instead of being sent later behind the caller's back.
		nats.ReconnectBufSize(-1),
		nats.ConnectHandler(func(*nats.Conn) { log.Info().Msg("connected to NATS") }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn().Str("error", err.Error()).Msg("disconnected from NATS; reconnecting")
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { log.Info().Msg("reconnected to NATS") }),
	)
	if err != nil {
		return fmt.Errorf("--nats-url: %w", err)
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
		return fmt.Errorf("--listen: %w", err)
	}
	// Slow or idle clients are cut off (see the README's Security section).
	srv := sotercare.NewServer(h, limits)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info().Str("addr", ln.Addr().String()).Str("nats", redact(natsURL)).Str("root", root).
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
	if _, err := c.Subject(root, sotercare.Reading{EventType: sotercare.TypeFall}); err != nil {
		return fmt.Errorf("--root %q: %w", root, err)
	}
	return nil
}

// redact hides the user info of a NATS URL for logging.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	if u.User != nil {
		u.User = url.User("REDACTED")
	}
	return u.String()
}

func newLogger(format string, w io.Writer) zerolog.Logger {
	zerolog.TimeFieldFormat = time.RFC3339Nano
	if format == "console" {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000", NoColor: !isTerminal(w)}
	}
	return zerolog.New(w).With().Timestamp().Str("service", "sotercare").Logger()
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

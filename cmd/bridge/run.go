package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/embedded"
)

func cmdRun(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("run", stderr)
	path := configFlag(fs)
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErr("run takes no arguments, got %q", pos[0])
	}
	cfg, err := loadConfig(*path, stderr)
	if err != nil {
		return err
	}
	log, err := newLogger(cfg.Log, stdout)
	if err != nil {
		return &exitError{code: 2, msg: "log.level: " + err.Error()}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	conn, err := openNATS(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer conn.close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	b, err := bridge.New(cfg, conn.js, bridge.Options{Logger: log, Registerer: reg})
	if err != nil {
		return err
	}
	stopAdmin, err := serveAdmin(cfg.Admin.Listen, b.AdminHandler(reg), log)
	if err != nil {
		return err
	}
	defer stopAdmin()
	if err := b.Run(ctx); err != nil {
		log.Error().Str("error", err.Error()).Msg("bridge failed")
		return &exitError{code: 1}
	}
	return nil
}

// serveAdmin serves the admin endpoints on listen ("" disables them) until
// the returned stop is called.
func serveAdmin(listen string, h http.Handler, log zerolog.Logger) (stop func(), err error) {
	if listen == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("admin.listen %s: %w", listen, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Str("error", err.Error()).Msg("admin server failed")
		}
	}()
	log.Info().Str("listen", ln.Addr().String()).Msg("admin endpoints: /healthz /readyz /status /metrics")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}

// natsConn is the connection to JetStream, with the embedded server behind
// it when the configuration names no URL.
type natsConn struct {
	srv     *embedded.Server
	nc      *nats.Conn
	js      jetstream.JetStream
	closed  chan struct{} // closed by the client once the connection is closed
	closing atomic.Bool   // set before a deliberate close: no "reconnecting" log
	log     zerolog.Logger
}

// openNATS starts the embedded server when nats.url is empty, then
// connects with reconnection forever.
func openNATS(ctx context.Context, cfg *config.Config, log zerolog.Logger) (*natsConn, error) {
	c := &natsConn{log: log, closed: make(chan struct{})}
	url := cfg.NATS.URL.Value()
	if cfg.Embedded() {
		srv, err := embedded.Start(ctx, embedded.Options{
			Listen:     cfg.NATS.Embedded.Listen,
			StoreDir:   cfg.NATS.Embedded.StoreDir,
			SyncAlways: cfg.NATS.Embedded.SyncAlways,
		})
		if err != nil {
			return nil, fmt.Errorf("embedded JetStream: %w", err)
		}
		c.srv = srv
		url = srv.ClientURL()
		log.Info().Str("listen", srv.Addr()).Str("store_dir", cfg.NATS.Embedded.StoreDir).
			Str("server_version", srv.Version()).Msg("embedded JetStream started")
	}
	opts, err := natsOptions(cfg.NATS, log, &c.closing)
	opts = append(opts, nats.ClosedHandler(func(*nats.Conn) { close(c.closed) }))
	if err != nil {
		c.close()
		return nil, &exitError{code: 2, msg: err.Error()}
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		c.close()
		return nil, fmt.Errorf("connect to NATS at %s: %w", cfg.NATS.URL.RedactedURL(), err)
	}
	c.nc = nc
	if c.js, err = jetstream.New(nc); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

func (c *natsConn) close() {
	if c.nc != nil {
		c.closing.Store(true)
		// Drain flushes the last acks before closing.
		if err := c.nc.Drain(); err != nil {
			c.nc.Close()
		}
		select {
		case <-c.closed:
		case <-time.After(10 * time.Second):
			c.nc.Close()
		}
	}
	if c.srv != nil {
		c.srv.Shutdown()
		c.log.Info().Msg("embedded JetStream stopped")
	}
}

// natsOptions maps the nats section to client options: authentication,
// TLS, and reconnection forever with backoff.
func natsOptions(nc config.NATS, log zerolog.Logger, closing *atomic.Bool) ([]nats.Option, error) {
	opts := []nats.Option{
		nats.Name(nc.Name),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true), // a broker not up yet is waited for, like a restart
		nats.ReconnectWait(500 * time.Millisecond),
		nats.ReconnectJitter(250*time.Millisecond, time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if closing.Load() {
				return
			}
			ev := log.Warn()
			if err != nil {
				ev = ev.Str("error", err.Error())
			}
			ev.Msg("disconnected from NATS; reconnecting")
		}),
		nats.ReconnectHandler(func(*nats.Conn) { log.Info().Msg("reconnected to NATS") }),
	}
	switch {
	case nc.CredsFile != "":
		opts = append(opts, nats.UserCredentials(nc.CredsFile))
	case nc.NKeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(nc.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("nats.nkey_seed_file: %w", err)
		}
		opts = append(opts, o)
	case nc.User != "":
		opts = append(opts, nats.UserInfo(nc.User, nc.Password.Value()))
	case nc.Token != "":
		opts = append(opts, nats.Token(nc.Token.Value()))
	}
	if t := nc.TLS; t.CAFile != "" {
		opts = append(opts, nats.RootCAs(t.CAFile))
	}
	if t := nc.TLS; t.CertFile != "" || t.KeyFile != "" {
		opts = append(opts, nats.ClientCert(t.CertFile, t.KeyFile))
	}
	return opts, nil
}

// newLogger builds the JSON or console logger of the log section.
func newLogger(lc config.Log, w io.Writer) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(strings.ToLower(lc.Level))
	if err != nil {
		return zerolog.Nop(), err
	}
	if lvl == zerolog.NoLevel {
		lvl = zerolog.InfoLevel
	}
	zerolog.TimeFieldFormat = time.RFC3339Nano
	if lc.Format == "console" {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339, NoColor: !isTerminal(w)}
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Str("service", "jetbridge").Logger(), nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func cmdVersion(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("version", stderr)
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErr("version takes no arguments, got %q", pos[0])
	}
	version := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		version = bi.Main.Version
	}
	fmt.Fprintf(stdout, "jetbridge %s\ngo %s\nnats-server %s (embedded)\n", version, runtime.Version(), embedded.ServerVersion())
	return nil
}

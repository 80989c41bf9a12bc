package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	stdlog "log"
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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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
	if err := checkNATSFiles(cfg.NATS); err != nil {
		return configFileErr(err, stderr)
	}
	log, err := newLogger(cfg.Log, stdout)
	if err != nil {
		return &exitError{code: 2, msg: "log.level: " + err.Error()}
	}
	for _, w := range configWarnings(cfg) {
		log.Warn().Str("key", w.key).Msg(w.text)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return runDaemon(ctx, cfg, log, production)
}

// daemonParts are the parts of `bridge run` that tests swap, one at a
// time, for a deliberately broken variant; production is the only set the
// command uses.
type daemonParts struct {
	// natsOptions builds the NATS client options; they are applied after
	// the daemon's own ClosedHandler, so they may replace it.
	natsOptions optionsFunc
	// adminHandler serves the admin endpoints of a running bridge.
	adminHandler func(*bridge.Bridge, prometheus.Gatherer) http.Handler
	// adminTimeouts bound the admin server's connections.
	adminTimeouts adminTimeouts
}

var production = daemonParts{
	natsOptions:   natsOptions,
	adminHandler:  (*bridge.Bridge).AdminHandler,
	adminTimeouts: defaultAdminTimeouts,
}

// runDaemon runs the bridge until ctx ends (exit 0 after the drain) or its
// NATS connection is closed for good (the same drain as far as it goes,
// then exit 1 with the cause). The admin endpoints answer from the start:
// /readyz says why while the first connection is not made.
func runDaemon(ctx context.Context, cfg *config.Config, log zerolog.Logger, parts daemonParts) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	admin := newAdminSwitch(reg)
	stopAdmin, err := serveAdmin(cfg.Admin.Listen, admin, log, parts.adminTimeouts)
	if err != nil {
		return err
	}
	defer stopAdmin()

	conn, err := openNATSWith(ctx, cfg, log, parts.natsOptions, admin.setNotReady)
	if err != nil || conn == nil {
		return err // nil: a signal came before the first connection
	}
	defer conn.close()

	tp, err := startTracing(ctx, cfg, reg, log)
	if err != nil {
		return err
	}
	defer tp.Shutdown(0) // bounded: a dead collector delays the exit by at most 5 s
	b, err := bridge.New(cfg, conn.js, bridge.Options{Logger: log, Registerer: reg, TracerProvider: tp.TracerProvider()})
	if err != nil {
		return err
	}
	admin.setBridge(parts.adminHandler(b, reg))

	// A connection closed for good stops the bridge like a signal.
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var lost atomic.Bool
	watch := make(chan struct{})
	go func() {
		defer close(watch)
		select {
		case <-conn.lost():
			if !conn.deliberate() {
				lost.Store(true)
				cancel()
			}
		case <-runCtx.Done():
		}
	}()
	runErr := b.Run(runCtx)
	cancel()
	<-watch
	if lost.Load() {
		cause := "unknown cause"
		if err := conn.nc.LastError(); err != nil {
			cause = scrub(err.Error(), natsSecrets(cfg.NATS))
		}
		log.Error().Str("url", cfg.NATS.URL.RedactedURL()).Str("error", cause).
			Msg("the NATS connection was closed for good; exiting so that the bridge is restarted")
		return &exitError{code: 1, msg: fmt.Sprintf("nats: connection to NATS at %s closed for good: %s", cfg.NATS.URL.RedactedURL(), cause)}
	}
	if runErr != nil {
		log.Error().Str("error", runErr.Error()).Msg("bridge failed")
		return &exitError{code: 1}
	}
	return nil
}

// adminTimeouts bound the admin server's connections (slow or idle
// clients cannot hold them open).
type adminTimeouts struct {
	readHeader, read, write, idle time.Duration
	maxHeaderBytes                int
}

// defaultAdminTimeouts: the write timeout is longer than /status's own 5 s
// bound.
var defaultAdminTimeouts = adminTimeouts{
	readHeader:     5 * time.Second,
	read:           10 * time.Second,
	write:          15 * time.Second,
	idle:           60 * time.Second,
	maxHeaderBytes: 16 << 10,
}

// serveAdmin serves the admin endpoints on listen ("" disables them) until
// the returned stop is called.
func serveAdmin(listen string, h http.Handler, log zerolog.Logger, to adminTimeouts) (stop func(), err error) {
	if listen == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("admin.listen %s: %w", listen, err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: to.readHeader,
		ReadTimeout:       to.read,
		WriteTimeout:      to.write,
		IdleTimeout:       to.idle,
		MaxHeaderBytes:    to.maxHeaderBytes,
		ErrorLog:          stdlog.New(io.Discard, "", 0), // client mistakes are not ours to log
	}
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

// adminSwitch serves the admin endpoints before the bridge exists
// (/healthz 200, /readyz 503 with why, /metrics), then the bridge's.
type adminSwitch struct {
	early    http.Handler
	bridge   atomic.Pointer[http.Handler]
	notReady atomic.Pointer[string]
}

func newAdminSwitch(g prometheus.Gatherer) *adminSwitch {
	a := &adminSwitch{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeAdminJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	notReady := func(w http.ResponseWriter, _ *http.Request) {
		reason := "starting: connecting to NATS"
		if r := a.notReady.Load(); r != nil && *r != "" {
			reason = *r
		}
		writeAdminJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "reason": reason})
	}
	mux.HandleFunc("GET /readyz", notReady)
	mux.HandleFunc("GET /status", notReady)
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	a.early = mux
	return a
}

func (a *adminSwitch) setNotReady(reason string) { a.notReady.Store(&reason) }
func (a *adminSwitch) setBridge(h http.Handler)  { a.bridge.Store(&h) }

func (a *adminSwitch) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h := a.bridge.Load(); h != nil {
		(*h).ServeHTTP(w, r)
		return
	}
	a.early.ServeHTTP(w, r)
}

func writeAdminJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
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

package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/buildinfo"
	"github.com/sotercare/jetbridge/internal/cli"
	"github.com/sotercare/jetbridge/internal/cli/logs"
	"github.com/sotercare/jetbridge/internal/embedded"
)

// runOptions are the flags of bridge run (and of plain bridge).
type runOptions struct {
	config, server string
	noDelivery     bool // docs/operating.md#forensics-without-delivery
	watch          bool
}

func (o *runOptions) register(fs *pflag.FlagSet) {
	configFlag(fs, &o.config)
	serverFlag(fs, &o.server)
	fs.BoolVar(&o.noDelivery, "no-delivery", false, "serve JetStream and the admin endpoints, provision, but pull nothing (forensics; /readyz stays 503)")
	fs.BoolVar(&o.watch, "watch", false, "reload the configuration file when it changes (as on SIGHUP), once it has been left alone for 500ms")
}

func newRunCmd() *cobra.Command {
	var o runOptions
	c := &cobra.Command{
		Use:   "run",
		Short: "run the bridge until SIGINT/SIGTERM (the default command)",
		Long: `Run the bridge: provision the streams and consumers, deliver every route's
messages, serve the admin endpoints (admin.listen), and on SIGINT/SIGTERM
stop fetching, finish what is in flight and exit 0.

With --no-delivery the bridge starts the same way (the embedded server
and its listener, provisioning, the admin endpoints) but pulls nothing, so
that streams, consumers and dead letters stay as they are while you look
at them (bridge dlq, /status); /readyz answers 503 "not delivering".

NATS is, in this order: --server, nats.url, $NATS_URL; with none of them
the bridge starts an embedded JetStream (nats.embedded). While NATS cannot
be reached the bridge logs why and /readyz says "cannot reach NATS at ...".

SIGHUP (systemctl reload, an ssh hang-up) never stops the bridge: it
reloads the configuration file. The file is validated whole and applied
whole (destinations, routes added, removed, changed or paused), or refused
whole with the reason logged, counted in bridge_config_reloads_total and
shown in /status, while the running configuration stays. A change to
nats, stream, dead_letter, idempotency, admin, log or tracing needs a
restart and is refused. With --watch, a change of the file reloads it too
(a rename over it, or a Kubernetes ConfigMap update, counts).`,
		Example: `  bridge run --config config/quickstart.yaml
  bridge run --config config/quickstart.yaml --watch                     # reload on a change of the file
  bridge run --config config/quickstart.yaml -s nats://127.0.0.1:4222   # join a running server`,
		Args: cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error { return cmdRun(o, c.OutOrStdout(), c.ErrOrStderr()) },
	}
	o.register(c.Flags())
	return c
}

func cmdRun(o runOptions, stdout, stderr io.Writer) error {
	// SIGHUP never stops the bridge: caught from the start, handled once
	// the daemon runs (watchReloads).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	cfg, data, source, err := loadConfigData(o.config, o.server, stderr)
	if err != nil {
		return err
	}
	if o.watch && notRegular(configPath(o.config)) {
		return usageErr("--watch: %s is not a regular file (a pipe is read once, at start)", configPath(o.config))
	}
	if err := checkNATSFiles(cfg.NATS); err != nil {
		return configFileErr(err, stderr)
	}
	if err := tracingEnvErr(cfg); err != nil { // before anything connects
		return configFileErr(err, stderr)
	}
	log, err := logs.New(cfg.Log.Format, cfg.Log.Level, "jetbridge", stdout)
	if err != nil {
		return &exitError{Code: 2, Msg: "log.level: " + err.Error()}
	}
	if source == "$NATS_URL" {
		log.Info().Str("url", cfg.NATS.URL.RedactedURL()).
			Msg("NATS server taken from $NATS_URL (nats.url is empty); unset NATS_URL to start the embedded server instead")
	}
	d, err := newDaemon(cfg, log, reloadSource{path: configPath(o.config), data: data, server: o.server, signals: hup, watch: o.watch})
	if err != nil {
		return err
	}
	d.noDelivery = o.noDelivery
	ctx, stop := signalContext()
	defer stop()
	return d.run(ctx)
}

// daemon is `bridge run` built from its configuration, not started: the
// metrics registry, the admin endpoints and the NATS connection's client
// options. run runs it once.
type daemon struct {
	cfg    *config.Config
	log    zerolog.Logger
	reload *reloader // SIGHUP and --watch
	reg    *prometheus.Registry
	state  processState
	admin  *adminSwitch
	// adminHandler is what the admin server serves: admin behind
	// admin.token.
	adminHandler http.Handler
	conn         *natsConn // made by run
	noDelivery   bool      // bridge.Options.NoDelivery
}

// newDaemon builds the daemon; its error is a configuration error (exit
// 2).
func newDaemon(cfg *config.Config, log zerolog.Logger, reload reloadSource) (*daemon, error) {
	d := &daemon{cfg: cfg, log: log, reg: prometheus.NewRegistry()}
	d.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	d.reload = newReloader(reload, log, d.reg)
	registerProcessMetrics(d.reg, &d.state)
	d.admin = newAdminSwitch(d.reg)
	// The token guards the whole switch: /status and /metrics need it
	// before the bridge exists too.
	d.adminHandler = bridge.RequireToken(cfg.Admin.Token, d.admin)
	conn, err := newNATSConn(cfg, log)
	if err != nil {
		return nil, err
	}
	d.conn = conn
	return d, nil
}

// run runs the bridge until ctx ends (exit 0 after the drain) or its
// NATS connection is closed for good (the same drain as far as it goes,
// then exit 1 with the cause). The admin endpoints answer from the start:
// /readyz says why while the first connection is not made.
func (d *daemon) run(ctx context.Context) error {
	cfg, log := d.cfg, d.log
	bi := buildinfo.Read()
	log.Info().Str("version", bi.Version).Str("revision", bi.Revision).Bool("modified", bi.Modified).Msg("jetbridge starting")
	for _, w := range configWarnings(cfg) {
		log.Warn().Str("key", w.Key).Msg(w.Text)
	}
	reloadCtx, cancelReloads := context.WithCancel(ctx)
	defer cancelReloads()
	waitReloads, err := d.reload.run(reloadCtx)
	if err != nil {
		return &exitError{Code: 1, Msg: err.Error()}
	}
	defer func() { cancelReloads(); waitReloads() }()
	adminTLS, err := adminTLSConfig(cfg.Admin.TLS, log)
	if err != nil {
		return &exitError{Code: 2, Msg: err.Error()}
	}
	stopAdmin, err := serveAdminTLS(cfg.Admin.Listen, adminTLS, d.adminHandler, log, defaultAdminTimeouts)
	if err != nil {
		return err
	}
	defer stopAdmin()

	conn := d.conn
	if connected, err := conn.open(ctx, d.admin.setNotReady); err != nil || !connected {
		return err // nil: a signal came before the first connection
	}
	defer conn.close()
	d.state.nc.Store(conn.nc)
	if conn.srv != nil {
		for _, w := range conn.srv.Warnings() {
			log.Warn().Str("key", "nats.embedded.store_dir").Msg(w)
		}
	}

	tp, err := startTracing(ctx, cfg, d.reg, log)
	if err != nil {
		return err
	}
	defer tp.Shutdown(0) // bounded: a dead collector delays the exit by at most 5 s
	b, err := bridge.New(cfg, conn.js, bridge.Options{Logger: log, Registerer: d.reg, TracerProvider: tp.TracerProvider(), NoDelivery: d.noDelivery})
	if err != nil {
		return err
	}
	d.reload.setBridge(b)
	d.admin.setBridge(b.AdminHandler(d.reg))
	ready := b.Readiness
	d.state.ready.Store(&ready)

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
		return &exitError{Code: 1, Msg: fmt.Sprintf("nats: connection to NATS at %s closed for good: %s", cfg.NATS.URL.RedactedURL(), cause)}
	}
	if runErr != nil {
		log.Error().Str("error", runErr.Error()).Msg("bridge failed")
		return &exitError{Code: 1}
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

// adminTLSConfig is the admin server's TLS configuration (TLS 1.2 and
// later), nil for plain HTTP. config.Validate has read and parsed the
// files already; they are read again here, at start, and whenever they
// change (see adminCert).
func adminTLSConfig(t config.AdminTLS, log zerolog.Logger) (*tls.Config, error) {
	if !t.Enabled() {
		return nil, nil
	}
	c, err := newAdminCert(t, log)
	if err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: c.getCertificate}, nil
}

// serveAdmin serves the admin endpoints over plain HTTP on listen (""
// disables them) until the returned stop is called.
func serveAdmin(listen string, h http.Handler, log zerolog.Logger, to adminTimeouts) (stop func(), err error) {
	return serveAdminTLS(listen, nil, h, log, to)
}

// serveAdminTLS is serveAdmin over HTTPS when tc is not nil.
func serveAdminTLS(listen string, tc *tls.Config, h http.Handler, log zerolog.Logger, to adminTimeouts) (stop func(), err error) {
	if listen == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("admin.listen %s is already in use, probably by another bridge; give this one another admin.listen (the example configs read $JETBRIDGE_ADMIN_LISTEN, e.g. JETBRIDGE_ADMIN_LISTEN=127.0.0.1:8090), or \"\" to serve no admin endpoints", listen)
		}
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
		TLSConfig:         tc,
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		serve := srv.Serve
		if tc != nil {
			serve = func(ln net.Listener) error { return srv.ServeTLS(ln, "", "") }
		}
		if err := serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Str("error", err.Error()).Msg("admin server failed")
		}
	}()
	scheme := "http"
	if tc != nil {
		scheme = "https"
	}
	log.Info().Str("listen", ln.Addr().String()).Str("scheme", scheme).Msg("admin endpoints: /healthz /readyz /status /metrics")
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
	_ = cli.WriteJSON(w, v)
}

// versionInfo is what bridge version prints: the build as Go recorded it
// and the embedded nats-server's version.
type versionInfo struct {
	buildinfo.Info
	NATSServer string `json:"nats_server"` // embedded
}

func newVersionCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "version",
		Short: "print the version and revision, the Go version and the embedded nats-server version",
		Long: `Print what this binary was built from, as Go recorded it: the module
version (a tag such as v0.1.0 in a release build, a pseudo-version in
another checkout, "(devel)" under go run), the VCS revision and its commit
time, whether the work tree was modified, the Go version, and the version
of the embedded nats-server. A value Go did not record is left empty.`,
		Example: "  bridge version\n  bridge version --json",
		Args:    cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			v := versionInfo{Info: buildinfo.Read(), NATSServer: embedded.ServerVersion()}
			if asJSON {
				return cli.WriteJSON(c.OutOrStdout(), v)
			}
			w := c.OutOrStdout()
			fmt.Fprintf(w, "jetbridge %s\n", v.Version)
			if v.Revision != "" {
				modified := ""
				if v.Modified {
					modified = " (modified)"
				}
				fmt.Fprintf(w, "revision %s%s\n", v.Revision, modified)
			}
			if v.Time != "" {
				fmt.Fprintf(w, "time %s\n", v.Time)
			}
			_, err := fmt.Fprintf(w, "go %s\nnats-server %s (embedded)\n", v.Go, v.NATSServer)
			return err
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, `print {"version","revision","time","modified","go","nats_server"}`)
	return c
}

package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/cli"
	"github.com/sotercare/jetbridge/internal/embedded"
	"github.com/sotercare/jetbridge/internal/throttle"
)

// Backoff of the first connection while NATS cannot be reached.
const (
	firstConnectMin = 250 * time.Millisecond
	firstConnectMax = 5 * time.Second
)

// connHint is what to check, in the configuration, for a class of
// connection failure.
func connHint(c cli.ConnErrClass) string {
	switch c {
	case cli.ConnAuth:
		return "check nats.user and nats.password, nats.token, nats.nkey_seed_file or nats.creds_file against the server's accounts"
	case cli.ConnTLS:
		return "check the URL's scheme (tls:// only for a TLS server) and nats.tls (ca_file for the server's certificate, cert_file and key_file when it wants a client certificate)"
	case cli.ConnCreds:
		return "check nats.creds_file or nats.nkey_seed_file (a creds file from nsc, an nkey seed starting SU)"
	}
	return "check that the server runs there; the URL comes from --server, nats.url or $NATS_URL, in that order"
}

// natsSecrets are the secret values of the nats section, for scrub.
func natsSecrets(n config.NATS) []string {
	out := []string{n.Password.Value(), n.Token.Value()}
	for raw := range strings.SplitSeq(n.URL.Value(), ",") {
		if u, err := url.Parse(strings.TrimSpace(raw)); err == nil && u.User != nil {
			out = append(out, u.User.Username())
			if p, ok := u.User.Password(); ok {
				out = append(out, p)
			}
		}
	}
	return out
}

// scrub replaces every secret in s by "[redacted]": library errors are
// not known to quote credentials, and stay that way in our output.
func scrub(s string, secrets []string) string {
	for _, sec := range secrets {
		if len(sec) >= 3 {
			s = strings.ReplaceAll(s, sec, "[redacted]")
		}
	}
	return s
}

// checkNATSFiles verifies the credential and TLS files of the nats
// section before any connection: each must exist, be readable and parse.
// An unusable file is a configuration error naming its key, e.g.
// "nats.creds_file: open /x: no such file or directory" (bridge check
// and bridge run exit 2 on it). Errors never quote a file's content.
func checkNATSFiles(n config.NATS) error {
	var errs []error
	bad := func(key string, err error) { errs = append(errs, fmt.Errorf("nats.%s: %w", key, err)) }
	if n.CredsFile != "" {
		if err := checkCredsFile(n.CredsFile); err != nil {
			bad("creds_file", err)
		}
	}
	if n.NKeySeedFile != "" {
		if _, err := nats.NkeyOptionFromSeed(n.NKeySeedFile); err != nil {
			bad("nkey_seed_file", err)
		}
	}
	if f := n.TLS.CAFile; f != "" {
		if data, err := os.ReadFile(f); err != nil {
			bad("tls.ca_file", err)
		} else if !x509.NewCertPool().AppendCertsFromPEM(data) {
			bad("tls.ca_file", fmt.Errorf("%s: no PEM certificate found", f))
		}
	}
	if c, k := n.TLS.CertFile, n.TLS.KeyFile; c != "" && k != "" {
		_, cerr := os.ReadFile(c)
		_, kerr := os.ReadFile(k)
		switch {
		case cerr != nil:
			bad("tls.cert_file", cerr)
		case kerr != nil:
			bad("tls.key_file", kerr)
		default:
			if _, err := tls.LoadX509KeyPair(c, k); err != nil {
				key := "tls.cert_file"
				if strings.Contains(err.Error(), "key") {
					key = "tls.key_file"
				}
				bad(key, fmt.Errorf("%s, %s: %w", c, k, err))
			}
		}
	}
	return errors.Join(errs...)
}

// checkCredsFile verifies that a creds file holds a user JWT and an nkey
// seed, as nats.UserCredentials will read it.
func checkCredsFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	defer clear(data) // the seed
	jwt, err := nkeys.ParseDecoratedJWT(data)
	if err != nil || strings.Count(jwt, ".") != 2 {
		return fmt.Errorf("%s: no user JWT found (want a creds file from nsc or nats-account-server)", path)
	}
	kp, err := nkeys.ParseDecoratedNKey(data)
	if err != nil {
		return fmt.Errorf("%s: no nkey seed found: %w", path, err)
	}
	kp.Wipe()
	return nil
}

// natsOptions maps the nats section to client options: authentication,
// TLS, reconnection forever with backoff, and nats.go's callbacks routed to
// the structured log. It first checks the credential files (checkNATSFiles);
// its error is a configuration error.
//
// An authentication error while reconnecting does not close the connection
// (IgnoreAuthErrorAbort): credentials rotated on the server side and back,
// or a server restarted with a different auth setup for a while, must not
// leave a bridge that never reconnects. It keeps retrying and reports
// "NATS rejected the credentials" on /readyz meanwhile.
func natsOptions(nc config.NATS, log zerolog.Logger, closing *atomic.Bool) ([]nats.Option, error) {
	if err := checkNATSFiles(nc); err != nil {
		return nil, err
	}
	secrets := natsSecrets(nc)
	asyncErrs := &throttle.Log{}
	opts := []nats.Option{
		nats.Name(nc.Name),
		nats.MaxReconnects(-1),
		nats.IgnoreAuthErrorAbort(),
		nats.ReconnectWait(500 * time.Millisecond),
		nats.ReconnectJitter(250*time.Millisecond, time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if closing.Load() {
				return
			}
			ev := log.Warn()
			if err != nil {
				ev = ev.Str("error", scrub(err.Error(), secrets))
			}
			ev.Msg("disconnected from NATS; reconnecting")
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			asyncErrs.Reset()
			log.Info().Str("server", config.Secret(c.ConnectedUrlRedacted()).RedactedURL()).Msg("reconnected to NATS")
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if closing.Load() || err == nil {
				return
			}
			class := cli.ClassifyConnErr(err)
			asyncErrs.Do(class.String()+err.Error(), func(n, _ int) {
				ev := log.Warn().Int("occurrences", n)
				if class != cli.ConnUnreachable {
					ev = ev.Str("class", class.String())
				}
				if sub != nil {
					// Our subscriptions are inboxes and JetStream API
					// subjects; the subject names no secret and no payload.
					ev = ev.Str("subject", sub.Subject)
				}
				ev.Str("error", scrub(err.Error(), secrets)).Msg("NATS error")
			})
		}),
		nats.LameDuckModeHandler(func(*nats.Conn) {
			log.Warn().Msg("NATS server entered lame duck mode; the connection will move to another server")
		}),
		nats.DiscoveredServersHandler(func(c *nats.Conn) {
			log.Info().Int("servers", len(c.DiscoveredServers())).Msg("discovered NATS servers")
		}),
	}
	auth, err := cli.Auth{
		CredsFile: nc.CredsFile, NKeySeedFile: nc.NKeySeedFile,
		User: nc.User, Password: nc.Password.Value(), Token: nc.Token.Value(),
		CAFile: nc.TLS.CAFile, CertFile: nc.TLS.CertFile, KeyFile: nc.TLS.KeyFile,
	}.Options()
	if err != nil {
		return nil, fmt.Errorf("nats.nkey_seed_file: %w", err)
	}
	opts = append(opts, auth...)
	return opts, nil
}

// natsConn is the connection to JetStream, with the embedded server behind
// it when the configuration names no URL. newNATSConn builds it, open
// makes it, close ends it.
type natsConn struct {
	cfg *config.Config
	// opts are the client options: the ClosedHandler that closes closed,
	// then natsOptions', which may replace it.
	opts    []nats.Option
	srv     *embedded.Server
	nc      *nats.Conn
	js      jetstream.JetStream
	closed  chan struct{} // closed once the client has closed the connection
	once    sync.Once     // closes closed
	closing atomic.Bool   // set before a deliberate close: not a loss, no logs
	log     zerolog.Logger
}

// newNATSConn builds the connection of cfg's nats section without making
// it. Its error is a configuration error (exit 2).
func newNATSConn(cfg *config.Config, log zerolog.Logger) (*natsConn, error) {
	c := &natsConn{cfg: cfg, log: log, closed: make(chan struct{})}
	built, err := natsOptions(cfg.NATS, log, &c.closing)
	if err != nil {
		return nil, &exitError{Code: 2, Msg: err.Error()}
	}
	// Ours first: the options built after them may replace any of them.
	// A failed nats.Connect calls no handler, so only the kept connection
	// closes c.closed; the Once is belt and braces.
	c.opts = append([]nats.Option{nats.ClosedHandler(func(*nats.Conn) { c.once.Do(func() { close(c.closed) }) })}, built...)
	return c, nil
}

// lost is closed when the connection was closed for good without our
// asking; cause is then nc.LastError().
func (c *natsConn) lost() <-chan struct{} { return c.closed }

// deliberate reports whether the connection was closed on our request.
func (c *natsConn) deliberate() bool { return c.closing.Load() }

// notReadyFunc receives why the first connection has not been made yet
// ("" once it is made); /readyz reports it.
type notReadyFunc func(reason string)

// openNATS builds and opens the connection for callers without admin
// endpoints (the demo); ctx ending first is an error.
func openNATS(ctx context.Context, cfg *config.Config, log zerolog.Logger) (*natsConn, error) {
	c, err := newNATSConn(cfg, log)
	if err != nil {
		return nil, err
	}
	connected, err := c.open(ctx, func(string) {})
	if err == nil && !connected {
		err = fmt.Errorf("connect to NATS: %w", context.Cause(ctx))
	}
	if err != nil {
		return nil, err
	}
	return c, nil
}

// open starts the embedded server when nats.url is empty, then makes the
// first connection: without RetryOnFailedConnect, so that a failure is the
// real cause. An authentication, TLS or credentials error is fatal (exit 1,
// with the cause); an unreachable server is waited for with backoff,
// reported on /readyz through notReady. Once connected, the connection
// reconnects forever. It returns false, and nil, when ctx ends first;
// whenever it does not connect, everything it started is stopped.
func (c *natsConn) open(ctx context.Context, notReady notReadyFunc) (connected bool, err error) {
	cfg, log := c.cfg, c.log
	url, shown := cfg.NATS.URL.Value(), cfg.NATS.URL.RedactedURL()
	if cfg.Embedded() {
		eo := embedded.Options{
			Listen:     cfg.NATS.Embedded.Listen,
			StoreDir:   cfg.NATS.Embedded.StoreDir,
			SyncAlways: cfg.NATS.Embedded.SyncAlways,
		}
		if cfg.NATS.Embedded.AllowNonLoopback {
			// Reachable from other hosts on purpose: every client, this
			// bridge's own connection included, presents the configured
			// token or user and password (config validation requires one).
			eo.AllowNonLoopback = true
			if cfg.NATS.Token != "" {
				eo.Token = cfg.NATS.Token.Value()
			} else {
				eo.User, eo.Password = cfg.NATS.User, cfg.NATS.Password.Value()
			}
		}
		srv, err := embedded.Start(ctx, eo)
		if err != nil {
			return false, embeddedErr(cfg, err)
		}
		c.srv = srv
		url, shown = srv.ClientURL(), srv.ClientURL()
		log.Info().Str("listen", srv.Addr()).Str("store_dir", cfg.NATS.Embedded.StoreDir).
			Str("server_version", srv.Version()).Msg("embedded JetStream started")
	}
	secrets := natsSecrets(cfg.NATS)
	pause := firstConnectMin
	unreachable := &throttle.Log{}
	for attempt := 1; ; attempt++ {
		nc, err := nats.Connect(url, c.opts...)
		if err == nil {
			c.nc = nc
			break
		}
		cause := scrub(cli.ConnectCause(err, url), secrets)
		class := cli.ClassifyConnErr(err)
		if class != cli.ConnUnreachable {
			c.close()
			return false, &exitError{Code: 1, Msg: fmt.Sprintf("nats: %s at %s: %s; %s", class, shown, cause, connHint(class))}
		}
		reason := fmt.Sprintf("cannot reach NATS at %s: %s", shown, cause)
		notReady(reason)
		unreachable.Do(cause, func(n, _ int) {
			log.Warn().Str("url", shown).Str("error", cause).Int("attempts", n).Str("retry_in", pause.String()).
				Msg("cannot reach NATS; retrying: " + connHint(class))
		})
		select {
		case <-ctx.Done():
			c.close()
			return false, nil
		case <-time.After(pause):
		}
		pause = min(2*pause, firstConnectMax)
	}
	notReady("")
	log.Info().Str("url", shown).Msg("connected to NATS")
	if c.js, err = jetstream.New(c.nc); err != nil {
		c.close()
		return false, err
	}
	return true, nil
}

// embeddedErr says why the embedded server did not start and what to do:
// join the server that holds the address, or give this one its own
// address and store.
func embeddedErr(cfg *config.Config, err error) error {
	e := cfg.NATS.Embedded
	var inUse *embedded.AddrInUseError
	var locked *embedded.StoreDirLockedError
	switch {
	case errors.As(err, &inUse):
		return fmt.Errorf("nats.embedded.listen %s is already in use, probably by a running bridge or nats-server; "+
			"to join it, run this bridge with --server nats://%s (or set nats.url); "+
			"to run a second embedded server, give it another nats.embedded.listen and its own nats.embedded.store_dir", e.Listen, joinAddr(inUse.Addr))
	case errors.As(err, &locked):
		who := "another bridge or bridge dlq command"
		if locked.PID > 0 {
			who = fmt.Sprintf("another bridge or bridge dlq command (process %d)", locked.PID)
		}
		return fmt.Errorf("nats.embedded.store_dir %s is in use by %s; two servers must not share a store: "+
			"stop it, join it with --server, or give this bridge its own nats.embedded.store_dir", e.StoreDir, who)
	}
	return fmt.Errorf("embedded JetStream: %s", strings.TrimPrefix(err.Error(), "embedded: "))
}

// joinAddr is the address a client dials to reach a server listening on
// addr (an unspecified host is reached on loopback).
func joinAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return net.JoinHostPort(host, port)
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

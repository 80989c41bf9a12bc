package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/cli"
	"github.com/sotercare/jetbridge/internal/cli/logs"
	"github.com/sotercare/jetbridge/internal/embedded"
)

// How a dlq command reaches JetStream (docs/operating.md#dead-letters-while-the-bridge-is-down):
//
//   - a URL (--server, nats.url, $NATS_URL): that server;
//   - else, the embedded store of the configuration: the command takes the
//     store's lock itself, as bridge run does, and serves the store with a
//     private server that binds no port (clients in this process only)
//     until the command ends; so it reads and changes the store of a
//     stopped bridge, and a bridge started afterwards delivers what was
//     replayed;
//   - when the lock is held (a bridge runs on the store), or the store
//     does not exist here: the running bridge's server on
//     nats.embedded.listen, as before;
//   - when the lock is held and nothing answers there (a bridge still
//     starting or stopping, another dlq command): a refusal, exit 1, and
//     the store untouched.

// privateServerName names the private server (in its JetStream metadata
// only; nothing can connect to it from outside).
const privateServerName = "jetbridge-dlq"

// openDLQ loads the configuration and connects (dialStore).
func openDLQ(path, server string, stderr io.Writer) (*dlqSession, error) {
	cfg, _, err := loadConfig(path, server, stderr)
	if err != nil {
		return nil, err
	}
	closing := new(atomic.Bool)
	nc, js, srv, err := dialStore(cfg, closing, stderr)
	if err != nil {
		return nil, err
	}
	return &dlqSession{cfg: cfg, nc: nc, js: js, closing: closing, q: deadletter.Open(js, cfg), srv: srv}, nil
}

// close closes the connection, then stops the private server, which
// flushes the store and releases its lock.
func (s *dlqSession) close() {
	s.closing.Store(true)
	s.nc.Close()
	if s.srv != nil {
		s.srv.Shutdown()
	}
}

// dialStore connects as described at the top of this file. srv is the
// private server when it serves the store, else nil; the caller shuts it
// down after closing nc.
func dialStore(cfg *config.Config, closing *atomic.Bool, stderr io.Writer) (nc *nats.Conn, js jetstream.JetStream, srv *embedded.Server, err error) {
	if !cfg.Embedded() {
		nc, js, err = dialNATS(cfg, closing, stderr)
		return nc, js, nil, err
	}
	e := cfg.NATS.Embedded
	srv, err = embedded.Start(context.Background(), embedded.Options{
		StoreDir:      e.StoreDir,
		SyncAlways:    e.SyncAlways,
		ServerName:    privateServerName,
		NoListen:      true,
		ExistingStore: true,
	})
	if err == nil {
		nc, js, err = dialPrivate(cfg, srv)
		if err != nil {
			srv.Shutdown()
			return nil, nil, nil, err
		}
		return nc, js, srv, nil
	}
	var locked *embedded.StoreDirLockedError
	if !errors.As(err, &locked) && !errors.Is(err, embedded.ErrNoStore) {
		return nil, nil, nil, fmt.Errorf("nats.embedded.store_dir %s: cannot serve it for this command: %s", e.StoreDir, strings.TrimPrefix(errText(err), "embedded: "))
	}
	nc, js, err = dialNATS(cfg, closing, stderr)
	var down *embeddedUnreachableError
	if !errors.As(err, &down) {
		return nc, js, nil, err
	}
	if locked != nil {
		who := "another process"
		if locked.PID > 0 {
			who = fmt.Sprintf("process %d", locked.PID)
		}
		return nil, nil, nil, fmt.Errorf("nats.embedded.store_dir %s is in use by %s, and nats.embedded.listen %s does not answer: %s; "+
			"a store is never opened by two processes at once: try again once that process (a bridge starting or stopping, "+
			"or another bridge dlq command) serves the store or has ended, or point --server at the NATS server of the bridge that holds it",
			e.StoreDir, who, e.Listen, down.cause)
	}
	return nil, nil, nil, fmt.Errorf("nats.embedded.store_dir %s holds no JetStream store, and nats.embedded.listen %s does not answer: %s; "+
		"has the bridge run with this configuration, from this directory? Start it with bridge run --config FILE, or point --server at your NATS",
		e.StoreDir, e.Listen, down.cause)
}

// dialPrivate connects to the private server in process.
func dialPrivate(cfg *config.Config, srv *embedded.Server) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect("", nats.Name(cfg.NATS.Name), nats.InProcessServer(srv), nats.NoReconnect())
	if err != nil {
		return nil, nil, fmt.Errorf("connect to the private server on nats.embedded.store_dir %s: %w", cfg.NATS.Embedded.StoreDir, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// dlqURL is the server the dlq commands connect to: the URL loadConfig
// resolved (--server, nats.url, $NATS_URL), else the embedded server that
// a running bridge serves on nats.embedded.listen (an unspecified listen
// host is reached on loopback). shown is the URL for messages, without
// credentials.
func dlqURL(cfg *config.Config) (url, shown string, err error) {
	if !cfg.Embedded() {
		return cfg.NATS.URL.Value(), cfg.NATS.URL.RedactedURL(), nil
	}
	if _, _, err := net.SplitHostPort(cfg.NATS.Embedded.Listen); err != nil {
		return "", "", &exitError{Code: 2, Msg: fmt.Sprintf("nats.embedded.listen: must be host:port, got %q", cfg.NATS.Embedded.Listen)}
	}
	url = "nats://" + joinAddr(cfg.NATS.Embedded.Listen)
	return url, url, nil
}

// embeddedUnreachableError: nothing answers on nats.embedded.listen.
type embeddedUnreachableError struct{ shown, cause string }

func (e *embeddedUnreachableError) Error() string {
	return fmt.Sprintf("cannot reach the bridge's embedded JetStream at %s (nats.embedded.listen): %s; is the bridge running? Start it with bridge run --config FILE, or point --server at your NATS", e.shown, e.cause)
}

// dialNATS connects with the configuration's credentials and TLS to
// dlqURL; nothing answering on nats.embedded.listen is an
// *embeddedUnreachableError.
func dialNATS(cfg *config.Config, closing *atomic.Bool, stderr io.Writer) (*nats.Conn, jetstream.JetStream, error) {
	url, shown, err := dlqURL(cfg)
	if err != nil {
		return nil, nil, err
	}
	log, _ := logs.New("console", "warn", "", stderr)
	opts, err := natsOptions(cfg.NATS, log, closing)
	if err != nil {
		return nil, nil, &exitError{Code: 2, Msg: err.Error()}
	}
	// A command fails at once when nothing answers, unlike the daemon,
	// which waits for its broker.
	opts = append(opts, nats.RetryOnFailedConnect(false))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		cause := scrub(cli.ConnectCause(err, url), natsSecrets(cfg.NATS))
		if class := cli.ClassifyConnErr(err); class != cli.ConnUnreachable {
			return nil, nil, fmt.Errorf("%s at %s: %s; %s", class, shown, cause, connHint(class))
		}
		if cfg.Embedded() {
			return nil, nil, &embeddedUnreachableError{shown: shown, cause: cause}
		}
		return nil, nil, fmt.Errorf("cannot reach NATS at %s: %s; %s", shown, cause, connHint(cli.ConnUnreachable))
	}
	js, err := jetstream.New(nc)
	if err != nil {
		closing.Store(true)
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

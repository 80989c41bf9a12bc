package natstest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/embedded"
)

// startTimeout bounds one server start, including waiting for a port that a
// previous instance has just released.
const startTimeout = 10 * time.Second

// Option configures Start.
type Option func(*options)

type options struct {
	storeDir string
	listen   string
	logs     bool
}

// WithStoreDir uses dir as the JetStream store dir instead of t.TempDir(),
// e.g. to start on the directory a killed child process used.
func WithStoreDir(dir string) Option { return func(o *options) { o.storeDir = dir } }

// WithListen binds "127.0.0.1:PORT" (or another loopback host:port) instead
// of a random port.
func WithListen(hostPort string) Option { return func(o *options) { o.listen = hostPort } }

// WithLogs sends the server's log lines to t.Logf (off by default): a
// debugging aid, used by no test as committed.
func WithLogs() Option { return func(o *options) { o.logs = true } }

// Server is an embedded JetStream server owned by one test.
type Server struct {
	opts embedded.Options // Listen is pinned to the first bound address
	url  string

	mu  sync.Mutex
	srv *embedded.Server // nil while shut down
}

// Start starts an embedded JetStream server on 127.0.0.1 (random port
// unless WithListen) with store dir t.TempDir() (unless WithStoreDir), waits
// until it accepts connections and shuts it down in t.Cleanup.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	o := options{listen: "127.0.0.1:0"}
	for _, opt := range opts {
		opt(&o)
	}
	if o.storeDir == "" {
		o.storeDir = t.TempDir()
	}
	eopts := embedded.Options{
		Listen:     o.listen,
		StoreDir:   o.storeDir,
		ServerName: uniqueName("natstest"), // ConnectPinned tells it from others
	}
	if o.logs {
		// Registered before the shutdown cleanup, so it runs after it:
		// no t.Logf once the test is finished.
		var done atomic.Bool
		t.Cleanup(func() { done.Store(true) })
		eopts.Logf = func(format string, args ...any) {
			if !done.Load() {
				t.Logf("nats-server: "+format, args...)
			}
		}
	}
	srv := startEmbedded(t, eopts)
	eopts.Listen = srv.Addr() // Restart comes back on the same port
	s := &Server{opts: eopts, url: srv.ClientURL(), srv: srv}
	t.Cleanup(s.Shutdown)
	return s
}

// URL is the client URL, e.g. "nats://127.0.0.1:PORT". It stays the same
// across Restart.
func (s *Server) URL() string { return s.url }

// StoreDir is the JetStream store dir.
func (s *Server) StoreDir() string { return s.opts.StoreDir }

// Shutdown stops the server gracefully and waits for it. It is a no-op if
// the server is already down. Safe for concurrent use.
func (s *Server) Shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		s.srv.Shutdown()
		s.srv = nil
	}
}

// Restart shuts the server down (if it is running) and starts it again on
// the same store dir and the same port, then waits until JetStream answers
// API requests. Connected clients reconnect on their own. If the port was
// taken while the server was down (another listener, another test's
// server), Restart fails the test at once, naming the port: it never
// waits for the port, nor comes back elsewhere.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		s.srv.Shutdown()
		s.srv = nil
	}
	s.srv = restartEmbedded(t, s.opts)
	waitJetStream(t, s.url, startTimeout)
}

// Identity is the server's name, kept across Restart (and, for a cluster
// node, its cluster's): what ConnectPinned accepts.
func (s *Server) Identity() Identity {
	id := Identity{Names: []string{s.opts.ServerName}}
	if s.opts.Cluster != nil {
		id.Cluster = s.opts.Cluster.Name
	}
	return id
}

// startEmbedded starts a server, retrying while a fixed port is still
// reported busy (e.g. the port of a killed child process). Restarts use
// restartEmbedded, which does not wait.
func startEmbedded(t testing.TB, opts embedded.Options) *embedded.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	retry := time.NewTicker(20 * time.Millisecond)
	defer retry.Stop()
	for {
		srv, err := embedded.Start(ctx, opts)
		if err == nil {
			return srv
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatalf("natstest: start server: %v", err)
		}
		select {
		case <-retry.C:
		case <-ctx.Done():
			t.Fatalf("natstest: start server: %v (gave up after %s)", err, startTimeout)
		}
	}
}

// waitJetStream waits until the JetStream API at url answers.
func waitJetStream(t testing.TB, url string, timeout time.Duration) {
	t.Helper()
	var nc *nats.Conn
	defer func() {
		if nc != nil {
			nc.Close()
		}
	}()
	Eventually(t, timeout, func() error {
		if nc == nil {
			c, err := nats.Connect(url, nats.Name("natstest-probe"))
			if err != nil {
				return fmt.Errorf("connect %s: %w", url, err)
			}
			nc = c
		}
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := js.AccountInfo(ctx); err != nil {
			return fmt.Errorf("JetStream account info at %s: %w", url, err)
		}
		return nil
	})
}

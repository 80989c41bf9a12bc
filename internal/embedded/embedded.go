package embedded

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// defaultServerName is used when Options.ServerName is empty.
const defaultServerName = "jetbridge-embedded"

// defaultStartTimeout bounds Start when ctx carries no earlier deadline.
const defaultStartTimeout = 10 * time.Second

// Errors returned by Start for invalid options. Match them with errors.Is.
var (
	// ErrStoreDirRequired: Options.StoreDir is empty.
	ErrStoreDirRequired = errors.New("embedded: store dir is required")
	// ErrNotLoopback: Options.Listen names a host that is not a loopback
	// address and AllowNonLoopback is false.
	ErrNotLoopback = errors.New("embedded: listen host is not a loopback address")
	// ErrStoreDirLocked: another embedded server (in this process or
	// another) holds Options.StoreDir; the error is a *StoreDirLockedError.
	ErrStoreDirLocked = errors.New("embedded: store dir is in use by another embedded server")
	// ErrUnsafeLockFile: the store dir's lock file is a symbolic link, not
	// a regular file, or a file with other hard links; the error is an
	// *UnsafeLockFileError.
	ErrUnsafeLockFile = errors.New("embedded: unsafe store dir lock file")
	// ErrNoStore: Options.ExistingStore is set and Options.StoreDir holds
	// no JetStream store; Start created nothing.
	ErrNoStore = errors.New("embedded: the store dir holds no JetStream store")
	// ErrNoListenCluster: Options.NoListen with Options.Cluster (a cluster
	// node needs its client listener).
	ErrNoListenCluster = errors.New("embedded: NoListen cannot be combined with Cluster")
)

// AddrInUseError is the error of Start when a listen address is taken.
// It matches syscall.EADDRINUSE with errors.Is.
type AddrInUseError struct {
	Addr string // host:port
	Err  error  // the listener's error
}

func (e *AddrInUseError) Error() string {
	return fmt.Sprintf("embedded: listen address %s is already in use", e.Addr)
}

func (e *AddrInUseError) Unwrap() error { return e.Err }

// StoreDirLockedError is the error of Start when another embedded server
// holds the store directory. It matches ErrStoreDirLocked.
type StoreDirLockedError struct {
	Dir string // absolute
	PID int    // the holder's process id, 0 when unknown
}

func (e *StoreDirLockedError) Error() string {
	holder := "another embedded server"
	if e.PID > 0 {
		holder += fmt.Sprintf(" (process %d)", e.PID)
	}
	return fmt.Sprintf("embedded: store dir %s is in use by %s", e.Dir, holder)
}

func (e *StoreDirLockedError) Is(target error) bool { return target == ErrStoreDirLocked }

// errStartTimeout is the cause when defaultStartTimeout ends Start; it
// matches context.DeadlineExceeded like a caller's own deadline does.
var errStartTimeout = fmt.Errorf("embedded: server not ready within %s: %w", defaultStartTimeout, context.DeadlineExceeded)

// Options configure an embedded server. The zero value is not valid:
// StoreDir is required.
type Options struct {
	// Listen is the client listener as "host:port". An empty value, an
	// empty port or port 0 picks a random free port. An empty host means
	// 127.0.0.1, and "localhost" is bound as 127.0.0.1. The host must be a
	// loopback IP unless AllowNonLoopback is set.
	Listen string
	// AllowNonLoopback permits a non-loopback (or host name) Listen host.
	AllowNonLoopback bool
	// Token, or User and Password, when set, are required of every client
	// (nats-server's authorization); jetbridge sets them whenever the
	// listener is not on loopback.
	Token          string
	User, Password string
	// StoreDir is the JetStream store directory (required). The server
	// keeps its data in a "jetstream" subdirectory.
	StoreDir string
	// SyncAlways makes JetStream fsync after every write.
	SyncAlways bool
	// ServerName defaults to "jetbridge-embedded".
	ServerName string
	// Logf, if set, receives the server's notice, warning, error and fatal
	// lines, each prefixed with its level ("[INF] ", "[WRN] ", "[ERR] ",
	// "[FTL] "). Nil discards them. Logf must be safe for concurrent use
	// and must not block. A fatal line never exits the process.
	Logf func(format string, args ...any)

	// Cluster, if set, makes the server one node of a JetStream cluster.
	// Nil (the default) runs a single node, as before.
	Cluster *Cluster

	// NoListen starts the server without any client listener: no port is
	// bound (Listen, AllowNonLoopback and the client authorization fields
	// are ignored), and the only clients are those of this process, over
	// Server.InProcessConn (nats.InProcessServer(srv)). ClientURL and Addr
	// are then "". The store dir is locked as always.
	NoListen bool
	// ExistingStore makes Start refuse with ErrNoStore, creating nothing
	// (not even StoreDir), when StoreDir holds no JetStream store yet: for
	// a caller that reads what a server stored before, never a new store.
	ExistingStore bool
}

// Cluster makes an embedded server one node of a JetStream cluster. Every
// node needs the same Name, its own Options.ServerName and StoreDir, and
// routes to the other nodes. A JetStream cluster answers no API request
// until its nodes have elected a meta leader, which Start does not wait
// for.
type Cluster struct {
	// Name is the cluster name, the same on every node (required).
	Name string
	// Listen is the route listener as "host:port", with the rules of
	// Options.Listen: an empty value or port 0 picks a random free port,
	// and the host must be a loopback IP unless AllowNonLoopback is set.
	Listen string
	// Routes are the route URLs of the cluster's nodes, e.g.
	// "nats://127.0.0.1:6222"; the node's own URL may be listed (it is
	// ignored), so every node can be given the same list.
	Routes []string
}

// Server is a running embedded nats-server with JetStream enabled.
type Server struct {
	ns       *server.Server
	addr     string
	url      string
	lock     *storeLock
	warnings []string
}

// Start validates opts, starts the server with JetStream and waits until it
// accepts client connections. Startup is bounded by ctx and by
// 10 s (defaultStartTimeout), whichever ends first; on any failure the partly
// started server is shut down before Start returns.
//
// If the requested port is already in use the error is an *AddrInUseError
// (errors.Is(err, syscall.EADDRINUSE) holds). The store directory is locked
// (a lock file in it) for as long as the server runs: a second server on
// the same directory gets a *StoreDirLockedError (ErrStoreDirLocked)
// instead of sharing, and corrupting, the first one's files. A lock file
// that is a symbolic link, not a regular file, or hard-linked elsewhere is
// never opened through nor written: Start fails with an
// *UnsafeLockFileError (ErrUnsafeLockFile).
func Start(ctx context.Context, opts Options) (*Server, error) {
	host, port := "", 0
	if opts.NoListen {
		if opts.Cluster != nil {
			return nil, ErrNoListenCluster
		}
	} else {
		var err error
		if host, port, err = parseListen(opts.Listen, opts.AllowNonLoopback); err != nil {
			return nil, err
		}
	}
	if opts.StoreDir == "" {
		return nil, ErrStoreDirRequired
	}
	storeDir, err := filepath.Abs(opts.StoreDir)
	if err != nil {
		return nil, fmt.Errorf("embedded: store dir %q: %w", opts.StoreDir, err)
	}
	if opts.ExistingStore {
		if err := hasStore(storeDir); err != nil {
			return nil, err
		}
	}
	name := opts.ServerName
	if name == "" {
		name = defaultServerName
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("embedded: start server %q: %w", name, context.Cause(ctx))
	}
	hostPort := net.JoinHostPort(host, strconv.Itoa(port))
	if opts.NoListen {
		hostPort = "(no client listener)"
	} else if port != 0 {
		// nats-server reports a busy port only through its logger, after
		// Start; probing first gives a typed error with a clear message.
		if err := probeListen(hostPort); err != nil {
			return nil, err
		}
	}
	cluster, err := clusterOptions(opts.Cluster, opts.AllowNonLoopback)
	if err != nil {
		return nil, err
	}
	lock, err := lockStoreDir(storeDir)
	if err != nil {
		return nil, err
	}
	warnings := storeDirWarnings(storeDir)
	started := false
	defer func() {
		if !started {
			lock.release()
		}
	}()
	var routes []*url.URL
	if opts.Cluster != nil {
		routes, err = routeURLs(opts.Cluster.Routes)
		if err != nil {
			return nil, err
		}
		if cluster.Port != server.RANDOM_PORT {
			// A busy route port would otherwise make the server wait out
			// the whole start deadline before failing.
			if err := probeListen(net.JoinHostPort(cluster.Host, strconv.Itoa(cluster.Port))); err != nil {
				return nil, err
			}
		}
	}

	serverPort := port
	if serverPort == 0 && !opts.NoListen {
		serverPort = server.RANDOM_PORT // 0 would mean the default 4222
	}
	ns, err := server.NewServer(&server.Options{
		ServerName: name,
		Host:       host,
		Port:       serverPort,
		JetStream:  true,
		StoreDir:   storeDir,
		SyncAlways: opts.SyncAlways,
		NoSigs:     true, // see package doc: never trap the process's signals
		NoLog:      true,
		DontListen: opts.NoListen,
		Cluster:    cluster,
		Routes:     routes,
		// Client authorization: at most one of the two is set.
		Authorization: opts.Token,
		Username:      opts.User,
		Password:      opts.Password,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded: server %q options: %w", name, err)
	}
	srv, err := run(ctx, ns, opts.Logf, name, hostPort, storeDir, opts.NoListen)
	if err != nil {
		return nil, err
	}
	started = true
	srv.lock, srv.warnings = lock, warnings
	return srv, nil
}

// Warnings are what Start found wrong but not bad enough to refuse to
// start: a store dir writable by other users. The package logs nothing
// itself; the caller logs them (bridge run at warn level).
func (s *Server) Warnings() []string { return s.warnings }

// storeDirWarnings warns about a store dir that users other than its
// owner and group may write to: they could change the stored messages, or
// plant links and files in it.
func storeDirWarnings(dir string) []string {
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm()&0o002 == 0 {
		return nil
	}
	return []string{fmt.Sprintf("store dir %s is writable by other users (mode %04o): any user of this host can change the stored messages "+
		"or plant files in it; remove their write permission (chmod o-w %s)", dir, unixMode(fi.Mode()), dir)}
}

// unixMode is m as chmod(1) numbers it, with the setuid, setgid and
// sticky bits.
func unixMode(m os.FileMode) uint32 {
	mode := uint32(m.Perm())
	if m&os.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// run starts ns and waits until it is ready; on failure it is shut down.
func run(ctx context.Context, ns *server.Server, logf func(string, ...any), name, hostPort, storeDir string, noListen bool) (*Server, error) {
	log := &logAdapter{logf: logf}
	ns.SetLoggerV2(log, false, false, false)

	ctx, cancel := context.WithTimeoutCause(ctx, defaultStartTimeout, errStartTimeout)
	defer cancel()

	// ns.Start returns once the client listener is up (or failed).
	started := make(chan struct{})
	go func() {
		defer close(started)
		ns.Start()
	}()
	fail := func(err error) (*Server, error) {
		ns.Shutdown()
		<-started
		ns.WaitForShutdown()
		return nil, err
	}
	select {
	case <-started:
	case <-ctx.Done():
		return fail(fmt.Errorf("embedded: start server %q on %s: %w", name, hostPort, context.Cause(ctx)))
	}
	if msg := log.firstFatal(); msg != "" {
		return fail(fmt.Errorf("embedded: start server %q on %s: %s", name, hostPort, msg))
	}
	addr := ns.Addr()
	if addr == nil && !noListen {
		return fail(fmt.Errorf("embedded: start server %q: client listener on %s did not start", name, hostPort))
	}
	if !ns.JetStreamEnabled() {
		return fail(fmt.Errorf("embedded: start server %q: JetStream not enabled (store dir %s)", name, storeDir))
	}
	where := hostPort
	if addr != nil {
		where = addr.String()
	}
	deadline, _ := ctx.Deadline() // always set by WithTimeoutCause
	if wait := time.Until(deadline); wait <= 0 || !ns.ReadyForConnections(wait) {
		return fail(fmt.Errorf("embedded: start server %q on %s: not ready for connections before the start deadline: %w",
			name, where, context.DeadlineExceeded))
	}
	if noListen {
		return &Server{ns: ns}, nil
	}
	return &Server{ns: ns, addr: addr.String(), url: ns.ClientURL()}, nil
}

// hasStore returns ErrNoStore, wrapped with dir, unless dir holds the
// server's "jetstream" directory.
func hasStore(dir string) error {
	fi, err := os.Stat(filepath.Join(dir, "jetstream"))
	if err == nil && fi.IsDir() {
		return nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("embedded: store dir %s: %w", dir, err)
	}
	return fmt.Errorf("%w: %s", ErrNoStore, dir)
}

// InProcessConn is a new client connection to the server within this
// process, over a pipe (no socket): pass the server to
// nats.InProcessServer. It works whether or not the server listens.
func (s *Server) InProcessConn() (net.Conn, error) { return s.ns.InProcessConn() }

// ClientURL is the URL clients connect to, e.g. "nats://127.0.0.1:4222";
// "" for a NoListen server.
func (s *Server) ClientURL() string { return s.url }

// Addr is the host:port the client listener actually bound; "" for a
// NoListen server.
func (s *Server) Addr() string { return s.addr }

// ClusterAddr is the host:port the route listener bound, or "" for a
// single node.
func (s *Server) ClusterAddr() string {
	if a := s.ns.ClusterAddr(); a != nil {
		return a.String()
	}
	return ""
}

// Version is the nats-server version.
func (s *Server) Version() string { return server.VERSION }

// ServerVersion is the version of the nats-server linked into this binary,
// available without starting a server (e.g. for a version command).
func ServerVersion() string { return server.VERSION }

// NATS returns the raw server. It is an escape hatch for tests; production
// code should not need it.
func (s *Server) NATS() *server.Server { return s.ns }

// Shutdown stops the server gracefully (JetStream state is flushed to the
// store dir) and waits until it has stopped. It is safe to call more than
// once.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
	s.lock.release()
}

// parseListen splits and checks Options.Listen. It returns the host to bind
// and the port, 0 meaning random.
func parseListen(listen string, allowNonLoopback bool) (string, int, error) {
	if listen == "" {
		return "127.0.0.1", 0, nil
	}
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0, fmt.Errorf("embedded: listen %q: %w", listen, err)
	}
	port := 0
	if portStr != "" {
		port, err = strconv.Atoi(portStr)
		if err != nil || port < 0 || port > 65535 {
			return "", 0, fmt.Errorf("embedded: listen %q: invalid port %q", listen, portStr)
		}
	}
	if host == "" || strings.EqualFold(host, "localhost") {
		return "127.0.0.1", port, nil
	}
	if allowNonLoopback {
		return host, port, nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return "", 0, fmt.Errorf("%w: %q (set AllowNonLoopback to expose the broker)", ErrNotLoopback, host)
	}
	return host, port, nil
}

// clusterOptions converts Options.Cluster; nil gives the zero value (no
// clustering).
func clusterOptions(c *Cluster, allowNonLoopback bool) (server.ClusterOpts, error) {
	if c == nil {
		return server.ClusterOpts{}, nil
	}
	if c.Name == "" {
		return server.ClusterOpts{}, errors.New("embedded: cluster name is required")
	}
	host, port, err := parseListen(c.Listen, allowNonLoopback)
	if err != nil {
		return server.ClusterOpts{}, fmt.Errorf("embedded: cluster route listener: %w", err)
	}
	if port == 0 {
		port = server.RANDOM_PORT // 0 would mean no route listener
	}
	return server.ClusterOpts{Name: c.Name, Host: host, Port: port}, nil
}

// routeURLs parses the route URLs of Options.Cluster.
func routeURLs(routes []string) ([]*url.URL, error) {
	out := make([]*url.URL, 0, len(routes))
	for _, r := range routes {
		u, err := url.Parse(r)
		if err != nil || u.Host == "" || (u.Scheme != "nats" && u.Scheme != "nats-route") {
			return nil, fmt.Errorf("embedded: cluster route %q: want nats://host:port", r)
		}
		out = append(out, u)
	}
	return out, nil
}

// probeListen checks that hostPort can be bound right now.
func probeListen(hostPort string) error {
	l, err := net.Listen("tcp", hostPort)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return &AddrInUseError{Addr: hostPort, Err: err}
		}
		return fmt.Errorf("embedded: cannot listen on %s: %w", hostPort, err)
	}
	return l.Close()
}

// logAdapter implements server.Logger. It forwards to an optional Logf and
// remembers the first fatal line so Start can report why startup failed.
// Unlike the server's default logger, Fatalf never exits the process.
type logAdapter struct {
	logf func(format string, args ...any)

	mu    sync.Mutex
	fatal string
}

var _ server.Logger = (*logAdapter)(nil)

func (l *logAdapter) firstFatal() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fatal
}

func (l *logAdapter) emit(prefix, format string, args []any) {
	if l.logf != nil {
		l.logf(prefix+format, args...)
	}
}

func (l *logAdapter) Noticef(format string, v ...any) { l.emit("[INF] ", format, v) }
func (l *logAdapter) Warnf(format string, v ...any)   { l.emit("[WRN] ", format, v) }
func (l *logAdapter) Errorf(format string, v ...any)  { l.emit("[ERR] ", format, v) }
func (l *logAdapter) Debugf(format string, v ...any)  { l.emit("[DBG] ", format, v) }
func (l *logAdapter) Tracef(format string, v ...any)  { l.emit("[TRC] ", format, v) }

func (l *logAdapter) Fatalf(format string, v ...any) {
	l.mu.Lock()
	if l.fatal == "" {
		l.fatal = fmt.Sprintf(format, v...)
	}
	l.mu.Unlock()
	l.emit("[FTL] ", format, v)
}

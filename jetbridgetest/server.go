package jetbridgetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/producer"
)

// Timeout bounds every wait of the kit: a server or a bridge becoming
// ready, a receiver getting its requests, a consumer becoming quiet. A wait
// that runs out fails the test and says what it saw; a passing test never
// waits that long.
const Timeout = 20 * time.Second

// callTimeout bounds one JetStream request made by the kit (a publish, a
// stream read).
const callTimeout = 5 * time.Second

// AuthMethod is what a server started WithAuth requires of its clients.
type AuthMethod string

// The authentication methods of WithAuth. Each server gets freshly
// generated credentials (Server.Credentials).
const (
	AuthToken        AuthMethod = "token"         // a bearer token
	AuthUserPassword AuthMethod = "user-password" // a user and a password
	AuthNKey         AuthMethod = "nkey"          // an nkey seed file
	AuthJWT          AuthMethod = "jwt"           // operator mode: a creds file (user JWT and seed)
	AuthTLS          AuthMethod = "tls"           // TLS; the client must trust the server's CA
	AuthMutualTLS    AuthMethod = "mtls"          // TLS with a verified client certificate
)

// Credentials are what a client of a server started WithAuth needs. Plain
// secrets are values (Token, Password); the others are files in the
// test's temporary directory. Fields the method does not use are empty.
type Credentials struct {
	Method       AuthMethod
	Token        string
	User         string
	Password     string
	NKeySeedFile string
	CredsFile    string // JWT: user JWT and seed
	CAFile       string // TLS: the CA the client trusts
	CertFile     string // mutual TLS: the client certificate
	KeyFile      string // mutual TLS: its key
	// Secrets lists every secret value these credentials carry (token,
	// password, seeds, the client key), so a test can assert that none
	// of them appears in its logs.
	Secrets []string

	inner natstest.Creds
}

// Options are the nats.go options that authenticate with c; none for a
// server without authentication.
func (c Credentials) Options() []nats.Option { return c.inner.Options() }

func credentials(c natstest.Creds) Credentials {
	return Credentials{
		Method: AuthMethod(c.Method), Token: c.Token, User: c.User, Password: c.Password,
		NKeySeedFile: c.NKeySeedFile, CredsFile: c.CredsFile, CAFile: c.CAFile,
		CertFile: c.CertFile, KeyFile: c.KeyFile, Secrets: c.Secrets, inner: c,
	}
}

// ServerOption configures NewServer.
type ServerOption func(*serverOptions)

type serverOptions struct {
	cluster bool
	auth    AuthMethod
}

// WithCluster runs a 3-node JetStream cluster in the test process instead
// of a single server. NewServer returns once a JetStream meta leader is
// elected and every node answers. It cannot be combined with WithAuth.
func WithCluster() ServerOption { return func(o *serverOptions) { o.cluster = true } }

// WithAuth makes the server require method, with freshly generated
// credentials (Server.Credentials). The kit's own connections use them.
func WithAuth(method AuthMethod) ServerOption { return func(o *serverOptions) { o.auth = method } }

// Server is a JetStream server (or a 3-node cluster) owned by one test:
// on 127.0.0.1 with random ports, with its store in the test's temporary
// directory, shut down in t.Cleanup.
type Server struct {
	single  *natstest.Server
	auth    *natstest.AuthServer
	cluster *natstest.Cluster

	mu sync.Mutex // guards nc and js, replaced by RotateCredentials
	nc *nats.Conn
	js jetstream.JetStream
}

// NewServer starts a JetStream server, waits until it answers JetStream
// requests and connects to it (Server.JetStream). Everything is stopped
// in t.Cleanup.
func NewServer(t testing.TB, opts ...ServerOption) *Server {
	t.Helper()
	var o serverOptions
	for _, opt := range opts {
		opt(&o)
	}
	s := &Server{}
	switch {
	case o.cluster && o.auth != "":
		t.Fatalf("jetbridgetest: WithCluster and WithAuth cannot be combined")
	case o.cluster:
		s.cluster = natstest.StartCluster(t, 3)
	case o.auth != "":
		switch o.auth {
		case AuthToken, AuthUserPassword, AuthNKey, AuthJWT, AuthTLS, AuthMutualTLS:
		default:
			t.Fatalf("jetbridgetest: WithAuth: unknown method %q", o.auth)
		}
		s.auth = natstest.StartAuth(t, natstest.AuthMethod(o.auth))
	default:
		s.single = natstest.Start(t)
	}
	s.nc, s.js = s.Connect(t)
	return s
}

// URL is the client URL, "nats://127.0.0.1:PORT" (for a cluster every
// node's URL, comma-separated, as nats.Connect accepts them). It stays the
// same across restarts.
func (s *Server) URL() string {
	switch {
	case s.cluster != nil:
		return s.cluster.URLs()
	case s.auth != nil:
		return s.auth.URL()
	}
	return s.single.URL()
}

// Credentials are the credentials the server accepts now; the zero value
// for a server without authentication.
func (s *Server) Credentials() Credentials {
	if s.auth == nil {
		return Credentials{}
	}
	return credentials(s.auth.Creds())
}

// JetStream is the kit's own connection to the server. It reconnects
// forever, quickly, so it follows Restart.
func (s *Server) JetStream() jetstream.JetStream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.js
}

// Conn is the NATS connection under JetStream.
func (s *Server) Conn() *nats.Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nc
}

// Connect opens another connection, authenticated with Credentials,
// reconnecting forever every 20 ms unless opts say otherwise (they are
// applied last), and closes it in t.Cleanup. Like every connection of the
// kit it talks to this server only, never to another server that took its
// port (package documentation); a nats.SetCustomDialer in opts replaces
// that check. Give a producer under test a connection of its own, e.g.
// Connect(t, nats.ReconnectBufSize(-1)) for one that must see publish
// errors while the server is away.
func (s *Server) Connect(t testing.TB, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	all := append(s.Credentials().Options(), nats.Name("jetbridgetest"))
	return natstest.ConnectPinned(t, s.URL(), s.identity(), append(all, opts...)...)
}

// identity is what the kit's connections accept (natstest.ConnectPinned).
func (s *Server) identity() natstest.Identity {
	switch {
	case s.cluster != nil:
		return s.cluster.Identity()
	case s.auth != nil:
		return s.auth.Identity()
	}
	return s.single.Identity()
}

// Shutdown stops the server (every node of a cluster) and waits for it;
// connected clients start reconnecting. Restart brings it back. It is a
// no-op while the server is down.
func (s *Server) Shutdown() {
	switch {
	case s.cluster != nil:
		for i := range s.cluster.Size() {
			s.cluster.Shutdown(i)
		}
	case s.auth != nil:
		s.auth.Shutdown()
	default:
		s.single.Shutdown()
	}
}

// Restart stops the server if it is running and starts it again on the
// same store and port, with the same credentials, and waits until
// JetStream answers. Streams, consumers and stored messages survive.
// A cluster is restarted one node at a time, each back in the cluster
// before the next goes down. If the port was taken while the server was
// down (by any listener, e.g. another test's server), Restart fails the
// test at once, naming the port.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	switch {
	case s.cluster != nil:
		for i := range s.cluster.Size() {
			s.cluster.Restart(t, i)
		}
	case s.auth != nil:
		s.auth.Restart(t, s.auth.Creds())
	default:
		s.single.Restart(t)
	}
}

// RotateCredentials restarts a server started WithAuth on the same store
// and port with new credentials of the same method and returns them; the
// old ones are refused from then on (for TLS: the server presents a
// certificate of another CA). The kit's own connection (JetStream, Conn)
// is replaced by one with the new credentials; every other connection,
// a bridge's included, keeps what it was given: that is what a test of
// credentials handling looks at.
//
// Not yet stable: it may still change
// (docs/testing.md#testing-your-producer-and-receiver).
func (s *Server) RotateCredentials(t testing.TB) Credentials {
	t.Helper()
	if s.auth == nil {
		t.Fatalf("jetbridgetest: RotateCredentials needs a server started WithAuth")
	}
	s.Conn().Close() // before the restart: it would only be refused
	c := s.auth.NewCreds(t)
	s.auth.Restart(t, c)
	nc, js := s.Connect(t)
	s.mu.Lock()
	s.nc, s.js = nc, js
	s.mu.Unlock()
	return credentials(c)
}

// Rejections counts the connections a server started WithAuth refused for
// bad credentials, across restarts; 0 without authentication. Wait on it
// rather than sleeping through a credentials change.
//
// Not yet stable: it may still change
// (docs/testing.md#testing-your-producer-and-receiver).
func (s *Server) Rejections() int {
	if s.auth == nil {
		return 0
	}
	return s.auth.Rejections()
}

// Nodes is the number of nodes: 3 WithCluster, else 1.
func (s *Server) Nodes() int {
	if s.cluster != nil {
		return s.cluster.Size()
	}
	return 1
}

// ShutdownNode stops node i (0-based) of a cluster; the others keep
// serving R3 streams. RestartNode brings it back.
//
// Not yet stable: it may still change
// (docs/testing.md#testing-your-producer-and-receiver).
func (s *Server) ShutdownNode(t testing.TB, i int) {
	t.Helper()
	s.node(t, i)
	s.cluster.Shutdown(i)
}

// RestartNode restarts node i (0-based) of a cluster on its store and
// ports and waits until it is back in the cluster.
//
// Not yet stable: it may still change
// (docs/testing.md#testing-your-producer-and-receiver).
func (s *Server) RestartNode(t testing.TB, i int) {
	t.Helper()
	s.node(t, i)
	s.cluster.Restart(t, i)
}

func (s *Server) node(t testing.TB, i int) {
	t.Helper()
	if s.cluster == nil {
		t.Fatalf("jetbridgetest: node %d: the server is not a cluster (use WithCluster)", i)
	}
	if i < 0 || i >= s.cluster.Size() {
		t.Fatalf("jetbridgetest: node %d: the cluster has nodes 0 to %d", i, s.cluster.Size()-1)
	}
}

// PublishOption adds to the message Publish sends.
type PublishOption func(*nats.Msg)

// WithHeader sets a header on the published message, e.g. one the
// producer package does not set itself.
func WithHeader(key, value string) PublishOption {
	return func(m *nats.Msg) { m.Header.Set(key, value) }
}

// WithTraceParent sets the W3C trace context header "traceparent".
func WithTraceParent(traceparent string) PublishOption {
	return func(m *nats.Msg) { m.Header["traceparent"] = []string{traceparent} }
}

// Publish publishes ev exactly as producer.Publisher does (subject
// <root>.<severity>.<type> under root "events" unless ev.Subject is set;
// Nats-Msg-Id, Event-Id, Event-Type, Event-Severity, Content-Type and
// Event-Meta-* headers), plus opts, and waits for the PubAck. A try that
// fails (the server restarting, a cluster electing a leader) is repeated
// with the same Nats-Msg-Id, which the broker's duplicate window makes
// safe, for up to Timeout. Publishing an ev.ID again inside the duplicate
// window is not an error: the result says Duplicate (so does a repeated
// try whose first one was stored). An event no stream captures, or one
// still failing after Timeout, fails the test.
func (s *Server) Publish(t testing.TB, ev producer.Event, opts ...PublishOption) producer.PublishResult {
	t.Helper()
	msg, err := producer.NewPublisher(nil, "").Message(ev)
	if err != nil {
		t.Fatalf("jetbridgetest: publish: %v", err)
	}
	for _, opt := range opts {
		opt(msg)
	}
	js := s.JetStream()
	var ack *jetstream.PubAck
	err = natstest.Poll(Timeout, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		a, perr := js.PublishMsg(ctx, msg)
		ack = a
		noStream := errors.Is(perr, jetstream.ErrNoStreamResponse) || errors.Is(perr, nats.ErrNoResponders)
		if noStream && s.cluster == nil {
			// A single server answers at once: nothing captures the subject.
			return nil
		}
		return perr
	})
	if err == nil && ack == nil {
		err = fmt.Errorf("no stream captures the subject: start a bridge, or Provision, first")
	}
	if err != nil {
		t.Fatalf("jetbridgetest: publish %s: %v", msg.Subject, err)
	}
	return producer.PublishResult{
		ID: msg.Header.Get(producer.HeaderEventID), Subject: msg.Subject,
		Stream: ack.Stream, Seq: ack.Sequence, Duplicate: ack.Duplicate,
	}
}

// Messages returns every message stream holds, in stream order, with its
// headers and data. A missing stream fails the test.
func (s *Server) Messages(t testing.TB, stream string) []*jetstream.RawStreamMsg {
	t.Helper()
	msgs, err := messages(s.JetStream(), stream)
	if err != nil {
		t.Fatalf("jetbridgetest: %v", err)
	}
	return msgs
}

func messages(js jetstream.JetStream, stream string) ([]*jetstream.RawStreamMsg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", stream, err)
	}
	state := st.CachedInfo().State
	var out []*jetstream.RawStreamMsg
	for seq := state.FirstSeq; state.Msgs > 0 && seq <= state.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // deleted
		}
		if err != nil {
			return nil, fmt.Errorf("stream %s seq %d: %w", stream, seq, err)
		}
		out = append(out, m)
	}
	return out, nil
}

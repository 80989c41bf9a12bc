package natstest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// AuthMethod is what a server started by StartAuth requires of clients.
type AuthMethod string

// The authentication methods StartAuth supports.
const (
	AuthToken        AuthMethod = "token"         // a bearer token
	AuthUserPassword AuthMethod = "user-password" // a user and a password
	AuthNKey         AuthMethod = "nkey"          // an nkey seed file
	AuthJWT          AuthMethod = "jwt"           // operator mode: a creds file (user JWT + seed)
	AuthTLS          AuthMethod = "tls"           // TLS; the client must trust the server's CA
	AuthMutualTLS    AuthMethod = "mtls"          // TLS with a verified client certificate
)

// AuthMethods lists every method, for table tests.
var AuthMethods = []AuthMethod{AuthToken, AuthUserPassword, AuthNKey, AuthJWT, AuthTLS, AuthMutualTLS}

// Creds are one client's credentials for an AuthServer. Secrets are plain
// values (Token, Password) or files in the test's temp dir (NKeySeedFile,
// CredsFile, KeyFile); Secrets lists every secret value, so that tests can
// assert none of them leaks into logs.
type Creds struct {
	Method       AuthMethod
	Token        string
	User         string
	Password     string
	NKeySeedFile string
	CredsFile    string
	CAFile       string // the CA the client trusts (TLS methods)
	CertFile     string // the client certificate (mutual TLS)
	KeyFile      string // its key
	// Secrets are the secret values these credentials carry: the token,
	// the password, the nkey seed, the user JWT's seed, the client key.
	Secrets []string

	// What a server must have to accept these credentials.
	ca         *CA           // TLS: signs the server's certificate; mutual TLS: the client's
	account    nkeys.KeyPair // JWT: the user's account
	accountJWT string
}

// Options are the nats.go options that authenticate with c.
func (c Creds) Options() []nats.Option {
	var o []nats.Option
	switch {
	case c.Token != "":
		o = append(o, nats.Token(c.Token))
	case c.User != "":
		o = append(o, nats.UserInfo(c.User, c.Password))
	case c.NKeySeedFile != "":
		o = append(o, nkeyOption(c.NKeySeedFile))
	case c.CredsFile != "":
		o = append(o, nats.UserCredentials(c.CredsFile))
	}
	if c.CAFile != "" {
		o = append(o, nats.RootCAs(c.CAFile))
	}
	if c.CertFile != "" {
		o = append(o, nats.ClientCert(c.CertFile, c.KeyFile))
	}
	return o
}

// nkeyOption defers a seed file error to Connect, like UserCredentials.
func nkeyOption(path string) nats.Option {
	o, err := nats.NkeyOptionFromSeed(path)
	if err != nil {
		return func(*nats.Options) error { return fmt.Errorf("natstest: nkey seed %s: %w", path, err) }
	}
	return o
}

// YAML is the bridge configuration's nats keys for c (without url), each
// line indented by two spaces, e.g. "  token: ...\n".
func (c Creds) YAML() string {
	var b strings.Builder
	switch {
	case c.Token != "":
		fmt.Fprintf(&b, "  token: %q\n", c.Token)
	case c.User != "":
		fmt.Fprintf(&b, "  user: %q\n  password: %q\n", c.User, c.Password)
	case c.NKeySeedFile != "":
		fmt.Fprintf(&b, "  nkey_seed_file: %q\n", c.NKeySeedFile)
	case c.CredsFile != "":
		fmt.Fprintf(&b, "  creds_file: %q\n", c.CredsFile)
	}
	if c.CAFile != "" || c.CertFile != "" {
		fmt.Fprintf(&b, "  tls:\n    ca_file: %q\n", c.CAFile)
		if c.CertFile != "" {
			fmt.Fprintf(&b, "    cert_file: %q\n    key_file: %q\n", c.CertFile, c.KeyFile)
		}
	}
	return b.String()
}

// AuthServer is an in-process nats-server with JetStream that requires one
// authentication method. It can be restarted on the same store dir and
// port with other credentials (Restart), e.g. to rotate a password under a
// running client.
type AuthServer struct {
	method AuthMethod
	name   string // server name, unique: ConnectPinned tells it from others
	dir    string // credentials, certificates, keys
	store  string // JetStream store dir
	addr   string // 127.0.0.1:PORT, pinned at the first start
	seq    atomic.Int64

	// Key material of the server: its CA (TLS), the operator and the
	// system account (JWT).
	ca       *CA
	operator nkeys.KeyPair
	opJWT    *jwt.OperatorClaims
	sysAcc   nkeys.KeyPair
	sysJWT   string

	rejected atomic.Int64 // connections refused for bad credentials, all runs

	mu    sync.Mutex
	creds Creds
	ns    *server.Server // nil while shut down
}

// Rejections counts the client connections the server refused for bad
// credentials (authentication errors) since StartAuth, across restarts.
// Tests wait on it instead of sleeping through a credentials change.
func (s *AuthServer) Rejections() int { return int(s.rejected.Load()) }

// authLog counts the server's authentication errors and drops the rest.
type authLog struct{ rejected *atomic.Int64 }

func (l authLog) Errorf(format string, v ...any) {
	if strings.Contains(fmt.Sprintf(format, v...), "authentication error") {
		l.rejected.Add(1)
	}
}
func (authLog) Noticef(string, ...any) {}
func (authLog) Warnf(string, ...any)   {}
func (authLog) Fatalf(string, ...any)  {}
func (authLog) Debugf(string, ...any)  {}
func (authLog) Tracef(string, ...any)  {}

// StartAuth starts a server on 127.0.0.1 (random port, store dir
// t.TempDir()) that requires method, with freshly generated credentials
// (Creds), waits until JetStream answers, and shuts it down in t.Cleanup.
func StartAuth(t testing.TB, method AuthMethod) *AuthServer {
	t.Helper()
	s := &AuthServer{method: method, name: uniqueName("natstest-auth"), dir: t.TempDir(), store: t.TempDir(), addr: "127.0.0.1:0"}
	switch method {
	case AuthTLS, AuthMutualTLS:
		s.ca = NewCA(t, s.dir, "ca")
	case AuthJWT:
		s.initOperator(t)
	case AuthToken, AuthUserPassword, AuthNKey:
	default:
		t.Fatalf("natstest: unknown auth method %q", method)
	}
	s.creds = s.NewCreds(t)
	s.start(t)
	t.Cleanup(s.Shutdown)
	return s
}

// URL is "nats://127.0.0.1:PORT"; it stays the same across Restart.
func (s *AuthServer) URL() string { return "nats://" + s.addr }

// StoreDir is the JetStream store dir.
func (s *AuthServer) StoreDir() string { return s.store }

// Identity is the server's name, kept across Restart: what ConnectPinned
// accepts.
func (s *AuthServer) Identity() Identity { return Identity{Names: []string{s.name}} }

// Creds are the credentials the running server accepts.
func (s *AuthServer) Creds() Creds {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.creds
}

// NewCreds generates another, independent set of credentials of the
// server's method, which the server accepts only after Restart with them:
// a new token, user and password, nkey, or (JWT) a user of a new account.
// For TLS it is a client that trusts another CA (after Restart the server
// presents a certificate from that CA); for mutual TLS a client
// certificate issued by another CA (after Restart the server verifies
// clients with it).
//
// Note for JWT: every set has its own account, and JetStream state belongs
// to an account, so streams made with one set are not seen with another.
func (s *AuthServer) NewCreds(t testing.TB) Creds {
	t.Helper()
	n := s.seq.Add(1)
	c := Creds{Method: s.method}
	switch s.method {
	case AuthToken:
		c.Token = fmt.Sprintf("natstest-token-%d-%s", n, randomText(t))
		c.Secrets = []string{c.Token}
	case AuthUserPassword:
		c.User, c.Password = fmt.Sprintf("natstest-user-%d", n), fmt.Sprintf("natstest-password-%d-%s", n, randomText(t))
		c.Secrets = []string{c.Password}
	case AuthNKey:
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		seed, err := kp.Seed()
		if err != nil {
			t.Fatal(err)
		}
		c.NKeySeedFile = writeFile(t, s.dir, fmt.Sprintf("user-%d.nk", n), seed)
		c.Secrets = []string{string(seed)}
	case AuthJWT:
		// Each set has its own account, which the server knows only while
		// it runs with these credentials.
		c.account, c.accountJWT = s.newAccount(t, fmt.Sprintf("APP%d", n), true)
		c.CredsFile, c.Secrets = s.userCreds(t, c.account, fmt.Sprintf("user-%d.creds", n))
	case AuthTLS:
		c.ca = s.ca
		if n > 1 {
			c.ca = NewCA(t, s.dir, fmt.Sprintf("other-ca-%d", n))
		}
		c.CAFile = c.ca.file
	case AuthMutualTLS:
		c.CAFile = s.ca.file
		c.ca = s.ca
		if n > 1 {
			c.ca = NewCA(t, s.dir, fmt.Sprintf("other-ca-%d", n))
		}
		c.CertFile, c.KeyFile = c.ca.Issue(t, s.dir, fmt.Sprintf("client-%d", n), true)
		key, err := os.ReadFile(c.KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		c.Secrets = []string{string(key)}
	}
	return c
}

// Shutdown stops the server and waits for it; a no-op when it is down.
func (s *AuthServer) Shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ns != nil {
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
		s.ns = nil
	}
}

// Restart stops the server (if running) and starts it again on the same
// store dir and port, now accepting creds (from NewCreds, or Creds for the
// same ones) instead, and waits until JetStream answers with them.
// For TLS methods the server keeps its certificate. A port taken while
// the server was down fails the test at once, naming it.
func (s *AuthServer) Restart(t testing.TB, creds Creds) {
	t.Helper()
	s.Shutdown()
	s.mu.Lock()
	s.creds = creds
	s.mu.Unlock()
	s.start(t)
}

func (s *AuthServer) start(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	host, port, err := net.SplitHostPort(s.addr)
	if err != nil {
		t.Fatal(err)
	}
	portN := server.RANDOM_PORT
	if port != "0" {
		fmt.Sscan(port, &portN)
	}
	deadline := time.Now().Add(startTimeout)
	for {
		if portN != server.RANDOM_PORT {
			// A restart: the port is free since our shutdown, unless
			// someone else took it; then fail at once, naming it.
			probeFree(t, s.addr)
		}
		opts := s.serverOptions(t, host, portN)
		ns, err := server.NewServer(opts)
		if err != nil {
			t.Fatalf("natstest: auth server options: %v", err)
		}
		ns.SetLoggerV2(authLog{&s.rejected}, false, false, false)
		go ns.Start()
		if ns.ReadyForConnections(startTimeout) && ns.Addr() != nil {
			s.ns = ns
			s.addr = ns.Addr().String()
			break
		}
		ns.Shutdown() // the fixed port is still busy: a stopped instance
		ns.WaitForShutdown()
		if time.Now().After(deadline) {
			t.Fatalf("natstest: auth server on %s did not start within %s", s.addr, startTimeout)
		}
		<-time.After(20 * time.Millisecond)
	}
	waitJetStreamWith(t, s.URL(), s.creds.Options(), startTimeout)
}

func (s *AuthServer) serverOptions(t testing.TB, host string, port int) *server.Options {
	t.Helper()
	o := &server.Options{
		ServerName: s.name,
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   s.store,
		NoSigs:     true,
	}
	c := s.creds
	switch s.method {
	case AuthToken:
		o.Authorization = c.Token
	case AuthUserPassword:
		o.Username, o.Password = c.User, c.Password
	case AuthNKey:
		seed, err := os.ReadFile(c.NKeySeedFile)
		if err != nil {
			t.Fatal(err)
		}
		kp, err := nkeys.FromSeed(seed)
		if err != nil {
			t.Fatal(err)
		}
		pub, err := kp.PublicKey()
		if err != nil {
			t.Fatal(err)
		}
		o.Nkeys = []*server.NkeyUser{{Nkey: pub}}
	case AuthJWT:
		sysPub, _ := s.sysAcc.PublicKey()
		accPub, _ := c.account.PublicKey()
		r := &server.MemAccResolver{}
		if err := r.Store(sysPub, s.sysJWT); err != nil {
			t.Fatal(err)
		}
		if err := r.Store(accPub, c.accountJWT); err != nil {
			t.Fatal(err)
		}
		o.TrustedOperators = []*jwt.OperatorClaims{s.opJWT}
		o.AccountResolver = r
		o.SystemAccount = sysPub
	case AuthTLS, AuthMutualTLS:
		// TLS: the server's certificate comes from the CA the client
		// trusts. Mutual TLS: the server verifies clients with the CA of
		// the client certificate.
		serverCA, clientCA := c.ca, s.ca
		if s.method == AuthMutualTLS {
			serverCA, clientCA = s.ca, c.ca
		}
		certFile, keyFile := serverCA.Issue(t, s.dir, fmt.Sprintf("server-%d", s.seq.Add(1)), false)
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{
			CertFile: certFile,
			KeyFile:  keyFile,
			CaFile:   clientCA.file,
			Verify:   s.method == AuthMutualTLS,
		})
		if err != nil {
			t.Fatalf("natstest: server TLS: %v", err)
		}
		o.TLS, o.TLSConfig, o.TLSVerify, o.TLSTimeout = true, tc, s.method == AuthMutualTLS, 2
	}
	return o
}

// initOperator creates the operator, the system account and one account
// with JetStream enabled.
func (s *AuthServer) initOperator(t testing.TB) {
	t.Helper()
	var err error
	if s.operator, err = nkeys.CreateOperator(); err != nil {
		t.Fatal(err)
	}
	opPub, _ := s.operator.PublicKey()
	s.opJWT = jwt.NewOperatorClaims(opPub)
	s.opJWT.Name = "natstest"
	opToken, err := s.opJWT.Encode(s.operator)
	if err != nil {
		t.Fatal(err)
	}
	// The server wants the decoded claims of a signed JWT.
	if s.opJWT, err = jwt.DecodeOperatorClaims(opToken); err != nil {
		t.Fatal(err)
	}
	s.sysAcc, s.sysJWT = s.newAccount(t, "SYS", false)
	sysPub, _ := s.sysAcc.PublicKey()
	s.opJWT.SystemAccount = sysPub
}

// newAccount creates an account signed by the operator.
func (s *AuthServer) newAccount(t testing.TB, name string, jetStream bool) (nkeys.KeyPair, string) {
	t.Helper()
	kp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	ac := jwt.NewAccountClaims(pub)
	ac.Name = name
	if jetStream {
		ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	}
	token, err := ac.Encode(s.operator)
	if err != nil {
		t.Fatal(err)
	}
	return kp, token
}

// userCreds writes a creds file for a new user of account.
func (s *AuthServer) userCreds(t testing.TB, account nkeys.KeyPair, name string) (path string, secrets []string) {
	t.Helper()
	ukp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	upub, _ := ukp.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.Name = name
	token, err := uc.Encode(account)
	if err != nil {
		t.Fatal(err)
	}
	seed, err := ukp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	data, err := jwt.FormatUserConfig(token, seed)
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, s.dir, name, data), []string{string(seed)}
}

// waitJetStreamWith waits until the JetStream API at url answers a client
// connected with opts.
func waitJetStreamWith(t testing.TB, url string, opts []nats.Option, timeout time.Duration) {
	t.Helper()
	Eventually(t, timeout, func() error {
		nc, err := nats.Connect(url, append([]nats.Option{nats.Name("natstest-probe"), nats.Timeout(time.Second)}, opts...)...)
		if err != nil {
			return fmt.Errorf("connect %s: %w", url, err)
		}
		defer nc.Close()
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

// CA is a certificate authority made at test time: it signs server and
// client certificates, written as PEM files. Tests of TLS destinations use
// it as well as the TLS servers of StartAuth.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string // PEM
}

// NewCA makes a CA and writes its certificate to dir/name.pem.
func NewCA(t testing.TB, dir, name string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: "natstest " + name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	file := writeFile(t, dir, name+".pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	return &CA{cert: cert, key: key, file: file}
}

// File is the path of the CA's PEM certificate.
func (ca *CA) File() string { return ca.file }

// Pool is a certificate pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Issue writes a certificate (for 127.0.0.1 and localhost, or a client
// certificate) and its key, and returns their paths.
func (ca *CA) Issue(t testing.TB, dir, name string, client bool) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: "natstest " + name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	if client {
		tmpl.ExtKeyUsage, tmpl.IPAddresses, tmpl.DNSNames = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil, nil
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile = writeFile(t, dir, name+"-cert.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	keyFile = writeFile(t, dir, name+"-key.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	return certFile, keyFile
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func randomText(t testing.TB) string {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 40))
	if err != nil {
		t.Fatal(err)
	}
	return n.Text(36)
}

func writeFile(t testing.TB, dir, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

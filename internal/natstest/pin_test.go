package natstest_test

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/sotercare/jetbridge/internal/natstest"
)

// fails runs fn with a fatalTB on its own goroutine and returns the
// message it failed with ("" if it did not fail) and how long it took.
func fails(t *testing.T, fn func(tb testing.TB)) (string, time.Duration) {
	t.Helper()
	f := &fatalTB{TB: t}
	begin := time.Now()
	done := make(chan struct{})
	go func() { defer close(done); fn(f) }()
	<-done
	return f.msg, time.Since(begin)
}

func restartTakenMsg(addr string) string {
	return "natstest: restart: " + addr + " was taken while the server was down (by another listener, or another test's server); refusing to come back on it"
}

// takePort listens on the address a stopped server held.
func takePort(t *testing.T, url string) string {
	t.Helper()
	addr := strings.TrimPrefix(url, "nats://")
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("take %s: %v", addr, err)
	}
	t.Cleanup(func() { l.Close() })
	return addr
}

// Every kind of restart fails at once, naming the port, when someone else
// took the port while the server was down; none waits out the start
// timeout. (The control, a restart on a free port, is every other restart
// test of the package.)
func TestRestartsRefuseATakenPort(t *testing.T) {
	check := func(t *testing.T, addr string, restart func(tb testing.TB)) {
		t.Helper()
		msg, took := fails(t, restart)
		if want := restartTakenMsg(addr); msg != want {
			t.Fatalf("restart failed with %q\nwant %q", msg, want)
		}
		if took > time.Second {
			t.Fatalf("restart took %s to fail; want at once", took)
		}
	}
	t.Run("server", func(t *testing.T) {
		s := natstest.Start(t)
		s.Shutdown()
		check(t, takePort(t, s.URL()), s.Restart)
	})
	t.Run("auth server", func(t *testing.T) {
		s := natstest.StartAuth(t, natstest.AuthToken)
		s.Shutdown()
		check(t, takePort(t, s.URL()), func(tb testing.TB) { s.Restart(tb, s.Creds()) })
	})
	t.Run("cluster node", func(t *testing.T) {
		c := natstest.StartCluster(t, 3)
		c.Shutdown(0)
		check(t, takePort(t, c.Node(0).URL()), func(tb testing.TB) { c.Restart(tb, 0) })
	})
}

// errorsTB records the messages of Errorf instead of failing the test.
type errorsTB struct {
	testing.TB
	mu   sync.Mutex
	msgs []string
}

func (e *errorsTB) Errorf(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.msgs = append(e.msgs, fmt.Sprintf(format, args...))
}

func (e *errorsTB) errors() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.msgs)
}

// connectRecorder is a real server's authenticator that accepts every
// client and records who connected and whether they presented password.
type connectRecorder struct {
	password string
	mu       sync.Mutex
	seen     []string // client name and whether the password was presented
}

func (r *connectRecorder) Check(c server.ClientAuthentication) bool {
	o := c.GetOpts()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, fmt.Sprintf("%s password=%t", o.Name, o.Password == r.password))
	return true
}

func (r *connectRecorder) connects() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seen)
}

// Another server takes the port of a server with a password while it is
// down. A pinned connection never sends it anything, so not its
// credentials either: it is closed and the test fails, naming both
// servers. Control: an unpinned connection with the same credentials
// reconnects to the foreign server and hands it the password.
func TestPinnedConnectionSendsNothingToAForeignServer(t *testing.T) {
	s := natstest.StartAuth(t, natstest.AuthUserPassword)
	creds := s.Creds()
	rec := &errorsTB{TB: t}
	pinned, _ := natstest.ConnectPinned(rec, s.URL(), s.Identity(), append(creds.Options(), nats.Name("pinned"))...)
	control, _ := natstest.Connect(t, s.URL(), append(creds.Options(), nats.Name("control"))...)

	addr := strings.TrimPrefix(s.URL(), "nats://")
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	portN, _ := strconv.Atoi(port)
	s.Shutdown()
	auth := &connectRecorder{password: creds.Password}
	foreign, err := server.NewServer(&server.Options{ServerName: "foreign", Host: host, Port: portN, NoSigs: true, NoLog: true,
		CustomClientAuthentication: auth})
	if err != nil {
		t.Fatal(err)
	}
	go foreign.Start()
	t.Cleanup(foreign.Shutdown)
	if !foreign.ReadyForConnections(10 * time.Second) {
		t.Fatalf("foreign server on %s not ready", addr)
	}

	natstest.Eventually(t, 20*time.Second, func() error {
		if !pinned.IsClosed() {
			return fmt.Errorf("pinned connection %v, want closed", pinned.Status())
		}
		if !control.IsConnected() || control.ConnectedServerName() != "foreign" {
			return fmt.Errorf("control connection %v on %q, want on the foreign server", control.Status(), control.ConnectedServerName())
		}
		return nil
	})
	want := fmt.Sprintf(`natstest: the server at %s is "foreign" (id %s), not this test's server %q; `+
		`closed the connection rather than use it (did another test's server take the port?)`, addr, foreign.ID(), s.Identity().Names[0])
	if got := rec.errors(); !slices.Equal(got, []string{want}) {
		t.Fatalf("test failures %q\nwant %q", got, want)
	}
	if got := auth.connects(); !slices.Equal(got, []string{"control password=true"}) {
		t.Fatalf("the foreign server saw CONNECTs %q, want only the control's (with the password)", got)
	}
}

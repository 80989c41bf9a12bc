package jetbridgetest

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/sotercare/jetbridge/internal/embedded"
	"github.com/sotercare/jetbridge/internal/natstest"
)

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

func restartTakenMsg(addr string) string {
	return "natstest: restart: " + addr + " was taken while the server was down (by another listener, or another test's server); refusing to come back on it"
}

// A plain listener took the port while the server was down: Restart fails
// the test at once (not after the 10 s start timeout), naming the port.
// Control: once the listener is gone, Restart comes back on the port and
// the kit's connection follows it.
func TestRestartRefusesAPortTakenByAListener(t *testing.T) {
	t.Parallel()
	srv := NewServer(t)
	name := srv.Conn().ConnectedServerName()
	addr := strings.TrimPrefix(srv.URL(), "nats://")
	srv.Shutdown()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("take the port: %v", err)
	}
	defer l.Close()

	begin := time.Now()
	msg := failure(t, func(tb testing.TB) { srv.Restart(tb) })
	took := time.Since(begin)
	if want := restartTakenMsg(addr); msg != want {
		t.Fatalf("Restart failed with %q\nwant %q", msg, want)
	}
	if took > time.Second {
		t.Fatalf("Restart took %s to fail; want at once", took)
	}

	l.Close()
	srv.Restart(t)
	natstest.Eventually(t, Timeout, func() error {
		if nc := srv.Conn(); !nc.IsConnected() || nc.ConnectedServerName() != name {
			return fmt.Errorf("kit connection %v on %q, want connected to %q", nc.Status(), nc.ConnectedServerName(), name)
		}
		return nil
	})
}

// Another NATS server took the port while the kit's server was down. The
// kit's own connection never uses it: it is closed, the test fails naming
// both servers, a publish on it fails, and the foreign server never saw
// it (no connection named "jetbridgetest", open or closed). Restart then
// refuses the port at once. Control: a kit connection whose check is
// replaced through Connect's options (another dialer) silently moves to
// the foreign server and exchanges messages with it both ways.
func TestKitConnectionsNeverUseAForeignServer(t *testing.T) {
	t.Parallel()
	rec := &errorsTB{TB: t}
	srv := NewServer(rec)
	own := srv.Conn()
	name := own.ConnectedServerName()
	ownSub, err := own.SubscribeSync("probe.from-foreign")
	if err != nil {
		t.Fatal(err)
	}
	ctl, _ := srv.Connect(t, nats.Name("control"), nats.SetCustomDialer(&net.Dialer{Timeout: 2 * time.Second}))
	ctlSub, err := ctl.SubscribeSync("probe.from-foreign")
	if err != nil {
		t.Fatal(err)
	}
	for _, nc := range []*nats.Conn{own, ctl} {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	addr := strings.TrimPrefix(srv.URL(), "nats://")

	srv.Shutdown()
	foreign, err := embedded.Start(t.Context(), embedded.Options{Listen: addr, StoreDir: t.TempDir(), ServerName: "foreign"})
	if err != nil {
		t.Fatalf("foreign server on %s: %v", addr, err)
	}
	t.Cleanup(foreign.Shutdown)

	natstest.Eventually(t, Timeout, func() error {
		if !own.IsClosed() {
			return fmt.Errorf("the kit's connection is %v, want closed", own.Status())
		}
		return nil
	})
	want := fmt.Sprintf(`natstest: the server at %s is "foreign" (id %s), not this test's server %q; `+
		`closed the connection rather than use it (did another test's server take the port?)`, addr, foreign.NATS().ID(), name)
	if got := rec.errors(); !slices.Equal(got, []string{want}) {
		t.Fatalf("test failures %q\nwant %q", got, want)
	}
	if err := own.Publish("probe.to-foreign", []byte("own")); !errors.Is(err, nats.ErrConnectionClosed) {
		t.Fatalf("publish on the kit's connection: %v, want %v", err, nats.ErrConnectionClosed)
	}

	// Control: without the check the connection is on the foreign server.
	natstest.Eventually(t, Timeout, func() error {
		if !ctl.IsConnected() || ctl.ConnectedServerName() != "foreign" {
			return fmt.Errorf("control connection %v on %q", ctl.Status(), ctl.ConnectedServerName())
		}
		return nil
	})
	fnc, err := nats.Connect(foreign.ClientURL(), nats.Name("foreign-client"))
	if err != nil {
		t.Fatal(err)
	}
	defer fnc.Close()
	fsub, err := fnc.SubscribeSync("probe.to-foreign")
	if err != nil {
		t.Fatal(err)
	}
	if err := fnc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := ctl.Publish("probe.to-foreign", []byte("control")); err != nil {
		t.Fatal(err)
	}
	if m, err := fsub.NextMsg(Timeout); err != nil || string(m.Data) != "control" {
		t.Fatalf("the foreign server got %v, %v; want the control connection's message", m, err)
	}
	if err := fnc.Publish("probe.from-foreign", []byte("foreign")); err != nil {
		t.Fatal(err)
	}
	if m, err := ctlSub.NextMsg(Timeout); err != nil || string(m.Data) != "foreign" {
		t.Fatalf("the control connection got %v, %v; want the foreign server's message", m, err)
	}
	if _, err := ownSub.NextMsg(time.Millisecond); !errors.Is(err, nats.ErrConnectionClosed) {
		t.Fatalf("the kit's subscription: %v, want %v", err, nats.ErrConnectionClosed)
	}

	connz, err := foreign.NATS().Connz(&server.ConnzOptions{State: server.ConnAll})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range connz.Conns {
		if c.Name != "" {
			names = append(names, c.Name)
		}
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"control", "foreign-client"}) {
		t.Fatalf("the foreign server's named connections %q, want only the control's and its own client's", names)
	}

	// Restart does not come back on the foreign server's port.
	begin := time.Now()
	if msg := failure(t, func(tb testing.TB) { srv.Restart(tb) }); msg != restartTakenMsg(addr) {
		t.Fatalf("Restart failed with %q\nwant %q", msg, restartTakenMsg(addr))
	}
	if took := time.Since(begin); took > time.Second {
		t.Fatalf("Restart took %s to fail; want at once", took)
	}
}

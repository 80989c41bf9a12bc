package embedded_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/embedded"
)

// connectInProcess connects to s over an in-process pipe.
func connectInProcess(t *testing.T, s *embedded.Server) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect("", nats.InProcessServer(s), nats.NoReconnect())
	if err != nil {
		t.Fatalf("in-process connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// A NoListen server binds no client port, yet serves JetStream to
// in-process clients on the store a listening server wrote, and holds the
// store lock like any other. Control: the listening server before it had
// an address.
func TestNoListenServesTheStoreInProcessOnly(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	dir := t.TempDir()

	// Given a store written by a listening server
	s := start(t, embedded.Options{StoreDir: dir})
	if s.NATS().Addr() == nil || s.ClientURL() == "" {
		t.Fatalf("control: the listening server has no address (%q)", s.ClientURL())
	}
	js := connect(t, s.ClientURL())
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "s.one", []byte("1")); err != nil {
		t.Fatal(err)
	}
	s.Shutdown()

	// When it is served with NoListen (the listen address is ignored)
	p := start(t, embedded.Options{StoreDir: dir, NoListen: true, ExistingStore: true, Listen: "not an address"})

	// Then no listener exists and the message is there, in process
	if p.NATS().Addr() != nil || p.ClientURL() != "" || p.Addr() != "" {
		t.Fatalf("NoListen server: listener %v, ClientURL %q, Addr %q; want none", p.NATS().Addr(), p.ClientURL(), p.Addr())
	}
	pjs := connectInProcess(t, p)
	st, err := pjs.Stream(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n != 1 {
		t.Fatalf("stream S holds %d messages, want 1", n)
	}
	// and the store is locked
	_, err = embedded.Start(ctx, embedded.Options{StoreDir: dir, NoListen: true})
	if !errors.Is(err, embedded.ErrStoreDirLocked) {
		t.Fatalf("second Start on the NoListen server's store: %v, want ErrStoreDirLocked", err)
	}
}

// ExistingStore on a directory without a store refuses and creates
// nothing, not even the directory; on a store it starts (above).
func TestExistingStoreCreatesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name  string
		mkdir bool
	}{{"missing dir", false}, {"empty dir", true}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "store")
			if tc.mkdir {
				if err := os.Mkdir(dir, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			_, err := embedded.Start(ctx, embedded.Options{StoreDir: dir, NoListen: true, ExistingStore: true})
			if !errors.Is(err, embedded.ErrNoStore) {
				t.Fatalf("Start: %v, want ErrNoStore", err)
			}
			entries, err := os.ReadDir(dir)
			switch {
			case !tc.mkdir && !errors.Is(err, os.ErrNotExist):
				t.Fatalf("the store dir was created (%v)", err)
			case tc.mkdir && (err != nil || len(entries) != 0):
				t.Fatalf("the store dir holds %d entries (%v), want none", len(entries), err)
			}
		})
	}
	if _, err := embedded.Start(ctx, embedded.Options{StoreDir: t.TempDir(), NoListen: true, Cluster: &embedded.Cluster{Name: "c"}}); !errors.Is(err, embedded.ErrNoListenCluster) {
		t.Fatalf("NoListen with Cluster: %v, want ErrNoListenCluster", err)
	}
}

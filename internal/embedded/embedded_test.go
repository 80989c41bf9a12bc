package embedded_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/embedded"
)

func start(t *testing.T, opts embedded.Options) *embedded.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s, err := embedded.Start(ctx, opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

func connect(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream.New: %v", err)
	}
	return js
}

func TestStartPublishConsume(t *testing.T) {
	// Given an embedded server on a random loopback port
	s := start(t, embedded.Options{StoreDir: t.TempDir()})
	if !strings.HasPrefix(s.ClientURL(), "nats://127.0.0.1:") {
		t.Fatalf("ClientURL = %q, want nats://127.0.0.1:PORT", s.ClientURL())
	}
	if want := "nats://" + s.Addr(); s.ClientURL() != want {
		t.Fatalf("ClientURL = %q, want %q (from Addr)", s.ClientURL(), want)
	}
	if strings.HasSuffix(s.Addr(), ":0") || strings.HasSuffix(s.Addr(), ":4222") {
		t.Fatalf("Addr = %q, want a random port", s.Addr())
	}
	if s.Version() == "" || s.Version() != embedded.ServerVersion() || s.NATS() == nil {
		t.Fatalf("Version %q, NATS() %v", s.Version(), s.NATS())
	}
	if !s.NATS().JetStreamEnabled() {
		t.Fatal("JetStream not enabled")
	}

	// When a message is published to a stream and pulled by a consumer
	ctx := t.Context()
	js := connect(t, s.ClientURL())
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}}); err != nil {
		t.Fatalf("CreateStream: %v", err)
	}
	ack, err := js.Publish(ctx, "events.a", []byte("hello"), jetstream.WithMsgID("evt-1"))
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	c, err := js.CreateOrUpdateConsumer(ctx, "EVENTS", jetstream.ConsumerConfig{Durable: "d1"})
	if err != nil {
		t.Fatalf("CreateOrUpdateConsumer: %v", err)
	}
	m, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatalf("Next: %v", err)
	}

	// Then it arrives intact
	if got := string(m.Data()); got != "hello" {
		t.Fatalf("data = %q, want hello", got)
	}
	if got := m.Headers().Get(jetstream.MsgIDHeader); got != "evt-1" {
		t.Fatalf("msg id = %q, want evt-1", got)
	}
	md, err := m.Metadata()
	if err != nil {
		t.Fatalf("Metadata: %v", err)
	}
	if md.Sequence.Stream != ack.Sequence {
		t.Fatalf("stream seq = %d, want %d", md.Sequence.Stream, ack.Sequence)
	}
	if err := m.DoubleAck(ctx); err != nil {
		t.Fatalf("DoubleAck: %v", err)
	}
}

func TestRestartSameStoreDirKeepsMessages(t *testing.T) {
	// Given a server that stored a message and was shut down gracefully
	dir := t.TempDir()
	ctx := t.Context()
	s1, err := embedded.Start(ctx, embedded.Options{StoreDir: dir})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(s1.Shutdown)
	js := connect(t, s1.ClientURL())
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}}); err != nil {
		t.Fatalf("CreateStream: %v", err)
	}
	if _, err := js.Publish(ctx, "events.a", []byte("kept"), jetstream.WithMsgID("evt-1")); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	addr := s1.Addr()
	s1.Shutdown()
	s1.Shutdown() // idempotent

	// When a new server starts on the same store dir and the same port
	s2 := start(t, embedded.Options{StoreDir: dir, Listen: addr, ServerName: "other-name"})
	if s2.Addr() != addr {
		t.Fatalf("Addr = %q, want %q", s2.Addr(), addr)
	}

	// Then the stream, the message and the dedup state are still there
	js2 := connect(t, s2.ClientURL())
	st, err := js2.Stream(ctx, "EVENTS")
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	raw, err := st.GetMsg(ctx, 1)
	if err != nil {
		t.Fatalf("GetMsg(1): %v", err)
	}
	if string(raw.Data) != "kept" {
		t.Fatalf("data = %q, want kept", raw.Data)
	}
	ack, err := js2.Publish(ctx, "events.a", []byte("again"), jetstream.WithMsgID("evt-1"))
	if err != nil {
		t.Fatalf("Publish dup: %v", err)
	}
	if !ack.Duplicate || ack.Sequence != 1 {
		t.Fatalf("dup ack = %+v, want Duplicate seq 1", ack)
	}
}

func TestStartRequiresStoreDir(t *testing.T) {
	_, err := embedded.Start(t.Context(), embedded.Options{})
	if !errors.Is(err, embedded.ErrStoreDirRequired) {
		t.Fatalf("err = %v, want ErrStoreDirRequired", err)
	}
}

func TestStartRejectsNonLoopback(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:0", "10.1.2.3:4222", "[::]:0", "example.com:0"} {
		t.Run(listen, func(t *testing.T) {
			_, err := embedded.Start(t.Context(), embedded.Options{Listen: listen, StoreDir: t.TempDir()})
			if !errors.Is(err, embedded.ErrNotLoopback) {
				t.Fatalf("err = %v, want ErrNotLoopback", err)
			}
		})
	}
}

func TestStartBusyPort(t *testing.T) {
	// Given a port somebody else is listening on
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	t.Cleanup(func() { l.Close() })

	// When the embedded server is asked to use it
	_, err = embedded.Start(t.Context(), embedded.Options{Listen: l.Addr().String(), StoreDir: t.TempDir()})

	// Then the error says the port is in use
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("err = %v, want EADDRINUSE", err)
	}
	if !strings.Contains(err.Error(), "already in use") || !strings.Contains(err.Error(), l.Addr().String()) ||
		strings.Count(err.Error(), "in use") != 1 {
		t.Fatalf("err = %q, want it to name the address and say once that it is in use", err)
	}
}

func TestStartCanceledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := embedded.Start(ctx, embedded.Options{StoreDir: t.TempDir()})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestLogf(t *testing.T) {
	var (
		mu    sync.Mutex
		lines []string
	)
	logf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, format)
	}
	start(t, embedded.Options{StoreDir: t.TempDir(), Logf: logf})
	mu.Lock()
	defer mu.Unlock()
	for _, l := range lines {
		if strings.HasPrefix(l, "[INF] ") && strings.Contains(l, "Server is ready") {
			return
		}
	}
	t.Fatalf("no \"[INF] Server is ready\" line in %d lines", len(lines))
}

// Two servers on one store directory would share and corrupt its files:
// the second is refused with an error naming the directory and the
// holder; another directory, or the same one after the first stopped,
// starts.
func TestStartRefusesALockedStoreDir(t *testing.T) {
	dir := t.TempDir()
	s1, err := embedded.Start(t.Context(), embedded.Options{StoreDir: dir})
	if err != nil {
		t.Fatalf("first Start: %v", err)
	}
	t.Cleanup(s1.Shutdown)

	_, err = embedded.Start(t.Context(), embedded.Options{StoreDir: dir})
	var locked *embedded.StoreDirLockedError
	if !errors.Is(err, embedded.ErrStoreDirLocked) || !errors.As(err, &locked) {
		t.Fatalf("second Start on the same dir: err = %v, want ErrStoreDirLocked", err)
	}
	if locked.PID != os.Getpid() || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), fmt.Sprintf("process %d", os.Getpid())) {
		t.Errorf("err = %q (pid %d), want it to name %s and this process", err, locked.PID, dir)
	}

	// Control: the refusal is about the directory, not a second server.
	s2, err := embedded.Start(t.Context(), embedded.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatalf("Start on another dir: %v", err)
	}
	s2.Shutdown()

	// The lock goes with the server.
	s1.Shutdown()
	s3, err := embedded.Start(t.Context(), embedded.Options{StoreDir: dir})
	if err != nil {
		t.Fatalf("Start after the first stopped: %v", err)
	}
	s3.Shutdown()
}

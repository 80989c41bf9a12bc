package natstest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/natstest"
)

const wait = 10 * time.Second

func createStream(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	_, err := js.CreateOrUpdateStream(t.Context(), jetstream.StreamConfig{
		Name: "EVENTS", Subjects: []string{"events.>"}, Storage: jetstream.FileStorage,
	})
	if err != nil {
		t.Fatalf("CreateOrUpdateStream: %v", err)
	}
}

func publish(t *testing.T, js jetstream.JetStream, n int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		if _, err := js.Publish(t.Context(), "events.a", fmt.Appendf(nil, "m%d", i), jetstream.WithMsgID(fmt.Sprintf("evt-%d", i))); err != nil {
			t.Fatalf("Publish %d: %v", i, err)
		}
	}
}

func streamMsgs(js jetstream.JetStream) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := js.Stream(ctx, "EVENTS")
	if err != nil {
		return 0, err
	}
	return st.CachedInfo().State.Msgs, nil
}

func TestStartAndRestart(t *testing.T) {
	// Given a server with 3 stored messages and a connected client
	s := natstest.Start(t)
	if !strings.HasPrefix(s.URL(), "nats://127.0.0.1:") {
		t.Fatalf("URL = %q, want nats://127.0.0.1:PORT", s.URL())
	}
	if s.StoreDir() == "" {
		t.Fatal("StoreDir is empty")
	}
	nc, js := natstest.Connect(t, s.URL())
	createStream(t, js)
	publish(t, js, 3)
	url := s.URL()

	// When it restarts
	s.Restart(t)

	// Then it is on the same URL, the old connection reconnects and the
	// messages are still there
	if s.URL() != url {
		t.Fatalf("URL after restart = %q, want %q", s.URL(), url)
	}
	natstest.Eventually(t, wait, func() error {
		n, err := streamMsgs(js)
		if err != nil {
			return err
		}
		if n != 3 {
			return fmt.Errorf("stream has %d msgs, want 3", n)
		}
		return nil
	})
	if !nc.IsConnected() {
		t.Fatalf("connection status %v, want connected", nc.Status())
	}

	// And a shut-down server can be restarted too
	s.Shutdown()
	s.Shutdown() // idempotent
	natstest.Eventually(t, wait, func() error {
		if st := nc.Status(); st == nats.CONNECTED {
			return fmt.Errorf("client still %v after Shutdown", st)
		}
		return nil
	})
	s.Restart(t)
	_, js2 := natstest.Connect(t, s.URL())
	if n, err := streamMsgs(js2); err != nil || n != 3 {
		t.Fatalf("after second restart: %d msgs, err %v; want 3", n, err)
	}
}

func TestWaitQuiet(t *testing.T) {
	// Given 20 messages and a durable consumer that acks each one
	s := natstest.Start(t)
	_, js := natstest.Connect(t, s.URL())
	createStream(t, js)
	publish(t, js, 20)
	c, err := js.CreateOrUpdateConsumer(t.Context(), "EVENTS", jetstream.ConsumerConfig{Durable: "d1"})
	if err != nil {
		t.Fatalf("CreateOrUpdateConsumer: %v", err)
	}
	cc, err := c.Consume(func(m jetstream.Msg) { _ = m.Ack() })
	if err != nil {
		t.Fatalf("Consume: %v", err)
	}
	t.Cleanup(cc.Stop)

	// Then the consumer becomes quiet
	natstest.WaitQuiet(t, js, "EVENTS", "d1", wait)
	info, err := c.Info(t.Context())
	if err != nil {
		t.Fatalf("Info: %v", err)
	}
	if info.AckFloor.Stream != 20 {
		t.Fatalf("ack floor = %d, want 20", info.AckFloor.Stream)
	}
}

// fatalTB records Fatalf and ends the calling goroutine like testing does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestEventuallyReportsLastError(t *testing.T) {
	ftb := &fatalTB{TB: t}
	calls := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		natstest.Eventually(ftb, 50*time.Millisecond, func() error {
			calls++
			return fmt.Errorf("attempt %d failed", calls)
		})
	}()
	<-done
	if calls < 2 {
		t.Fatalf("cond called %d times, want it polled", calls)
	}
	if want := fmt.Sprintf("attempt %d failed", calls); !strings.Contains(ftb.msg, want) {
		t.Fatalf("Fatalf message %q does not contain the last error %q", ftb.msg, want)
	}

	// And a condition that holds returns at once.
	natstest.Eventually(t, wait, func() error { return nil })
}

// TestChildCrash shows the crash-test pattern: the test binary re-executes
// itself as a child that runs an embedded server and publishes; the parent
// SIGKILLs it and restarts a server on the same store dir and port.
func TestChildCrash(t *testing.T) {
	const n = 50
	if natstest.ChildRole() == "natsd" {
		runNatsdChild(t, n)
		return
	}

	// Given a child process that stored n acknowledged messages
	dir := t.TempDir()
	child := natstest.StartChild(t, "TestChildCrash", "natsd", "NATSTEST_STORE_DIR="+dir)
	var url string
	natstest.Eventually(t, wait, func() error {
		for line := range strings.Lines(child.Output()) {
			if u, ok := strings.CutPrefix(strings.TrimSpace(line), "ready "); ok {
				url = u
				return nil
			}
		}
		return errors.New("child has not printed ready yet")
	})

	// When it is killed with SIGKILL
	pid := child.PID()
	child.Kill()
	code, err := child.Wait(wait)
	if err != nil || code != -1 {
		t.Fatalf("child pid %d: exit code %d, err %v; want killed by signal (-1)", pid, code, err)
	}

	// Then a server restarted on its store dir and port has every message
	// and the dedup state
	s := natstest.Start(t, natstest.WithStoreDir(dir), natstest.WithListen(strings.TrimPrefix(url, "nats://")))
	if s.URL() != url {
		t.Fatalf("URL = %q, want the child's %q", s.URL(), url)
	}
	_, js := natstest.Connect(t, s.URL())
	if got, err := streamMsgs(js); err != nil || got != n {
		t.Fatalf("stream has %d msgs (err %v), want %d", got, err, n)
	}
	ack, err := js.Publish(t.Context(), "events.a", []byte("again"), jetstream.WithMsgID("evt-1"))
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if !ack.Duplicate {
		t.Fatalf("re-publish of evt-1: %+v, want Duplicate", ack)
	}
}

func runNatsdChild(t *testing.T, n int) {
	dir := os.Getenv("NATSTEST_STORE_DIR")
	if dir == "" {
		t.Fatal("NATSTEST_STORE_DIR not set")
	}
	s := natstest.Start(t, natstest.WithStoreDir(dir))
	_, js := natstest.Connect(t, s.URL())
	createStream(t, js)
	publish(t, js, n)
	fmt.Printf("ready %s\n", s.URL())
	// The parent kills us; this bound only keeps an orphan from lingering.
	<-time.After(time.Minute)
	t.Fatal("child was not killed within a minute")
}

package test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/jetbridgetest"
	"github.com/sotercare/jetbridge/producer"
)

const (
	readyTimeout    = 15 * time.Second // start the embedded server, provision the stream
	deliveryTimeout = 10 * time.Second
	shutdownSlack   = 5 * time.Second // beyond shutdown_timeout
)

// The quickstart as the README tells it, with the real binary: the bridge
// starts JetStream itself, delivers one event to the receiver, and stops
// cleanly on SIGTERM without logging the payload or the receiver's token.
func TestQuickstart(t *testing.T) {
	// Given the bridge binary run with config/quickstart.yaml, a free NATS
	// port, a fresh store and a receiver that answers 200.
	root := moduleRoot(t)
	bin := bridgeBinary(t)
	quickstart := filepath.Join(root, "config", "quickstart.yaml")
	cfg, err := config.LoadFile(quickstart)
	if err != nil {
		t.Fatalf("load %s: %v", quickstart, err)
	}
	sink := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(jetbridgetest.Always(http.StatusOK)))
	natsAddr := freeAddr(t)
	// The token is a URL query value: a secret that must never be logged.
	receiverToken := "token-" + rand.Text()
	b := startBridge(t, bin, []string{"run", "--config", quickstart},
		"JETBRIDGE_NATS_LISTEN="+natsAddr,
		"JETBRIDGE_STORE_DIR="+t.TempDir(),
		"JETBRIDGE_RECEIVER_URL="+sink.URL()+"/events?token="+receiverToken,
		"JETBRIDGE_LOG_FORMAT=json",
		"JETBRIDGE_ADMIN_LISTEN="+freeAddr(t),
	)
	nc, js := b.waitReady(t, "nats://"+natsAddr, cfg.Stream.Name)

	// When one event is published.
	id := "quickstart-" + rand.Text()
	canary := "canary-" + rand.Text()
	payload := fmt.Sprintf(`{"order":42,"note":%q}`, canary)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	res, err := producer.NewPublisher(js, "events").Publish(ctx, producer.Event{
		ID: id, Type: "order.created", Payload: []byte(payload),
	})
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	if res.Duplicate || res.Stream != cfg.Stream.Name {
		t.Fatalf("publish result %+v, want stored in %s", res, cfg.Stream.Name)
	}

	// Then the receiver gets exactly one POST on /events carrying it, and
	// the route's consumer settles it.
	waitCount(t, sink, 1, deliveryTimeout)
	route := cfg.Routes[0].Name
	natstest.WaitQuiet(t, js, cfg.Stream.Name, route, deliveryTimeout)
	reqs := sink.Requests()
	if len(reqs) != 1 {
		t.Fatalf("receiver got %d requests, want exactly 1", len(reqs))
	}
	assertDelivery(t, reqs[0], id, res.Subject, payload)

	// When the bridge gets SIGTERM.
	nc.Close()
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}

	// Then it exits 0 within shutdown_timeout, and its logs are JSON lines
	// free of the payload and of the receiver's token.
	code := b.wait(t, cfg.ShutdownTimeout.D()+shutdownSlack)
	if code != 0 {
		t.Fatalf("bridge exited %d after SIGTERM, want 0", code)
	}
	stdout, stderr := b.stdout.String(), b.stderr.String()
	for _, secret := range []string{canary, receiverToken} {
		if strings.Contains(stdout+stderr, secret) {
			t.Errorf("bridge output contains %q", secret)
		}
	}
	assertJSONLines(t, stdout)
}

// assertDelivery checks one request against the contract's envelope
// format (docs/delivery.md#the-request).
func assertDelivery(t *testing.T, r jetbridgetest.Request, id, subject, payload string) {
	t.Helper()
	if r.Method != http.MethodPost || r.Path != "/events" {
		t.Errorf("request %s %s, want POST /events", r.Method, r.Path)
	}
	if got := r.Header.Get(jetbridgetest.HeaderEventID); got != id {
		t.Errorf("%s = %q, want %q", jetbridgetest.HeaderEventID, got, id)
	}
	var env struct {
		ID        string          `json:"id"`
		EventType string          `json:"eventType"`
		Severity  string          `json:"severity"`
		Subject   string          `json:"subject"`
		Payload   json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal(r.Body, &env); err != nil {
		t.Fatalf("body is not a JSON envelope: %v\n%s", err, r.Body)
	}
	if env.ID != id || env.EventType != "order.created" || env.Severity != "INFO" || env.Subject != subject {
		t.Errorf("envelope id=%q eventType=%q severity=%q subject=%q, want %q, order.created, INFO, %q",
			env.ID, env.EventType, env.Severity, env.Subject, id, subject)
	}
	var got, want any
	if err := json.Unmarshal(env.Payload, &got); err != nil {
		t.Fatalf("envelope payload is not JSON: %v\n%s", err, r.Body)
	}
	if err := json.Unmarshal([]byte(payload), &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("envelope payload %s, want %s", env.Payload, payload)
	}
}

// assertJSONLines checks that every line of the log is a JSON object.
func assertJSONLines(t *testing.T, log string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(log), "\n")
	if len(lines) == 0 || lines[0] == "" {
		t.Fatal("the bridge logged nothing")
	}
	for _, l := range lines {
		var obj map[string]any
		if err := json.Unmarshal([]byte(l), &obj); err != nil {
			t.Errorf("log line is not a JSON object (%v): %s", err, l)
		}
	}
}

// moduleRoot is the directory holding go.mod, the parent of this package.
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !bytes.HasPrefix(data, []byte("module github.com/sotercare/jetbridge\n")) {
		t.Fatalf("%s is not the jetbridge module root (err %v)", root, err)
	}
	return root
}

// freeAddr returns a loopback address with a port that was free a moment
// ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// child is the bridge running as a child process.
type child struct {
	cmd            *exec.Cmd
	stdout, stderr natstest.Buffer
	done           chan struct{} // closed once the process has been reaped
}

// startBridge starts bin with args in a temporary working directory, with
// env added to the test's environment. The process is killed and reaped in
// t.Cleanup if still running, and its output logged if the test failed.
func startBridge(t *testing.T, bin string, args []string, env ...string) *child {
	t.Helper()
	c := &child{done: make(chan struct{})}
	c.cmd = exec.Command(bin, args...)
	c.cmd.Dir = t.TempDir()
	c.cmd.Env = append(os.Environ(), env...) // later entries win
	c.cmd.Stdout = &c.stdout
	c.cmd.Stderr = &c.stderr
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	go func() {
		_ = c.cmd.Wait() // the exit status is read from ProcessState
		close(c.done)
	}()
	t.Cleanup(func() {
		select {
		case <-c.done:
		default:
			_ = c.cmd.Process.Kill() // fails only if it has just exited
			<-c.done
		}
		if t.Failed() {
			t.Logf("bridge pid %d stdout:\n%s\nstderr:\n%s", c.cmd.Process.Pid, c.stdout.String(), c.stderr.String())
		}
	})
	return c
}

// failIfExited fails the test if the child is no longer running.
func (c *child) failIfExited(t *testing.T) {
	t.Helper()
	select {
	case <-c.done:
		t.Fatalf("bridge exited early with code %d", c.cmd.ProcessState.ExitCode())
	default:
	}
}

// waitReady waits until a client can connect to url and the stream
// exists, and returns that client's connection, closed in t.Cleanup.
func (c *child) waitReady(t *testing.T, url, stream string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	var (
		nc *nats.Conn
		js jetstream.JetStream
	)
	t.Cleanup(func() {
		if nc != nil {
			nc.Close()
		}
	})
	natstest.Eventually(t, readyTimeout, func() error {
		c.failIfExited(t)
		if nc == nil {
			conn, err := nats.Connect(url, nats.Name("quickstart-test"), nats.Timeout(time.Second), nats.NoReconnect())
			if err != nil {
				return fmt.Errorf("connect %s: %w", url, err)
			}
			if js, err = jetstream.New(conn); err != nil {
				conn.Close()
				return err
			}
			nc = conn
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if _, err := js.Stream(ctx, stream); err != nil {
			return fmt.Errorf("stream %s: %w", stream, err)
		}
		return nil
	})
	return nc, js
}

// wait waits up to timeout for the child to exit and returns its exit
// code.
func (c *child) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-c.done:
		return c.cmd.ProcessState.ExitCode()
	case <-timer.C:
		t.Fatalf("bridge still running %s after SIGTERM", timeout)
		return -1
	}
}

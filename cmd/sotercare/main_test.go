package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sotercare"
)

// service is one in-process run of the command.
type service struct {
	addr   string
	stdout *natstest.Buffer
	stop   func() int // cancels the run and returns its exit code
}

// start runs the command with args (plus --listen on a random port and JSON
// logs) until the test ends, and waits until it listens.
func start(t *testing.T, args ...string) *service {
	t.Helper()
	return startWith(t, sotercare.DefaultServerLimits, args...)
}

// startWith is start with the HTTP server limits given by limits.
func startWith(t *testing.T, limits func(time.Duration) sotercare.ServerLimits, args ...string) *service {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &natstest.Buffer{}
	var stderr natstest.Buffer
	done := make(chan int, 1)
	go func() {
		done <- runWith(ctx, append([]string{"--listen", "127.0.0.1:0", "--log-format", "json", "--publish-timeout", "1s"}, args...), out, &stderr, limits)
	}()
	s := &service{stdout: out}
	s.stop = sync.OnceValue(func() int {
		cancel()
		select {
		case code := <-done:
			return code
		case <-time.After(15 * time.Second):
			t.Errorf("sotercare did not stop within 15s")
			return -1
		}
	})
	t.Cleanup(func() {
		s.stop()
		if t.Failed() {
			t.Logf("stdout:\n%s\nstderr:\n%s", out.String(), stderr.String())
		}
	})
	natstest.Eventually(t, 10*time.Second, func() error {
		select {
		case code := <-done:
			t.Fatalf("sotercare exited with %d before listening; stderr: %s", code, stderr.String())
		default:
		}
		for line := range strings.Lines(out.String()) {
			var l struct {
				Message string `json:"message"`
				Addr    string `json:"addr"`
			}
			if json.Unmarshal([]byte(line), &l) == nil && strings.HasPrefix(l.Message, "SoterCare API listening") {
				s.addr = l.Addr
				return nil
			}
		}
		return fmt.Errorf("no listening line yet")
	})
	return s
}

func (s *service) post(t *testing.T, body string) (int, string) {
	t.Helper()
	resp, err := http.Post("http://"+s.addr+"/api/v1/events", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

const fall = `{"eventId":"fall-0001","deviceId":"bed-3","eventType":"fall","value":1,"unit":"boolean","timestamp":1735689600000}`

// The wiring: flags, the API on --listen publishing under --root to
// --nats-url, payload-free logs, and a clean stop with exit code 0.
func TestServe(t *testing.T) {
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL())
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "CARE", Subjects: []string{"care-events.>"}})
	if err != nil {
		t.Fatal(err)
	}
	s := start(t, "--nats-url", srv.URL(), "--root", "care-events")

	resp, err := http.Get("http://" + s.addr + "/api/v1/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("health: %d", resp.StatusCode)
	}
	code, body := s.post(t, fall)
	if code != http.StatusAccepted || !strings.Contains(body, `"stream":"CARE","seq":1`) {
		t.Fatalf("post: %d %s", code, body)
	}
	msg, err := stream.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Subject != "care-events.critical.care.caregiver.bed-3.fall" {
		t.Fatalf("stored on %s", msg.Subject)
	}

	if code := s.stop(); code != 0 {
		t.Fatalf("exit code %d after the stop, want 0", code)
	}
	logs := s.stdout.String()
	if !strings.Contains(logs, `"message":"stopped"`) {
		t.Errorf("no clean stop logged:\n%s", logs)
	}
	if strings.Contains(logs, "bed-3") || strings.Contains(logs, "1735689600000") {
		t.Errorf("the logs carry the payload:\n%s", logs)
	}
}

// Without NATS the service still starts, answers health, and refuses
// readings with 503.
func TestServeWithoutNATS(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nowhere := "nats://" + l.Addr().String()
	l.Close()
	s := start(t, "--server", "nats://sc-user:sc-Secret-pw@"+strings.TrimPrefix(nowhere, "nats://"))
	if code, body := s.post(t, fall); code != http.StatusServiceUnavailable || body != `{"code":"BROKER_UNAVAILABLE"}`+"\n" {
		t.Fatalf("post: %d %s, want 503", code, body)
	}
	// The log says so at once: the URL without its credentials, the cause
	// and how to point it elsewhere.
	natstest.Eventually(t, 5*time.Second, func() error {
		for line := range strings.Lines(s.stdout.String()) {
			if strings.Contains(line, "cannot reach NATS") && strings.Contains(line, strings.TrimPrefix(nowhere, "nats://")) &&
				strings.Contains(line, "connection refused") && strings.Contains(line, "--server") {
				return nil
			}
		}
		return fmt.Errorf("no \"cannot reach NATS\" line yet")
	})
	if logs := s.stdout.String(); strings.Contains(logs, "sc-Secret-pw") || strings.Contains(logs, "sc-user") {
		t.Errorf("the logs carry the URL's credentials:\n%s", logs)
	}
	if code := s.stop(); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
}

// The server is -s/--server (or its old spelling --nats-url), else
// $NATS_URL; the readings reach the one that was chosen.
func TestServerPrecedence(t *testing.T) {
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL())
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}}); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "nats://" + l.Addr().String()
	l.Close()
	n := 0
	reading := func() string {
		n++
		return strings.Replace(fall, "fall-0001", fmt.Sprintf("fall-p%d", n), 1)
	}

	t.Setenv("NATS_URL", dead)
	for _, flag := range []string{"--server", "-s", "--nats-url"} {
		s := start(t, flag, srv.URL())
		if code, body := s.post(t, reading()); code != http.StatusAccepted {
			t.Errorf("%s over $NATS_URL: %d %s", flag, code, body)
		}
		s.stop()
	}
	t.Setenv("NATS_URL", srv.URL())
	s := start(t)
	if code, body := s.post(t, reading()); code != http.StatusAccepted {
		t.Errorf("$NATS_URL without a flag: %d %s", code, body)
	}
	s.stop()
	s = start(t, "--server", dead)
	if code, _ := s.post(t, reading()); code != http.StatusServiceUnavailable {
		t.Errorf("--server must win over $NATS_URL: %d", code)
	}
}

// headersRefused checks that the service answers 431 to a request with
// 32 KiB of headers (over DefaultServerLimits' 16 KiB).
func headersRefused(s *service) error {
	req, err := http.NewRequest(http.MethodGet, "http://"+s.addr+"/api/v1/health", nil)
	if err != nil {
		return err
	}
	req.Header.Set("X-Big", strings.Repeat("h", 32<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		return fmt.Errorf("32 KiB of headers: %d, want 431", resp.StatusCode)
	}
	return nil
}

// The command serves with sotercare.DefaultServerLimits (each limit is
// triggered for real in internal/sotercare's TestServerLimits); here the
// header size bound shows they are applied. The negative control runs the
// command with no limits at all.
func TestServeAppliesServerLimits(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nowhere := "nats://" + l.Addr().String()
	l.Close()
	if err := headersRefused(start(t, "--nats-url", nowhere)); err != nil {
		t.Fatal(err)
	}
	t.Run("negative control: no limits", func(t *testing.T) {
		none := func(time.Duration) sotercare.ServerLimits { return sotercare.ServerLimits{} }
		if err := headersRefused(startWith(t, none, "--nats-url", nowhere)); err == nil {
			t.Fatal("the check passed against a server without limits")
		} else {
			t.Logf("caught, as it should: %v", err)
		}
	})
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--no-such-flag"},
		{"extra"},
		{"--log-format", "xml"},
		{"--root", "bad root"},
		{"--publish-timeout", "0s"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(t.Context(), args, &stdout, &stderr); code != 2 {
			t.Errorf("%q: exit %d, want 2 (stderr %s)", args, code, stderr.String())
		}
		if sc := bufio.NewScanner(&stderr); !sc.Scan() || sc.Text() == "" {
			t.Errorf("%q: nothing on stderr", args)
		}
	}
}

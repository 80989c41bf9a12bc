package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/natstest"
)

// post sends one delivery to url with the client timeout and returns the
// status (0 when the client gave up).
func post(t *testing.T, url, id string, timeout time.Duration) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/events", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Event-Id", id)
	resp, err := http.DefaultClient.Do(req)
	if errors.Is(err, context.DeadlineExceeded) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// The summary counts answered requests by status and abandoned ones (the
// client gave up before the answer) apart; on a terminal the status is
// coloured.
func TestReceiveSummaryAndColour(t *testing.T) {
	out := &natstest.Buffer{}
	rc := &receiver{status: 202, out: out, color: true, delay: 300 * time.Millisecond}
	srv := httptest.NewServer(rc)
	defer srv.Close()

	if code := post(t, srv.URL, "slow-1", 20*time.Millisecond); code != 0 {
		t.Fatalf("a client with a 20ms timeout got %d", code)
	}
	// The handler notices the abandon when the connection closes.
	if err := waitFor(5*time.Second, func() error {
		if rc.abandoned.Load() != 1 {
			return errors.New("not counted as abandoned yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if code := post(t, srv.URL, "ok-1", 5*time.Second); code != 202 {
		t.Fatalf("status %d, want 202", code)
	}
	if got, want := rc.summary(), "received 2 requests: 1 answered (1 202), 1 abandoned by the client before the answer"; got != want {
		t.Errorf("summary %q, want %q", got, want)
	}
	text := out.String()
	if !strings.Contains(text, ansiGreen+"202"+ansiReset) || !strings.Contains(text, "abandoned (client gave up before the answer)") {
		t.Errorf("output lacks the coloured status or the abandoned line:\n%q", text)
	}
	// Control: not a terminal, no colour.
	rc.color = false
	if got := rc.paint(503, "503"); got != "503" {
		t.Errorf("uncoloured paint %q", got)
	}
}

// receive --json prints one object per request.
func TestReceiveJSON(t *testing.T) {
	out := &natstest.Buffer{}
	rc := &receiver{status: 400, out: out, json: true}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	if code := post(t, srv.URL, "j-1", 5*time.Second); code != 400 {
		t.Fatalf("status %d", code)
	}
	var l receiveLine
	if err := json.Unmarshal([]byte(out.String()), &l); err != nil || l.Status != 400 || l.EventID != "j-1" || l.Abandoned || l.Path != "/events" {
		t.Errorf("line %q: %+v %v", out.String(), l, err)
	}
}

// A taken --listen names the flag and what to do.
func TestReceiveListenInUse(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	stderr := runFails(t, 1, "receive", "--listen", addr)
	wantAll(t, "stderr", stderr, "--listen "+addr+": the address is already in use", "pick another port with --listen")
}

// --listen takes HOST:PORT or a bare PORT, which means 127.0.0.1:PORT:
// a taken port given bare is reported as the loopback address it tried.
// Any other form is bad usage (exit 2) naming both forms.
func TestReceiveListenForms(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://") // 127.0.0.1:PORT
	_, port, _ := strings.Cut(addr, ":")
	if got := runFails(t, 1, "receive", "--listen", port); got != "bridge: --listen "+addr+": the address is already in use (another bridge receive, or another program?); stop it or pick another port with --listen\n" {
		t.Errorf("--listen %s (taken on 127.0.0.1): %q", port, got)
	}
	for _, tt := range []struct{ listen, want string }{
		{"localhost", `bridge: --listen "localhost": want HOST:PORT or PORT, e.g. 127.0.0.1:9090 or 9090` + "\n"},
		{"127.0.0.1:http", `bridge: --listen "127.0.0.1:http": want HOST:PORT or PORT, e.g. 127.0.0.1:9090 or 9090` + "\n"},
		{"70000", `bridge: --listen "70000": not a port (0 to 65535); want HOST:PORT or PORT, e.g. 127.0.0.1:9090 or 9090` + "\n"},
		{"127.0.0.1:70000", `bridge: --listen "127.0.0.1:70000": want HOST:PORT or PORT, e.g. 127.0.0.1:9090 or 9090` + "\n"},
	} {
		if got := runFails(t, 2, "receive", "--listen", tt.listen); got != tt.want {
			t.Errorf("--listen %s:\n got %q\nwant %q", tt.listen, got, tt.want)
		}
	}
	for in, want := range map[string]string{"9090": "127.0.0.1:9090", "0": "127.0.0.1:0", ":9090": ":9090", "[::1]:9090": "[::1]:9090"} {
		if got, err := receiveListenAddr(in); got != want || err != nil {
			t.Errorf("receiveListenAddr(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

package sotercare

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// testLimits are small enough for a test to trigger each for real.
var testLimits = ServerLimits{
	ReadHeaderTimeout: 300 * time.Millisecond,
	ReadTimeout:       300 * time.Millisecond,
	WriteTimeout:      5 * time.Second,
	IdleTimeout:       300 * time.Millisecond,
	MaxHeaderBytes:    16 << 10,
}

// serveLimited runs the API (with no broker: the requests of these tests
// never get as far as publishing) behind NewServer(l) on 127.0.0.1 until
// the test ends, and returns its address.
func serveLimited(t *testing.T, l ServerLimits) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(NewHandler(nil, Options{}), l)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return ln.Addr().String()
}

// paced is how fast a slow client sends: one byte per 100 ms, 30 bytes.
const (
	pacedEvery = 100 * time.Millisecond
	pacedBytes = 30
)

// slowClientCut sends head, then one byte every 100 ms, 30 in all. It
// returns nil when the server ends the exchange (answers and closes, or
// just closes) before the 30th byte, and an error when it is still waiting
// after all of them.
func slowClientCut(addr, head string) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		_, _ = io.Copy(io.Discard, c) // until the server closes, or c.Close below
	}()
	defer func() { c.Close(); <-ended }()
	if _, err := io.WriteString(c, head); err != nil {
		return err
	}
	tick := time.NewTicker(pacedEvery)
	defer tick.Stop()
	for range pacedBytes {
		select {
		case <-ended:
			return nil
		case <-tick.C:
		}
		if _, err := c.Write([]byte{'x'}); err != nil {
			return nil // closed by the server
		}
	}
	select {
	case <-ended:
		return nil
	default:
		return fmt.Errorf("sent %d bytes at one per %s and the server was still reading", pacedBytes, pacedEvery)
	}
}

// slowBodyHead is a reading request whose 30-byte body comes slowly.
var slowBodyHead = fmt.Sprintf("POST /api/v1/events HTTP/1.1\r\nHost: sotercare\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", pacedBytes)

// slowHeaderHead is a request whose last header never ends.
const slowHeaderHead = "GET /api/v1/health HTTP/1.1\r\nHost: sotercare\r\nX-Slow: "

// idleClosed makes one keep-alive request and checks that the server
// closes the idle connection within the given time.
func idleClosed(addr string, within time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /api/v1/health HTTP/1.1\r\nHost: sotercare\r\n\r\n"); err != nil {
		return err
	}
	br := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		return fmt.Errorf("health: %d, close %t; want 200 on a kept-alive connection", resp.StatusCode, resp.Close)
	}
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(within))
	_, err = br.ReadByte()
	switch {
	case err == nil:
		return errors.New("the server sent data on an idle connection")
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("an idle keep-alive connection was still open after %s", within)
	}
	return nil // EOF or reset: closed by the server
}

// bigHeaderStatus is the status of a request with 32 KiB of headers.
func bigHeaderRefused(addr string) error {
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/api/v1/health", nil)
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
		return fmt.Errorf("32 KiB of request headers: %d, want 431", resp.StatusCode)
	}
	return nil
}

// Each limit of the SoterCare server triggered for real: a body sent at
// one byte per 100 ms is cut by ReadTimeout, headers sent that way by
// ReadHeaderTimeout, an idle keep-alive connection is closed after
// IdleTimeout, and 32 KiB of headers get 431. Each negative control runs
// the same check against a server without that limit.
func TestServerLimits(t *testing.T) {
	without := func(f func(*ServerLimits)) ServerLimits {
		l := testLimits
		f(&l)
		return l
	}
	tests := []struct {
		name   string
		check  func(addr string) error
		broken ServerLimits
	}{
		{"slow body cut by ReadTimeout", func(a string) error { return slowClientCut(a, slowBodyHead) },
			without(func(l *ServerLimits) { l.ReadTimeout = 0 })},
		{"slow headers cut by ReadHeaderTimeout", func(a string) error { return slowClientCut(a, slowHeaderHead) },
			without(func(l *ServerLimits) { l.ReadHeaderTimeout, l.ReadTimeout = 0, 0 })},
		{"idle connection closed by IdleTimeout", func(a string) error { return idleClosed(a, 5*time.Second) },
			without(func(l *ServerLimits) { l.IdleTimeout, l.ReadTimeout = 0, 0 })}, // zero IdleTimeout falls back to ReadTimeout
		{"large headers refused by MaxHeaderBytes", bigHeaderRefused,
			without(func(l *ServerLimits) { l.MaxHeaderBytes = 0 })},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel() // the negative controls wait out their bounds
			if err := tt.check(serveLimited(t, testLimits)); err != nil {
				t.Fatal(err)
			}
			t.Run("negative control: limit unset", func(t *testing.T) {
				if err := tt.check(serveLimited(t, tt.broken)); err == nil {
					t.Fatal("the check passed against a server without the limit")
				} else {
					t.Logf("caught, as it should: %v", err)
				}
			})
		})
	}
}

// The defaults set every limit, and leave the handler time to read the
// body and wait for JetStream before the write deadline.
func TestDefaultServerLimits(t *testing.T) {
	publish := 30 * time.Second
	l := DefaultServerLimits(publish)
	if l.ReadHeaderTimeout <= 0 || l.ReadTimeout <= 0 || l.IdleTimeout <= 0 || l.MaxHeaderBytes <= 0 {
		t.Fatalf("a limit is unset: %+v", l)
	}
	if l.WriteTimeout <= l.ReadTimeout+publish {
		t.Fatalf("WriteTimeout %s leaves no time to answer after reading (%s) and publishing (%s)", l.WriteTimeout, l.ReadTimeout, publish)
	}
	srv := NewServer(http.NotFoundHandler(), l)
	if srv.ReadHeaderTimeout != l.ReadHeaderTimeout || srv.ReadTimeout != l.ReadTimeout || srv.WriteTimeout != l.WriteTimeout ||
		srv.IdleTimeout != l.IdleTimeout || srv.MaxHeaderBytes != l.MaxHeaderBytes {
		t.Fatalf("NewServer does not apply the limits: %+v", srv)
	}
}

package test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/jetbridgetest"
)

// Bounds of the header bomb scenario. Measured peak RSS with the response
// header cap: 32 MiB (124 MiB under -race); without it the same run peaked
// at 598 to 737 MiB (2.5 GiB under -race). See
// docs/security.md.
const (
	bombHeaderBytes  = 9 << 20   // header section of every answer
	bombEvents       = 200       // events published
	bombInFlight     = 64        // the route's max_in_flight
	bombRSSBound     = 150 << 20 // peak RSS of the bridge, plain build
	bombRSSBoundRace = 400 << 20 // the same under -race (the detector's shadow memory)
)

// headerBomb is a raw TCP destination on 127.0.0.1 that reads each request
// and answers "HTTP/1.1 200 OK" followed by a 9 MB header section. It
// holds each answer after its first 32 KiB until max_in_flight answers are
// waiting (or 500 ms pass), so that that many are read at once.
type headerBomb struct {
	l       net.Listener
	payload []byte
	gate    *gate
	wg      sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]bool
	done  bool
}

func newHeaderBomb(t *testing.T, size, together int) *headerBomb {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	b.WriteString("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n")
	filler := strings.Repeat("b", 1000)
	for i := 0; b.Len() < size; i++ {
		fmt.Fprintf(&b, "X-Bomb-%06d: %s\r\n", i, filler)
	}
	b.WriteString("\r\n")
	hb := &headerBomb{l: l, payload: b.Bytes(), gate: &gate{target: together}, conns: map[net.Conn]bool{}}
	hb.wg.Add(1)
	go hb.accept()
	t.Cleanup(hb.close)
	return hb
}

func (hb *headerBomb) url() string { return "http://" + hb.l.Addr().String() + "/hook" }

func (hb *headerBomb) accept() {
	defer hb.wg.Done()
	for {
		c, err := hb.l.Accept()
		if err != nil {
			return // closed
		}
		hb.mu.Lock()
		if hb.done {
			hb.mu.Unlock()
			c.Close()
			return
		}
		hb.conns[c] = true
		hb.wg.Add(1)
		hb.mu.Unlock()
		go hb.serve(c)
	}
}

func (hb *headerBomb) serve(c net.Conn) {
	defer hb.wg.Done()
	defer func() {
		hb.mu.Lock()
		delete(hb.conns, c)
		hb.mu.Unlock()
		c.Close()
	}()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	req, err := http.ReadRequest(bufio.NewReader(c))
	if err != nil {
		return
	}
	if _, err := io.Copy(io.Discard, req.Body); err != nil {
		return
	}
	const head = 32 << 10
	if _, err := c.Write(hb.payload[:head]); err != nil {
		return
	}
	hb.gate.wait(500 * time.Millisecond)
	_, _ = c.Write(hb.payload[head:]) // the bridge hangs up after its cap
}

func (hb *headerBomb) close() {
	hb.mu.Lock()
	hb.done = true
	for c := range hb.conns {
		c.Close()
	}
	hb.mu.Unlock()
	hb.l.Close()
	hb.wg.Wait()
}

// gate releases its waiters in groups of target, or each after a timeout.
type gate struct {
	target int
	mu     sync.Mutex
	group  chan struct{}
	n      int
}

func (g *gate) wait(timeout time.Duration) {
	g.mu.Lock()
	if g.group == nil {
		g.group = make(chan struct{})
	}
	ch := g.group
	if g.n++; g.n >= g.target {
		close(ch)
		g.group, g.n = nil, 0
	}
	g.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	}
}

// peakRSS is the peak resident set size (VmHWM) of a running process.
func peakRSS(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmHWM in /proc status")
}

// A destination answering 200 with a 9 MB header section, 64 answers at
// a time, gets nothing delivered and cannot blow up the bridge's memory:
// every try is a transport error (the response headers are cut off at the
// cap) and the real bridge binary's peak RSS stays under a fixed bound.
// The negative control of the cap itself (the same answer accepted as a
// delivery when the transport is built without it) is
// bridge.TestResponseHeaderCap.
func TestHeaderBombBoundedRSS(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("needs /proc to read the bridge's peak RSS")
	}
	bound := int64(bombRSSBound)
	if raceEnabled() {
		bound = bombRSSBoundRace
	}
	// Given a destination answering every request with a 9 MB header
	// section, and a bridge with 64 tries in flight and no breaker
	srv := jetbridgetest.NewServer(t)
	_, js := srv.Connect(t)
	bomb := newHeaderBomb(t, bombHeaderBytes, bombInFlight)
	path := filepath.Join(t.TempDir(), "bridge.yaml")
	if err := os.WriteFile(path, fmt.Appendf(nil, `nats:
  url: %s
admin:
  listen: ${JETBRIDGE_ADMIN_LISTEN}
log:
  format: json
  level: error
destinations:
  bomb:
    url: %s
    timeout: 10s
    transport_retry: {count: 0}
    circuit_breaker: {enabled: false}
routes:
  - name: %s
    subjects: ["events.>"]
    destination: bomb
    max_in_flight: %d
    max_deliver: 100
    backoff: [10ms]
`, srv.URL(), bomb.url(), routeName, bombInFlight), 0o600); err != nil {
		t.Fatal(err)
	}
	p := runBridge(t, path)

	// When 200 events are published and each was tried at least once
	for i := range bombEvents {
		if _, err := js.Publish(t.Context(), "events.info.bomb", []byte(`{}`), jetstream.WithMsgID(fmt.Sprintf("bomb-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	var tries, ok2xx float64
	natstest.Eventually(t, 2*countTimeout, func() error {
		p.failIfExited(t)
		tries = max(p.metric(t, "bridge_http_requests_total", `class="transport"`), 0)
		ok2xx = max(p.metric(t, "bridge_http_requests_total", `class="2xx"`), 0)
		if tries+ok2xx < bombEvents {
			return fmt.Errorf("%v tries so far, want %d", tries+ok2xx, bombEvents)
		}
		return nil
	})
	rss, err := peakRSS(p.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}

	// Then nothing was delivered, every try was a transport error, and the
	// peak RSS stayed under the bound
	delivered := p.metric(t, "bridge_messages_total", `outcome="delivered"`)
	t.Logf("%v tries were transport errors, %v were 2xx; peak RSS %d MiB (bound %d MiB, race %t)", tries, ok2xx, rss>>20, bound>>20, raceEnabled())
	if delivered > 0 || ok2xx > 0 {
		t.Errorf("%v messages delivered and %v tries counted 2xx, want none", delivered, ok2xx)
	}
	if rss > bound {
		t.Errorf("peak RSS %d MiB, want under %d MiB", rss>>20, bound>>20)
	}
}

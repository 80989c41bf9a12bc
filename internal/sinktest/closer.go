package sinktest

import (
	"bufio"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// closerReadTimeout bounds how long a readFirst Closer waits for a request
// head before closing anyway.
const closerReadTimeout = 10 * time.Second

// Closer is a raw TCP listener on 127.0.0.1 that accepts connections and
// closes them without writing a single byte, optionally after reading the
// HTTP request head. Clients see a transport error (EOF or connection
// reset), never a status code.
type Closer struct {
	l         net.Listener
	readFirst bool
	wg        sync.WaitGroup

	mu       sync.Mutex
	accepted int
	changed  chan struct{} // closed and replaced on every accept
	open     map[net.Conn]struct{}
	closed   bool
}

// NewCloser starts a Closer and shuts it down in t.Cleanup. With readFirst
// it reads the request head (request line and headers, not the body)
// before closing; otherwise it closes right after accepting.
func NewCloser(t testing.TB, readFirst bool) *Closer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("sinktest: closer listen: %v", err)
	}
	c := &Closer{
		l:         l,
		readFirst: readFirst,
		changed:   make(chan struct{}),
		open:      make(map[net.Conn]struct{}),
	}
	c.wg.Add(1)
	go c.acceptLoop()
	t.Cleanup(c.close)
	return c
}

// URL is "http://127.0.0.1:PORT/".
func (c *Closer) URL() string { return "http://" + c.l.Addr().String() + "/" }

// Accepted is the number of connections accepted so far.
func (c *Closer) Accepted() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.accepted
}

// WaitAccepted blocks until at least n connections have been accepted and
// fails the test if that takes longer than timeout.
func (c *Closer) WaitAccepted(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		c.mu.Lock()
		got, changed := c.accepted, c.changed
		c.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-changed:
		case <-timer.C:
			t.Fatalf("sinktest: closer accepted %d connections within %s, want at least %d", c.Accepted(), timeout, n)
		}
	}
}

func (c *Closer) acceptLoop() {
	defer c.wg.Done()
	for {
		conn, err := c.l.Accept()
		if err != nil {
			return // listener closed
		}
		c.mu.Lock()
		c.accepted++
		close(c.changed)
		c.changed = make(chan struct{})
		if c.closed {
			c.mu.Unlock()
			_ = conn.Close()
			continue
		}
		if !c.readFirst {
			c.mu.Unlock()
			_ = conn.Close()
			continue
		}
		c.open[conn] = struct{}{}
		c.wg.Add(1)
		c.mu.Unlock()
		go c.readThenClose(conn)
	}
}

func (c *Closer) readThenClose(conn net.Conn) {
	defer c.wg.Done()
	_ = conn.SetReadDeadline(time.Now().Add(closerReadTimeout))
	// ReadRequest consumes the request line and headers only.
	_, _ = http.ReadRequest(bufio.NewReader(conn))
	c.mu.Lock()
	delete(c.open, conn)
	c.mu.Unlock()
	_ = conn.Close()
}

func (c *Closer) close() {
	c.mu.Lock()
	c.closed = true
	for conn := range c.open {
		_ = conn.Close() // unblocks readThenClose
	}
	c.mu.Unlock()
	_ = c.l.Close()
	c.wg.Wait()
}

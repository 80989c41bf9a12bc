package natstest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/embedded"
)

// pinTimeout bounds a pinned dial: the TCP connect and reading the
// server's INFO line.
const pinTimeout = 2 * time.Second

// uniqueName is prefix with a random suffix, so that a pinned connection
// tells the server from another test's server that took its port.
func uniqueName(prefix string) string { return prefix + "-" + strings.ToLower(rand.Text()[:10]) }

// Identity is what a pinned connection (ConnectPinned) accepts: a server
// named one of Names and, for a cluster, in the cluster named Cluster.
// Every server of this package has a name of its own, kept across
// restarts (a cluster: a name of its own).
type Identity struct {
	Names   []string
	Cluster string // "" for a single server
}

func (id Identity) String() string {
	q := make([]string, len(id.Names))
	for i, n := range id.Names {
		q[i] = fmt.Sprintf("%q", n)
	}
	s := strings.Join(q, " or ")
	if id.Cluster != "" {
		s += fmt.Sprintf(" of cluster %q", id.Cluster)
	}
	return s
}

// serverInfo is the part of a server's INFO line that identifies it.
type serverInfo struct {
	ID      string `json:"server_id"`
	Name    string `json:"server_name"`
	Cluster string `json:"cluster"`
}

func (i serverInfo) String() string {
	s := fmt.Sprintf("%q (id %s", i.Name, i.ID)
	if i.Cluster != "" {
		s += fmt.Sprintf(", cluster %q", i.Cluster)
	}
	return s + ")"
}

func (id Identity) accepts(i serverInfo) bool {
	return slices.Contains(id.Names, i.Name) && i.Cluster == id.Cluster
}

// ConnectPinned is Connect for a connection that only ever talks to the
// server (or cluster) id names. Before the client sends anything (its
// CONNECT, and so its credentials), every dial, the first and each
// reconnect, reads the server's INFO and checks its name. Another server
// on the address, e.g. another test's server that took the port while
// this one was down, is never used: the first connect fails the test;
// after that the connection is closed and the test fails (t.Errorf) with
// both servers named, instead of publishing to or consuming from it.
//
// The check is a custom dialer (nats.SetCustomDialer); opts are applied
// after it, so an option setting another dialer replaces the check.
func ConnectPinned(t testing.TB, url string, id Identity, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	p := &pinDialer{id: id, report: func(err error) { t.Errorf("%v", err) }}
	nc, js := Connect(t, url, append([]nats.Option{nats.SetCustomDialer(p)}, opts...)...)
	p.nc.Store(nc)
	return nc, js
}

// pinDialer is the dialer of ConnectPinned.
type pinDialer struct {
	id     Identity
	report func(error)
	nc     atomic.Pointer[nats.Conn] // set once the first connect succeeded
	closed atomic.Bool               // reported and closed once
}

// Dial is called by nats.go with the connection's lock held: it closes the
// connection on another goroutine.
func (p *pinDialer) Dial(network, address string) (net.Conn, error) {
	d := net.Dialer{Timeout: pinTimeout}
	conn, err := d.Dial(network, address)
	if err != nil {
		return nil, err
	}
	info, r, err := readInfo(conn)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("natstest: %s: %w", address, err)
	}
	if p.id.accepts(info) {
		return &replayConn{Conn: conn, r: r}, nil
	}
	conn.Close()
	err = fmt.Errorf("natstest: the server at %s is %s, not this test's server %s; "+
		"closed the connection rather than use it (did another test's server take the port?)", address, info, p.id)
	if nc := p.nc.Load(); nc != nil && p.closed.CompareAndSwap(false, true) {
		p.report(err)
		go nc.Close() // nats.go holds nc's lock during Dial
	}
	return nil, err
}

// readInfo reads the INFO line a NATS server sends first. The returned
// reader gives that line again, then the rest of what conn receives.
func readInfo(conn net.Conn) (serverInfo, io.Reader, error) {
	var info serverInfo
	if err := conn.SetReadDeadline(time.Now().Add(pinTimeout)); err != nil {
		return info, nil, err
	}
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil {
		return info, nil, fmt.Errorf("no INFO from the server: %w", err)
	}
	body, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "INFO ")
	if !ok {
		return info, nil, fmt.Errorf("not a NATS server: it sent %.40q", line)
	}
	if err := json.Unmarshal([]byte(body), &info); err != nil {
		return info, nil, fmt.Errorf("bad INFO from the server: %w", err)
	}
	return info, io.MultiReader(strings.NewReader(line), r), conn.SetReadDeadline(time.Time{})
}

// replayConn is conn with the INFO line that readInfo consumed put back.
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// restartTaken is the failure of a restart whose address someone else
// took while the server was down.
func restartTaken(addr string) string {
	return fmt.Sprintf("natstest: restart: %s was taken while the server was down (by another listener, or another test's server); "+
		"refusing to come back on it", addr)
}

// restartEmbedded starts a stopped server again on its pinned address(es).
// Its own shutdown released them, so one that is busy was taken by
// someone else: that fails the test at once, naming it.
func restartEmbedded(t testing.TB, opts embedded.Options) *embedded.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	srv, err := embedded.Start(ctx, opts)
	var inUse *embedded.AddrInUseError
	switch {
	case errors.As(err, &inUse):
		t.Fatalf("%s", restartTaken(inUse.Addr))
	case err != nil:
		t.Fatalf("natstest: restart: %v", err)
	}
	return srv
}

// probeFree fails the test at once when addr, which a stopped server
// held, is now taken.
func probeFree(t testing.TB, addr string) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("%s", restartTaken(addr))
	}
	if err != nil {
		t.Fatalf("natstest: restart on %s: %v", addr, err)
	}
	l.Close()
}

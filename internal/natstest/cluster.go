package natstest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/embedded"
)

// clusterTimeout bounds each wait of a cluster: the first meta leader, a
// node rejoining after Restart, a new leader after a stepdown.
const clusterTimeout = 20 * time.Second

// apiTimeout bounds one JetStream API request made by the cluster helpers.
// Requests are retried: a cluster without a (meta) leader does not answer.
const apiTimeout = 2 * time.Second

// account is the account every test client uses (no auth configured).
const account = server.DEFAULT_GLOBAL_ACCOUNT

// Cluster is an n-node JetStream cluster inside the test process: every
// node listens on 127.0.0.1 (random client port, pinned for Restart;
// pre-picked route port), has its own store dir under t.TempDir() and the
// same route list. Node i is named "n<i+1>". The nodes are shut down in
// t.Cleanup; their logs are printed if the test failed.
//
// A Cluster is safe for concurrent use, but Shutdown and Restart of one
// node must not race with each other.
type Cluster struct {
	name  string
	nodes []*Server
	logs  *Buffer
}

// StartCluster starts an n-node JetStream cluster and waits until it is
// usable: every node accepts connections, a meta leader is elected, every
// node is a current member of the meta group and the JetStream API answers
// through every node. A cluster answers no API request before it has a
// meta leader (0.25 to 0.65 s after start), which is why readiness alone is
// not enough.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("natstest: StartCluster: need at least 1 node, got %d", n)
	}
	begin := time.Now()
	c := &Cluster{name: uniqueName("natstest"), logs: &Buffer{}} // ConnectPinned tells it from others
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("cluster server logs:\n%s", c.logs.String())
		}
	})
	ports := freePorts(t, n)
	routes := make([]string, n)
	for i, p := range ports {
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", p)
	}
	base := t.TempDir()
	t.Cleanup(c.shutdownAll) // also the nodes started before a failed one
	for i := range n {
		name := fmt.Sprintf("n%d", i+1)
		opts := embedded.Options{
			Listen:     "127.0.0.1:0",
			StoreDir:   filepath.Join(base, name),
			ServerName: name,
			Logf:       c.logf(name),
			Cluster: &embedded.Cluster{
				Name:   c.name,
				Listen: fmt.Sprintf("127.0.0.1:%d", ports[i]),
				Routes: routes,
			},
		}
		srv := startEmbedded(t, opts)
		opts.Listen = srv.Addr() // Restart comes back on the same port
		node := &Server{opts: opts, url: srv.ClientURL(), srv: srv}
		c.nodes = append(c.nodes, node)
	}
	c.waitFormed(t)
	t.Logf("natstest: %d-node cluster usable after %s (meta leader n%d)",
		n, time.Since(begin).Round(time.Millisecond), c.MetaLeader()+1)
	return c
}

// freePorts picks n distinct free loopback ports. They are released before
// the nodes bind them; the window is small, and a port taken meanwhile
// makes the start fail with "address already in use".
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("natstest: pick a free port: %v", err)
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports
}

// logf collects a node's log lines, prefixed with its name.
func (c *Cluster) logf(name string) func(string, ...any) {
	return func(format string, args ...any) {
		line := fmt.Sprintf(format, args...)
		fmt.Fprintf(c.logs, "%s %s %s\n", time.Now().Format("15:04:05.000"), name, line)
	}
}

// Logs returns the nodes' log lines so far (notices and above).
func (c *Cluster) Logs() string { return c.logs.String() }

// Size is the number of nodes.
func (c *Cluster) Size() int { return len(c.nodes) }

// URLs is the comma-separated list of every node's client URL, for
// nats.Connect: a client connected to it fails over to another node.
func (c *Cluster) URLs() string {
	urls := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		urls[i] = n.URL()
	}
	return strings.Join(urls, ",")
}

// Node returns node i (0-based). Its URL and StoreDir stay the same across
// Restart. Use the Cluster's Shutdown and Restart, which also wait on the
// cluster, rather than the node's own.
func (c *Cluster) Node(i int) *Server { return c.nodes[i] }

// Name is node i's server name, as JetStream reports it (e.g. in
// StreamInfo.Cluster.Leader).
func (c *Cluster) Name(i int) string { return c.nodes[i].opts.ServerName }

// index returns the index of the node named name, or -1.
func (c *Cluster) index(name string) int {
	for i, n := range c.nodes {
		if n.opts.ServerName == name {
			return i
		}
	}
	return -1
}

// raw returns node i's nats-server, or nil while it is shut down.
func (c *Cluster) raw(i int) *server.Server {
	s := c.nodes[i]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv == nil {
		return nil
	}
	return s.srv.NATS()
}

// Running reports whether node i is up.
func (c *Cluster) Running(i int) bool { return c.raw(i) != nil }

// Shutdown stops node i (a graceful nats-server shutdown: it hands off its
// Raft leaderships and closes its client connections, as on SIGTERM). It
// returns once the node has stopped, without waiting for the remaining
// nodes to elect new leaders. With 3 nodes, R3
// assets stay available.
func (c *Cluster) Shutdown(i int) { c.nodes[i].Shutdown() }

// Restart starts node i again with the same options (name, store dir,
// client and route ports) and waits until it is back in the cluster: a
// meta leader exists, every node is a current member of the meta group
// and the JetStream API answers through node i. Streams catch up in the
// background; WaitStreamCurrent waits for that. A client or route port
// taken while the node was down fails the test at once, naming it.
func (c *Cluster) Restart(t testing.TB, i int) {
	t.Helper()
	begin := time.Now()
	s := c.nodes[i]
	s.Shutdown()
	srv := restartEmbedded(t, s.opts) // not under s.mu: it may end the test
	s.mu.Lock()
	s.srv = srv
	s.mu.Unlock()
	c.waitFormed(t)
	t.Logf("natstest: node %s rejoined after %s", c.Name(i), time.Since(begin).Round(time.Millisecond))
}

// Identity is the cluster's name and its nodes' names: what ConnectPinned
// accepts.
func (c *Cluster) Identity() Identity {
	id := Identity{Cluster: c.name}
	for i := range c.nodes {
		id.Names = append(id.Names, c.Name(i))
	}
	return id
}

func (c *Cluster) shutdownAll() {
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Go(n.Shutdown)
	}
	wg.Wait()
}

// MetaLeader is the index of the only running node that leads the
// JetStream meta group, or -1 (none, or two during a hand-off).
func (c *Cluster) MetaLeader() int {
	return c.onlyLeader(func(s *server.Server) bool { return s.JetStreamIsLeader() })
}

// waitFormed waits until the running nodes form a working JetStream
// cluster; see StartCluster.
func (c *Cluster) waitFormed(t testing.TB) {
	t.Helper()
	// What the cluster waited for, and when, goes to the logs: a slow
	// start is then explained when the test fails.
	begin := time.Now()
	last := ""
	Eventually(t, clusterTimeout, func() error {
		err := c.formed()
		msg := "yes"
		if err != nil {
			msg = err.Error()
		}
		if msg != last {
			last = msg
			fmt.Fprintf(c.logs, "%s natstest +%s: cluster formed: %s\n",
				time.Now().Format("15:04:05.000"), time.Since(begin).Round(time.Millisecond), msg)
		}
		return err
	})
	// The API answers through every running node.
	for i, n := range c.nodes {
		if c.Running(i) {
			waitJetStream(t, n.URL(), clusterTimeout)
		}
	}
}

// formed checks the cluster's state on the raw servers.
func (c *Cluster) formed() error {
	running := 0
	for i := range c.nodes {
		s := c.raw(i)
		if s == nil {
			continue
		}
		running++
		if !s.ReadyForConnections(10 * time.Millisecond) {
			return fmt.Errorf("node %s not ready for connections", c.Name(i))
		}
		if !s.JetStreamIsCurrent() {
			return fmt.Errorf("node %s not current with the meta group", c.Name(i))
		}
	}
	l := c.MetaLeader()
	if l < 0 {
		return errors.New("no JetStream meta leader")
	}
	leader := c.raw(l)
	if leader == nil {
		return errors.New("meta leader shut down meanwhile")
	}
	if peers := leader.JetStreamClusterPeers(); len(peers) != running {
		return fmt.Errorf("meta leader %s sees %d JetStream peers online (%v), want %d",
			c.Name(l), len(peers), peers, running)
	}
	return nil
}

// StreamLeader returns the index of the node that leads stream, as
// JetStream reports it through js (StreamInfo.Cluster.Leader), or -1 if it
// has no leader right now or cannot be asked.
func (c *Cluster) StreamLeader(js jetstream.JetStream, stream string) int {
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return -1
	}
	info := s.CachedInfo()
	if info.Cluster == nil {
		return -1
	}
	return c.index(info.Cluster.Leader)
}

// ConsumerLeader returns the index of the node that leads the consumer, as
// JetStream reports it through js (ConsumerInfo.Cluster.Leader), or -1.
func (c *Cluster) ConsumerLeader(js jetstream.JetStream, stream, consumer string) int {
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	cons, err := js.Consumer(ctx, stream, consumer)
	if err != nil {
		return -1
	}
	info := cons.CachedInfo()
	if info.Cluster == nil {
		return -1
	}
	return c.index(info.Cluster.Leader)
}

// streamLeaderRaw is the index of the only running node that considers
// itself the stream's leader, or -1 (none, or two during a hand-off).
func (c *Cluster) streamLeaderRaw(stream string) int {
	return c.onlyLeader(func(s *server.Server) bool { return s.JetStreamIsStreamLeader(account, stream) })
}

func (c *Cluster) consumerLeaderRaw(stream, consumer string) int {
	return c.onlyLeader(func(s *server.Server) bool { return s.JetStreamIsConsumerLeader(account, stream, consumer) })
}

func (c *Cluster) onlyLeader(is func(*server.Server) bool) int {
	found := -1
	for i := range c.nodes {
		if s := c.raw(i); s != nil && is(s) {
			if found >= 0 {
				return -1
			}
			found = i
		}
	}
	return found
}

// WaitStreamLeader waits until stream has a leader, both on the servers
// and in what JetStream reports through js, and returns its index.
func (c *Cluster) WaitStreamLeader(t testing.TB, js jetstream.JetStream, stream string) int {
	t.Helper()
	var got int
	Eventually(t, clusterTimeout, func() error {
		raw := c.streamLeaderRaw(stream)
		if raw < 0 {
			return fmt.Errorf("stream %s has no leader", stream)
		}
		if api := c.StreamLeader(js, stream); api != raw {
			return fmt.Errorf("stream %s: leader %d on the servers, %d reported by the API", stream, raw, api)
		}
		got = raw
		return nil
	})
	return got
}

// WaitStreamCurrent waits until stream has a leader and every running node
// holds a current replica of it (e.g. after Restart, once the restarted
// node has caught up).
func (c *Cluster) WaitStreamCurrent(t testing.TB, stream string) {
	t.Helper()
	Eventually(t, clusterTimeout, func() error {
		if c.streamLeaderRaw(stream) < 0 {
			return fmt.Errorf("stream %s has no leader", stream)
		}
		for i := range c.nodes {
			if s := c.raw(i); s != nil && !s.JetStreamIsStreamCurrent(account, stream) {
				return fmt.Errorf("node %s: replica of stream %s not current", c.Name(i), stream)
			}
		}
		return nil
	})
}

// StepDownStream asks the leader of stream to step down
// ($JS.API.STREAM.LEADER.STEPDOWN.<stream>) and waits until another node
// leads it. It returns the new leader's index.
func (c *Cluster) StepDownStream(t testing.TB, nc *nats.Conn, stream string) int {
	t.Helper()
	return c.stepDown(t, nc, "stream "+stream, "$JS.API.STREAM.LEADER.STEPDOWN."+stream,
		func() int { return c.streamLeaderRaw(stream) }, -1)
}

// MoveStreamLeader makes node to the leader of stream: a stepdown with
// node to as the preferred new leader. It is a no-op if to leads already.
func (c *Cluster) MoveStreamLeader(t testing.TB, nc *nats.Conn, stream string, to int) {
	t.Helper()
	c.stepDown(t, nc, "stream "+stream, "$JS.API.STREAM.LEADER.STEPDOWN."+stream,
		func() int { return c.streamLeaderRaw(stream) }, to)
}

// StepDownConsumer asks the leader of the consumer to step down
// ($JS.API.CONSUMER.LEADER.STEPDOWN.<stream>.<consumer>) and waits until
// another node leads it. It returns the new leader's index.
func (c *Cluster) StepDownConsumer(t testing.TB, nc *nats.Conn, stream, consumer string) int {
	t.Helper()
	return c.stepDown(t, nc, "consumer "+stream+"/"+consumer, "$JS.API.CONSUMER.LEADER.STEPDOWN."+stream+"."+consumer,
		func() int { return c.consumerLeaderRaw(stream, consumer) }, -1)
}

// MoveConsumerLeader makes node to the leader of the consumer: a stepdown
// with node to as the preferred new leader. It is a no-op if to leads
// already.
func (c *Cluster) MoveConsumerLeader(t testing.TB, nc *nats.Conn, stream, consumer string, to int) {
	t.Helper()
	c.stepDown(t, nc, "consumer "+stream+"/"+consumer, "$JS.API.CONSUMER.LEADER.STEPDOWN."+stream+"."+consumer,
		func() int { return c.consumerLeaderRaw(stream, consumer) }, to)
}

// stepDown sends stepdown requests to subject until the leader changes,
// to node to if to >= 0, and returns the new leader.
func (c *Cluster) stepDown(t testing.TB, nc *nats.Conn, what, subject string, leader func() int, to int) int {
	t.Helper()
	begin := time.Now()
	var old int
	Eventually(t, clusterTimeout, func() error {
		if old = leader(); old < 0 {
			return fmt.Errorf("%s has no leader to step down", what)
		}
		return nil
	})
	if old == to {
		return old
	}
	done := func(now int) bool { return now >= 0 && now != old && (to < 0 || now == to) }
	var body []byte
	if to >= 0 {
		body = fmt.Appendf(nil, `{"placement":{"preferred":%q}}`, c.Name(to))
	}
	want := "another node"
	if to >= 0 {
		want = c.Name(to)
	}
	// The request is answered by the leader; a request lost in a hand-off
	// gets no reply, and a preferred node that is not current may be
	// passed over, so the request is repeated (at most once a second
	// after a success) until the wanted leader is elected.
	var now int
	var sent time.Time
	pause := time.Duration(0) // before the next request
	Eventually(t, clusterTimeout, func() error {
		if now = leader(); done(now) {
			return nil
		}
		if time.Since(sent) < pause {
			return fmt.Errorf("%s: leader is %d, want %s (was %s)", what, now, want, c.Name(old))
		}
		sent, pause = time.Now(), 250*time.Millisecond
		msg, err := nc.Request(subject, body, apiTimeout)
		if err != nil {
			return fmt.Errorf("%s: stepdown request: %w", what, err)
		}
		var resp struct {
			Success bool `json:"success"`
			Error   *struct {
				Code        int    `json:"code"`
				ErrCode     int    `json:"err_code"`
				Description string `json:"description"`
			} `json:"error"`
		}
		if err := json.Unmarshal(msg.Data, &resp); err != nil {
			return fmt.Errorf("%s: stepdown response %q: %w", what, msg.Data, err)
		}
		if resp.Error != nil {
			return fmt.Errorf("%s: stepdown refused: %s (code %d, err_code %d)",
				what, resp.Error.Description, resp.Error.Code, resp.Error.ErrCode)
		}
		if !resp.Success {
			return fmt.Errorf("%s: stepdown not successful: %s", what, msg.Data)
		}
		pause = time.Second
		return fmt.Errorf("%s: stepdown accepted, waiting for %s to lead (was %s)", what, want, c.Name(old))
	})
	t.Logf("natstest: %s leader %s -> %s in %s", what, c.Name(old), c.Name(now), time.Since(begin).Round(time.Millisecond))
	return now
}

package natstest_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/embedded"
	"github.com/sotercare/jetbridge/internal/natstest"
)

// publishRetrying publishes with a fixed Nats-Msg-Id, repeating a failed
// try (a node that went away, a leader election) for up to 15 s.
func publishRetrying(t *testing.T, js jetstream.JetStream, subject, id string) *jetstream.PubAck {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		// nats.go waits and retries itself while nothing answers.
		ack, err := js.Publish(ctx, subject, []byte(id), jetstream.WithMsgID(id),
			jetstream.WithRetryWait(50*time.Millisecond), jetstream.WithRetryAttempts(10))
		cancel()
		if err == nil {
			return ack
		}
		if time.Now().After(deadline) {
			t.Fatalf("publish %s: %v", id, err)
		}
	}
}

// A 3-node cluster is usable when StartCluster returns: it has a meta
// leader, an R3 stream and an R3 consumer can be created at once, leaders
// change on stepdown, and losing the stream leader keeps the stream
// writable; the node comes back on Restart and catches up.
func TestCluster(t *testing.T) {
	// Given a 3-node cluster and a client connected to every node.
	c := natstest.StartCluster(t, 3)
	if got := strings.Count(c.URLs(), ",") + 1; got != 3 {
		t.Fatalf("URLs() = %q, want 3 URLs", c.URLs())
	}
	for i := range c.Size() {
		if !c.Running(i) {
			t.Fatalf("node %d not running", i)
		}
		if c.Node(i).URL() == "" || c.Name(i) != fmt.Sprintf("n%d", i+1) {
			t.Fatalf("node %d: URL %q, name %q", i, c.Node(i).URL(), c.Name(i))
		}
	}
	if c.MetaLeader() < 0 {
		t.Fatal("no meta leader")
	}
	nc, js := natstest.Connect(t, c.URLs())

	// When an R3 stream is created right away (no retry).
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "EVENTS", Subjects: []string{"events.>"}, Storage: jetstream.FileStorage,
		Replicas: 3, Duplicates: time.Minute,
	})
	if err != nil {
		t.Fatalf("CreateStream R3: %v", err)
	}
	// Then it has 3 replicas and a leader.
	if info := st.CachedInfo(); info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("stream info: replicas %d, cluster %+v; want R3 with a leader and 2 followers", info.Config.Replicas, info.Cluster)
	}
	lead := c.WaitStreamLeader(t, js, "EVENTS")

	// And a consumer with Replicas 0 inherits R3 and has a leader.
	if _, err := js.CreateOrUpdateConsumer(ctx, "EVENTS", jetstream.ConsumerConfig{
		Durable: "d", AckPolicy: jetstream.AckExplicitPolicy,
	}); err != nil {
		t.Fatalf("CreateOrUpdateConsumer: %v", err)
	}
	natstest.Eventually(t, 10*time.Second, func() error {
		if l := c.ConsumerLeader(js, "EVENTS", "d"); l < 0 {
			return errors.New("consumer has no leader")
		}
		return nil
	})
	cons, err := js.Consumer(ctx, "EVENTS", "d")
	if err != nil {
		t.Fatal(err)
	}
	if ci := cons.CachedInfo(); ci.Cluster == nil || len(ci.Cluster.Replicas) != 2 {
		t.Fatalf("consumer cluster info %+v, want a leader and 2 followers", ci.Cluster)
	}

	// When the stream leader steps down, another node leads.
	if now := c.StepDownStream(t, nc, "EVENTS"); now == lead {
		t.Fatalf("stream leader still %d after stepdown", now)
	}
	// When the consumer leader steps down, another node leads.
	cl := c.ConsumerLeader(js, "EVENTS", "d")
	if now := c.StepDownConsumer(t, nc, "EVENTS", "d"); now == cl {
		t.Fatalf("consumer leader still %d after stepdown", now)
	}

	// When both leaderships are moved to a chosen node, it leads both.
	to := (c.StreamLeader(js, "EVENTS") + 1) % 3
	c.MoveStreamLeader(t, nc, "EVENTS", to)
	c.MoveConsumerLeader(t, nc, "EVENTS", "d", to)
	if sl, cl := c.WaitStreamLeader(t, js, "EVENTS"), c.ConsumerLeader(js, "EVENTS", "d"); sl != to || cl != to {
		t.Fatalf("stream leader %d, consumer leader %d, want both %d", sl, cl, to)
	}

	// When 50 messages are stored and the stream leader node is shut down.
	for i := 1; i <= 50; i++ {
		publishRetrying(t, js, "events.a", fmt.Sprintf("m-%d", i))
	}
	lead = c.WaitStreamLeader(t, js, "EVENTS")
	begin := time.Now()
	c.Shutdown(lead)

	// Then the stream stays writable: 50 more are stored, with a new
	// leader, and none of the first 50 is stored twice.
	for i := 51; i <= 100; i++ {
		publishRetrying(t, js, "events.a", fmt.Sprintf("m-%d", i))
	}
	t.Logf("50 publishes after losing the leader took %s", time.Since(begin).Round(time.Millisecond))
	if now := c.WaitStreamLeader(t, js, "EVENTS"); now == lead {
		t.Fatalf("stream still led by the node that was shut down")
	}
	if ack := publishRetrying(t, js, "events.a", "m-7"); !ack.Duplicate || ack.Sequence != 7 {
		t.Fatalf("republish of m-7: %+v, want a duplicate of seq 7", ack)
	}
	natstest.Eventually(t, 10*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		info, err := js.Stream(ctx, "EVENTS")
		if err != nil {
			return err
		}
		if n := info.CachedInfo().State.Msgs; n != 100 {
			return fmt.Errorf("stream holds %d messages, want 100", n)
		}
		return nil
	})

	// When the node is restarted, it rejoins and its replica catches up.
	c.Restart(t, lead)
	c.WaitStreamCurrent(t, "EVENTS")
	node := c.Node(lead)
	_, njs := natstest.Connect(t, node.URL())
	if ack := publishRetrying(t, njs, "events.a", "m-101"); ack.Sequence != 101 {
		t.Fatalf("publish through the restarted node: seq %d, want 101", ack.Sequence)
	}
}

// The cluster options of embedded.Start fail fast and clearly: a missing
// cluster name, a malformed route, and a busy route port (typed, without
// waiting out the start deadline).
func TestClusterOptionsRejected(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cases := []struct {
		name    string
		cluster embedded.Cluster
		want    string
		is      error
	}{
		{"no name", embedded.Cluster{Routes: []string{"nats://127.0.0.1:1"}}, "cluster name is required", nil},
		{"bad route", embedded.Cluster{Name: "c", Routes: []string{"127.0.0.1:6222"}}, "want nats://host:port", nil},
		{"not loopback", embedded.Cluster{Name: "c", Listen: "0.0.0.0:0"}, "not a loopback", embedded.ErrNotLoopback},
		{"busy port", embedded.Cluster{Name: "c", Listen: busy.Addr().String()}, "already in use", syscall.EADDRINUSE},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			begin := time.Now()
			s, err := embedded.Start(t.Context(), embedded.Options{StoreDir: t.TempDir(), Cluster: &tc.cluster})
			if err == nil {
				s.Shutdown()
				t.Fatal("Start succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) || (tc.is != nil && !errors.Is(err, tc.is)) {
				t.Fatalf("error %q, want it to say %q (and match %v)", err, tc.want, tc.is)
			}
			if d := time.Since(begin); d > time.Second {
				t.Fatalf("failed after %s, want at once", d)
			}
		})
	}
}

// A single node started with cluster options and a random route port
// reports the port it bound.
func TestClusterAddr(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s, err := embedded.Start(ctx, embedded.Options{
		StoreDir: t.TempDir(), ServerName: "solo",
		// A route to a port nobody listens on: a cluster needs one.
		Cluster: &embedded.Cluster{Name: "c", Routes: []string{"nats://127.0.0.1:1"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	if a := s.ClusterAddr(); !strings.HasPrefix(a, "127.0.0.1:") || strings.HasSuffix(a, ":0") {
		t.Fatalf("ClusterAddr = %q, want 127.0.0.1:<random port>", a)
	}
	plain, err := embedded.Start(ctx, embedded.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Shutdown()
	if a := plain.ClusterAddr(); a != "" {
		t.Fatalf("single node ClusterAddr = %q, want empty", a)
	}
}

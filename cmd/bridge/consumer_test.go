package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/embedded"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
	"github.com/sotercare/jetbridge/producer"
)

// dlqConfigWithoutRA is dlqConfig with route ra removed from the file.
var dlqConfigWithoutRA = strings.Replace(dlqConfig, `  - name: ra
    subjects: ["events.info.a.>"]
    destination: d
`, "", 1)

// consumerEnv is a NATS server with the streams and the consumers of
// dlqConfig provisioned (nothing delivering), and the two config files:
// with route ra and without it.
type consumerEnv struct {
	t                 *testing.T
	srv               *natstest.Server
	js                jetstream.JetStream
	sink              *sinktest.Sink
	path, pathWithout string
}

func newConsumerEnv(t *testing.T) *consumerEnv {
	t.Helper()
	unsetenv(t, "BRIDGE_CONFIG")
	e := &consumerEnv{t: t, srv: natstest.Start(t), sink: sinktest.New(t, sinktest.Always(200))}
	_, e.js = natstest.Connect(t, e.srv.URL())
	e.path = writeDLQConfig(t, e.srv.URL(), "127.0.0.1:4222", e.sink.URL())
	e.pathWithout = writeDLQConfigFrom(t, dlqConfigWithoutRA, e.srv.URL(), "127.0.0.1:4222", e.sink.URL())
	b, err := bridge.New(e.load(e.path), e.js, bridge.Options{Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Provision(e.ctx()); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *consumerEnv) load(path string) *config.Config {
	e.t.Helper()
	cfg, err := config.LoadFile(path)
	if err != nil {
		e.t.Fatal(err)
	}
	return cfg
}

func (e *consumerEnv) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	e.t.Cleanup(cancel)
	return ctx
}

func (e *consumerEnv) publish(id, subject string) {
	e.t.Helper()
	if _, err := producer.NewPublisher(e.js, "events").Publish(e.ctx(), producer.Event{ID: id, Subject: subject, Payload: []byte(`{"secret":"payload-Zq9"}`)}); err != nil {
		e.t.Fatal(err)
	}
}

// exists reports whether the consumer is on the server.
func (e *consumerEnv) exists(name string) bool {
	e.t.Helper()
	_, err := e.js.Consumer(e.ctx(), "EVENTS", name)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return false
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return true
}

// waitIdle waits until no pull request waits on consumer name.
func (e *consumerEnv) waitIdle(name string) {
	e.t.Helper()
	natstest.Eventually(e.t, 15*time.Second, func() error {
		c, err := e.js.Consumer(e.ctx(), "EVENTS", name)
		if err != nil {
			return err
		}
		if n := c.CachedInfo().NumWaiting; n != 0 {
			return fmt.Errorf("consumer %s: %d pull requests waiting", name, n)
		}
		return nil
	})
}

// runBridgeUntil runs a bridge in process on the file until the returned
// function is called; it returns once the bridge is ready.
func (e *consumerEnv) runBridgeUntil(path string) (stop func()) {
	e.t.Helper()
	b, err := bridge.New(e.load(path), e.js, bridge.Options{Logger: zerolog.New(zerolog.NewTestWriter(e.t)).Level(zerolog.WarnLevel)})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("bridge Run: %v", err)
		}
	}
	e.t.Cleanup(stop)
	select {
	case <-b.Ready():
	case err := <-done:
		e.t.Fatalf("bridge Run: %v", err)
	}
	return stop
}

// withStdin runs f with os.Stdin a pipe (not a terminal).
func withStdin(t *testing.T, f func()) {
	t.Helper()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin := os.Stdin
	os.Stdin = pr
	defer func() {
		os.Stdin = stdin
		pr.Close()
		pw.Close()
	}()
	f()
}

// list shows the routes' consumers and a leftover one, with their exact
// counts; delete refuses a route of the file (exit 2, nothing deleted) and
// deletes the same name once the route is out of the file (the control),
// refuses without --yes on a non-terminal stdin (exit 2, nothing deleted)
// and deletes with --yes (checked on the server), writes the audit line,
// and refuses a consumer that does not exist (exit 1). Nothing read from
// NATS but names and counts is printed.
func TestConsumerListAndDelete(t *testing.T) {
	e := newConsumerEnv(t)
	// A leftover consumer (a route removed earlier), one message
	// delivered to it and not acknowledged.
	old, err := e.js.CreateOrUpdateConsumer(e.ctx(), "EVENTS", jetstream.ConsumerConfig{
		Durable: "old", FilterSubjects: []string{"events.>"}, AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		e.publish(fmt.Sprintf("a-%d", i), "events.info.a.one")
	}
	for i := range 2 {
		e.publish(fmt.Sprintf("b-%d", i), "events.critical.b.one")
	}
	batch, err := old.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for range batch.Messages() {
	}
	if batch.Error() != nil {
		t.Fatal(batch.Error())
	}
	info, err := old.Info(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	if info.Delivered.Last == nil || info.NumAckPending != 1 || info.NumPending != 4 {
		t.Fatalf("old consumer: %+v", info)
	}
	last := info.Delivered.Last.UTC()

	wantList := fmt.Sprintf(`NAME  ROUTE          PENDING  ACK PENDING  LAST DELIVERY
old   not in config  4        1            %s
ra    in config      3        0            never
rb    in config      2        0            never
`, last.Format(time.RFC3339))
	if r := runBridge(t, "consumer", "list", "--config", e.path); r.code != 0 || r.stdout != wantList || r.stderr != "" {
		t.Fatalf("consumer list: %s\nwant stdout:\n%s", r, wantList)
	}
	wantJSON := fmt.Sprintf(`{"name":"old","stream":"EVENTS","in_config":false,"pending":4,"ack_pending":1,"last_delivery":"%s"}
{"name":"ra","stream":"EVENTS","in_config":true,"pending":3,"ack_pending":0,"last_delivery":""}
{"name":"rb","stream":"EVENTS","in_config":true,"pending":2,"ack_pending":0,"last_delivery":""}
`, last.Format(time.RFC3339Nano))
	if r := runBridge(t, "consumer", "list", "--json", "--config", e.path); r.code != 0 || r.stdout != wantJSON || r.stderr != "" {
		t.Fatalf("consumer list --json: %s\nwant stdout:\n%s", r, wantJSON)
	}

	// A route of the file is refused, and stays
	r := runBridge(t, "consumer", "delete", "ra", "--yes", "--config", e.path)
	if want := "bridge: consumer delete: ra is a route of " + e.path + ": it is in force; remove the route from the file and reload every replica first\n"; r.code != 2 || r.stdout != "" || r.stderr != want {
		t.Fatalf("delete of a route in the file: %s\nwant stderr %q", r, want)
	}
	if !e.exists("ra") {
		t.Fatal("ra deleted although it is a route of the file")
	}
	// Control: the same name, once the route is out of the file, is deleted
	since := time.Now()
	r = runBridge(t, "consumer", "delete", "ra", "--yes", "--config", e.pathWithout)
	if want := "deleted consumer ra of stream EVENTS: it had 3 messages pending and 0 acknowledgements pending\n" +
		"its messages stay in the stream; a route named ra created again starts from the stream's first message matching its subjects, delivered ones included\n"; r.code != 0 || r.stdout != want {
		t.Fatalf("delete of ra out of the file: %s\nwant stdout:\n%s", r, want)
	}
	if got := auditLine(t, r, "consumer delete", since); got != "stream=EVENTS consumer=ra pending=3 ack_pending=0 result=deleted" || withoutAudit(t, r).stderr != "" {
		t.Fatalf("delete audit: %q\n%s", got, r)
	}
	if e.exists("ra") {
		t.Fatal("ra still exists after its deletion")
	}
	if r := runBridge(t, "consumer", "list", "--config", e.pathWithout); r.code != 0 || r.stdout != fmt.Sprintf(`NAME  ROUTE          PENDING  ACK PENDING  LAST DELIVERY
old   not in config  4        1            %s
rb    in config      2        0            never
`, last.Format(time.RFC3339)) {
		t.Fatalf("consumer list after the deletion: %s", r)
	}

	// Without --yes on a non-terminal stdin: refused, nothing deleted
	withStdin(t, func() { r = runBridge(t, "consumer", "delete", "old", "--config", e.path) })
	if r.code != 2 || r.stdout != "" || r.stderr != "bridge: consumer delete: stdin is not a terminal: give --yes to delete without a question\n" {
		t.Fatalf("delete without --yes: %s", r)
	}
	if !e.exists("old") {
		t.Fatal("old deleted without --yes")
	}
	// Control: with --yes it is gone, as JSON
	since = time.Now()
	// In use (one message handed out, not acknowledged): refused without
	// --force, nothing deleted; the control is --force below.
	withStdin(t, func() { r = runBridge(t, "consumer", "delete", "old", "--yes", "--config", e.path) })
	if want := "bridge: consumer delete: old is in use (0 pulls waiting, 1 acknowledgement pending): a bridge still pulls from it; reload every replica without the route, or give --force\n"; r.code != 1 || r.stdout != "" || withoutAudit(t, r).stderr != want {
		t.Fatalf("delete of a consumer in use: %s\nwant stderr %q", r, want)
	}
	if got := auditLine(t, r, "consumer delete", since); got != "stream=EVENTS consumer=old pending=4 ack_pending=1 result=in-use" {
		t.Fatalf("in-use audit: %q", got)
	}
	withStdin(t, func() {
		r = runBridge(t, "consumer", "delete", "old", "--yes", "--force", "--json", "--config", e.path)
	})
	if want := fmt.Sprintf(`{"name":"old","stream":"EVENTS","in_config":false,"pending":4,"ack_pending":1,"last_delivery":"%s","deleted":true}`+"\n", last.Format(time.RFC3339Nano)); r.code != 0 || r.stdout != want {
		t.Fatalf("delete --yes --json: %s\nwant stdout:\n%s", r, want)
	}
	if got := auditLine(t, r, "consumer delete", since); got != "stream=EVENTS consumer=old pending=4 ack_pending=1 result=deleted" {
		t.Fatalf("delete --json audit: %q", got)
	}
	if e.exists("old") {
		t.Fatal("old still exists after delete --yes")
	}
	// The messages stay in the stream
	st, err := e.js.Stream(e.ctx(), "EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	if si, err := st.Info(e.ctx()); err != nil || si.State.Msgs != 5 {
		t.Fatalf("stream after the deletions: %v, %v; want 5 messages", si, err)
	}

	// A consumer that does not exist: exit 1, audited
	r = runBridge(t, "consumer", "delete", "old", "--yes", "--config", e.path)
	if got := auditLine(t, r, "consumer delete", since); r.code != 1 || got != "stream=EVENTS consumer=old result=not-found" ||
		withoutAudit(t, r).stderr != "bridge: no consumer old on stream EVENTS (bridge consumer list shows them)\n" {
		t.Fatalf("delete of nothing: %s", r)
	}
	for _, out := range []string{wantList, wantJSON, r.stderr} {
		if l := leaks(out, "payload-Zq9", "events.info.a.one"); l != nil {
			t.Errorf("output holds %v", l)
		}
	}
}

// Bad usage exits 2 before connecting (the server named does not exist).
func TestConsumerUsage(t *testing.T) {
	unsetenv(t, "BRIDGE_CONFIG")
	path := writeDLQConfig(t, "nats://127.0.0.1:1", "127.0.0.1:4222", "http://127.0.0.1:1")
	for _, c := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"consumer", "delete", "--yes"}, "bridge: consumer delete takes exactly one NAME, got 0 arguments\n"},
		{[]string{"consumer", "delete", "a", "b", "--yes"}, "bridge: consumer delete takes exactly one NAME, got 2 arguments\n"},
		{[]string{"consumer", "delete", "a.b", "--yes"}, "bridge: consumer delete: \"a.b\" is not a route name ([A-Za-z0-9_-]+)\n"},
		{[]string{"consumer", "delete", "a\x1b[2Jb", "--yes"}, "bridge: consumer delete: \"a\\x1b[2Jb\" is not a route name ([A-Za-z0-9_-]+)\n"},
	} {
		if r := runBridge(t, append(c.args, "--config", path)...); r.code != 2 || r.stdout != "" || r.stderr != c.stderr {
			t.Errorf("%q: %s\nwant stderr %q", c.args, r, c.stderr)
		}
	}
	if r := runBridge(t, "consumer", "list", "extra", "--config", path); r.code != 2 || r.stdout != "" {
		t.Errorf("consumer list with an argument: %s", r)
	}
}

// A route deleted, then given back to the file: the bridge creates its
// consumer again, which starts from the stream's first message, so the
// events the old consumer had delivered are delivered again (deliver
// policy all, as the docs say). Control: a restart with the consumer kept
// delivers only the event published meanwhile.
func TestConsumerDeletedRouteComesBack(t *testing.T) {
	e := newConsumerEnv(t)
	ids := func() []string {
		var ids []string
		for _, req := range e.sink.Requests() {
			ids = append(ids, req.Header.Get(sinktest.EventIDHeader))
		}
		slices.Sort(ids)
		return ids
	}
	settled := func(seq uint64) {
		natstest.Eventually(t, 15*time.Second, func() error {
			c, err := e.js.Consumer(e.ctx(), "EVENTS", "ra")
			if err != nil {
				return err
			}
			i, err := c.Info(e.ctx())
			if err != nil {
				return err
			}
			if i.NumPending != 0 || i.NumAckPending != 0 || i.AckFloor.Stream != seq {
				return fmt.Errorf("ra: pending %d, ack pending %d, ack floor %d", i.NumPending, i.NumAckPending, i.AckFloor.Stream)
			}
			return nil
		})
	}
	stop := e.runBridgeUntil(e.path)
	e.publish("a-1", "events.info.a.one")
	e.publish("a-2", "events.info.a.two")
	e.sink.WaitCount(t, 2, 15*time.Second)
	settled(2)
	stop()

	// Control: restarted with its consumer, the route delivers what is new only
	e.publish("a-3", "events.info.a.three")
	stop = e.runBridgeUntil(e.path)
	e.sink.WaitCount(t, 3, 15*time.Second)
	settled(3)
	stop()
	if got, want := ids(), []string{"a-1", "a-2", "a-3"}; !slices.Equal(got, want) {
		t.Fatalf("event ids delivered after a restart with the consumer kept: %v, want %v", got, want)
	}
	// The stopped bridge's last pull request leaves the server when its
	// unsubscription arrives (or it expires): until then the consumer
	// counts as in use, and delete refuses it without --force.
	e.waitIdle("ra")

	if r := runBridge(t, "consumer", "delete", "ra", "--yes", "--config", e.pathWithout); r.code != 0 ||
		!strings.HasPrefix(r.stdout, "deleted consumer ra of stream EVENTS: it had 0 messages pending and 0 acknowledgements pending\n") {
		t.Fatalf("delete: %s", r)
	}
	e.runBridgeUntil(e.path)
	e.sink.WaitCount(t, 6, 15*time.Second)
	settled(3)
	if got, want := ids(), []string{"a-1", "a-1", "a-2", "a-2", "a-3", "a-3"}; !slices.Equal(got, want) {
		t.Fatalf("event ids delivered %v, want %v", got, want)
	}
}

// The transcript of docs/operating.md#removing-a-route-for-good, run: its
// commands against a server holding what it shows (config/sotercare.yaml's
// ordered route, which has no consumer on the stream, and a leftover
// family-digest consumer), its outputs compared
// line for line, times aside.
func TestConsumerDocsTranscript(t *testing.T) {
	unsetenv(t, "BRIDGE_CONFIG")
	doc, err := os.ReadFile("../../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Removing a route for good\n")
	if !ok {
		t.Fatal("docs/operating.md has no section Removing a route for good")
	}
	_, block, ok := strings.Cut(section, "\n```\n$ ")
	block, _, ok2 := strings.Cut(block, "\n```\n")
	if !ok || !ok2 {
		t.Fatal("the section has no transcript")
	}
	type step struct {
		args []string
		want string
	}
	var steps []step
	for _, l := range strings.SplitAfter("$ "+block+"\n", "\n") {
		if cmd, ok := strings.CutPrefix(l, "$ go run ./cmd/bridge "); ok {
			steps = append(steps, step{args: strings.Fields(strings.ReplaceAll(cmd, "config/", "../../config/"))})
		} else if len(steps) > 0 {
			steps[len(steps)-1].want += l
		}
	}
	if len(steps) != 2 {
		t.Fatalf("%d commands in the transcript, want 2", len(steps))
	}

	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL())
	cfg, err := config.LoadFile("../../config/sotercare.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg.NATS.URL = config.Secret(srv.URL())
	b, err := bridge.New(cfg, js, bridge.Options{Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := b.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, "EVENTS", jetstream.ConsumerConfig{
		Durable: "family-digest", FilterSubjects: []string{"events.info.care.family.>"}, AckPolicy: jetstream.AckExplicitPolicy,
	}); err != nil {
		t.Fatal(err)
	}
	publish := func(subject string, n int) {
		for range n {
			if _, err := js.Publish(ctx, subject, []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// take fetches one message from the consumer, acknowledged or not.
	take := func(name string, ack bool) {
		c, err := js.Consumer(ctx, "EVENTS", name)
		if err != nil {
			t.Fatal(err)
		}
		m, err := c.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if ack {
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish("events.info.care.family.digest", 15)
	take("family-digest", true)

	times := regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`)
	for _, s := range steps {
		r := runBridge(t, append(s.args, "--server", srv.URL())...)
		if r.code != 0 {
			t.Fatalf("%v: %s", s.args, r)
		}
		if got, want := times.ReplaceAllString(r.stdout, "TIME"), times.ReplaceAllString(s.want, "TIME"); got != want {
			t.Errorf("%v:\n got:\n%s\nthe docs show:\n%s", s.args, r.stdout, s.want)
		}
	}
	if _, err := js.Consumer(ctx, "EVENTS", "family-digest"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("family-digest after the transcript: %v, want deleted", err)
	}
}

// Against the store of a stopped embedded bridge the commands serve it
// privately, as the dlq commands do: list shows its consumers, delete
// deletes one for good (gone the next time the store is served).
func TestConsumerStoppedEmbeddedStore(t *testing.T) {
	unsetenv(t, "NATS_URL")
	unsetenv(t, "BRIDGE_CONFIG")
	path := writeDLQConfigFrom(t, dlqConfigWithoutRA, "", freePort(t), "http://127.0.0.1:1/")
	cfg, err := config.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// What a bridge left: its streams and consumer rb, and ra's consumer
	// (a route since removed from the file).
	srv, err := embedded.Start(context.Background(), embedded.Options{StoreDir: cfg.NATS.Embedded.StoreDir, NoListen: true})
	if err != nil {
		t.Fatal(err)
	}
	nc, js, err := dialPrivate(cfg, srv)
	if err != nil {
		srv.Shutdown()
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	b, err := bridge.New(cfg, js, bridge.Options{Logger: zerolog.Nop()})
	if err == nil {
		err = b.Provision(ctx)
	}
	if err == nil {
		_, err = js.CreateOrUpdateConsumer(ctx, "EVENTS", jetstream.ConsumerConfig{Durable: "ra", FilterSubjects: []string{"events.info.a.>"}, AckPolicy: jetstream.AckExplicitPolicy})
	}
	if err == nil {
		_, err = js.Publish(ctx, "events.info.a.one", []byte(`{}`))
	}
	nc.Close()
	srv.Shutdown()
	if err != nil {
		t.Fatal(err)
	}

	want := `NAME  ROUTE          PENDING  ACK PENDING  LAST DELIVERY
ra    not in config  1        0            never
rb    in config      0        0            never
`
	if r := runBridge(t, "consumer", "list", "--config", path); r.code != 0 || r.stdout != want || r.stderr != "" {
		t.Fatalf("consumer list on the stopped store: %s\nwant stdout:\n%s", r, want)
	}
	r := runBridge(t, "consumer", "delete", "ra", "--yes", "--config", path)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "deleted consumer ra of stream EVENTS: it had 1 message pending and 0 acknowledgements pending\n") {
		t.Fatalf("consumer delete on the stopped store: %s", r)
	}
	want = `NAME  ROUTE      PENDING  ACK PENDING  LAST DELIVERY
rb    in config  0        0            never
`
	if r := runBridge(t, "consumer", "list", "--config", path); r.code != 0 || r.stdout != want || r.stderr != "" {
		t.Fatalf("consumer list after the deletion: %s\nwant stdout:\n%s", r, want)
	}
}

// A server without the source stream: both commands exit 1 saying so, and
// delete writes no audit line (it had nothing to work on).
func TestConsumerMissingStream(t *testing.T) {
	unsetenv(t, "BRIDGE_CONFIG")
	srv := natstest.Start(t)
	path := writeDLQConfig(t, srv.URL(), "127.0.0.1:4222", "http://127.0.0.1:1/")
	const want = "bridge: stream EVENTS does not exist (has the bridge run with this configuration?)\n"
	for _, args := range [][]string{{"consumer", "list"}, {"consumer", "delete", "old", "--yes"}} {
		if r := runBridge(t, append(args, "--config", path)...); r.code != 1 || r.stdout != "" || r.stderr != want {
			t.Errorf("%v: %s\nwant stderr %q", args, r, want)
		}
	}
}

package test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/jetbridgetest"
)

// The cluster scenario (reliability.md 4, row 4), sized for 2 cores.
const (
	clusterEvents   = 500
	clusterRate     = 100 // events published per second
	clusterInFlight = 16  // the route's max_in_flight
	clusterFaults   = 3   // stream stepdown, consumer stepdown, loss of the leader node
	// clusterMaxStall is the longest the destination may see no request
	// while an event is stored and not yet delivered.
	clusterMaxStall = 5 * time.Second
	clusterRoute    = "cluster"
	clusterSubject  = "events.info.cluster.tick"
	clusterStream   = "EVENTS"
	clusterDLQ      = "EVENTS_DLQ"

	clusterPublishTry   = time.Second // per publish try
	clusterPublishTries = 20          // then the publish has failed
	// clusterBudget bounds the whole scenario, failures included: each
	// wait gets what is left of it. A passing run takes 7 to 15 s.
	clusterBudget = 50 * time.Second
)

const clusterYAML = `
stream:
  replicas: 3
dead_letter:
  replicas: 3
shutdown_timeout: 2s
destinations:
  sink:
    url: %s/events
    timeout: 2s
routes:
  - name: ` + clusterRoute + `
    subjects: ["events.>"]
    destination: sink
    ack_wait: 2s
    max_in_flight: %d
    max_deliver: 10
    backoff: [100ms]
`

// Cluster: a 3-node in-process JetStream cluster with an R3 stream, R3
// dead-letter stream and R3 consumers. 500 events are published at 100/s
// (retrying a failed publish with the same Nats-Msg-Id) while the stream
// leadership and then the consumer leadership move to one node, which is
// then shut down: the stream leader, the consumer leader and the server the
// bridge and the producer are connected to, all at once. Every event is
// delivered, duplicates stay within max_in_flight per fault, the
// destination never waits more than 5 s while an event is outstanding, and
// the stream holds exactly the 500 events.
func TestClusterLeaderChangesLoseNothing(t *testing.T) {
	begin := time.Now()
	deadline := begin.Add(clusterBudget)
	left := func() time.Duration { return max(time.Until(deadline), time.Second) }
	// Given a 3-node cluster, a destination answering 200 after 0-20 ms,
	// and a configuration with R3 streams.
	c := natstest.StartCluster(t, 3)
	sink := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(func(r jetbridgetest.Request) jetbridgetest.Response {
		return jetbridgetest.Response{Delay: time.Duration(r.N%5) * 5 * time.Millisecond}
	}))
	cfg, err := config.Load(fmt.Appendf(nil, clusterYAML, sink.URL(), clusterInFlight), "cluster.yaml")
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	_, adminJS := natstest.Connect(t, c.URLs(), nats.Name("cluster-admin"))

	// The streams and the consumer are provisioned first, so that the node
	// to lose can be picked: one that leads neither the stream nor the
	// consumer yet.
	pre, err := bridge.New(cfg, adminJS, bridge.Options{})
	if err != nil {
		t.Fatalf("bridge.New: %v", err)
	}
	pctx, cancel := context.WithTimeout(t.Context(), min(20*time.Second, left()))
	if err := pre.Provision(pctx); err != nil {
		cancel()
		t.Fatalf("Provision on the cluster: %v", err)
	}
	cancel()
	clusterAssertReplicas(t, adminJS)
	streamLead := c.WaitStreamLeader(t, adminJS, clusterStream)
	consLead := c.ConsumerLeader(adminJS, clusterStream, clusterRoute)
	victim := -1
	for i := range c.Size() {
		if i != streamLead && i != consLead {
			victim = i
			break
		}
	}
	t.Logf("stream leader %s, consumer leader %s: %s will take both leaderships and be shut down",
		c.Name(streamLead), c.Name(consLead), c.Name(victim))

	// The test's own connection, for stepdowns and checks, is on the two
	// nodes that stay up; the bridge and the producer connect to the
	// victim first and to the others on failure.
	var survivors []string
	for i := range c.Size() {
		if i != victim {
			survivors = append(survivors, c.Node(i).URL())
		}
	}
	adminNC, adminJS := natstest.Connect(t, strings.Join(survivors, ","), nats.Name("cluster-admin"))
	victimFirst := c.Node(victim).URL() + "," + strings.Join(survivors, ",")

	// When the bridge runs in-process, connected to every node.
	logs := &clusterLogBuffer{}
	log := zerolog.New(logs).Level(zerolog.DebugLevel)
	bnc, bjs := clusterConnect(t, victimFirst, "cluster-bridge", log)
	if got := bnc.ConnectedServerName(); got != c.Name(victim) {
		t.Fatalf("bridge connected to %s, want %s", got, c.Name(victim))
	}
	var settled clusterSettled
	b, err := bridge.New(cfg, bjs, bridge.Options{Logger: log, OnSettle: settled.add})
	if err != nil {
		t.Fatalf("bridge.New: %v", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- b.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		select {
		case <-runDone:
		case <-time.After(10 * time.Second):
			t.Errorf("bridge Run did not return within 10 s of cancel")
		}
		if t.Failed() || os.Getenv("JETBRIDGE_TEST_LOGS") != "" {
			t.Logf("bridge logs:\n%s", logs.String())
		}
	})
	select {
	case <-b.Ready():
	case err := <-runDone:
		t.Fatalf("bridge Run returned before ready: %v", err)
	case <-time.After(min(20*time.Second, left())):
		t.Fatal("bridge not ready in time")
	}

	// And 500 events are published at a steady rate.
	_, pjs := clusterConnect(t, victimFirst, "cluster-producer", log)
	ledger := natstest.NewLedger("cl", clusterEvents)
	pub := clusterPublish(pjs, ledger)

	// And, during the flow, the stream leadership moves to the victim, then
	// the consumer leadership, then the victim is shut down.
	clusterWaitPublished(t, pub, 100, left())
	c.MoveStreamLeader(t, adminNC, clusterStream, victim)
	clusterWaitPublished(t, pub, 200, left())
	c.MoveConsumerLeader(t, adminNC, clusterStream, clusterRoute, victim)
	clusterWaitPublished(t, pub, 300, left())
	if sl, cl := c.StreamLeader(adminJS, clusterStream), c.ConsumerLeader(adminJS, clusterStream, clusterRoute); sl != victim || cl != victim {
		t.Fatalf("before the shutdown: stream leader %d, consumer leader %d, want both %d", sl, cl, victim)
	}
	killed := time.Now()
	c.Shutdown(victim)
	t.Logf("%s shut down at +%s with %d events published", c.Name(victim), killed.Sub(begin).Round(time.Millisecond), pub.count.Load())
	newLead := c.WaitStreamLeader(t, adminJS, clusterStream)
	t.Logf("new stream leader %s after %s", c.Name(newLead), time.Since(killed).Round(time.Millisecond))

	// Then every publish succeeds (with retries), every event reaches the
	// destination and the consumer becomes quiet.
	select {
	case <-pub.done:
	case <-time.After(left()):
		t.Fatalf("publisher not done within %s: %d published", clusterBudget, pub.count.Load())
	}
	if err := pub.err(); err != nil {
		t.Fatalf("publish: %v", err)
	}
	natstest.Eventually(t, left(), func() error {
		if n := len(clusterFirstArrivals(sink.Requests())); n < clusterEvents {
			return fmt.Errorf("%d of %d events delivered", n, clusterEvents)
		}
		return nil
	})
	natstest.WaitQuiet(t, adminJS, clusterStream, clusterRoute, left())
	reqs := sink.Requests()
	end := time.Now()

	// Accounting: none missing, none dead-lettered, duplicates bounded.
	ledger.Delivered(clusterEventIDs(reqs)...)
	ledger.ReadDeadLetters(t, adminJS, clusterDLQ)
	report, err := ledger.Check()
	if err != nil {
		t.Fatalf("ledger: %v", err)
	}
	if report.DeadLettered != 0 {
		t.Errorf("%d events dead-lettered, want 0 (the destination always answers 200)", report.DeadLettered)
	}
	if max := clusterFaults * clusterInFlight; report.DuplicateCount > max {
		t.Errorf("%d duplicate deliveries, want at most %d (max_in_flight %d per fault, %d faults)",
			report.DuplicateCount, max, clusterInFlight, clusterFaults)
	}

	// No stall: the destination never waited long while an event was
	// outstanding.
	stall := clusterLongestStall(pub.stored(), clusterArrivals(reqs), end)
	if stall.d > clusterMaxStall {
		t.Errorf("longest stall %s (ending at +%s, %s waiting), want at most %s", stall.d.Round(time.Millisecond),
			stall.end.Sub(begin).Round(time.Millisecond), stall.id, clusterMaxStall)
	}

	// The stream holds exactly the 500 events, each once.
	ids := clusterStreamIDs(t, adminJS)
	if len(ids) != clusterEvents || !slices.Equal(clusterSorted(ids), clusterSorted(ledger.IDs())) {
		t.Errorf("stream holds %d messages, want exactly the %d published ids once each", len(ids), clusterEvents)
	}

	// The slowest event: one handed to a pull that died with its node
	// is redelivered only after ack_wait.
	var slowest time.Duration
	var slowestID string
	first := clusterFirstArrivals(reqs)
	for id, at := range pub.stored() {
		if d := first[id].Sub(at); d > slowest {
			slowest, slowestID = d, id
		}
	}
	outcomes := settled.counts()
	t.Logf("%d requests for %d events: %s; outcomes %v; slowest event %s (%s from PubAck to the destination)",
		len(reqs), clusterEvents, report, outcomes, slowestID, slowest.Round(time.Millisecond))
	t.Logf("longest stall %s (ending +%s, %s waiting; node lost at +%s); publish retries %d, longest publish %s; whole test %s",
		stall.d.Round(time.Millisecond), stall.end.Sub(begin).Round(time.Millisecond), stall.id, killed.Sub(begin).Round(time.Millisecond),
		pub.retries(), pub.maxLatency().Round(time.Millisecond), time.Since(begin).Round(time.Millisecond))

	// Negative controls: the same checks over doctored copies of what was
	// observed must fail.
	t.Run("negative control: a dropped event is missing", func(t *testing.T) {
		doctored := natstest.NewLedger("cl", clusterEvents)
		drop := ledger.ID(clusterEvents / 2)
		for _, id := range clusterEventIDs(reqs) {
			if id != drop {
				doctored.Delivered(id)
			}
		}
		if _, err := doctored.Check(); err == nil || !strings.Contains(err.Error(), drop) {
			t.Fatalf("ledger check passed without %s (err %v)", drop, err)
		}
	})
	t.Run("negative control: a 6 s gap is a stall", func(t *testing.T) {
		arr := clusterArrivals(reqs)
		mid := arr[len(arr)/2].at
		for i := range arr {
			if !arr[i].at.Before(mid) {
				arr[i].at = arr[i].at.Add(6 * time.Second)
			}
		}
		if s := clusterLongestStall(pub.stored(), arr, end.Add(6*time.Second)); s.d <= clusterMaxStall {
			t.Fatalf("stall detector reports %s over a 6 s gap, want more than %s", s.d, clusterMaxStall)
		}
	})
	t.Run("negative control: an undelivered event stalls until the end", func(t *testing.T) {
		arr := clusterArrivals(reqs)
		drop := ledger.ID(clusterEvents)
		arr = slices.DeleteFunc(arr, func(a clusterArrival) bool { return a.id == drop })
		if s := clusterLongestStall(pub.stored(), arr, end.Add(10*time.Second)); s.d <= clusterMaxStall || s.id != drop {
			t.Fatalf("stall detector reports %s (%s waiting) with %s never delivered, want more than %s", s.d, s.id, drop, clusterMaxStall)
		}
	})
}

// clusterAssertReplicas checks that the stream and the dead-letter stream
// have 3 replicas, and that the route's consumer inherits them: a cluster
// leader and 2 followers.
func clusterAssertReplicas(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, name := range []string{clusterStream, clusterDLQ} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		if r := s.CachedInfo().Config.Replicas; r != 3 {
			t.Errorf("stream %s has %d replicas, want 3", name, r)
		}
	}
	natstest.Eventually(t, 10*time.Second, func() error {
		cons, err := js.Consumer(ctx, clusterStream, clusterRoute)
		if err != nil {
			return err
		}
		info := cons.CachedInfo()
		if info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != 2 {
			return fmt.Errorf("consumer %s: config replicas %d, cluster %+v; want a leader and 2 followers",
				clusterRoute, info.Config.Replicas, info.Cluster)
		}
		return nil
	})
}

// clusterConnect connects like the bridge does in production (reconnect
// forever), with a short reconnect wait, to the servers in the order given.
func clusterConnect(t *testing.T, urls, name string, log zerolog.Logger) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return natstest.Connect(t, urls,
		nats.Name(name),
		nats.DontRandomize(),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond),
		nats.ReconnectJitter(0, 0),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Warn().Str("conn", name).AnErr("error", err).Msg("disconnected")
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info().Str("conn", name).Str("server", nc.ConnectedServerName()).Msg("reconnected")
		}),
	)
}

// clusterPublisher publishes the ledger's events in a goroutine.
type clusterPublisher struct {
	count atomic.Int64  // events published so far (PubAck received)
	done  chan struct{} // closed when every event was published or one failed

	mu       sync.Mutex
	at       map[string]time.Time     // PubAck time per id
	latency  map[string]time.Duration // first try to PubAck
	failed   error
	attempts int
}

// clusterPublish publishes event 1..N at clusterRate per second. A failed
// try is repeated with the same Nats-Msg-Id (the broker's dedup window
// makes that safe), each try bounded by clusterPublishTry, up to
// clusterPublishTries tries.
func clusterPublish(js jetstream.JetStream, ledger *natstest.Ledger) *clusterPublisher {
	p := &clusterPublisher{done: make(chan struct{}), at: map[string]time.Time{}, latency: map[string]time.Duration{}}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(time.Second / clusterRate)
		defer tick.Stop()
		for i := 1; i <= ledger.N(); i++ {
			<-tick.C
			id := ledger.ID(i)
			first := time.Now()
			var err error
			for try := 1; try <= clusterPublishTries; try++ {
				ctx, cancel := context.WithTimeout(context.Background(), clusterPublishTry)
				// nats.go itself waits and retries while nothing answers (a
				// leader election); other failures use up the try's timeout.
				_, err = js.Publish(ctx, clusterSubject, fmt.Appendf(nil, `{"n":%d}`, i), jetstream.WithMsgID(id),
					jetstream.WithRetryWait(50*time.Millisecond), jetstream.WithRetryAttempts(10))
				cancel()
				p.mu.Lock()
				p.attempts++
				p.mu.Unlock()
				if err == nil {
					break
				}
			}
			p.mu.Lock()
			if err != nil {
				p.failed = fmt.Errorf("%s: %d tries failed, the last: %w", id, clusterPublishTries, err)
				p.mu.Unlock()
				return
			}
			now := time.Now()
			p.at[id] = now
			p.latency[id] = now.Sub(first)
			p.mu.Unlock()
			p.count.Store(int64(i))
		}
	}()
	return p
}

func (p *clusterPublisher) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}

// stored returns the PubAck time of every published event.
func (p *clusterPublisher) stored() map[string]time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]time.Time, len(p.at))
	for id, at := range p.at {
		out[id] = at
	}
	return out
}

// retries is the number of publish tries that were repeats.
func (p *clusterPublisher) retries() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.attempts - len(p.at)
}

func (p *clusterPublisher) maxLatency() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var m time.Duration
	for _, d := range p.latency {
		m = max(m, d)
	}
	return m
}

// clusterWaitPublished waits until n events are published.
func clusterWaitPublished(t *testing.T, p *clusterPublisher, n int64, timeout time.Duration) {
	t.Helper()
	natstest.Eventually(t, timeout, func() error {
		if err := p.err(); err != nil {
			return err
		}
		if got := p.count.Load(); got < n {
			return fmt.Errorf("%d events published, waiting for %d", got, n)
		}
		return nil
	})
}

// clusterArrival is one request at the destination.
type clusterArrival struct {
	id string
	at time.Time
}

func clusterArrivals(reqs []jetbridgetest.Request) []clusterArrival {
	out := make([]clusterArrival, len(reqs))
	for i, r := range reqs {
		out[i] = clusterArrival{id: r.Header.Get(jetbridgetest.HeaderEventID), at: r.At}
	}
	return out
}

func clusterEventIDs(reqs []jetbridgetest.Request) []string {
	ids := make([]string, len(reqs))
	for i, r := range reqs {
		ids[i] = r.Header.Get(jetbridgetest.HeaderEventID)
	}
	return ids
}

// clusterFirstArrivals maps each event id to its first arrival.
func clusterFirstArrivals(reqs []jetbridgetest.Request) map[string]time.Time {
	first := make(map[string]time.Time, len(reqs))
	for _, r := range reqs {
		id := r.Header.Get(jetbridgetest.HeaderEventID)
		if at, ok := first[id]; !ok || r.At.Before(at) {
			first[id] = r.At
		}
	}
	return first
}

// clusterStall is a stretch of time during which the destination received
// nothing while an event was outstanding.
type clusterStall struct {
	d   time.Duration
	end time.Time // the arrival that ended it, or the end of observation
	id  string    // the event outstanding longest during it
}

// clusterLongestStall is the stall detector. An event is outstanding from
// its PubAck (stored) until its first arrival at the destination. A stall
// is a stretch of time with no arrival at all while some event is
// outstanding; it ends with the next arrival, or at end if nothing arrives
// any more. It returns the longest stall.
func clusterLongestStall(stored map[string]time.Time, arrivals []clusterArrival, end time.Time) clusterStall {
	arr := slices.Clone(arrivals)
	slices.SortFunc(arr, func(a, b clusterArrival) int { return a.at.Compare(b.at) })
	first := map[string]time.Time{}
	for _, a := range arr {
		if _, ok := first[a.id]; !ok {
			first[a.id] = a.at
		}
	}
	var longest clusterStall
	for k := 0; k <= len(arr); k++ {
		gapEnd := end
		if k < len(arr) {
			gapEnd = arr[k].at
		}
		// The earliest event stored before the gap ended and not
		// delivered before it ended.
		var since time.Time
		var waiting string
		for id, at := range stored {
			if !at.Before(gapEnd) {
				continue
			}
			if f, ok := first[id]; ok && f.Before(gapEnd) {
				continue
			}
			if since.IsZero() || at.Before(since) {
				since, waiting = at, id
			}
		}
		if since.IsZero() {
			continue
		}
		if k > 0 && arr[k-1].at.After(since) {
			since = arr[k-1].at
		}
		if d := gapEnd.Sub(since); d > longest.d {
			longest = clusterStall{d: d, end: gapEnd, id: waiting}
		}
	}
	return longest
}

// clusterStreamIDs reads the Nats-Msg-Id of every message in the stream
// with an ordered consumer.
func clusterStreamIDs(t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, clusterStream)
	if err != nil {
		t.Fatalf("stream %s: %v", clusterStream, err)
	}
	total := int(s.CachedInfo().State.Msgs)
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatalf("ordered consumer: %v", err)
	}
	var ids []string
	for len(ids) < total {
		batch, err := cons.Fetch(total-len(ids), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatalf("read stream %s: %v", clusterStream, err)
		}
		n := 0
		for m := range batch.Messages() {
			ids = append(ids, m.Headers().Get(jetstream.MsgIDHeader))
			n++
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			t.Fatalf("read stream %s: %v", clusterStream, err)
		}
		if n == 0 {
			t.Fatalf("read stream %s: %d of %d messages, then nothing", clusterStream, len(ids), total)
		}
	}
	return ids
}

func clusterSorted(ids []string) []string {
	out := slices.Clone(ids)
	slices.Sort(out)
	return out
}

// clusterSettled counts the bridge's settlements by outcome.
type clusterSettled struct {
	mu sync.Mutex
	n  map[string]int
}

func (s *clusterSettled) add(st bridge.Settled) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == nil {
		s.n = map[string]int{}
	}
	s.n[string(st.Outcome)]++
}

func (s *clusterSettled) counts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.n)
}

// clusterLogBuffer collects the bridge's log lines, each prefixed with
// the time in milliseconds (zerolog's own timestamp has seconds), to line
// them up with the servers' logs.
type clusterLogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *clusterLogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.WriteString(time.Now().Format("15:04:05.000 "))
	return b.buf.Write(p)
}

func (b *clusterLogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// The stall detector measures gaps in arrivals only while some event is
// outstanding, from when it was stored or from the previous arrival.
func TestClusterStallDetector(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	stored := map[string]time.Time{"a": at(0), "b": at(100), "c": at(5000)}
	cases := []struct {
		name     string
		arrivals []clusterArrival
		end      time.Time
		want     time.Duration
		wantID   string
	}{
		// a waits 300 ms; nothing is outstanding from 400 to 5000 ms
		// (an idle gap is no stall); c waits 200 ms.
		{"idle gap", []clusterArrival{{"a", at(300)}, {"b", at(400)}, {"c", at(5200)}}, at(6000), 300 * time.Millisecond, "a"},
		// b is outstanding from 100 ms; arrivals of others (a duplicate
		// of a) keep coming, so the stall is the longest gap: 1000 to
		// 3000 ms.
		{"gap while outstanding", []clusterArrival{{"a", at(50)}, {"a", at(1000)}, {"b", at(3000)}, {"c", at(5100)}}, at(6000), 2 * time.Second, "b"},
		// c never arrives: the stall runs to the end.
		{"never delivered", []clusterArrival{{"a", at(10)}, {"b", at(110)}}, at(9000), 4 * time.Second, "c"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := clusterLongestStall(stored, tc.arrivals, tc.end)
			if got.d != tc.want || got.id != tc.wantID {
				t.Fatalf("stall %s (%s waiting), want %s (%s)", got.d, got.id, tc.want, tc.wantID)
			}
		})
	}
}

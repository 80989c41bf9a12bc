package test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/jetbridgetest"
)

// Ordered delivery across replicas (docs/delivery.md#ordered-delivery),
// with the bridges as child processes built without the race detector
// (plainBinary): the bridge package's in-process tests cover the same code
// under -race.

// orderKeys and orderPerKey shape the ordering scenario: 10,000 events
// over 500 keys.
const (
	orderKeys   = 500
	orderPerKey = 20
	orderAck    = 2 * time.Second
)

// orderYAML is a configuration of route r from events.> to the sink, whose
// URL path names the replica ($JETBRIDGE_REPLICA), ordered by the subject's
// fourth token when ordered is set.
func orderYAML(natsURL, sinkURL string, ordered bool) string {
	ordering := ""
	if ordered {
		// Two partitions: with more, a replica that gains several at
		// once (after a kill or a NATS restart) can fill its buffer with
		// fenced messages and stall (a known limit, docs/delivery.md).
		ordering = "\n    ordering: {key: {tokens: [4]}, partitions: 2}"
	}
	return fmt.Sprintf(`nats:
  url: %s
admin:
  listen: ${JETBRIDGE_ADMIN_LISTEN:-}
log:
  format: json
shutdown_timeout: 5s
destinations:
  sink:
    url: %s/${JETBRIDGE_REPLICA:-x}
    timeout: 500ms
routes:
  - name: %s
    subjects: ["events.>"]
    destination: sink
    ack_wait: %s
    max_in_flight: 32
    max_deliver: 50
    backoff: [100ms]%s
`, natsURL, sinkURL, routeName, orderAck, ordering)
}

// orderLedger is the destination's view: the script it answers with
// (503 to one request in ten, no answer to one in a hundred, 200 to the
// rest, by arrival number) and the 200s it gave, in arrival order.
type orderLedger struct {
	mu   sync.Mutex
	oks  []orderOK
	reqs int
}

type orderOK struct {
	id   string
	at   time.Time
	path string
}

func (l *orderLedger) script(r jetbridgetest.Request) jetbridgetest.Response {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reqs++
	switch {
	case r.N%100 == 42:
		return jetbridgetest.Response{Hang: true}
	case r.N%10 == 7:
		return jetbridgetest.Response{Status: 503}
	}
	l.oks = append(l.oks, orderOK{id: r.EventID(), at: r.At, path: r.Path})
	return jetbridgetest.Response{}
}

// record is the script of a destination that answers 200 to everything.
func (l *orderLedger) record(r jetbridgetest.Request) jetbridgetest.Response {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reqs++
	l.oks = append(l.oks, orderOK{id: r.EventID(), at: r.At, path: r.Path})
	return jetbridgetest.Response{}
}

func (l *orderLedger) all() []orderOK {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]orderOK(nil), l.oks...)
}

// delivered is the number of distinct events that got a 200.
func (l *orderLedger) delivered() int {
	seen := map[string]bool{}
	for _, ok := range l.all() {
		seen[ok.id] = true
	}
	return len(seen)
}

func (l *orderLedger) waitDelivered(t *testing.T, n int, timeout time.Duration, procs ...*proc) {
	t.Helper()
	natstest.Eventually(t, timeout, func() error {
		for _, p := range procs {
			p.failIfExited(t)
		}
		if got := l.delivered(); got < n {
			return fmt.Errorf("%d of %d events delivered", got, n)
		}
		return nil
	})
}

// orderReport counts, over every key, the events of the key whose first
// 200 came before the first 200 of an event published before them
// (inversions of adjacent events), the events never delivered, and the
// events delivered more than once with the time of their first 200.
type orderReport struct {
	inversions int
	missing    int
	duplicates map[string]time.Time
	perPath    map[string]int
}

func (r orderReport) String() string {
	return fmt.Sprintf("%d inversions, %d missing, %d duplicates, first 200s per replica %v", r.inversions, r.missing, len(r.duplicates), r.perPath)
}

// orderEventID names event i of key k.
func orderEventID(prefix string, k, i int) string { return fmt.Sprintf("%s-%d-%d", prefix, k, i) }

func analyseOrder(oks []orderOK, prefix string, keys, perKey int) orderReport {
	first := map[string]int{}
	firstAt := map[string]time.Time{}
	r := orderReport{duplicates: map[string]time.Time{}, perPath: map[string]int{}}
	for n, ok := range oks {
		if _, seen := first[ok.id]; seen {
			r.duplicates[ok.id] = firstAt[ok.id]
			continue
		}
		first[ok.id], firstAt[ok.id] = n, ok.at
		r.perPath[ok.path]++
	}
	for k := range keys {
		prev := -1
		for i := range perKey {
			n, ok := first[orderEventID(prefix, k, i)]
			if !ok {
				r.missing++
				continue
			}
			if n < prev {
				r.inversions++
			}
			prev = max(prev, n)
		}
	}
	return r
}

// publishOrdered publishes perKey events for each of keys keys, key k on
// events.info.patient.k<k>, in rounds (event i of every key, in a shuffled
// key order, before event i+1 of any), on one connection: the stream's
// order is the publish order.
func publishOrdered(t *testing.T, js jetstream.JetStream, prefix string, keys, perKey int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range perKey {
		for _, k := range rng.Perm(keys) {
			id := orderEventID(prefix, k, i)
			msg := &nats.Msg{Subject: "events.info.patient.k" + strconv.Itoa(k), Header: nats.Header{}, Data: []byte(`{"n":` + strconv.Itoa(i) + `}`)}
			msg.Header.Set(jetstream.MsgIDHeader, id)
			msg.Header.Set("Event-Id", id)
			if _, err := js.PublishMsgAsync(msg); err != nil {
				t.Fatalf("publish %s: %v", id, err)
			}
		}
		// A round at a time: nats.go stalls a publisher with more than
		// 4,000 publishes unconfirmed.
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(time.Minute):
			t.Fatalf("%d publishes unconfirmed after a minute", js.PublishAsyncPending())
		}
	}
}

// waitOrderQuiet waits until route r holds nothing: for an ordered route its
// partitioned copy (a work queue) is empty, every message acknowledged or
// dead-lettered; otherwise its durable has nothing pending.
func waitOrderQuiet(t *testing.T, js jetstream.JetStream, ordered bool) {
	t.Helper()
	if !ordered {
		natstest.WaitQuiet(t, js, streamName, routeName, quietTimeout)
		return
	}
	natstest.Eventually(t, quietTimeout, func() error {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		s, err := js.Stream(ctx, config.CopyStream(streamName, routeName))
		if err != nil {
			return err
		}
		if n := s.CachedInfo().State.Msgs; n != 0 {
			return fmt.Errorf("the route's copy holds %d messages", n)
		}
		return nil
	})
}

// orderScenario is the run: 10,000 events over 500 keys, the
// destination answering 503 to 10 % of requests and never answering 1 %,
// two replicas, the one that delivered the most killed with SIGKILL after
// 3,000 deliveries and started again after 5,000, the NATS server
// restarted after 6,500.
//
// It returns the report and the spans of the two faults in which an
// event's first 200 means it was in flight at the fault: for the kill,
// from a second before it to 100 ms after it (a request the killed
// process sent may still be read by the destination); for the restart,
// from a second before the server went down to twice ack_wait after it was
// back (a message pulled before the restart may be sent after it, until the
// server hands it out again; the restart drops every pin, and an ack lost
// in the hand-backs that follow shows one ack_wait after the re-pin).
func orderScenario(t *testing.T, ordered bool) (orderReport, [2]faultSpan) {
	srv := jetbridgetest.NewServer(t)
	_, js := srv.Connect(t)
	led := &orderLedger{}
	sink := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(led.script))
	path := filepath.Join(t.TempDir(), "bridge.yaml")
	if err := os.WriteFile(path, []byte(orderYAML(srv.URL(), sink.URL(), ordered)), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := plainBinary(t)
	procs := map[string]*proc{
		"/a": runBinary(t, bin, path, "JETBRIDGE_REPLICA=a"),
		"/b": runBinary(t, bin, path, "JETBRIDGE_REPLICA=b"),
	}
	all := func() []*proc { return []*proc{procs["/a"], procs["/b"]} }
	const n = orderKeys * orderPerKey
	publishOrdered(t, js, "o", orderKeys, orderPerKey)

	led.waitDelivered(t, 3000, time.Minute, all()...)
	// The replica that delivered the most so far dies: it owns partitions.
	r := analyseOrder(led.all(), "o", orderKeys, orderPerKey)
	victim, other := "/a", "/b"
	if r.perPath["/b"] > r.perPath["/a"] {
		victim, other = other, victim
	}
	procs[victim].kill(t)
	killed := time.Now()
	led.waitDelivered(t, 5000, time.Minute, procs[other])
	procs[victim] = runBinary(t, bin, path, "JETBRIDGE_REPLICA="+victim[1:])
	led.waitDelivered(t, 6500, time.Minute, all()...)
	down := time.Now()
	srv.Shutdown()
	srv.Restart(t)
	up := time.Now()
	led.waitDelivered(t, n, 2*time.Minute, all()...)
	waitOrderQuiet(t, js, ordered)

	r = analyseOrder(led.all(), "o", orderKeys, orderPerKey)
	t.Logf("ordered=%t: %d requests; %s", ordered, led.reqs, r)
	return r, [2]faultSpan{{killed.Add(-time.Second), killed.Add(100 * time.Millisecond)}, {down.Add(-time.Second), up.Add(2 * orderAck)}}
}

// faultSpan is [from, to].
type faultSpan struct{ from, to time.Time }

func (s faultSpan) has(t time.Time) bool { return !t.Before(s.from) && !t.After(s.to) }

func (s faultSpan) String() string {
	return s.from.Format("15:04:05.000") + "–" + s.to.Format("15:04:05.000")
}

// 10,000 events over 500 keys arrive in publish order per key (the first
// 200 of each event), whatever the destination, a SIGKILL of one of two
// replicas and a NATS restart do; nothing is lost, and an event is
// delivered twice only if it was in flight at the kill or the restart
// (orderScenario's spans). Negative control: the same run without ordering shows
// inversions.
func TestOrderedAcrossReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("two runs of 10,000 events over two bridge processes")
	}
	r, faults := orderScenario(t, true)
	if r.inversions != 0 || r.missing != 0 {
		t.Errorf("ordered: %s; want 0 inversions, 0 missing", r)
	}
	for id, first := range r.duplicates {
		if !faults[0].has(first) && !faults[1].has(first) {
			t.Errorf("event %s delivered twice, first at %s: not in flight at the kill (%s) or the restart (%s)",
				id, first.Format("15:04:05.000"), faults[0], faults[1])
		}
	}
	t.Run("control: unordered", func(t *testing.T) {
		r, _ := orderScenario(t, false)
		if r.missing != 0 {
			t.Errorf("unordered: %s; want 0 missing", r)
		}
		if r.inversions == 0 {
			t.Errorf("unordered: %s; want inversions (the ordering assertion would catch nothing)", r)
		}
	})
}

package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
)

// orderedYAML is a configuration with route r on events.*.ord.> to the
// sink at url, ordered by token 4 (the key) when ordered, with the extra
// route settings given (a YAML flow mapping's tail).
func orderedYAML(url string, ordered bool, extra string) string {
	ord := ""
	if ordered {
		ord = ", ordering: {key: {tokens: [4]}, partitions: 8}"
	}
	return fmt.Sprintf(`
destinations:
  d:
    url: %s
    timeout: 1s
    circuit_breaker: {enabled: false}
routes:
  - {name: r, subjects: ["events.*.ord.>"], destination: d, ack_wait: 2s, max_deliver: 30, backoff: [50ms]%s%s}
`, url, ord, extra)
}

// orderSink is the destination of the ordering tests: it answers by a
// script on (event id, attempt) and records, per key, the first
// successful delivery of each event. Event ids are <key>-<index>.
type orderSink struct {
	sink *sinktest.Sink
	mu   sync.Mutex
	// firsts[key] is the indices of the key's events in the order of
	// their first 2xx; got[id] is when.
	firsts map[string][]int
	got    map[string]time.Time
	by     map[string]string // event id: the sink path (replica) of its first 2xx
}

// newOrderSink answers with status(id, attempt) (0: 200).
func newOrderSink(t testing.TB, status func(id string, attempt int) int) *orderSink {
	s := &orderSink{firsts: map[string][]int{}, got: map[string]time.Time{}, by: map[string]string{}}
	var mu sync.Mutex
	attempts := map[string]int{}
	s.sink = sinktest.New(t, func(r sinktest.Request) sinktest.Response {
		id := r.Header.Get(sinktest.EventIDHeader)
		mu.Lock()
		attempts[id]++
		n := attempts[id]
		mu.Unlock()
		if st := status(id, n); st != 0 && st != 200 {
			return sinktest.Response{Status: st}
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.got[id]; !ok {
			s.got[id] = time.Now()
			s.by[id] = r.Path
			k, i := splitID(id)
			s.firsts[k] = append(s.firsts[k], i)
		}
		return sinktest.Response{}
	})
	return s
}

func splitID(id string) (string, int) {
	k, i, _ := strings.Cut(id, "-")
	n, _ := strconv.Atoi(i)
	return k, n
}

// delivered is how many events had a 2xx.
func (s *orderSink) delivered() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.got)
}

func (s *orderSink) at(id string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got[id]
}

// inversions counts, over every key, the events whose first 2xx came
// after the first 2xx of a later event of the same key.
func (s *orderSink) inversions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, is := range s.firsts {
		top := -1
		for _, i := range is {
			if i < top {
				n++
			}
			top = max(top, i)
		}
	}
	return n
}

// inverted describes up to n keys whose events had their first 2xx out
// of order: the indices in the order of their first 2xx, each with the
// sink path that saw it and when (for a failure's diagnosis).
func (s *orderSink) inverted(n int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for key, is := range s.firsts {
		if len(out) == n {
			break
		}
		if slices.IsSorted(is) {
			continue
		}
		var b strings.Builder
		fmt.Fprintf(&b, "key %s:", key)
		for _, i := range is {
			id := fmt.Sprintf("%s-%d", key, i)
			fmt.Fprintf(&b, " %d (%s %s)", i, s.by[id], s.got[id].Format("15:04:05.000"))
		}
		out = append(out, b.String())
	}
	return strings.Join(out, "; ")
}

// flaky answers 503 to about a tenth of the tries, decided by a hash of
// the event id and the attempt (deterministic).
func flaky(id string, attempt int) int {
	h := fnv.New32a()
	fmt.Fprintf(h, "%s/%d", id, attempt)
	if h.Sum32()%10 == 0 {
		return 503
	}
	return 0
}

// publishKeys publishes perKey events to each of keys keys, interleaved
// (key by key for each index), as events.info.ord.<key> with event id
// <key>-<index> (also its Nats-Msg-Id).
func publishKeys(h *harness, keys, perKey int) {
	for i := range perKey {
		for k := range keys {
			key := "k" + strconv.Itoa(k)
			id := key + "-" + strconv.Itoa(i)
			h.publish("events.info.ord."+key, id, []byte(`{}`), map[string]string{"Event-Id": id})
		}
	}
}

// With a destination answering 503 to a tenth of the tries, an ordered
// route delivers every event of each key in publish order (0 inversions,
// counted on each event's first 2xx) and loses none: 2,000 events over
// 100 keys. The control is the same route without ordering: a 503's
// redelivery is overtaken by the key's later events (inversions > 0).
func TestOrderedDeliveryUnderFailures(t *testing.T) {
	const keys, perKey = 100, 20
	run := func(t testing.TB, ordered bool) (inv, got int, err error) {
		srv := natstest.Start(t)
		s := newOrderSink(t, flaky)
		// A backoff of 300 ms: longer than the route takes to work
		// through the 99 events of other keys published between two of
		// one key's, even on a loaded machine, so that without ordering
		// a redelivery is overtaken.
		y := strings.Replace(orderedYAML(s.sink.URL(), ordered, ", max_in_flight: 16"), "backoff: [50ms]", "backoff: [300ms]", 1)
		h := startHarness(t, srv, testConfig(t, "%s", y), faults{}, nil)
		publishKeys(h, keys, perKey)
		if !waitUntil(2*time.Minute, func() bool { return s.delivered() == keys*perKey }) {
			return s.inversions(), s.delivered(), fmt.Errorf("%d of %d events delivered", s.delivered(), keys*perKey)
		}
		if err := h.b.Readiness(); err != nil {
			return 0, 0, fmt.Errorf("not ready: %w", err)
		}
		return s.inversions(), s.delivered(), nil
	}
	inv, got, err := run(t, true)
	if err != nil {
		t.Fatal(err)
	}
	if inv != 0 || got != keys*perKey {
		t.Fatalf("ordered: %d inversions, %d of %d delivered; want 0 and all", inv, got, keys*perKey)
	}
	expectBroken(t, "the same route without ordering", func(t testing.TB) error {
		inv, _, err := run(t, false)
		if err != nil {
			return err
		}
		if inv > 0 {
			return fmt.Errorf("%d inversions", inv)
		}
		return nil
	})
}

// A redelivery with a 2 s backoff on key A holds A's later event and not
// key B's: B's events arrive during A's hold, A's second only after A's
// first succeeded. The control is the same route without ordering: A's
// first is handed back with NakWithDelay (nothing is held in the
// process), and A's second overtakes it.
func TestOrderedBackoffHoldsOnlyItsKey(t *testing.T) {
	run := func(t testing.TB, ordered bool) error {
		srv := natstest.Start(t)
		s := newOrderSink(t, func(id string, attempt int) int {
			if id == "kA-0" && attempt == 1 {
				return 503
			}
			return 0
		})
		cfg := testConfig(t, "%s", strings.Replace(orderedYAML(s.sink.URL(), ordered, ", max_in_flight: 4"), "backoff: [50ms]", "backoff: [2s]", 1))
		h := startHarness(t, srv, cfg, faults{}, nil)
		for _, id := range []string{"kA-0", "kA-1", "kB-0", "kB-1", "kB-2"} {
			k, _ := splitID(id)
			h.publish("events.info.ord."+k, id, []byte(`{}`), map[string]string{"Event-Id": id})
		}
		failed := time.Now()
		if !waitUntil(20*time.Second, func() bool { return s.delivered() == 5 }) {
			return fmt.Errorf("%d of 5 events delivered", s.delivered())
		}
		a0, a1 := s.at("kA-0"), s.at("kA-1")
		if !a1.After(a0) {
			return fmt.Errorf("kA-1 delivered %v before kA-0", a0.Sub(a1))
		}
		if d := a0.Sub(failed); d < 1900*time.Millisecond {
			return fmt.Errorf("kA-0 succeeded %v after the publish, before its 2s backoff", d)
		}
		for _, id := range []string{"kB-0", "kB-1", "kB-2"} {
			if !s.at(id).Before(a0) {
				return fmt.Errorf("%s waited for key A's backoff", id)
			}
		}
		if n, _ := counterValue(h.reg, "bridge_ordering_holds_total", map[string]string{"route": "r", "reason": "backoff"}); n != 1 {
			return fmt.Errorf("bridge_ordering_holds_total{reason=backoff} = %v, want 1", n)
		}
		return nil
	}
	if err := run(t, true); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "the same route without ordering: the redelivery handed back with NakWithDelay", func(t testing.TB) error {
		return run(t, false)
	})
}

// on_dead_letter block: key A's dead letter (a 400) stops A: its later
// events are held (the key shows blocked in /status) while B flows; the
// replay of the dead letter re-opens A at its head, and A's events then
// arrive in order. The control is the same route with on_dead_letter
// continue: A's later events are delivered before the replay.
func TestOrderedBlockUntilReplay(t *testing.T) {
	run := func(t testing.TB, mode string) error {
		srv := natstest.Start(t)
		s := newOrderSink(t, func(id string, attempt int) int {
			if id == "kA-1" && attempt == 1 {
				return 400
			}
			return 0
		})
		y := strings.Replace(orderedYAML(s.sink.URL(), true, ", max_in_flight: 4"), "partitions: 8}", "partitions: 8, on_dead_letter: "+mode+"}", 1)
		h := startHarness(t, srv, testConfig(t, "%s", y), faults{}, nil)
		for i := range 4 {
			for _, k := range []string{"kA", "kB"} {
				id := k + "-" + strconv.Itoa(i)
				h.publish("events.info.ord."+k, id, []byte(`{}`), map[string]string{"Event-Id": id})
			}
		}
		if !waitUntil(20*time.Second, func() bool { return s.delivered() >= 5 }) {
			return fmt.Errorf("%d events delivered, want kA-0 and key B's 4", s.delivered())
		}
		var dls []uint64
		if !waitUntil(10*time.Second, func() bool {
			dls = dls[:0]
			for _, m := range h.deadLetters() {
				dls = append(dls, m.Sequence)
			}
			return len(dls) == 1
		}) {
			return fmt.Errorf("%d dead letters, want 1", len(dls))
		}
		ord := h.b.routes[0].ord
		var st *OrderingStatus
		if !waitUntil(5*time.Second, func() bool {
			st = ord.status()
			return len(st.BlockedKeys) == 1 && st.BlockedKeys[0].Held == 2
		}) {
			return fmt.Errorf("status %+v, want key kA blocked holding 2; delivered %d", st, s.delivered())
		}
		if st.BlockedKeys[0].Key != "kA" || s.delivered() != 5 {
			return fmt.Errorf("blocked %+v, %d delivered; want kA and 5", st.BlockedKeys, s.delivered())
		}
		if got, ackPending := statusOrdering(t, h); len(got.BlockedKeys) != 1 || got.BlockedKeys[0].Key != "kA" || got.Partitions != 8 || ackPending != 2 {
			return fmt.Errorf("/status ordering %+v, ack_pending %d; want key kA blocked of 8 partitions, 2 ack pending", got, ackPending)
		}
		if !waitUntil(5*time.Second, func() bool { return strings.Contains(scrapeText(t, h), `bridge_ordering_blocked_keys{route="r"} 1`) }) {
			return fmt.Errorf("bridge_ordering_blocked_keys is not 1")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := deadletter.Open(h.js, h.cfg).Replay(ctx, dls[0], false); err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		if !waitUntil(20*time.Second, func() bool { return s.delivered() == 8 }) {
			return fmt.Errorf("%d of 8 events delivered after the replay", s.delivered())
		}
		if inv := s.inversions(); inv != 0 {
			return fmt.Errorf("%d inversions", inv)
		}
		if st := ord.status(); len(st.BlockedKeys) != 0 {
			return fmt.Errorf("still blocked after the replay: %+v", st.BlockedKeys)
		}
		return nil
	}
	if err := run(t, "block"); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "on_dead_letter continue", func(t testing.TB) error { return run(t, "continue") })
}

// Two replicas deliver an ordered route; the one owning the partitions
// stops mid-run (gracefully: it hands back and unpins; or as if it
// crashed: its NATS connection closes, while its HTTP attempts could go
// on), and the other takes its partitions over: every key's events still
// arrive in order and none is lost. The control is two replicas whose
// partitions are not pinned (no pin, fence or lease): both deliver one
// partition, and the same count finds inversions.
func TestOrderedAcrossReplicas(t *testing.T) {
	const keys, perKey = 100, 20
	run := func(t testing.TB, tweak func(*Bridge), crash bool) error {
		srv := natstest.Start(t)
		s := newOrderSink(t, flaky)
		// A 300 ms backoff: without pins, a key's redelivery on one
		// replica is overtaken by its next event on the other even on a
		// loaded machine (the control).
		y := strings.Replace(orderedYAML(s.sink.URL(), true, ", max_in_flight: 8"), "backoff: [50ms]", "backoff: [300ms]", 1)
		cfg := testConfig(t, "%s", y)
		hs := replicas(t, srv, cfg, tweak, 2)
		publishKeys(hs[0], keys, perKey)
		if !waitUntil(time.Minute, func() bool { return s.delivered() >= keys*perKey/3 }) {
			return fmt.Errorf("%d events delivered", s.delivered())
		}
		// The replica owning the most partitions stops: they move.
		o0, o1 := len(hs[0].b.routes[0].ord.status().Owned), len(hs[1].b.routes[0].ord.status().Owned)
		stop, owned := hs[0], o0
		if o1 > o0 {
			stop, owned = hs[1], o1
		}
		if owned == 0 {
			return fmt.Errorf("neither replica owns a partition")
		}
		t.Logf("the replica stopped owned %d of 8 partitions, the other %d (crash: %v)", owned, o0+o1-owned, crash)
		if crash {
			stop.nc.Close()
		} else {
			stop.stop()
		}
		if !waitUntil(time.Minute, func() bool { return s.delivered() == keys*perKey }) {
			return fmt.Errorf("%d of %d events delivered", s.delivered(), keys*perKey)
		}
		if inv := s.inversions(); inv != 0 {
			return fmt.Errorf("%d inversions", inv)
		}
		return nil
	}
	if err := run(t, nil, false); err != nil {
		t.Fatal(err)
	}
	t.Run("crash", func(t *testing.T) {
		if err := run(t, nil, true); err != nil {
			t.Fatal(err)
		}
	})
	expectBroken(t, "partitions not pinned: two replicas deliver one partition", func(t testing.TB) error {
		return run(t, func(b *Bridge) { b.routes[0].ord.cfg.pinned = false }, false)
	})
}

// statusOrdering is route r's ordering and ack pending in h's /status.
func statusOrdering(t testing.TB, h *harness) (OrderingStatus, int) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.b.AdminHandler(h.reg).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/status", nil))
	var out struct {
		Routes []struct {
			Ordering   *OrderingStatus `json:"ordering"`
			AckPending int             `json:"ack_pending"`
			Error      string          `json:"error"`
		} `json:"routes"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || len(out.Routes) != 1 || out.Routes[0].Ordering == nil || out.Routes[0].Error != "" {
		t.Fatalf("/status: %v: %s", err, rec.Body.String())
	}
	return *out.Routes[0].Ordering, out.Routes[0].AckPending
}

// scrapeText is h's /metrics.
func scrapeText(t testing.TB, h *harness) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.b.AdminHandler(h.reg).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	return rec.Body.String()
}

// A block is kept across a hand-over: key A is blocked by its dead letter
// on the replica owning its partition, that replica stops, and the other,
// which takes the partition over, keeps A's later events held (the block
// record in the bucket); deleting the record (what an operator does to
// unblock without a replay) lets them go, in order. The control deletes
// the record before the hand-over: the new owner then delivers them, so
// the check can fail.
func TestOrderedBlockSurvivesHandOver(t *testing.T) {
	run := func(t testing.TB, unrecordFirst bool) error {
		srv := natstest.Start(t)
		s := newOrderSink(t, func(id string, attempt int) int {
			if id == "kA-1" && attempt == 1 {
				return 400
			}
			return 0
		})
		y := strings.Replace(orderedYAML(s.sink.URL(), true, ", max_in_flight: 4"), "partitions: 8}", "partitions: 8, on_dead_letter: block}", 1)
		hs := replicas(t, srv, testConfig(t, "%s", y), nil, 2)
		pub := func(id string) {
			k, _ := splitID(id)
			hs[0].publish("events.info.ord."+k, id, []byte(`{}`), map[string]string{"Event-Id": id})
		}
		for _, id := range []string{"kA-0", "kA-1", "kA-2"} {
			pub(id)
		}
		var owner, other *harness
		if !waitUntil(20*time.Second, func() bool {
			for i, h := range hs {
				if st := h.b.routes[0].ord.status(); len(st.BlockedKeys) == 1 && st.BlockedKeys[0].Held == 1 {
					owner, other = h, hs[1-i]
					return true
				}
			}
			return false
		}) {
			return fmt.Errorf("key A not blocked holding kA-2; %d delivered", s.delivered())
		}
		kv, err := hs[0].js.KeyValue(context.Background(), "EVENTS_BRIDGE")
		if err != nil {
			return err
		}
		rec := "ord.r.blocked." + blockID("kA")
		if unrecordFirst {
			if err := kv.Delete(context.Background(), rec); err != nil {
				return err
			}
		}
		owner.stop()
		pub("kA-3")
		if !waitUntil(20*time.Second, func() bool {
			st := other.b.routes[0].ord.status()
			blocked := len(st.BlockedKeys) == 1 && st.BlockedKeys[0].Key == "kA" && st.BlockedKeys[0].Held == 2
			return len(st.Owned) > 0 && len(st.Fenced) == 0 && blocked || s.delivered() > 1
		}) {
			return fmt.Errorf("the other replica did not take key A's partition over (%+v); %d delivered", other.b.routes[0].ord.status(), s.delivered())
		}
		if n := s.delivered(); n != 1 {
			return fmt.Errorf("%d events delivered after the hand-over, want only kA-0", n)
		}
		if err := kv.Delete(context.Background(), rec); err != nil {
			return err
		}
		if !waitUntil(20*time.Second, func() bool { return s.delivered() == 3 }) {
			return fmt.Errorf("%d of 3 delivered after the record was deleted", s.delivered())
		}
		if inv := s.inversions(); inv != 0 {
			return fmt.Errorf("%d inversions", inv)
		}
		return nil
	}
	if err := run(t, false); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "no block record at the hand-over", func(t testing.TB) error { return run(t, true) })
}

// A reload that changes a running route's ordering (added, changed or
// removed) is refused: the route's copy and consumers are made for it. Its
// other keys, and ordered routes added or removed, apply live. The
// control: a reloader that needs no restart for anything lets the
// ordering change through.
func TestReloadRefusesOrderedRouteChanges(t *testing.T) {
	sink := sinktest.New(t, nil)
	ordered := orderedYAML(sink.URL(), true, "")
	unordered := orderedYAML(sink.URL(), false, "")
	for _, tc := range []struct{ name, from, to string }{
		{"partitions changed", ordered, strings.Replace(ordered, "partitions: 8", "partitions: 4", 1)},
		{"ordering removed", ordered, unordered},
		{"ordering added", unordered, ordered},
	} {
		if got := orderedRestartKeys(testConfig(t, "%s", tc.from), testConfig(t, "%s", tc.to)); len(got) != 1 || !strings.HasPrefix(got[0], "routes[0].ordering (r: ") {
			t.Errorf("%s: restart keys %v", tc.name, got)
		}
	}
	renamed := strings.Replace(ordered, "name: r,", "name: r2,", 1)
	for _, tc := range []struct{ name, from, to string }{
		{"an unordered route's change", unordered, strings.Replace(unordered, "max_deliver: 30", "max_deliver: 31", 1)},
		{"an ordered route's other key", ordered, strings.Replace(ordered, "max_deliver: 30", "max_deliver: 31", 1)},
		{"an ordered route added and one removed", ordered, renamed},
	} {
		if got := orderedRestartKeys(testConfig(t, "%s", tc.from), testConfig(t, "%s", tc.to)); len(got) != 0 {
			t.Errorf("%s: restart keys %v, want none", tc.name, got)
		}
	}
	check := func(t testing.TB, rl reloader) error {
		srv := natstest.Start(t)
		h := startHarness(t, srv, testConfig(t, "%s", ordered), faults{}, withReloader(rl))
		err := h.b.Reload(context.Background(), testConfig(t, "%s", strings.Replace(ordered, "partitions: 8", "partitions: 4", 1)))
		var nr *NeedsRestartError
		if !errors.As(err, &nr) || len(nr.Keys) != 1 || !strings.HasPrefix(nr.Keys[0], "routes[0].ordering (r: ") {
			return fmt.Errorf("reload: %v, want a *NeedsRestartError naming routes[0].ordering", err)
		}
		return nil
	}
	if err := check(t, liveReload{}); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "restart keys ignored", func(t testing.TB) error { return check(t, brokenReload{ignoreRestart: true}) })
}

// A reload while an ordered route delivers, which moves its destination
// (another URL path) and raises max_in_flight from 8 to 16: every event of
// each key still arrives in publish order, across both destinations, and
// none is lost (1,000 events over 50 keys, a tenth answered 503). The
// retired route hands back what it holds and unpins; the new one gains
// the partitions behind a fence. The control is the same reload of the
// route without ordering: inversions.
func TestOrderedReloadKeepsOrder(t *testing.T) {
	const keys, perKey = 50, 20
	run := func(t testing.TB, ordered bool) error {
		srv := natstest.Start(t)
		s := newOrderSink(t, flaky)
		y := strings.Replace(orderedYAML(s.sink.URL()+"/v1", ordered, ", max_in_flight: 8"), "backoff: [50ms]", "backoff: [300ms]", 1)
		h := startHarness(t, srv, testConfig(t, "%s", y), faults{}, nil)
		publishKeys(h, keys, perKey)
		if !waitUntil(time.Minute, func() bool { return s.delivered() >= keys*perKey/4 }) {
			return fmt.Errorf("%d events delivered before the reload", s.delivered())
		}
		next := strings.Replace(strings.Replace(y, "/v1", "/v2", 1), "max_in_flight: 8", "max_in_flight: 16", 1)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := h.b.Reload(ctx, testConfig(t, "%s", next)); err != nil {
			return fmt.Errorf("reload: %w", err)
		}
		if !waitUntil(time.Minute, func() bool { return s.delivered() == keys*perKey }) {
			return fmt.Errorf("%d of %d events delivered", s.delivered(), keys*perKey)
		}
		by := map[string]int{}
		s.mu.Lock()
		for _, p := range s.by {
			by[p]++
		}
		s.mu.Unlock()
		t.Logf("first 2xx by destination path: %v", by)
		if by["/v1"]+by["/v2"] != keys*perKey || by["/v2"] == 0 {
			return fmt.Errorf("first 2xx by path %v: want all on /v1 and /v2, some on /v2", by)
		}
		if inv := s.inversions(); inv != 0 {
			return fmt.Errorf("%d inversions; %s", inv, s.inverted(3))
		}
		return nil
	}
	if err := run(t, true); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "the same reload without ordering", func(t testing.TB) error { return run(t, false) })
}

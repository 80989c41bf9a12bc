package bridge

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

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
		h := startHarness(t, srv, testConfig(t, "%s", orderedYAML(s.sink.URL(), ordered, ", max_in_flight: 16")), faults{}, nil)
		publishKeys(h, keys, perKey)
		if !waitUntil(2*time.Minute, func() bool { return s.delivered() == keys*perKey }) {
			return s.inversions(), s.delivered(), fmt.Errorf("%d of %d events delivered", s.delivered(), keys*perKey)
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

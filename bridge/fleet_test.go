package bridge

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/natstest"
)

// Fleet-wide flow control (fleet.go, docs/delivery.md#flow-control), with
// three replicas: three Bridge values on one server, each with its own
// connections, sharing the route's durable consumer as replicas do.

// perProcessRate replaces a bridge's rate limits by the per-process
// limiter alone, through the rate stage's source (the behaviour before
// fleet-wide limits): the negative control of the fleet's rate.
func perProcessRate(b *Bridge) {
	for _, d := range b.dests {
		cfg := b.cfg.Destinations[d.name]
		if cfg.RateLimit == nil {
			continue
		}
		p := *d.pipe.Load()
		p.rate = &rateWait{src: newLocalRate(cfg.RateLimit), d: d}
		d.replace(p.build())
	}
}

// unsharedPauses cuts a bridge's gates off the fleet's state: a pause is
// then neither shared nor, for lack of a shared one, seen (the negative
// control of the shared pause).
func unsharedPauses(b *Bridge) {
	for _, d := range b.dests {
		d.gate.fleet = &fleetHolder{}
	}
}

// maxPerSecond is the most arrivals in any span [a_i, a_i + 1 s).
func maxPerSecond(as []arrival) (int, time.Time) {
	most, at := 0, time.Time{}
	j := 0
	for i := range as {
		for j < len(as) && as[j].at.Sub(as[i].at) < time.Second {
			j++
		}
		if j-i > most {
			most, at = j-i, as[i].at
		}
	}
	return most, at
}

// countBetween counts the arrivals in [from, to).
func countBetween(as []arrival, from, to time.Time) int {
	n := 0
	for _, a := range as {
		if !a.at.Before(from) && a.at.Before(to) {
			n++
		}
	}
	return n
}

// A rate limit of 50/s holds for three replicas together: with a backlog
// of 900 events, no span of one second at the destination sees more than
// 55 requests (1.1 × the rate, CONTRACT section 2) and the first 8 s see at
// least 320; then one replica stops and the two others keep the rate from
// 1 s after its stop (the bound is one window, 100 ms; the second lets its
// drain end). The lower bounds are 0.8 × the rate here, where three
// replicas share a process built with -race on a loaded machine (358 of
// 360 was seen under load); the contract's 0.9 × over 20 s is asserted on
// bridge processes built without it (test/fleet_test.go). 8 s rather than 20: the bound
// of a second holds by construction for every window (quotas of 5 per
// 100 ms window), so 80 windows already cover every phase of the window
// grid many times; the mean is over 80 windows of 5.
func TestFleetRateLimit(t *testing.T) {
	check := func(t testing.TB, tweak func(*Bridge)) error {
		srv := natstest.Start(t)
		sink := newFlowSink(t, 2*time.Millisecond)
		cfg := testConfig(t, `
destinations:
  d:
    url: %s
    rate_limit: {requests: 50, per: 1s, burst: 5}
routes:
  - {name: r, subjects: ["events.>"], destination: d, max_in_flight: 16, ack_wait: 2s}
`, sink.srv.URL)
		hs := replicas(t, srv, cfg, tweak, 3)
		// More than the 8 + 4 s of the run can take at 50/s (600 and a
		// burst), with room for a slow stop and a late poll.
		const n = 900
		publishN(hs[0], "events.info.x", "e", n)
		const phase = 8 * time.Second
		if !sink.waitFor(time.Minute, func(as []arrival) bool { return len(as) == n || len(as) > 0 && time.Since(as[0].at) >= phase }) {
			return fmt.Errorf("no request arrived")
		}
		stopped := time.Now() // from the stop's start: its drain may take a while
		hs[2].stop()          // a replica stops: the two others take its share
		if !sink.waitFor(time.Minute, func(as []arrival) bool { return time.Since(stopped) >= 4*time.Second || len(as) == n }) {
			return fmt.Errorf("the run did not end")
		}
		as := sink.arrivals()
		if most, at := maxPerSecond(as); most > 55 {
			t.Logf("%d requests over %s", len(as), as[len(as)-1].at.Sub(as[0].at).Round(time.Millisecond))
			return fmt.Errorf("%d requests in the second from %s, want at most 55", most, at.Format("15:04:05.000"))
		}
		if got := countBetween(as, as[0].at, as[0].at.Add(phase)); got < 320 {
			return fmt.Errorf("%d requests in the first %s, want at least 320 (0.8 × 50/s)", got, phase)
		}
		if len(as) == n {
			return fmt.Errorf("the backlog ran out before the end of the run (%d requests)", len(as))
		}
		if got := countBetween(as, stopped.Add(time.Second), stopped.Add(4*time.Second)); got < 120 {
			return fmt.Errorf("%d requests from 1 s to 4 s after a replica stopped, want at least 120 (0.8 × 50/s)", got)
		}
		most, _ := maxPerSecond(as)
		t.Logf("%d requests over %s; the most in a second: %d; %d in the first %s; %d from 1 s to 4 s after the stop",
			len(as), as[len(as)-1].at.Sub(as[0].at).Round(time.Millisecond), most,
			countBetween(as, as[0].at, as[0].at.Add(phase)), phase, countBetween(as, stopped.Add(time.Second), stopped.Add(4*time.Second)))
		return nil
	}
	if err := check(t, nil); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "per-process rate limits", func(t testing.TB) error { return check(t, perProcessRate) })
}

// A Retry-After seen by one replica pauses the destination on all three:
// once the 429 is answered every replica's gate is paused, and no request
// arrives before the pause ends (2 s after the 429, the end shared to the
// millisecond).
func TestFleetRetryAfterPausesEveryReplica(t *testing.T) {
	check := func(t testing.TB, tweak func(*Bridge)) error {
		srv := natstest.Start(t)
		sink := newFlowSink(t, 0)
		sink.script = retryAfterFirst("2")
		cfg := testConfig(t, `
destinations:
  d:
    url: %s
    circuit_breaker: {enabled: false}
    concurrency: {max: 4}
routes:
  - {name: r, subjects: ["events.>"], destination: d, max_in_flight: 4, ack_wait: 1s}
`, sink.srv.URL)
		hs := replicas(t, srv, cfg, tweak, 3)
		hs[0].publish("events.info.x", "first", []byte(`{}`), nil)
		if !sink.waitFor(settleWait, func(as []arrival) bool { return len(as) == 1 }) {
			return fmt.Errorf("the first event never arrived")
		}
		paused := func() int {
			n := 0
			for _, h := range hs {
				if h.b.dests["d"].gate.Status().PausedFor != "" {
					n++
				}
			}
			return n
		}
		if !waitUntil(time.Second, func() bool { return paused() == len(hs) }) {
			return fmt.Errorf("%d of %d replicas paused after the 429", paused(), len(hs))
		}
		publishN(hs[0], "events.info.x", "e", 30)
		if !sink.waitFor(settleWait, func(as []arrival) bool { return len(as) >= 32 }) {
			return fmt.Errorf("%d requests arrived, want 32", len(sink.arrivals()))
		}
		as := sink.arrivals()
		if gap := as[1].at.Sub(as[0].at); gap < 2*time.Second-time.Millisecond {
			return fmt.Errorf("the next request came %s after the 429, want at least 2s", gap)
		}
		return nil
	}
	if err := check(t, nil); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "pauses not shared", func(t testing.TB) error { return check(t, unsharedPauses) })
}

// The quotas of a period's windows sum to its requests, for every phase.
func TestFleetWindowQuotas(t *testing.T) {
	for _, c := range []struct {
		requests int
		per      time.Duration
		windows  int
	}{{50, time.Second, 10}, {7, time.Second, 10}, {1000, time.Minute, 10}, {3, 50 * time.Millisecond, 5}} {
		r := newFleetRate(&config.RateLimit{Requests: c.requests, Per: config.Duration(c.per), Burst: 1}, "d", newGate(nil, "d", nil, zerolog.Nop()), nil)
		if r.windows != c.windows {
			t.Errorf("%d per %s: %d windows, want %d", c.requests, c.per, r.windows, c.windows)
		}
		for start := int64(0); start < int64(r.windows); start++ {
			sum, most := 0, 0
			for k := start; k < start+int64(r.windows); k++ {
				sum += r.quota(k)
				most = max(most, r.quota(k))
			}
			if sum != c.requests {
				t.Errorf("%d per %s from window %d: the quotas sum to %d", c.requests, c.per, start, sum)
			}
			if want := (c.requests + r.windows - 1) / r.windows; most > want {
				t.Errorf("%d per %s: a window's quota is %d, want at most %d", c.requests, c.per, most, want)
			}
		}
	}
}

// BenchmarkFleetRatePermit is the cost of one permit of a rate limit that
// never binds, asked by 8 goroutines: the per-process limiter alone, and
// the fleet-wide limit on a real server (leases: round trips per permit
// reported as incr/op).
//
//	go test -run '^$' -bench FleetRatePermit ./bridge
func BenchmarkFleetRatePermit(b *testing.B) {
	rl := &config.RateLimit{Requests: 1_000_000, Per: config.Duration(time.Second), Burst: 1000}
	b.Run("local", func(b *testing.B) {
		src := newLocalRate(rl)
		b.ReportAllocs()
		b.SetParallelism(4)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := src.wait(b.Context()); err != nil {
					b.Error(err)
				}
			}
		})
	})
	b.Run("fleet", func(b *testing.B) {
		srv := natstest.Start(b)
		_, js := natstest.Connect(b, srv.URL())
		cfg := testConfig(b, `
destinations:
  d: {url: "http://127.0.0.1:1", rate_limit: {requests: 1000000, per: 1s, burst: 1000}}
routes:
  - {name: r, subjects: ["events.>"], destination: d}
`)
		br := provisioned(b, cfg, js, faults{})
		d := br.dests["d"]
		src := d.pipe.Load().rate.src.(*fleetRate)
		before := fleetIncrs(b, br)
		b.ReportAllocs()
		b.ResetTimer()
		b.SetParallelism(4)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := src.wait(b.Context()); err != nil {
					b.Error(err)
				}
			}
		})
		b.StopTimer()
		b.ReportMetric(float64(fleetIncrs(b, br)-before)/float64(b.N), "incr/op")
	})
}

// fleetIncrs is how many leases the fleet's counter stream took.
func fleetIncrs(t testing.TB, b *Bridge) uint64 {
	t.Helper()
	s, err := b.js.Stream(t.Context(), fleetRateStreamName(b.cfg.Stream.Name))
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

// perProcessSlots makes a bridge's fixed concurrency limits per process
// again (the gate without its fleet slots): the negative control.
func perProcessSlots(b *Bridge) {
	for _, d := range b.dests {
		d.gate.slots = nil
	}
}

// A concurrency limit of 8 holds for three replicas together: with 200
// events and 30 ms per request, the destination never has more than 8
// requests in flight, and has 8 (the limit is used); each replica alone
// could have 8.
func TestFleetConcurrencyLimit(t *testing.T) {
	check := func(t testing.TB, tweak func(*Bridge)) error {
		srv := natstest.Start(t)
		sink := newFlowSink(t, 30*time.Millisecond)
		cfg := testConfig(t, `
destinations:
  d:
    url: %s
    concurrency: {max: 8}
routes:
  - {name: r, subjects: ["events.>"], destination: d, max_in_flight: 8, ack_wait: 2s}
`, sink.srv.URL)
		hs := replicas(t, srv, cfg, tweak, 3)
		const n = 200
		publishN(hs[0], "events.info.x", "e", n)
		if !sink.waitFor(time.Minute, func(as []arrival) bool { return len(as) >= n }) {
			return fmt.Errorf("%d of %d requests arrived", len(sink.arrivals()), n)
		}
		as := sink.arrivals()
		if got := maxInFlight(as); got != 8 {
			return fmt.Errorf("at most %d requests in flight at the destination, want 8", got)
		}
		return nil
	}
	if err := check(t, nil); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "per-process concurrency limits", func(t testing.TB) error { return check(t, perProcessSlots) })
}

// A replica that died holding every slot (its leases written, never
// renewed nor deleted) blocks the others until the slots expire, and no
// longer: the first request arrives between fleetSlotTTL and
// fleetSlotTTL + 1 s after its last write.
func TestFleetConcurrencySlotsOfADeadReplica(t *testing.T) {
	check := func(t testing.TB, tweak func(*Bridge)) error {
		srv := natstest.Start(t)
		sink := newFlowSink(t, 0)
		cfg := testConfig(t, `
destinations:
  d:
    url: %s
    concurrency: {max: 8}
routes:
  - {name: r, subjects: ["events.>"], destination: d, max_in_flight: 8, ack_wait: 2s}
`, sink.srv.URL)
		hs := replicas(t, srv, cfg, tweak, 2)
		kv, err := hs[0].js.KeyValue(t.Context(), fleetBucketName(cfg.Stream.Name))
		if err != nil {
			return err
		}
		written := time.Now()
		for i := range 8 {
			if _, err := kv.Create(t.Context(), slotKey("d", i), []byte("dead-1"), jetstream.KeyTTL(fleetSlotTTL)); err != nil {
				return fmt.Errorf("slot %d: %w", i, err)
			}
		}
		wrote := time.Now()
		publishN(hs[0], "events.info.x", "e", 20)
		if !sink.waitFor(time.Minute, func(as []arrival) bool { return len(as) >= 20 }) {
			return fmt.Errorf("%d of 20 requests arrived", len(sink.arrivals()))
		}
		first := sink.arrivals()[0].at
		t.Logf("first request %s after the dead replica's last write", first.Sub(wrote).Round(time.Millisecond))
		if first.Sub(written) < fleetSlotTTL {
			return fmt.Errorf("the first request came %s after the slots were taken, want at least %s", first.Sub(written), fleetSlotTTL)
		}
		if first.Sub(wrote) > fleetSlotTTL+time.Second {
			return fmt.Errorf("the first request came %s after the slots were taken, want at most %s", first.Sub(wrote), fleetSlotTTL+time.Second)
		}
		return nil
	}
	if err := check(t, nil); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "per-process concurrency limits", func(t testing.TB) error { return check(t, perProcessSlots) })
}

// A slot is written only at the revision it was seen at: a renewal at the
// lease's revision succeeds, a write at an older one (another replica's
// view from before) is refused.
func TestFleetSlotWrites(t *testing.T) {
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL())
	cfg := testConfig(t, `
destinations:
  d: {url: "http://127.0.0.1:1", concurrency: {max: 2}}
routes:
  - {name: r, subjects: ["events.>"], destination: d}
`)
	b := provisioned(t, cfg, js, faults{})
	f := b.fleet.load()
	key := slotKey("d", 0)
	rev1, err := f.writeSlot(t.Context(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.writeSlot(t.Context(), key, 0); !wrongLastSeq(err) {
		t.Fatalf("a second take of a free slot: %v, want a wrong-last-sequence refusal", err)
	}
	rev2, err := f.writeSlot(t.Context(), key, rev1)
	if err != nil {
		t.Fatalf("renewal: %v", err)
	}
	if _, err := f.writeSlot(t.Context(), key, rev1); !wrongLastSeq(err) {
		t.Fatalf("a write at a stale revision: %v, want a wrong-last-sequence refusal", err)
	}
	if err := f.kv.Delete(t.Context(), key, jetstream.LastRevision(rev2)); err != nil {
		t.Fatal(err)
	}
	e, err := f.kv.Watch(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Stop() }()
	marker := <-e.Updates()
	if marker == nil || marker.Operation() != jetstream.KeyValueDelete {
		t.Fatalf("after the release the watch shows %v, want a delete", marker)
	}
	if _, err := f.writeSlot(t.Context(), key, marker.Revision()); err != nil {
		t.Fatalf("taking a released slot at its marker's revision: %v", err)
	}
}

// replicas starts n bridges on srv with cfg and tweak, each with its own
// connections: replicas of one fleet.
func replicas(t testing.TB, srv *natstest.Server, cfg *config.Config, tweak func(*Bridge), n int) []*harness {
	t.Helper()
	hs := make([]*harness, n)
	for i := range hs {
		hs[i] = startHarness(t, srv, cfg, faults{}, tweak)
	}
	return hs
}

package bridge

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/natstest"
)

// balanceYAML is the route of the rebalancing tests: orderedYAML's with
// `partitions` partitions posting to url, max_in_flight 32 (B = 128, so
// that 4 partitions per replica stay within the known limit of
// docs/delivery.md: B ÷ 32) and a destination timeout of 500 ms (the sink
// answers at once), which leaves a partition's lease (ack_wait + 1 s, cut
// a timeout before its end) more than a pull's length of room.
func balanceYAML(url string, partitions int) string {
	y := orderedYAML(url, true, ", max_in_flight: 32")
	y = strings.Replace(y, "timeout: 1s", "timeout: 500ms", 1)
	return strings.Replace(y, "partitions: 8", "partitions: "+strconv.Itoa(partitions), 1)
}

// The NATS users of the rebalancing tests: "bridge" may do everything,
// "mute" everything but write a presence record (the seam of the
// negative controls: a replica that cannot announce itself).
var balanceUsers = []natstest.User{
	{Name: "bridge", Password: "bridge-pw"},
	{Name: "mute", Password: "mute-pw", DenyPublish: []string{"$KV.EVENTS_BRIDGE.ord.*.member.*"}},
}

// balanceFlow publishes rounds of events (round i: event <key>-<i> of each
// key) while the sink keeps up: a round goes out once all but the last
// two are delivered, so every partition gets messages all the time.
type balanceFlow struct {
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
	rounds int // published, read after done
	err    error
}

func startBalanceFlow(pub jetstream.JetStream, s *orderSink, keys int) *balanceFlow {
	f := &balanceFlow{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(f.done)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			for s.delivered() < (f.rounds-2)*keys {
				select {
				case <-f.stop:
					return
				case <-tick.C:
				}
			}
			select {
			case <-f.stop:
				return
			default:
			}
			for k := range keys {
				id := "k" + strconv.Itoa(k) + "-" + strconv.Itoa(f.rounds)
				msg := &nats.Msg{Subject: "events.info.ord.k" + strconv.Itoa(k), Data: []byte(`{}`), Header: nats.Header{}}
				msg.Header.Set(jetstream.MsgIDHeader, id)
				msg.Header.Set("Event-Id", id)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := pub.PublishMsg(ctx, msg)
				cancel()
				if err != nil {
					f.err = err
					return
				}
			}
			f.rounds++
		}
	}()
	return f
}

// end stops the flow and returns how many rounds it published.
func (f *balanceFlow) end() (int, error) {
	f.once.Do(func() { close(f.stop) })
	<-f.done
	return f.rounds, f.err
}

// wantShares is the owned counts P partitions spread over n replicas
// should end at, sorted.
func wantShares(p, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = p / n
		if i >= n-p%n {
			out[i]++
		}
	}
	return out
}

// rebalance runs an ordered route of `partitions` partitions on one
// replica (user users[0]) while events flow, until it owns every
// partition; then the others start (their users users[1:]). Within
// `bound` of the last start the owned counts must be the shares (see
// wantShares) with each replica's /status share equal to what it owns,
// and stay so while `hold` more rounds of events are delivered; then
// every event is delivered with 0 inversions and no replica lost a
// partition. It returns the replicas, for the caller's exact counts.
//
// strict: no partition moves at all during the hold. Otherwise a move
// that is not a shed is let through (a partition lost to its lease under
// load, see ordered_route.go, comes back), but no replica sheds during
// the hold, the counts are the shares again at its end, and the losses
// are logged instead of refused.
func rebalance(t testing.TB, partitions int, users []string, bound time.Duration, hold int, strict bool) ([]*harness, error) {
	const keys = 40
	srv := natstest.StartUsers(t, balanceUsers...)
	s := newOrderSink(t, flaky)
	// Each replica posts to its own path, so the sink tells who
	// delivered what.
	cfg := func(i int) *config.Config {
		return testConfig(t, "%s", balanceYAML(s.sink.URL()+"/r"+strconv.Itoa(i), partitions))
	}
	hs := []*harness{startHarnessAt(t, nil, srv.URLFor(t, users[0]), cfg(0), faults{}, nil)}
	flow := startBalanceFlow(hs[0].pub, s, keys)
	defer flow.end()
	owned := func() []int {
		out := make([]int, len(hs))
		for i, h := range hs {
			out[i] = len(h.b.routes[0].ord.status().Owned)
		}
		return out
	}
	if !waitUntil(20*time.Second, func() bool { return owned()[0] == partitions }) {
		return hs, fmt.Errorf("the first replica owns %d of %d partitions", owned()[0], partitions)
	}
	for i, u := range users[1:] {
		hs = append(hs, startHarnessAt(t, nil, srv.URLFor(t, u), cfg(i+1), faults{}, nil))
	}
	started := time.Now()
	want := wantShares(partitions, len(hs))
	balanced := func() bool {
		got := owned()
		slices.Sort(got)
		if !slices.Equal(got, want) {
			return false
		}
		for _, h := range hs {
			if st := h.b.routes[0].ord.status(); st.Members != len(hs) || st.Share != len(st.Owned) {
				return false
			}
		}
		return true
	}
	if !waitUntil(bound, balanced) {
		return hs, fmt.Errorf("%v after %v: owned %v, want %v (sorted)", bound, time.Since(started).Round(time.Millisecond), owned(), want)
	}
	took := time.Since(started)
	// Held while `hold` more rounds are delivered.
	sheds := func() []float64 {
		var out []float64
		for _, h := range hs {
			out = append(out, changes(h, "shed"))
		}
		return out
	}
	shed0 := sheds()
	from := s.delivered()
	var moved error
	waitUntil(time.Minute, func() bool {
		if strict && !balanced() {
			moved = fmt.Errorf("the partitions moved again after they were spread: owned %v", owned())
			return true
		}
		if got := sheds(); !slices.Equal(got, shed0) {
			moved = fmt.Errorf("a replica shed again after the partitions were spread: sheds %v, then %v; owned %v", shed0, got, owned())
			return true
		}
		return s.delivered() >= from+hold*keys
	})
	if moved != nil {
		return hs, moved
	}
	if !strict && !waitUntil(bound, balanced) {
		return hs, fmt.Errorf("not spread again after the hold: owned %v, want %v (sorted)", owned(), want)
	}
	rounds, err := flow.end()
	if err != nil {
		return hs, fmt.Errorf("publish: %w", err)
	}
	t.Logf("spread %v over %d replicas %v after the last start; held while %d events were delivered", owned(), len(hs), took.Round(time.Millisecond), s.delivered()-from)
	if !waitUntil(time.Minute, func() bool { return s.delivered() == rounds*keys }) {
		return hs, fmt.Errorf("%d of %d events delivered", s.delivered(), rounds*keys)
	}
	if inv := s.inversions(); inv != 0 {
		return hs, fmt.Errorf("%d inversions: %s", inv, inverted(s))
	}
	for i, h := range hs {
		if n := changes(h, "lost"); n != 0 && strict {
			return hs, fmt.Errorf("replica %d lost %v partitions", i, n)
		} else if n != 0 {
			t.Logf("replica %d lost %v partitions (its lease passed: a pull answered late under load)", i, n)
		}
	}
	return hs, nil
}

// inverted names, for each key with an inversion, the indices of its
// events in the order of their first 2xx, with the replica (sink path)
// and time of each.
func inverted(s *orderSink) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k, is := range s.firsts {
		if slices.IsSorted(is) {
			continue
		}
		var evs []string
		for _, i := range is {
			id := k + "-" + strconv.Itoa(i)
			evs = append(evs, fmt.Sprintf("%d@%s %s", i, s.by[id], s.got[id].Format("15:04:05.000")))
		}
		out = append(out, k+": "+strings.Join(evs, ", "))
	}
	return strings.Join(out, "; ")
}

// changes is h's bridge_partition_ownership_changes_total{route="r"} of
// change.
func changes(h *harness, change string) float64 {
	n, _ := counterValue(h.reg, "bridge_partition_ownership_changes_total", map[string]string{"route": "r", "change": change})
	return n
}

// A replica that joins takes its share: replica A alone owns the 8
// partitions while events flow; replica B starts, and A sheds 4, one at a
// time, which B takes: 4 each within 6 s of B's start (the bound is
// balanceSettle 1 s + 4 sheds 300 ms apart + the hand-over of each, a
// few ms while events flow: about 2.5 s, with room for a loaded machine),
// held while 800 more events are delivered, every event delivered in
// order. The changes are exact: A acquired 8 and shed 4, B acquired 4,
// none lost. The control is B without the right to write its presence
// record (a NATS permission): A never sees it, never sheds, and B owns
// none.
func TestOrderedRebalanceOnJoin(t *testing.T) {
	run := func(t testing.TB, joiner string) error {
		hs, err := rebalance(t, 8, []string{"bridge", joiner}, 6*time.Second, 20, true)
		if err != nil {
			return err
		}
		a, b := hs[0], hs[1]
		got := []float64{changes(a, "acquired"), changes(a, "shed"), changes(b, "acquired"), changes(b, "shed")}
		if !slices.Equal(got, []float64{8, 4, 4, 0}) {
			return fmt.Errorf("changes (A acquired, A shed, B acquired, B shed) = %v, want [8 4 4 0]", got)
		}
		if !strings.Contains(a.logs.String(), "partition shed") {
			return fmt.Errorf("no log line of the sheds")
		}
		return nil
	}
	if err := run(t, "bridge"); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "the joining replica cannot write its presence record", func(t testing.TB) error { return run(t, "mute") })
}

// Three replicas: A alone owns 16 partitions, B and C start; the
// partitions end spread 6/5/5 (each replica's share by the rank of its id)
// within 15 s (about 5 s on a quiet machine, 8 s under load), and no
// replica sheds again while 800 events are delivered, in order. The moves
// are not counted exactly here: a replica holding its share still makes
// short pulls (for liveness) and may, rarely, take a partition shed for
// the third, which it then sheds again; and with 16 partitions per replica
// a lease can pass under load (a pull answered late: ordered_route.go),
// the partition then coming back. The control: C cannot write its presence
// record, so A and B split the partitions 8/8 and C owns none.
func TestOrderedRebalanceThreeReplicas(t *testing.T) {
	run := func(t testing.TB, last string) error {
		hs, err := rebalance(t, 16, []string{"bridge", "bridge", last}, 15*time.Second, 20, false)
		if err != nil {
			return err
		}
		var shed []float64
		for _, h := range hs {
			shed = append(shed, changes(h, "shed"))
		}
		t.Logf("sheds by replica: %v", shed)
		return nil
	}
	if err := run(t, "bridge"); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "the third replica cannot write its presence record", func(t testing.TB) error { return run(t, "mute") })
}

// The shares: the live ids sorted, rank i owns P/n, one more when
// i < P mod n, so they sum to P; a record older than the TTL is not
// live; a replica whose own record is not written, or whose watch has not
// delivered the stored records, does not rebalance (zero view).
func TestBalanceShares(t *testing.T) {
	now := time.Now()
	ttl := 3 * time.Second
	view := func(parts int, self string, others map[string]time.Duration, mod func(*balancer)) balanceView {
		b := &balancer{id: self, ttl: ttl, parts: make([]balancePart, parts), members: map[string]time.Time{}, synced: true, written: now}
		for id, age := range others {
			b.members[id] = now.Add(-age)
		}
		if mod != nil {
			mod(b)
		}
		return b.viewLocked(now)
	}
	for _, tc := range []struct {
		name   string
		parts  int
		self   string
		others map[string]time.Duration
		mod    func(*balancer)
		want   balanceView
	}{
		{"alone", 8, "b", nil, nil, balanceView{1, 8}},
		{"two, 8", 8, "b", map[string]time.Duration{"a": 0}, nil, balanceView{2, 4}},
		{"three, 16, first", 16, "a", map[string]time.Duration{"b": 0, "c": time.Second}, nil, balanceView{3, 6}},
		{"three, 16, second", 16, "b", map[string]time.Duration{"a": 0, "c": time.Second}, nil, balanceView{3, 5}},
		{"three, 16, last", 16, "c", map[string]time.Duration{"a": 0, "b": 0}, nil, balanceView{3, 5}},
		{"more replicas than partitions", 2, "c", map[string]time.Duration{"a": 0, "b": 0}, nil, balanceView{3, 0}},
		{"a record past its TTL", 8, "b", map[string]time.Duration{"a": ttl + time.Millisecond}, nil, balanceView{1, 8}},
		{"own record failing", 8, "b", map[string]time.Duration{"a": 0}, func(b *balancer) { b.failing = true }, balanceView{}},
		{"own record never written", 8, "b", map[string]time.Duration{"a": 0}, func(b *balancer) { b.written = time.Time{} }, balanceView{}},
		{"own record too old", 8, "b", map[string]time.Duration{"a": 0}, func(b *balancer) { b.written = now.Add(-ttl - time.Millisecond) }, balanceView{}},
		{"watch not synced", 8, "b", map[string]time.Duration{"a": 0}, func(b *balancer) { b.synced = false }, balanceView{}},
	} {
		if got := view(tc.parts, tc.self, tc.others, tc.mod); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// Member ids read back from the bucket are 1 to 32 characters of [a-z0-9].
func TestValidMemberID(t *testing.T) {
	for id, want := range map[string]bool{
		memberID():              true,
		"0":                     true,
		strings.Repeat("a", 32): true,
		strings.Repeat("a", 33): false,
		"":                      false,
		"A1":                    false,
		"a.b":                   false,
		"a*":                    false,
		"a-b":                   false,
		"é":                     false,
	} {
		if got := validMemberID(id); got != want {
			t.Errorf("validMemberID(%q) = %v, want %v", id, got, want)
		}
	}
}

// A replica holding its share takes over a dead replica's partitions even
// while the dead one still looks alive: A and B own 4 partitions each, B's
// NATS connection closes (a crash, as far as NATS can tell) while a
// test-side actor keeps rewriting B's presence record, so A's share stays
// 4 and only its short pulls can find B's partitions. A owns all 8 within
// ack_wait + 1 s (B's pins lapse) + 1 s (one short-pull cycle) + 1.5 s of
// margin for a loaded machine, and every event is delivered in order. The
// control: B's connection stays open; then the check fails (B keeps its
// partitions), so it does not pass by itself.
func TestOrderedRebalanceTakeOverAtShare(t *testing.T) {
	const keys = 40
	run := func(t testing.TB, crash bool) error {
		srv := natstest.StartUsers(t, balanceUsers...)
		s := newOrderSink(t, flaky)
		cfg := testConfig(t, "%s", balanceYAML(s.sink.URL(), 8))
		hs := []*harness{startHarnessAt(t, nil, srv.URL(), cfg, faults{}, nil), startHarnessAt(t, nil, srv.URL(), cfg, faults{}, nil)}
		flow := startBalanceFlow(hs[0].pub, s, keys)
		defer flow.end()
		owned := func(h *harness) int { return len(h.b.routes[0].ord.status().Owned) }
		if !waitUntil(20*time.Second, func() bool { return owned(hs[0]) == 4 && owned(hs[1]) == 4 }) {
			return fmt.Errorf("not spread: owned %d and %d", owned(hs[0]), owned(hs[1]))
		}
		kv, err := hs[0].pub.KeyValue(context.Background(), "EVENTS_BRIDGE")
		if err != nil {
			return err
		}
		zombie := "ord.r.member." + hs[1].b.routes[0].ord.bal.id
		stop := make(chan struct{})
		actor := make(chan struct{})
		defer func() { close(stop); <-actor }()
		go func() { // B's record, kept alive whatever B does
			defer close(actor)
			tick := time.NewTicker(300 * time.Millisecond)
			defer tick.Stop()
			for {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_, _ = kv.Put(ctx, zombie, []byte("zombie"))
				cancel()
				select {
				case <-stop:
					return
				case <-tick.C:
				}
			}
		}()
		if crash {
			hs[1].nc.Close()
		}
		closed := time.Now()
		bound := 2*time.Second + time.Second + time.Second + 1500*time.Millisecond
		if !waitUntil(bound, func() bool { return owned(hs[0]) == 8 }) {
			return fmt.Errorf("A owns %d of 8 partitions %v after B's connection closed (crash: %v)", owned(hs[0]), bound, crash)
		}
		took := time.Since(closed)
		if st := hs[0].b.routes[0].ord.status(); st.Members != 2 || st.Share != 4 {
			return fmt.Errorf("A's view: %d members, share %d; want B still counted (2, 4)", st.Members, st.Share)
		}
		rounds, err := flow.end()
		if err != nil {
			return err
		}
		if !waitUntil(time.Minute, func() bool { return s.delivered() == rounds*keys }) {
			return fmt.Errorf("%d of %d events delivered", s.delivered(), rounds*keys)
		}
		if inv := s.inversions(); inv != 0 {
			return fmt.Errorf("%d inversions: %s", inv, inverted(s))
		}
		t.Logf("A took B's partitions over %v after B's connection closed, at its share", took.Round(time.Millisecond))
		return nil
	}
	if err := run(t, true); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "B alive", func(t testing.TB) error { return run(t, false) })
}

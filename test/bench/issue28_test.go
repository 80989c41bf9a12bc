package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/subjects"
)

// TestIssue28BridgeConfigs loads the bridge configurations of issue 28's
// scenarios with the bridge's own loader (what `bridge run` does with
// them): the ordered route keys on the token that carries the key of
// subjectOf, with the default partitions, and the rate limit is the one
// the scenario names, accepted by bridge check. The control: the same
// configuration keyed on a token outside the published subjects' key is
// a different key (the test would catch a key token that does not split
// the keys).
func TestIssue28BridgeConfigs(t *testing.T) {
	for _, sc := range issue28Scenarios(defaultOptions(true)) {
		for _, sys := range []system{sc.a, sc.b} {
			yaml := bridgeConfig(sys, "nats://127.0.0.1:4222", "127.0.0.1:0", "http://127.0.0.1:1/events", "bench0")
			cfg, err := config.Load([]byte(yaml), "bench.yaml")
			if err != nil {
				t.Fatalf("%s, %s: %v\n%s", sc.name, sys.label(), err, yaml)
			}
			route := cfg.Routes[0]
			if got := route.Ordering != nil; got != sys.ordered {
				t.Errorf("%s, %s: ordered %t, want %t", sc.name, sys.label(), got, sys.ordered)
			}
			if sys.ordered {
				if got := route.Ordering.Key.Tokens; len(got) != 1 || got[0] != keyToken {
					t.Errorf("%s: key tokens %v, want [%d]", sc.name, got, keyToken)
				}
				if route.Ordering.Partitions != 16 {
					t.Errorf("%s: %d partitions, want the default 16", sc.name, route.Ordering.Partitions)
				}
			}
			rl := cfg.Destinations["sink"].RateLimit
			if got := rl != nil; got != sys.rateLimit {
				t.Fatalf("%s, %s: rate limit %t, want %t", sc.name, sys.label(), got, sys.rateLimit)
			}
			if rl != nil && (rl.Requests != 1_000_000 || rl.Per.D() != time.Second || rl.Burst != 1000) {
				t.Errorf("%s: rate limit %+v, want %s", sc.name, *rl, fleetRateYAML)
			}
		}
	}
	// The key token of subjectOf: the third token differs between keys
	// and is the same for one key; the second (the control) is the same
	// for every key.
	token := func(subj string, i int) string { return strings.Split(subj, ".")[i-1] }
	keys := map[string]bool{}
	control := map[string]bool{}
	for seq := range 2 * orderedKeys {
		keys[token(subjectOf(seq, orderedKeys), keyToken)] = true
		control[token(subjectOf(seq, orderedKeys), keyToken-1)] = true
	}
	if len(keys) != orderedKeys || len(control) != 1 {
		t.Errorf("token %d gives %d keys (want %d), token %d gives %d (want 1)", keyToken, len(keys), orderedKeys, keyToken-1, len(control))
	}
	if a, b := subjectOf(0, orderedKeys), subjectOf(1, orderedKeys); a == b {
		t.Errorf("messages 0 and 1 share the key %s: the keys do not interleave", a)
	}
	if a, b := subjectOf(0, 1), subjectOf(7, 1); a != b {
		t.Errorf("one key: %s and %s", a, b)
	}
}

// TestSinkDelay checks the sink's added latency: a reset with delay_us
// makes each answer wait that long, one outside [0, 1 s] is refused, and
// a reset without it answers at once.
func TestSinkDelay(t *testing.T) {
	s := &sink{status: http.StatusAccepted, since: time.Now()}
	dest := httptest.NewServer(http.HandlerFunc(s.serveEvent))
	defer dest.Close()
	ctl := httptest.NewServer(s.controlHandler())
	defer ctl.Close()
	c := &sinkClient{dest: dest.URL + "/events", ctl: ctl.URL, hc: &http.Client{Timeout: 10 * time.Second}}
	post := func() time.Duration {
		t.Helper()
		t0 := time.Now()
		resp, err := http.Post(c.dest, "application/json", strings.NewReader(string(payload(0, 0))))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("status %d", resp.StatusCode)
		}
		return time.Since(t0)
	}
	const delay = 200 * time.Millisecond
	if err := c.resetDelayed(t.Context(), 1, http.StatusAccepted, 1, delay); err != nil {
		t.Fatal(err)
	}
	if d := post(); d < delay {
		t.Errorf("answered after %s with delay_us %d", d, delay.Microseconds())
	}
	for _, bad := range []time.Duration{-time.Microsecond, maxSinkDelay + time.Microsecond} {
		if err := c.resetDelayed(t.Context(), 1, http.StatusAccepted, 1, bad); err == nil {
			t.Errorf("reset with delay %s accepted", bad)
		}
	}
	// The control: without delay_us the same request is answered well
	// within the delay (the bound of the check above means something).
	if err := c.reset(t.Context(), 1, http.StatusAccepted, 1); err != nil {
		t.Fatal(err)
	}
	if d := post(); d >= delay {
		t.Errorf("answered after %s without a delay", d)
	}
}

// BenchmarkOrderedCopy measures the partitioned copy of an ordered route
// alone (docs/performance.md#ordered-delivery-and-fleet-limits-issue-28):
// b.N stored 1 KiB messages over 1,000 keys (or 10), then a copy stream made as
// the bridge makes it (work-queue retention, the route's partition
// transforms from subjects.Partitioner) sources them; the timer runs from
// the copy's creation until its last sequence reaches b.N (partitions=0:
// the same copy without the transform). No bridge,
// no consumer: what the JetStream server spends to copy a message, which
// the ordered scenario's server CPU includes. cpu-µs/msg is this
// process's CPU (the embedded server, and the client polling the copy's
// state every 5 ms) per message; publish-cpu-µs/msg is the same over the
// publishing of the messages into the source stream before the timer
// (the client's async publishes and the server storing them): what
// storing a message first-hand costs, to compare.
//
//	go test -run '^$' -bench OrderedCopy -benchtime 10000x ./test/bench
func BenchmarkOrderedCopy(b *testing.B) {
	// partitions=0: the same copy without a subject transform, to tell
	// the transform's cost from the sourcing's. filter: the route's
	// subjects; "events.>" (the benchmark's route) expands into one
	// transform per subject length up to the key token and one for
	// longer subjects (subjects.Partitioner), "events.info.*" is one
	// transform: to tell the cost of several from the partition function's.
	// keys: the distinct subjects of the source stream (the copy's
	// cost may depend on them).
	for _, c := range []struct {
		filter      string
		parts, keys int
	}{{"events.>", 0, orderedKeys}, {"events.>", 1, orderedKeys}, {"events.>", 16, orderedKeys}, {"events.>", 16, 10}, {"events.info.*", 16, orderedKeys}} {
		parts := c.parts
		b.Run(fmt.Sprintf("filter=%s/partitions=%d/keys=%d", c.filter, parts, c.keys), func(b *testing.B) {
			srv := natstest.Start(b)
			_, js := natstest.Connect(b, srv.URL())
			ctx := b.Context()
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: streamName, Subjects: []string{"events.>"},
				Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute, MaxAge: 168 * time.Hour}); err != nil {
				b.Fatal(err)
			}
			pub0 := processCPU(b)
			for seq := range b.N {
				m := &nats.Msg{Subject: subjectOf(seq, c.keys), Header: nats.Header{}, Data: payload(seq, 0)}
				m.Header.Set(jetstream.MsgIDHeader, "m-"+strconv.Itoa(seq))
				if _, err := js.PublishMsgAsync(m, jetstream.WithStallWait(stallWait)); err != nil {
					b.Fatal(err)
				}
			}
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				b.Fatal("publish: PubAcks still pending after 1m")
			}
			pubCPU := processCPU(b) - pub0
			var trs []jetstream.SubjectTransformConfig
			if parts > 0 {
				key, err := subjects.NewPartitioner([]string{c.filter}, parts, []int{keyToken})
				if err != nil {
					b.Fatal(err)
				}
				for _, tr := range key.Transforms() {
					trs = append(trs, jetstream.SubjectTransformConfig{Source: tr.Source, Destination: tr.Destination})
				}
			}
			cpu0 := processCPU(b)
			b.ResetTimer()
			s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: config.CopyStream(streamName, "bench0"),
				Storage: jetstream.FileStorage, Retention: jetstream.WorkQueuePolicy, MaxAge: 168 * time.Hour, AllowDirect: true,
				Sources: []*jetstream.StreamSource{{Name: streamName, SubjectTransforms: trs}}})
			if err != nil {
				b.Fatal(err)
			}
			deadline := time.Now().Add(time.Minute + time.Duration(b.N)*time.Millisecond)
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for {
				info, err := s.Info(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if info.State.LastSeq >= uint64(b.N) {
					break
				}
				if time.Now().After(deadline) {
					b.Fatalf("the copy took in %d of %d messages", info.State.LastSeq, b.N)
				}
				<-tick.C
			}
			b.StopTimer()
			b.ReportMetric(float64(len(trs)), "transforms")
			b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/msg")
			b.ReportMetric(float64(pubCPU.Microseconds())/float64(b.N), "publish-cpu-µs/msg")
		})
	}
}

// processCPU is this process's user and system CPU time.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestReadRateCounters reads the rate limit's counters as the bridge's
// /metrics exports them: the two wait counters, only the fleet errors of
// op "rate", absent series as 0.
func TestReadRateCounters(t *testing.T) {
	body := "# HELP bridge_destination_rate_limited_seconds_total x\n" +
		"bridge_destination_rate_limited_seconds_total{destination=\"sink\"} 0.25\n" +
		"bridge_fleet_rate_wait_seconds_total{destination=\"sink\"} 0.5\n" +
		"bridge_fleet_state_errors_total{destination=\"sink\",op=\"rate\"} 2\n" +
		"bridge_fleet_state_errors_total{destination=\"sink\",op=\"pause\"} 7\n" +
		"go_memstats_mallocs_total 123\n"
	for _, c := range []struct {
		body                   string
		limited, fleet, errors float64
	}{{body, 0.25, 0.5, 2}, {"go_memstats_mallocs_total 123\n", 0, 0, 0}} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(c.body)) }))
		got, err := readRateCounters(t.Context(), srv.Client(), srv.URL)
		srv.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got.limitedSecs != c.limited || got.fleetWaitSecs != c.fleet || got.fleetErrors != c.errors {
			t.Errorf("read %+v, want %g s limited, %g s fleet waits and %g errors", got, c.limited, c.fleet, c.errors)
		}
	}
}

package bridge

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/internal/sinktest"
)

// Throughput and latency through an embedded JetStream server and a local
// HTTP destination on loopback. Reported, never asserted: see
// docs/performance.md for numbers and how to reproduce them.
//
//	go test -run '^$' -bench . -benchtime 5000x ./bridge

// BenchmarkThroughput publishes b.N events as fast as JetStream takes them
// (async publish) and measures how fast the bridge drains them.
func BenchmarkThroughput(b *testing.B) {
	for _, tc := range []struct {
		inFlight int
		delay    time.Duration
		idem     bool
	}{
		{1, 0, false}, {32, 0, false}, {128, 0, false}, {32, 0, true},
		{32, 5 * time.Millisecond, false}, {128, 5 * time.Millisecond, false},
	} {
		b.Run(fmt.Sprintf("in_flight=%d/dest_delay=%s/idempotency=%t", tc.inFlight, tc.delay, tc.idem), func(b *testing.B) {
			sink, h := benchBridge(b, tc.inFlight, tc.delay, tc.idem)
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				if _, err := h.js.PublishAsync("events.info.bench", []byte(`{"n":1}`), jetstream.WithMsgID(strconv.Itoa(i))); err != nil {
					b.Fatal(err)
				}
			}
			<-h.js.PublishAsyncComplete()
			if !waitUntil(5*time.Minute, func() bool { return sink.Count() >= b.N }) {
				b.Fatalf("only %d of %d delivered", sink.Count(), b.N)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
		})
	}
}

// BenchmarkLatency publishes one event at a time and measures the time from
// publish to its arrival at the destination, on an idle bridge.
func BenchmarkLatency(b *testing.B) {
	for _, idem := range []bool{false, true} {
		b.Run(fmt.Sprintf("idempotency=%t", idem), func(b *testing.B) {
			sink, h := benchBridge(b, 32, 0, idem)
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				start := time.Now()
				h.publish("events.info.bench", strconv.Itoa(i), []byte(`{"n":1}`), nil)
				waitArrival(sink, i+1)
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50_ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99_ms")
		})
	}
}

func benchBridge(b *testing.B, inFlight int, delay time.Duration, idem bool) (*sinktest.Sink, *harness) {
	return benchBridgeFlow(b, inFlight, delay, idem, "")
}

func benchBridgeFlow(b *testing.B, inFlight int, delay time.Duration, idem bool, flow string) (*sinktest.Sink, *harness) {
	harnessLogLevel = zerolog.WarnLevel
	b.Cleanup(func() { harnessLogLevel = zerolog.DebugLevel })
	sink := sinktest.New(b, func(sinktest.Request) sinktest.Response {
		return sinktest.Response{Status: 200, Delay: delay}
	})
	cfg := testConfig(b, `
log: {level: warn}
idempotency: {bucket: DELIVERED}
destinations:
  d: {url: %s, timeout: 5s, %s}
routes:
  - {name: r, subjects: ["events.>"], destination: d, max_in_flight: %d, idempotency: %t}
`, sink.URL(), flow, inFlight, idem)
	return sink, startBridge(b, cfg, faults{})
}

// waitArrival spins briefly on the sink's count: a latency probe cannot
// afford a 5 ms poll.
func waitArrival(s *sinktest.Sink, n int) {
	deadline := time.Now().Add(10 * time.Second)
	for s.Count() < n && time.Now().Before(deadline) {
		<-time.After(50 * time.Microsecond)
	}
}

// BenchmarkHotPath drains 1 KiB JSON events (envelope format, 64 in
// flight), the in-process profile target of
// docs/performance.md:
//
//	go test -run '^$' -bench HotPath -benchtime 20000x -cpuprofile cpu.out ./bridge
func BenchmarkHotPath(b *testing.B) {
	b.Run("flow=off", func(b *testing.B) { benchHotPath(b, "") })
	// A fixed concurrency limit that is never reached: the cost of the gate.
	b.Run("flow=concurrency", func(b *testing.B) { benchHotPath(b, "concurrency: {max: 64}") })
	// A rate limit that is never reached: the cost of the rate limit
	// (fleet-wide: docs/delivery.md#flow-control).
	b.Run("flow=rate", func(b *testing.B) { benchHotPath(b, "rate_limit: {requests: 1000000, per: 1s, burst: 1000}") })
}

func benchHotPath(b *testing.B, flow string) {
	payload := []byte(`{"patient":"p-1","reading":{"kind":"heart_rate","value":72},"note":"` +
		strings.Repeat("x", 1024-78) + `"}`)
	sink, h := benchBridgeFlow(b, 64, 0, false, flow)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		if _, err := h.js.PublishAsync("events.info.bench", payload, jetstream.WithMsgID(strconv.Itoa(i))); err != nil {
			b.Fatal(err)
		}
	}
	<-h.js.PublishAsyncComplete()
	if !waitUntil(5*time.Minute, func() bool { return sink.Count() >= b.N }) {
		b.Fatalf("only %d of %d delivered", sink.Count(), b.N)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
}

// BenchmarkAdaptiveLimit drains a backlog into a destination that serves 8
// requests at a time (10 ms each) and queues the rest, with max_in_flight
// 64: an adaptive limit against a fixed limit of 8 and none. It reports
// events/s and the destination-side queueing time (p50, p99) of the
// second half of the run, once the adaptive limit has settled:
//
//	go test -run '^$' -bench AdaptiveLimit -benchtime 4000x ./bridge
func BenchmarkAdaptiveLimit(b *testing.B) {
	for _, tc := range []struct{ name, concurrency string }{
		{"adaptive", "concurrency: {adaptive: true, min: 1, max: 64}"},
		{"fixed-8", "concurrency: {max: 8}"},
		{"none", ""},
	} {
		b.Run(tc.name, func(b *testing.B) {
			harnessLogLevel = zerolog.WarnLevel
			b.Cleanup(func() { harnessLogLevel = zerolog.DebugLevel })
			sink := newFlowSink(b, 10*time.Millisecond)
			sink.slots = make(chan struct{}, 8)
			cfg := testConfig(b, `
log: {level: warn}
destinations:
  d: {url: %s, timeout: 30s, %s}
routes:
  - {name: r, subjects: ["events.>"], destination: d, max_in_flight: 64}
`, sink.srv.URL, tc.concurrency)
			h := startBridge(b, cfg, faults{})
			for i := range b.N {
				if _, err := h.pub.PublishAsync("events.info.bench", []byte(`{"n":1}`), jetstream.WithMsgID(strconv.Itoa(i))); err != nil {
					b.Fatal(err)
				}
			}
			<-h.pub.PublishAsyncComplete()
			b.ResetTimer()
			start := time.Now()
			if !sink.waitFor(10*time.Minute, func(as []arrival) bool { return len(as) >= b.N }) {
				b.Fatalf("only %d of %d delivered", len(sink.arrivals()), b.N)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
			as := sink.arrivals()[b.N/2:]
			queued := make([]time.Duration, 0, len(as))
			for _, a := range as {
				queued = append(queued, a.queued)
			}
			slices.Sort(queued)
			b.ReportMetric(float64(queued[len(queued)/2].Microseconds())/1000, "queued_p50_ms")
			b.ReportMetric(float64(queued[len(queued)*99/100].Microseconds())/1000, "queued_p99_ms")
		})
	}
}

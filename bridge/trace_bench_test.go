package bridge

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/otlptest"
	"github.com/sotercare/jetbridge/internal/sinktest"
	"github.com/sotercare/jetbridge/tracing/export"
)

// BenchmarkHotPathTracing is BenchmarkHotPath with tracing on, exporting
// over OTLP/HTTP to a real receiver on loopback (docs/tracing.md): every
// delivery sampled (ratio 1.0), one in a hundred (0.01), and with a dead
// collector (nothing listening; a receiver that never answers), and off
// (as BenchmarkHotPath), so that -count interleaves the variants on a
// machine whose load changes.
//
//	go test -run '^$' -bench HotPathTracing -benchtime 20000x ./bridge
func BenchmarkHotPathTracing(b *testing.B) {
	refused := func(b *testing.B) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		return "http://" + addr
	}
	for _, tc := range []struct {
		name     string
		ratio    string
		endpoint func(b *testing.B) string
	}{
		{"off", "", nil},
		{"ratio=1.0", "1.0", func(b *testing.B) string { return otlptest.New(b, false).URL() }},
		{"ratio=0.01", "0.01", func(b *testing.B) string { return otlptest.New(b, false).URL() }},
		{"collector=refused", "1.0", refused},
		{"collector=hangs", "1.0", func(b *testing.B) string { return otlptest.New(b, true).URL() }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var p *export.Provider
			if tc.endpoint != nil {
				b.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", tc.endpoint(b))
				b.Setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
				b.Setenv("OTEL_TRACES_SAMPLER_ARG", tc.ratio)
				var err error
				if p, err = export.Setup(context.Background(), export.Settings{OnError: func(error) {}}); err != nil {
					b.Fatal(err)
				}
			}
			b.Cleanup(func() { _ = p.Shutdown(100 * time.Millisecond) })
			harnessLogLevel = zerolog.WarnLevel
			b.Cleanup(func() { harnessLogLevel = zerolog.DebugLevel })
			sink := sinktest.New(b, func(sinktest.Request) sinktest.Response { return sinktest.Response{Status: 200} })
			cfg := testConfig(b, `
log: {level: warn}
destinations:
  d: {url: %s, timeout: 5s}
routes:
  - {name: r, subjects: ["events.>"], destination: d, max_in_flight: 64}
`, sink.URL())
			h := startHarness(b, natstest.Start(b), cfg, faults{}, withTracing(p.TracerProvider(), false))
			payload := []byte(`{"patient":"p-1","reading":{"kind":"heart_rate","value":72},"note":"` +
				strings.Repeat("x", 1024-78) + `"}`)
			b.ReportAllocs()
			b.ResetTimer()
			start, cpu0 := time.Now(), cpuTime()
			for i := 0; i < b.N; {
				_, err := h.js.PublishAsync("events.info.bench", payload, jetstream.WithMsgID(strconv.Itoa(i)))
				switch {
				case errors.Is(err, jetstream.ErrTooManyStalledMsgs):
					<-h.js.PublishAsyncComplete() // a loaded machine: let the acks catch up
					continue
				case err != nil:
					b.Fatal(err)
				}
				i++
			}
			<-h.js.PublishAsyncComplete()
			if !waitUntil(5*time.Minute, func() bool { return sink.Count() >= b.N }) {
				b.Fatalf("only %d of %d delivered", sink.Count(), b.N)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
			// CPU time of the whole process (bridge, JetStream server,
			// destination, OTLP receiver) per event: less at the mercy of
			// the machine's other load than events/s.
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu_us/event")
			b.ReportMetric(float64(p.Dropped()), "spans_dropped")
		})
	}
}

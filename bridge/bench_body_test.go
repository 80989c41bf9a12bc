package bridge

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/internal/sinktest"
)

// BenchmarkHotPathResponseBody is BenchmarkHotPath's flow=off with a
// destination that answers every request with a small body, as many do
// ({"ok":true}): the bridge drains it (response.finish) before the
// connection is reused. Whole process, like BenchmarkHotPath:
//
//	go test -run '^$' -bench HotPathResponseBody -benchtime 20000x ./bridge
func BenchmarkHotPathResponseBody(b *testing.B) {
	harnessLogLevel = zerolog.WarnLevel
	b.Cleanup(func() { harnessLogLevel = zerolog.DebugLevel })
	sink := sinktest.New(b, func(sinktest.Request) sinktest.Response {
		return sinktest.Response{Status: 200, Body: `{"ok":true}`}
	})
	cfg := testConfig(b, `
log: {level: warn}
destinations:
  d: {url: %s, timeout: 5s}
routes:
  - {name: r, subjects: ["events.>"], destination: d, max_in_flight: 64}
`, sink.URL())
	h := startBridge(b, cfg, faults{})
	payload := []byte(`{"patient":"p-1","reading":{"kind":"heart_rate","value":72},"note":"` +
		strings.Repeat("x", 1024-78) + `"}`)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		if _, err := h.pub.PublishAsync("events.info.bench", payload, jetstream.WithMsgID(strconv.Itoa(i))); err != nil {
			b.Fatal(err)
		}
	}
	<-h.pub.PublishAsyncComplete()
	if !waitUntil(5*time.Minute, func() bool { return sink.Count() >= b.N }) {
		b.Fatalf("only %d of %d delivered", sink.Count(), b.N)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
}

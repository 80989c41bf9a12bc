package main

// The libraries alone, for the allocations per event that the bridge's
// profile leaves inside them (issue 26: "inside the library" counts only
// with the library's own benchmark or profile). Each benchmark measures one
// library's part of an event, with the bridge's options, and records
// nothing of its set-up in the heap profile (the profile rate is 0 until
// the timer starts), so that a profile of it splits by the library's own
// frames:
//
//	go test -run '^$' -bench 'NATSFetch|HTTPRoundTrip|FailsafeGet' -benchtime 20000x -memprofile mem.out -memprofilerate 1 ./test/bench
//	go tool pprof -sample_index=alloc_objects -top -cum mem.out
//
// The embedded JetStream server and the HTTP server run in the same
// process: their frames (nats-server, net/http's server side) are not the
// client's, and allocs/op counts both.

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/retrypolicy"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/natstest"
)

// profileRate is the heap profile's rate as -test.memprofilerate set it.
var profileRate = sync.OnceValue(func() int { return runtime.MemProfileRate })

// noProfile stops recording allocations until the returned func restores
// the rate (the set-up of a benchmark stays out of its heap profile; its
// tear-down, the servers' shutdown, is recorded and not the client's).
func noProfile() func() {
	rate := profileRate()
	runtime.MemProfileRate = 0
	return func() { runtime.MemProfileRate = rate }
}

// BenchmarkNATSFetch takes b.N stored 1 KiB messages (the benchmark's
// publisher's headers: Nats-Msg-Id, Content-Type) with nats.go's Fetch,
// 64 at a time, reads each one's metadata and acks it: what nats.go
// allocates for one event the bridge pulls (its confirmed ack is not
// included).
func BenchmarkNATSFetch(b *testing.B) {
	restore := noProfile()
	srv := natstest.Start(b)
	_, pub := natstest.Connect(b, srv.URL())
	_, js := natstest.Connect(b, srv.URL())
	ctx := b.Context()
	if _, err := pub.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}}); err != nil {
		b.Fatal(err)
	}
	for i := range b.N {
		m := &nats.Msg{Subject: "events.info.bench", Header: nats.Header{}, Data: payload(i, time.Now().UnixNano())}
		m.Header.Set(jetstream.MsgIDHeader, "m-"+strconv.Itoa(i))
		m.Header.Set("Content-Type", "application/json")
		if _, err := pub.PublishMsgAsync(m); err != nil {
			b.Fatal(err)
		}
	}
	<-pub.PublishAsyncComplete()
	cons, err := js.CreateOrUpdateConsumer(ctx, "EVENTS", jetstream.ConsumerConfig{
		Durable: "fetch", AckPolicy: jetstream.AckExplicitPolicy, FilterSubjects: []string{"events.>"}, MaxAckPending: 1024,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	restore()
	for got := 0; got < b.N; {
		batch, err := cons.Fetch(min(64, b.N-got), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		for m := range batch.Messages() {
			if _, err := m.Metadata(); err != nil {
				b.Fatal(err)
			}
			if err := m.Ack(); err != nil {
				b.Fatal(err)
			}
			got++
		}
		if err := batch.Error(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHTTPRoundTrip sends b.N POSTs of a 1.2 KB body with the
// bridge's request headers through an http.Transport set up as the
// bridge's destination transport (no compression, idle connections kept),
// straight to RoundTrip as the bridge does (no http.Client), from 8
// goroutines, to a server that answers 200 with no body: what net/http's
// client allocates for one try.
func BenchmarkHTTPRoundTrip(b *testing.B) {
	restore := noProfile()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusOK)
	}))
	b.Cleanup(srv.Close)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy, tr.DisableCompression, tr.MaxIdleConnsPerHost = nil, true, 64
	b.Cleanup(tr.CloseIdleConnections)
	tmpl, err := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+"/hook", nil)
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"id":"m-1","payload":` + strings.Repeat("x", 1200) + `}`)
	header := http.Header{
		"Content-Type": {"application/json"}, "X-Event-Id": {"m-1"}, "X-Event-Type": {"bench"},
		"X-Event-Severity": {"INFO"}, "X-Delivery-Attempt": {"1"}, "Idempotency-Key": {"m-1"},
	}
	b.SetParallelism(4) // 8 goroutines on 2 cores
	b.ReportAllocs()
	b.ResetTimer()
	restore()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req := tmpl.WithContext(context.Background())
			req.Body, req.ContentLength, req.Header = io.NopCloser(bytes.NewReader(body)), int64(len(body)), header
			resp, err := tr.RoundTrip(req)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
	})
}

// BenchmarkFailsafeGet runs b.N successful executions through failsafe-go
// policies shaped like the bridge's default pipeline (bridge/pipeline.go):
// a transport retry (a condition, aborts on an open breaker, a backoff)
// around a circuit breaker (a failure rate over a window), on an executor
// made once with its context (as the bridge's pooled attempts reuse
// theirs), the function returning at once: what failsafe-go allocates for
// one attempt, without the bridge's gate and with nothing else in the
// process.
func BenchmarkFailsafeGet(b *testing.B) {
	type result struct{ status int }
	retry := retrypolicy.NewBuilder[*result]().
		HandleIf(func(_ *result, err error) bool { return err != nil }).
		AbortOnErrors(circuitbreaker.ErrOpen, context.Canceled).
		WithMaxRetries(2).
		WithBackoffFactor(100*time.Millisecond, time.Second, 2).
		ReturnLastFailure().
		Build()
	breaker := circuitbreaker.NewBuilder[*result]().
		HandleIf(func(r *result, err error) bool { return err != nil || r.status >= 500 }).
		WithFailureRateThreshold(0.5, 20, time.Minute).
		WithDelay(30 * time.Second).
		Build()
	exec := failsafe.With[*result](retry, breaker).WithContext(context.Background())
	ok := &result{status: 200}
	try := func() (*result, error) { return ok, nil }
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := exec.Get(try); err != nil {
			b.Fatal(err)
		}
	}
}

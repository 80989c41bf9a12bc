package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"runtime/metrics"
	"time"
)

// serveAllocMetrics serves GET /metrics on addr until ctx ends: the two
// allocation counters of the Go runtime that the bridge's own /metrics
// exports (Prometheus' Go collector), named and computed as it does, so
// that the benchmark counts allocations per event the same way in every
// system. The same few lines serve the naive bridge (test/bench/allocs.go).
func serveAllocMetrics(ctx context.Context, addr string) error {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("-metrics: %w", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(writeAllocMetrics), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	return nil
}

// writeAllocMetrics writes go_memstats_mallocs_total (heap objects
// allocated, tiny ones included) and go_memstats_alloc_bytes_total (bytes
// allocated on the heap) in the Prometheus text format.
func writeAllocMetrics(w http.ResponseWriter, _ *http.Request) {
	s := []metrics.Sample{
		{Name: "/gc/heap/allocs:objects"},
		{Name: "/gc/heap/tiny/allocs:objects"},
		{Name: "/gc/heap/allocs:bytes"},
	}
	metrics.Read(s)
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	fmt.Fprintf(w, "go_memstats_mallocs_total %d\ngo_memstats_alloc_bytes_total %d\n",
		s[0].Value.Uint64()+s[1].Value.Uint64(), s[2].Value.Uint64())
}

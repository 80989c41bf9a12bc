package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	rtmetrics "runtime/metrics"
	"strconv"
	"strings"
	"time"
)

// Allocations per event are counted in the system's own process, from
// the Go runtime's counters that the bridge exports on its admin
// /metrics (Prometheus' Go collector): go_memstats_mallocs_total (heap
// objects allocated, tiny ones included) and go_memstats_alloc_bytes_total
// (bytes allocated on the heap). The naive bridge (-metrics) and the
// Watermill peer (test/bench/watermill/metrics.go) serve the same two
// counters, computed the same way, so that the three are counted alike.

// allocCounters are a process's cumulative allocation counters.
type allocCounters struct{ objects, bytes float64 }

// serveAllocMetrics serves GET /metrics on addr until ctx ends, with the
// two counters in the Prometheus text format.
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

// writeAllocMetrics writes the counters as client_golang's Go collector
// computes them from runtime/metrics.
func writeAllocMetrics(w http.ResponseWriter, _ *http.Request) {
	s := []rtmetrics.Sample{
		{Name: "/gc/heap/allocs:objects"},
		{Name: "/gc/heap/tiny/allocs:objects"},
		{Name: "/gc/heap/allocs:bytes"},
	}
	rtmetrics.Read(s)
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	fmt.Fprintf(w, "go_memstats_mallocs_total %d\ngo_memstats_alloc_bytes_total %d\n",
		s[0].Value.Uint64()+s[1].Value.Uint64(), s[2].Value.Uint64())
}

// readAllocs scrapes url (a Prometheus text endpoint) for the two
// counters. The scrape's own allocations in the bridge (its registry's
// gathering, some hundreds of KB) fall inside a drain's count once: well
// under 1 % of a drain of 10,000 messages.
func readAllocs(ctx context.Context, hc *http.Client, url string) (allocCounters, error) {
	var c allocCounters
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return c, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return c, fmt.Errorf("allocation counters: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return c, fmt.Errorf("allocation counters: %s: status %d", url, resp.StatusCode)
	}
	found := 0
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 4<<20))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		var dst *float64
		switch name {
		case "go_memstats_mallocs_total":
			dst = &c.objects
		case "go_memstats_alloc_bytes_total":
			dst = &c.bytes
		default:
			continue
		}
		if *dst, err = strconv.ParseFloat(strings.TrimSpace(v), 64); err != nil {
			return c, fmt.Errorf("allocation counters: %s: %w", name, err)
		}
		found++
	}
	if err := sc.Err(); err != nil {
		return c, fmt.Errorf("allocation counters: %w", err)
	}
	if found != 2 {
		return c, fmt.Errorf("allocation counters: %s has no go_memstats_mallocs_total and go_memstats_alloc_bytes_total", url)
	}
	return c, nil
}

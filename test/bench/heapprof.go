//go:build heapprof

package main

// A profiling build of the benchmark (go build -tags heapprof ./test/bench),
// for the allocation accounting of issue 26: with $JB_HEAPPROF_DIR set, the
// process it runs as (the naive bridge, say) records allocations at
// MemProfileRate 512 and writes its heap profile every 100 ms to
// $JB_HEAPPROF_DIR/heap-PID-N.pb.gz; two of them taken during a drain,
// subtracted (go tool pprof -base), split its allocations per event by
// origin. The profiles' own writing is runtime/pprof's, left out.

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"time"
)

func init() {
	dir := os.Getenv("JB_HEAPPROF_DIR")
	if dir == "" {
		return
	}
	runtime.MemProfileRate = 512
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		for i := 0; ; i++ {
			<-tick.C
			f, err := os.Create(filepath.Join(dir, fmt.Sprintf("heap-%d-%04d.pb.gz", os.Getpid(), i)))
			if err != nil {
				return
			}
			_ = pprof.Lookup("allocs").WriteTo(f, 0)
			_ = f.Close()
		}
	}()
}

package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// pollInterval is how often a run reads the sink's counters.
const pollInterval = 10 * time.Millisecond

// stallTimeout fails a run whose sink sees no new message for this long.
const stallTimeout = 30 * time.Second

// result is what one run of one system measured; the fields a kind does
// not measure stay zero.
type result struct {
	rate      float64 // msgs/s, first request to last new message at the sink
	cpuPer10k float64 // CPU seconds of the system process per 10,000 messages
	rssMB     float64 // peak RSS (VmHWM) of the system process, MiB
	startMB   float64 // drain runs: its peak RSS when the sink saw the first request (start-up), MiB
	fileMB    float64 // drain runs: its file-backed RSS (its binary's pages) at the end, MiB
	conns     float64 // TCP connections the sink accepted
	dups      float64 // requests for a message the sink had already seen
	syscalls  float64 // read and write system calls of the system process per message
	allocs    float64 // drain runs: heap objects the system process allocated per message (allocs.go)
	allocKB   float64 // drain runs: KB it allocated per message
	serverCPU float64 // CPU seconds of the JetStream server per 10,000 messages, same window
	sinkCPU   float64 // CPU seconds of the HTTP sink per 10,000 messages, same window
	p50, p99  float64 // publish-to-delivery latency, ms
	p999      float64
	cpuShare  float64 // CPU of the system over the window, % of one core
	requests  float64 // requests the sink answered over the window
	reqRate   float64 // requests/s over the window
	// counterPubs: drain runs of a system with a fleet rate limit, the
	// publishes to its counter stream per message (issue28.go); else 0.
	counterPubs float64
	// copyShare: drain runs of an ordered route, the share of the drain
	// (from the first request) after which the route's partitioned copy
	// held every message (issue28.go); else NaN or 0.
	copyShare float64
	// limitedSecs, fleetWaitSecs, fleetErrors: drain runs with a fleet
	// rate limit, the bridge's seconds waited for it and failed uses of
	// its counter (rateCounters, issue28.go).
	limitedSecs, fleetWaitSecs, fleetErrors float64
}

// env is what every run shares: the binaries, the sink, the temp dir.
type env struct {
	opts        options
	sinkPID     int // the HTTP sink process, shared by every run
	tmp         string
	self        string // this benchmark's binary, re-executed for the roles
	bridgeBin   string
	fatSelf     string // this benchmark built with -tags fatfloor; "" when no scenario needs it
	baselineBin string // -baseline: the bridge build the baseline scenarios compare against
	// watermillBin is the Watermill peer built from its nested module
	// (test/bench/watermill); "" when no scenario needs it. watermillMods
	// names the Watermill modules and versions it was built with.
	watermillBin, watermillMods string
	sink                        *sinkClient
	perfDir                     string // -perf: record each drain's system process here
	keep                        bool   // -keep: keep each run's logs (not its store)
}

// run performs one run of sys in sc, in a fresh JetStream server with its
// own store, and stops everything it started before returning.
func (e *env) run(ctx context.Context, sc scenario, sys system, dir string) (r result, err error) {
	err = e.withServer(ctx, dir, func(natsURL string, serverPID int, pub *publisher) error {
		switch sc.kind {
		case drain:
			r, err = e.drainRun(ctx, sc.backlog(sys), sys, pub, natsURL, dir, serverPID)
		case latency:
			var rs []result
			rs, err = e.latencyRun(ctx, []system{sys}, false, pub, natsURL, dir)
			if err == nil {
				r = rs[0]
			}
		default:
			r, err = e.failureRun(ctx, sc, sys, pub, natsURL, dir)
		}
		return err
	})
	return r, err
}

// runTogether performs one run of a latency scenario whose two systems
// run at once (scenario.together), b started first when bFirst.
func (e *env) runTogether(ctx context.Context, sc scenario, dir string, bFirst bool) (ra, rb result, err error) {
	err = e.withServer(ctx, dir, func(natsURL string, _ int, pub *publisher) error {
		rs, err := e.latencyRun(ctx, []system{sc.a, sc.b}, bFirst, pub, natsURL, dir)
		if err == nil {
			ra, rb = rs[0], rs[1]
		}
		return err
	})
	return ra, rb, err
}

// withServer runs f with a fresh JetStream server (its store in dir) and
// a publisher on it, and stops both and removes dir afterwards (with
// -keep, only the store: the logs stay).
func (e *env) withServer(ctx context.Context, dir string, f func(natsURL string, serverPID int, pub *publisher) error) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	store := filepath.Join(dir, "store")
	if e.keep {
		defer os.RemoveAll(store)
	} else {
		defer os.RemoveAll(dir)
	}
	nd, natsURL, err := startChild(ctx, dir, "natsd", e.self, []string{"_natsd", "-store", store}, nil)
	if err != nil {
		return err
	}
	defer nd.stop()
	pub, err := newPublisher(ctx, natsURL)
	if err != nil {
		return err
	}
	defer pub.close()
	return f(natsURL, nd.pid(), pub)
}

// drainRun pre-publishes n messages, then starts sys and measures until
// the sink has seen every one of them.
func (e *env) drainRun(ctx context.Context, n int, sys system, pub *publisher, natsURL, dir string, serverPID int) (result, error) {
	if err := pub.prepublish(ctx, n, sys.keys); err != nil {
		return result{}, err
	}
	if err := e.sink.resetDelayed(ctx, n, http.StatusAccepted, n, sys.sinkDelay); err != nil {
		return result{}, err
	}
	s, err := e.startSystem(ctx, sys, natsURL, dir)
	if err != nil {
		return result{}, err
	}
	defer s.stop()
	if e.perfDir != "" {
		// The system and the JetStream server, each in its file: the
		// server's share of a message is part of its cost (ordered
		// routes' copies and partition consumers are work done there).
		rec, err := startPerf(ctx, dir, "perf", filepath.Join(e.perfDir, filepath.Base(dir)+".perf.data"), s.pid())
		if err != nil {
			return result{}, err
		}
		defer rec.stop() // before s.stop: perf writes its file on SIGTERM
		srec, err := startPerf(ctx, dir, "perf-server", filepath.Join(e.perfDir, filepath.Base(dir)+".server.perf.data"), serverPID)
		if err != nil {
			return result{}, err
		}
		defer srec.stop()
	}
	// CPU is counted from the first request the sink sees: the start-up
	// (config, connection, provisioning) is not part of the drain.
	// The server's and the sink's CPU over the same window: on a shared
	// machine they are part of what a message costs (docs/performance.md).
	// Allocations are counted from the same moment, in the system's own
	// process (allocs.go), over the messages the sink had not seen when
	// the counters were read: those in flight then count with their
	// allocations, a little over what they cost.
	var cpu0, server0, sink0 time.Duration
	var sys0, start int64
	var alloc0 allocCounters
	counted := n
	hc := &http.Client{Timeout: 5 * time.Second}
	started := false
	firstRequest := func(st sinkStats) error {
		if started || st.Requests == 0 {
			return nil
		}
		started = true
		var err error
		if cpu0, err = cpuTime(s.pid()); err != nil {
			return err
		}
		if sys0, err = syscalls(s.pid()); err != nil {
			return err
		}
		if start, err = peakRSS(s.pid()); err != nil {
			return err
		}
		if server0, err = cpuTime(serverPID); err != nil {
			return err
		}
		if sink0, err = cpuTime(e.sinkPID); err != nil {
			return err
		}
		if alloc0, err = readAllocs(ctx, hc, s.metrics); err != nil {
			return err
		}
		after, err := e.sink.statsOf(ctx, s.lane, false)
		counted = n - after.Unique
		return err
	}
	observe := firstRequest
	var copyObs *copyWatch
	if sys.ordered {
		copyObs = newCopyWatch(pub, n)
		observe = func(st sinkStats) error {
			if err := firstRequest(st); err != nil {
				return err
			}
			return copyObs.observe(ctx, started)
		}
	}
	st, err := e.waitUnique(ctx, s, n, time.Minute+time.Duration(n)*2*time.Millisecond, observe)
	if err != nil {
		return result{}, err
	}
	cpu1, rss, err := usage(s.pid())
	if err != nil {
		return result{}, err
	}
	alloc1, err := readAllocs(ctx, hc, s.metrics)
	if err != nil {
		return result{}, err
	}
	sys1, err := syscalls(s.pid())
	if err != nil {
		return result{}, err
	}
	server1, err := cpuTime(serverPID)
	if err != nil {
		return result{}, err
	}
	sink1, err := cpuTime(e.sinkPID)
	if err != nil {
		return result{}, err
	}
	file, err := fileRSS(s.pid())
	if err != nil {
		return result{}, err
	}
	var rc rateCounters
	if sys.rateLimit {
		if rc, err = readRateCounters(ctx, hc, s.metrics); err != nil {
			return result{}, err
		}
	}
	s.stop()
	if st, err = e.sink.stats(ctx, false); err != nil { // late duplicates included
		return result{}, err
	}
	counterPubs := 0.0
	if sys.rateLimit {
		pubs, err := pub.counterPublishes(ctx)
		if err != nil {
			return result{}, err
		}
		counterPubs = float64(pubs) / float64(n)
	}
	secs := time.Duration(st.LastNewNS - st.FirstNS).Seconds()
	copyShare := math.NaN()
	if copyObs != nil {
		copyShare = copyObs.share(secs)
	}
	allocs, allocKB := math.NaN(), math.NaN()
	if counted > 0 {
		allocs = (alloc1.objects - alloc0.objects) / float64(counted)
		allocKB = (alloc1.bytes - alloc0.bytes) / 1024 / float64(counted)
	}
	return result{
		rate:      float64(n) / max(secs, 1e-9),
		cpuPer10k: (cpu1 - cpu0).Seconds() * 10_000 / float64(n),
		rssMB:     float64(rss) / (1 << 20),
		startMB:   float64(start) / (1 << 20),
		fileMB:    float64(file) / (1 << 20),
		conns:     float64(st.Conns),
		dups:      float64(st.Dups),
		syscalls:  float64(sys1-sys0) / float64(n),
		allocs:    allocs,
		allocKB:   allocKB,
		serverCPU: (server1 - server0).Seconds() * 10_000 / float64(n),
		sinkCPU:   (sink1 - sink0).Seconds() * 10_000 / float64(n),

		counterPubs: counterPubs,
		copyShare:   copyShare,

		limitedSecs:   rc.limitedSecs,
		fleetWaitSecs: rc.fleetWaitSecs,
		fleetErrors:   rc.fleetErrors,
	}, nil
}

// failureSettle separates a failure run's regime being reached from the
// start of its measuring window (a quarter of the breaker delay).
const failureSettle = breakerDelay / 4

// latencyWarmup messages are delivered before the paced ones are timed.
const latencyWarmup = 200

// latencyRun starts systems on an empty stream (one, or two at once,
// the last first when lastFirst), each with a durable consumer of its own
// delivering to its own sink lane, warms them up, then publishes at the
// fixed rate and reads each one's latency percentiles at the sink.
func (e *env) latencyRun(ctx context.Context, systems []system, lastFirst bool, pub *publisher, natsURL, dir string) ([]result, error) {
	paced := e.opts.rate * int(e.opts.latencyFor/time.Second)
	total := latencyWarmup + paced
	if err := e.sink.reset(ctx, total, http.StatusAccepted, latencyWarmup); err != nil {
		return nil, err
	}
	suts := make([]*sut, len(systems))
	for k := range systems {
		i := k
		if lastFirst {
			i = len(systems) - 1 - k
		}
		sdir := dir
		if len(systems) > 1 {
			sdir = filepath.Join(dir, string(rune('a'+i)))
			if err := os.MkdirAll(sdir, 0o700); err != nil {
				return nil, err
			}
		}
		s, err := e.startSystemOn(ctx, systems[i], natsURL, sdir, i)
		if err != nil {
			return nil, err
		}
		defer s.stop()
		suts[i] = s
	}
	if err := pub.paced(ctx, 0, latencyWarmup, e.opts.rate); err != nil {
		return nil, err
	}
	for _, s := range suts {
		if _, err := e.waitUnique(ctx, s, latencyWarmup, stallTimeout, nil); err != nil {
			return nil, err
		}
	}
	cpu0 := make([]time.Duration, len(suts))
	for i, s := range suts {
		var err error
		if cpu0[i], err = cpuTime(s.pid()); err != nil {
			return nil, err
		}
	}
	if err := pub.paced(ctx, latencyWarmup, paced, e.opts.rate); err != nil {
		return nil, err
	}
	for _, s := range suts {
		if _, err := e.waitUnique(ctx, s, total, stallTimeout, nil); err != nil {
			return nil, err
		}
	}
	out := make([]result, len(suts))
	for i, s := range suts {
		cpu1, rss, err := usage(s.pid())
		if err != nil {
			return nil, err
		}
		st, err := e.sink.statsOf(ctx, s.lane, true)
		if err != nil {
			return nil, err
		}
		if st.Latencies != paced {
			return nil, fmt.Errorf("latency, %s: %d timed deliveries, want %d", systems[i].label(), st.Latencies, paced)
		}
		ms := func(ns int64) float64 { return float64(ns) / 1e6 }
		out[i] = result{
			p50: ms(st.P50NS), p99: ms(st.P99NS), p999: ms(st.P999NS),
			cpuPer10k: (cpu1 - cpu0[i]).Seconds() * 10_000 / float64(paced),
			rssMB:     float64(rss) / (1 << 20),
			dups:      float64(st.Dups),
		}
	}
	return out, nil
}

// failureRun pre-publishes the backlog, points sys at a sink answering
// 503 (breakerOpen) or 500 (status500) to everything, waits until the
// failure regime is reached and measures the system's cost over a window.
func (e *env) failureRun(ctx context.Context, sc scenario, sys system, pub *publisher, natsURL, dir string) (result, error) {
	n := sc.backlog(sys)
	if err := pub.prepublish(ctx, n, 0); err != nil {
		return result{}, err
	}
	code := http.StatusServiceUnavailable
	if sc.kind == status500 {
		code = http.StatusInternalServerError
	}
	if err := e.sink.reset(ctx, n, code, n); err != nil {
		return result{}, err
	}
	s, err := e.startSystem(ctx, sys, natsURL, dir)
	if err != nil {
		return result{}, err
	}
	defer s.stop()
	// The regime: for jetbridge with a breaker, the breaker is open; else
	// at least as many requests as messages were sent (the naive bridge's
	// immediate redeliveries may keep some messages from ever being tried).
	if sc.kind == breakerOpen && !sys.naive {
		if err := s.waitBreaker(ctx, "open", stallTimeout); err != nil {
			return result{}, err
		}
	} else if _, err := e.waitSink(ctx, s, fmt.Sprintf("%d requests", n), stallTimeout,
		func(st sinkStats) bool { return st.Requests >= int64(n) },
		func(st sinkStats) int64 { return st.Requests }, nil); err != nil {
		return result{}, err
	}
	// Requests sent just before the breaker opened may still be arriving.
	if err := sleep(ctx, failureSettle); err != nil {
		return result{}, err
	}
	st0, err := e.sink.stats(ctx, false)
	if err != nil {
		return result{}, err
	}
	cpu0, err := cpuTime(s.pid())
	if err != nil {
		return result{}, err
	}
	window := e.opts.window(sc.kind)
	start := time.Now()
	if err := sleep(ctx, window); err != nil {
		return result{}, err
	}
	cpu1, err := cpuTime(s.pid())
	if err != nil {
		return result{}, err
	}
	st1, err := e.sink.stats(ctx, false)
	if err != nil {
		return result{}, err
	}
	elapsed := time.Since(start)
	if err := s.exited(); err != nil {
		return result{}, err
	}
	reqs := float64(st1.Requests - st0.Requests)
	return result{
		cpuShare: 100 * (cpu1 - cpu0).Seconds() / elapsed.Seconds(),
		requests: reqs,
		reqRate:  reqs / elapsed.Seconds(),
	}, nil
}

// waitUnique polls the sink until it has seen want distinct messages.
func (e *env) waitUnique(ctx context.Context, s *sut, want int, timeout time.Duration, observe func(sinkStats) error) (sinkStats, error) {
	return e.waitSink(ctx, s, fmt.Sprintf("%d messages", want), timeout,
		func(st sinkStats) bool { return st.Unique >= want },
		func(st sinkStats) int64 { return int64(st.Unique) }, observe)
}

// waitSink polls the sink until done holds. It fails when the system
// exits, when progress does not change for stallTimeout or when timeout
// passes; each poll's counters go to observe (if set).
func (e *env) waitSink(ctx context.Context, s *sut, what string, timeout time.Duration,
	done func(sinkStats) bool, progress func(sinkStats) int64, observe func(sinkStats) error) (sinkStats, error) {
	deadline := time.Now().Add(timeout)
	last, lastProgress := int64(-1), time.Now()
	for {
		st, err := e.sink.statsOf(ctx, s.lane, false)
		if err != nil {
			return st, err
		}
		if observe != nil {
			if err := observe(st); err != nil {
				return st, err
			}
		}
		if done(st) {
			return st, nil
		}
		if err := s.exited(); err != nil {
			return st, err
		}
		now := time.Now()
		if p := progress(st); p != last {
			last, lastProgress = p, now
		}
		if now.Sub(lastProgress) > stallTimeout || now.After(deadline) {
			return st, fmt.Errorf("waiting for %s: the sink has %d distinct messages, %d requests, %d duplicates, %d invalid after %s%s",
				what, st.Unique, st.Requests, st.Dups, st.Invalid, formatDuration(timeout), s.logTail())
		}
		if err := sleep(ctx, pollInterval); err != nil {
			return st, err
		}
	}
}

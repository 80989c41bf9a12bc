package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sotercare/jetbridge/config"
)

// Issue 28's rows (docs/performance.md#ordered-delivery-and-fleet-limits-issue-28):
// the cost of ordered delivery (docs/delivery.md#ordered-delivery) and of
// the fleet-wide rate limit (docs/delivery.md#across-replicas), each
// measured as jetbridge against the same jetbridge route without it, the
// two alternating in one run.
//
//   - ordered: an ordered route over orderedKeys keys (the subject's third
//     token), the backlog published round-robin over the keys so that they
//     interleave, default partitions, max_in_flight 64, against the same
//     route without ordering and the same backlog. Target ≥ 0.8×.
//   - orderedone (run only when named): the same with the route's
//     subjects events.info.* instead of events.>: the copy then sources
//     through one subject transform instead of one per subject length
//     up to the key token (subjects.Partitioner; BenchmarkOrderedCopy
//     measures the copy alone both ways).
//   - onekey: the ordered route with every message on one key against a
//     sink that answers after oneKeyDelay, against the same route and key
//     with a sink answering at once. One key runs one message at a time, so
//     A is bounded by 1 / (oneKeyDelay + the bridge's time per message of
//     that key), and B measures that time in the same pair: the bound of
//     pair i is 1 / (oneKeyDelay + 1 / rate B_i). No target: reported.
//   - fleetrate: a destination rate_limit never reached (fleetRateYAML),
//     with twice the backlog and two more pairs than the others,
//     so that each try takes a per-process permit and leases the fleet's
//     permits from the counter stream <stream>_RATE but never waits,
//     against no rate limit. Reported: the throughput and CPU ratios, the
//     time added per request and the publishes to the counter per request
//     (the counter stream's last sequence after the run: the server is
//     fresh each run, and the stream keeps one message per subject, so its
//     message count would be the windows, not the publishes).

const (
	// orderedKeys is the number of keys of the ordered scenario.
	orderedKeys = 1000
	// keyToken is the subject token the ordered routes key on:
	// events.info.k<i> (subjectOf).
	keyToken = 3
	// oneKeyDelay is the sink's added latency in the onekey scenario.
	oneKeyDelay = 5 * time.Millisecond
	// fleetRateYAML is the fleetrate scenario's rate limit: 1,000,000
	// requests a second in bursts of 1,000 (refilled every 1 ms, the
	// fastest bridge check allows), far above what one bridge sends on
	// this machine, so that no try ever waits for it.
	fleetRateYAML = "{requests: 1000000, per: 1s, burst: 1000}"
)

// keysLabel names a backlog spread over keys subjects.
func keysLabel(keys int) string {
	if keys == 1 {
		return "1 key"
	}
	return thousands(float64(keys)) + " keys"
}

// issue28Scenarios are the scenarios of issue 28, run after the others.
func issue28Scenarios(o options) []scenario {
	unordered := system{inFlight: 64, keys: orderedKeys}
	ordered := unordered
	ordered.ordered = true
	oneKey := system{inFlight: 64, keys: 1, ordered: true}
	oneKeySlow := oneKey
	oneKeySlow.sinkDelay = oneKeyDelay
	limited := system{inFlight: 64, rateLimit: true}
	unorderedOne := unordered
	unorderedOne.filter = "events.info.*"
	orderedOne := ordered
	orderedOne.filter = unorderedOne.filter
	return []scenario{
		{name: "ordered", title: fmt.Sprintf("ordered delivery, %s interleaved, vs the same route without ordering (issue 28)", keysLabel(orderedKeys)),
			kind: drain, a: ordered, b: unordered, n: o.n, runs: o.runs},
		{name: "orderedone", title: fmt.Sprintf("the ordered scenario with the route's subjects %s (one subject transform for the copy instead of three) vs the same route without ordering (issue 28)", unorderedOne.filter),
			kind: drain, a: orderedOne, b: unorderedOne, n: o.n, runs: o.runs, named: true},
		{name: "onekey", title: fmt.Sprintf("ordered delivery, every message on one key, sink answering after %s vs at once (issue 28)", oneKeyDelay),
			kind: drain, a: oneKeySlow, b: oneKey, n: o.oneKeyN, runs: o.runs},
		// Twice the backlog and two more pairs: the difference measured is
		// a few µs per request, within the noise of short drains.
		{name: "fleetrate", title: "a fleet-wide rate limit never reached vs no rate limit (issue 28)",
			kind: drain, a: limited, b: system{inFlight: 64}, n: 2 * o.n, runs: o.runs + 2},
	}
}

// counterPublishes is the number of publishes the bridge made to the
// fleet rate limit's counter stream on this (fresh) server: its last
// sequence.
func (p *publisher) counterPublishes(ctx context.Context) (uint64, error) {
	s, err := p.js.Stream(ctx, streamName+"_RATE")
	if err != nil {
		return 0, fmt.Errorf("counter stream %s_RATE: %w", streamName, err)
	}
	return s.CachedInfo().State.LastSeq, nil
}

// targets28 evaluates issue 28's rows on the scenarios that ran.
func targets28(res map[string]*scenarioResult) []target {
	rate := metricOf(drain, "msgs/s")
	cpu := metricOf(drain, "CPU s / 10k msgs")
	var ts []target
	notRun := func(measure, goal, name string) {
		ts = append(ts, target{measure: measure, goal: goal, got: "not run (scenario " + name + ")", notRun: true})
	}

	ordMeasure := fmt.Sprintf("throughput, ordered route (%s interleaved, 16 partitions, max_in_flight 64) vs the same route unordered, same run (ordered)", keysLabel(orderedKeys))
	const ordGoal = "≥ 0.8×"
	if sr, ok := ran(res, "ordered"); ok {
		r := sr.ratio(rate)
		ts = append(ts, check(ordMeasure, ordGoal, ratioText(r, 0.8), r >= 0.8))
		ts = append(ts, noteLine("↳ CPU per message of the bridge process, ordered vs unordered (ordered)", "—", fmt.Sprintf("%.2f×", sr.ratio(cpu))))
		ts = append(ts, noteLine("↳ time ordering adds per message (ordered)", "—", fmt.Sprintf("%+.1f µs/msg", addedMicros(sr))))
		ts = append(ts, noteLine("↳ JetStream server CPU per message, ordered vs unordered (the copy's sourcing, 16 partition consumers; ordered)", "—",
			fmt.Sprintf("%.2f×", sr.ratio(metricOf(drain, "server CPU s / 10k")))))
		share := median(slices.DeleteFunc(values(sr.a[:sr.pairs()], func(r result) float64 { return r.copyShare }), math.IsNaN))
		ts = append(ts, noteLine("↳ the partitioned copy held the whole backlog after this share of the ordered drain (ordered)", "—",
			fmt.Sprintf("%.0f %%", 100*share)))
		if one, ok := ran(res, "orderedone"); ok {
			ts = append(ts, noteLine("↳ the same with the route's subjects events.info.* instead of events.>: one transform for the copy (orderedone)", "—",
				fmt.Sprintf("%.2f× (server CPU %.2f×)", one.ratio(rate), one.ratio(metricOf(drain, "server CPU s / 10k")))))
		}
	} else {
		notRun(ordMeasure, ordGoal, "ordered")
	}

	oneMeasure := fmt.Sprintf("throughput of one key, sink latency %s (onekey)", oneKeyDelay)
	oneGoal := fmt.Sprintf("report: one at a time, ≈ 1 / (%s + the bridge's time per message of one key)", oneKeyDelay)
	if sr, ok := ran(res, "onekey"); ok {
		got, bound, of, perMsg := oneKeyBound(sr)
		ts = append(ts, noteLine(oneMeasure, oneGoal,
			fmt.Sprintf("%s msgs/s = %.2f× the bound %s msgs/s (1 / (%s + %.0f µs)); 1 / %s alone is %s msgs/s",
				thousands(got), of, thousands(bound), oneKeyDelay, perMsg, oneKeyDelay, thousands(1/oneKeyDelay.Seconds()))))
		ts = append(ts, noteLine("↳ one key, sink answering at once: the bridge's time per message of one key (onekey, B)", "—",
			fmt.Sprintf("%s msgs/s, %.0f µs/msg", thousands(sr.column(rate, sr.b[:sr.pairs()])), perMsg)))
	} else {
		notRun(oneMeasure, oneGoal, "onekey")
	}

	const frMeasure = "fleet rate limit never reached vs none: throughput (fleetrate)"
	const frGoal = "report: the cost per request"
	if sr, ok := ran(res, "fleetrate"); ok {
		ts = append(ts, noteLine(frMeasure, frGoal, fmt.Sprintf("%.2f×", sr.ratio(rate))))
		ts = append(ts, noteLine("↳ CPU per message of the bridge process (fleetrate)", "—", fmt.Sprintf("%.2f×", sr.ratio(cpu))))
		ts = append(ts, noteLine("↳ time added per request (fleetrate)", "—", fmt.Sprintf("%+.1f µs/request", addedMicros(sr))))
		pubs := median(values(sr.a[:sr.pairs()], func(r result) float64 { return r.counterPubs }))
		// Summed over the tries of every run of A, per request (a request
		// per message: the sink answers 202 to all).
		perReq := func(f func(result) float64) float64 {
			return sum(values(sr.a[:sr.pairs()], f)) * 1e6 / float64(sr.sc.n*sr.pairs())
		}
		ts = append(ts, noteLine("↳ time tries waited, summed over tries, per request: for the rate limit (bridge_destination_rate_limited_seconds_total) / for the fleet's quota (bridge_fleet_rate_wait_seconds_total); failed uses of the counter, all runs (fleetrate)", "—",
			fmt.Sprintf("%.1f µs / %.1f µs; %.0f", perReq(func(r result) float64 { return r.limitedSecs }),
				perReq(func(r result) float64 { return r.fleetWaitSecs }), sum(values(sr.a[:sr.pairs()], func(r result) float64 { return r.fleetErrors })))))
		ts = append(ts, noteLine("↳ publishes to the counter stream `"+streamName+"_RATE` per request (fleetrate)", "—", strconv.FormatFloat(pubs, 'f', 4, 64)))
	} else {
		notRun(frMeasure, frGoal, "fleetrate")
	}
	return ts
}

// oneKeyBound reads the onekey scenario: the median rate of A (got), the
// median over the pairs of the bound 1 / (oneKeyDelay + 1 / rate B_i),
// the median of the pairs' A / bound (of), and the median time per
// message of B in µs (perMsg).
func oneKeyBound(sr *scenarioResult) (got, bound, of, perMsg float64) {
	var bounds, ofs, per []float64
	for i := range sr.pairs() {
		a, b := sr.a[i].rate, sr.b[i].rate
		if a <= 0 || b <= 0 {
			continue
		}
		bd := 1 / (oneKeyDelay.Seconds() + 1/b)
		bounds, ofs, per = append(bounds, bd), append(ofs, a/bd), append(per, 1e6/b)
	}
	got = median(values(sr.a[:sr.pairs()], func(r result) float64 { return r.rate }))
	if len(bounds) == 0 {
		return got, math.NaN(), math.NaN(), math.NaN()
	}
	return got, median(bounds), median(ofs), median(per)
}

// copyPoll is how often a drain of an ordered route reads its copy's
// state: each read is a stream info request to the server under test.
const copyPoll = 100 * time.Millisecond

// copyWatch follows how far the partitioned copy of an ordered route has
// taken in the backlog during a drain (the copy sources the source
// stream while the route delivers): when it holds all n messages early
// in the drain, the copy does not pace delivery; when only at its end,
// it may.
type copyWatch struct {
	pub        *publisher
	n          uint64
	first      time.Time // the first request, as the drain's poll saw it
	done       time.Time // the copy held every message
	lastPoll   time.Time
	copyStream string
}

func newCopyWatch(pub *publisher, n int) *copyWatch {
	return &copyWatch{pub: pub, n: uint64(n), copyStream: config.CopyStream(streamName, "bench0")}
}

// observe is called at every poll of the drain; started reports whether
// the sink has seen the first request.
func (w *copyWatch) observe(ctx context.Context, started bool) error {
	now := time.Now()
	if !started || !w.done.IsZero() || now.Sub(w.lastPoll) < copyPoll {
		return nil
	}
	if w.first.IsZero() {
		w.first = now
	}
	w.lastPoll = now
	s, err := w.pub.js.Stream(ctx, w.copyStream)
	if err != nil {
		return fmt.Errorf("copy stream %s: %w", w.copyStream, err)
	}
	// A work-queue stream: messages leave it once delivered, its last
	// sequence counts every one it took in.
	if s.CachedInfo().State.LastSeq >= w.n {
		w.done = now
	}
	return nil
}

// share is the part of a drain of secs seconds after which the copy held
// every message (NaN when it was never seen full).
func (w *copyWatch) share(secs float64) float64 {
	if w.done.IsZero() || secs <= 0 {
		return math.NaN()
	}
	return min(w.done.Sub(w.first).Seconds()/secs, 1)
}

// rateCounters are what the bridge's /metrics says of its rate limit over
// a fleetrate run: the seconds tries waited for it (the destination's
// rate_limited counter, and the fleet's wait counter) and the failed uses of the fleet counter (op "rate": the
// replica then kept to its per-process limit, the counter unused).
type rateCounters struct {
	limitedSecs, fleetWaitSecs, fleetErrors float64
}

// readRateCounters scrapes the bridge's /metrics at url for them. A
// series never incremented is not exported: it counts 0.
func readRateCounters(ctx context.Context, hc *http.Client, url string) (rateCounters, error) {
	var c rateCounters
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return c, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return c, fmt.Errorf("rate counters: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return c, fmt.Errorf("rate counters: %s: status %d", url, resp.StatusCode)
	}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 4<<20))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		series, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		name, labels, _ := strings.Cut(series, "{")
		var dst *float64
		switch {
		case name == "bridge_destination_rate_limited_seconds_total":
			dst = &c.limitedSecs
		case name == "bridge_fleet_rate_wait_seconds_total":
			dst = &c.fleetWaitSecs
		case name == "bridge_fleet_state_errors_total" && strings.Contains(labels, `op="rate"`):
			dst = &c.fleetErrors
		default:
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return c, fmt.Errorf("rate counters: %s: %w", series, err)
		}
		*dst += f
	}
	if err := sc.Err(); err != nil {
		return c, fmt.Errorf("rate counters: %w", err)
	}
	return c, nil
}

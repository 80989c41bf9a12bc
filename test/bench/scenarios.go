package main

import (
	"fmt"
	"time"
)

// kind is what a run measures.
type kind int

const (
	// drain: pre-publish the backlog, start the system, time the drain.
	drain kind = iota
	// latency: start the system, publish at a fixed rate, time each event.
	latency
	// breakerOpen: destination answers 503, breaker open; cost over a window.
	breakerOpen
	// status500: destination answers 500 to everything; cost over a window.
	status500
)

// scenario is a pair of systems measured alternately (A B A B …); ratios
// are A / B of the same pair of runs.
type scenario struct {
	name  string // for -scenarios
	title string
	kind  kind
	a, b  system
	n     int // backlog (drain, failure runs) unless a system sets its own
	runs  int
	// named: run only when -scenarios names it (the baseline comparisons,
	// which need -baseline).
	named bool
	// together (latency scenarios): each run starts A and B at once on one
	// server, each consuming every message and delivering to a sink lane
	// of its own, so that both see the same moment of the machine (on a
	// shared machine, the latency tail of separate runs mostly measures
	// what else ran then). Which system starts first alternates.
	together bool
}

// options are the benchmark's flags.
type options struct {
	runs, failureRuns int
	n, connsN         int
	rssSmall, rssBig  int
	rate              int
	latencyFor        time.Duration
	breakerFor        time.Duration
	status500For      time.Duration
	status500Backlog  int
	oneKeyN           int // backlog of the onekey scenario (issue28.go)
}

func defaultOptions(quick bool) options {
	if quick {
		return options{
			runs: 3, failureRuns: 1, n: 10_000, connsN: 20_000, rssSmall: 20_000, rssBig: 100_000,
			rate: 1000, latencyFor: 5 * time.Second, breakerFor: 10 * time.Second,
			status500For: 5 * time.Second, status500Backlog: 100, oneKeyN: 1000,
		}
	}
	return options{
		runs: 5, failureRuns: 1, n: 30_000, connsN: 100_000, rssSmall: 20_000, rssBig: 200_000,
		rate: 1000, latencyFor: 10 * time.Second, breakerFor: 30 * time.Second,
		status500For: 10 * time.Second, status500Backlog: 100, oneKeyN: 2000,
	}
}

// status500Backoff is the route's backoff in the status500 scenario: the
// redelivery rate is bounded by backlog / backoff.
const (
	status500Backoff     = time.Second
	status500BackoffYAML = "[1s]"
)

// allScenarios are the scenarios of issues 10, 26 and 28 (issue28.go), in
// the order they run.
func allScenarios(o options) []scenario {
	jb := func(inFlight int) system { return system{inFlight: inFlight} }
	naive := func(k int) system { return system{naive: true, inFlight: k} }
	// floor is the naive bridge doing the work the contract requires of
	// jetbridge and nothing more: the envelope and a confirmed ack, its
	// confirmation collected asynchronously as the bridge collects its own
	// (the cheapest known way). floorSync confirms each ack with DoubleAck,
	// the floor before acks were confirmed off the worker.
	floor := naive(64)
	floor.envelope, floor.confirm, floor.async = true, true, true
	floorSync := floor
	floorSync.async = false
	// floorKV is the floor plus the two KV writes of idempotency (the
	// reservation before the POST, done after the 2xx) and nothing more.
	// fatFloor is the floor linked with the third-party code the bridge
	// binary carries (fat.go): the floor of its peak RSS.
	fatFloor := floor
	fatFloor.fat = true
	floorKV := floor
	floorKV.kv = true
	raw := jb(64)
	raw.format = "raw"
	idem := jb(64)
	idem.idempotency = true
	small, big := jb(64), jb(64)
	small.messages, big.messages = o.rssSmall, o.rssBig
	failing := system{inFlight: 64, noBreaker: true, backoff: status500BackoffYAML, maxDeliver: 1000}
	limited := jb(64)
	limited.concurrency = 64
	floor32 := naive(32)
	floor32.envelope, floor32.confirm, floor32.async = true, true, true
	// wm is the Watermill peer, in the one configuration issue 26 states
	// (64 queue subscriptions): its concurrency is part of it.
	wm := system{watermill: true, inFlight: watermillSubscribers}
	base64, base32 := jb(64), jb(32)
	base64.baseline, base32.baseline = true, true
	return append([]scenario{
		{name: "envelope", title: "envelope, defaults (breaker, transport retry, metrics; idempotency off)", kind: drain, a: jb(64), b: naive(64), n: o.n, runs: o.runs},
		{name: "raw", title: "format raw", kind: drain, a: raw, b: naive(64), n: o.n, runs: o.runs},
		{name: "floor", title: "the contract's required work alone on the naive bridge (envelope with json.Valid, confirmed ack)", kind: drain, a: floor, b: naive(64), n: o.n, runs: o.runs},
		{name: "floorsync", title: "the floor confirming each ack with DoubleAck (the floor before issue 26) vs the floor", kind: drain, a: floorSync, b: floor, n: o.n, runs: o.runs},
		{name: "overhead", title: "jetbridge beyond the floor (envelope defaults vs the naive bridge doing only the required work)", kind: drain, a: jb(64), b: floor, n: o.n, runs: o.runs},
		{name: "watermill", title: "jetbridge vs a Watermill-assembled bridge (issue 26: Router, watermill-nats push consumer with 64 queue subscriptions, watermill-http publisher, Retry and Recoverer)", kind: drain, a: jb(64), b: wm, n: o.n, runs: o.runs},
		{name: "wmnaive", title: "the Watermill-assembled bridge vs the minimal loop", kind: drain, a: wm, b: naive(64), n: o.n, runs: o.runs},
		{name: "rssfloor", title: "the floor linked with the bridge's third-party dependencies (embedded JetStream server, OpenTelemetry with OTLP HTTP and gRPC, Prometheus, YAML, CLI) vs naive", kind: drain, a: fatFloor, b: naive(64), n: o.n, runs: o.runs},
		{name: "rssoverhead", title: "jetbridge beyond that floor", kind: drain, a: jb(64), b: fatFloor, n: o.n, runs: o.runs},
		{name: "mif256", title: "envelope, max_in_flight 256", kind: drain, a: jb(256), b: naive(256), n: o.n, runs: o.runs},
		{name: "idempotency", title: "idempotency on vs off", kind: drain, a: idem, b: jb(64), n: o.n, runs: o.runs},
		{name: "idemfloor", title: "idempotency's two KV writes alone on the floor (kv.Create before each POST, kv.Update after the 2xx, bucket like the bridge's)", kind: drain, a: floorKV, b: floor, n: o.n, runs: o.runs},
		{name: "flow", title: "a fixed concurrency limit (never reached) vs no flow control", kind: drain, a: limited, b: jb(64), n: o.n, runs: o.runs},
		{name: "latency", title: fmt.Sprintf("publish-to-delivery latency at %d msgs/s for %s", o.rate, o.latencyFor), kind: latency, a: jb(32), b: naive(32), runs: o.runs},
		{name: "latencyfloor", title: fmt.Sprintf("latency at %d msgs/s, separate runs: the contract's required work alone on the naive bridge (envelope with json.Valid, confirmed ack)", o.rate), kind: latency, a: floor32, b: naive(32), runs: o.runs},
		{name: "latencyoverhead", title: fmt.Sprintf("latency at %d msgs/s, separate runs: jetbridge beyond that floor", o.rate), kind: latency, a: jb(32), b: floor32, runs: o.runs},
		{name: "latpair", title: fmt.Sprintf("the latency scenario with both systems at once (each consumes every message, %d msgs/s each)", o.rate), kind: latency, a: jb(32), b: naive(32), runs: o.runs, together: true},
		{name: "latfloor", title: fmt.Sprintf("latency at %d msgs/s, both at once: the contract's required work alone on the naive bridge (envelope with json.Valid, confirmed ack)", o.rate), kind: latency, a: floor32, b: naive(32), runs: o.runs, together: true},
		{name: "latoverhead", title: fmt.Sprintf("latency at %d msgs/s, both at once: jetbridge beyond that floor", o.rate), kind: latency, a: jb(32), b: floor32, runs: o.runs, together: true},
		{name: "latwatermill", title: fmt.Sprintf("latency at %d msgs/s, both at once: jetbridge (max_in_flight 32) vs the Watermill-assembled bridge (its 64 subscriptions)", o.rate), kind: latency, a: jb(32), b: wm, runs: o.runs, together: true},
		{name: "latwmnaive", title: fmt.Sprintf("latency at %d msgs/s, both at once: the Watermill-assembled bridge (its 64 subscriptions) vs naive K=32", o.rate), kind: latency, a: wm, b: naive(32), runs: o.runs, together: true},
		{name: "conns256", title: fmt.Sprintf("sink TCP connections, %d messages, max_in_flight 256", o.connsN), kind: drain, a: jb(256), b: naive(256), n: o.connsN, runs: o.runs},
		{name: "conns1024", title: fmt.Sprintf("sink TCP connections, %d messages, max_in_flight 1024", o.connsN), kind: drain, a: jb(1024), b: naive(1024), n: o.connsN, runs: o.runs},
		{name: "rss", title: fmt.Sprintf("peak RSS flatness, %d vs %d backlog", o.rssSmall, o.rssBig), kind: drain, a: small, b: big, runs: o.runs},
		{name: "breaker", title: fmt.Sprintf("destination answering 503, breaker open, %s window", o.breakerFor), kind: breakerOpen, a: jb(64), b: naive(64), n: 1000, runs: o.failureRuns},
		{name: "baseline", title: "this build vs the -baseline build, envelope defaults", kind: drain, a: jb(64), b: base64, n: o.n, runs: o.runs, named: true},
		{name: "latbaseline", title: fmt.Sprintf("this build vs the -baseline build, latency at %d msgs/s for %s, both at once", o.rate, o.latencyFor), kind: latency, a: jb(32), b: base32, runs: o.runs, named: true, together: true},
		{name: "status500", title: fmt.Sprintf("destination answering 500 to everything, %d messages, %s window (jetbridge: breaker off, backoff %s)", o.status500Backlog, o.status500For, status500BackoffYAML), kind: status500, a: failing, b: naive(64), n: o.status500Backlog, runs: o.failureRuns},
	}, issue28Scenarios(o)...)
}

// backlog is the number of messages sys drains in sc.
func (sc scenario) backlog(sys system) int {
	if sys.messages > 0 {
		return sys.messages
	}
	return sc.n
}

// window is how long a failure run measures.
func (o options) window(k kind) time.Duration {
	if k == breakerOpen {
		return o.breakerFor
	}
	return o.status500For
}

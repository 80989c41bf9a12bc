// Command bench is jetbridge's end-to-end performance benchmark
// (docs/performance.md). In one run on one machine it builds the real bridge
// binary, starts a JetStream server and an HTTP sink in processes of their
// own, and measures the bridge against a naive reference bridge written
// here, the two alternating run by run (A B A B …). It prints medians and
// paired ratios as Markdown tables, then the issues' targets met or missed.
//
// Two scenarios are floor references. The naive bridge's -envelope and
// -confirm options each add one piece of the work jetbridge's contract
// requires and the naive bridge skips: the JSON envelope of
// docs/delivery.md#the-request (json.Valid, the same bytes, appended into a reused buffer) and
// the confirmed ack (-async: collected on one subscription as the bridge
// collects its own; "floorsync" compares it with a DoubleAck per
// message, the floor before issue 26). "floor" measures that naive bridge against
// the plain one, the cost of the required work alone; "overhead" measures
// jetbridge against that floor, the cost of jetbridge beyond it. Under a
// missed throughput or CPU target the targets table prints both.
// "idemfloor" does the same for idempotency: the naive bridge's -kv adds
// the two KV writes of docs/delivery.md#exactly-one-delivery-per-event-id (an
// atomic kv.Create before each POST, a kv.Update to done after the 2xx,
// on a bucket configured like the bridge's) to that floor, and measures it
// against the floor; under a missed idempotency target the targets table
// prints what those two writes alone cost, against what idempotency adds
// to jetbridge per message. "rssfloor" and "rssoverhead" do the same for
// peak RSS: the floor is then run from a second build of this benchmark
// (-tags fatfloor, fat.go) that links the third-party code the bridge
// binary must carry, whose initialisation and resident code pages are
// part of any bridge that keeps the contract.
//
// The Watermill peer (issue 26) is a third system: a bridge assembled
// from Watermill as a Go developer would, in a nested module of its own
// (test/bench/watermill, so that jetbridge's module never depends on
// Watermill), built with `go build` there and run against the same
// server, stream and sink. "watermill" measures jetbridge against it,
// "wmnaive" it against the naive bridge, "latwatermill" and "latwmnaive"
// the same at the paced rate, both at once. Every drain also counts the
// allocations per message of the system's own process (allocs.go). The
// run ends with issue 26's targets (issue26.go), each row measured or
// marked as not run, then the rest of issue 10's, then issue 28's rows
// (issue28.go): "ordered" (an ordered route over 1,000 interleaved keys
// vs the same route unordered), "onekey" (one key, against a sink that
// answers after 5 ms vs at once) and "fleetrate" (a fleet-wide rate limit
// never reached vs none), jetbridge against jetbridge.
//
// Latency tails on a shared machine mostly measure what else ran at the
// time, so "latpair", "latfloor" and "latoverhead" run their two systems
// at once on one server, each with its own durable consumer (every message
// is delivered by both) and its own sink lane: the pair sees the same
// moment of the machine. "latency" is the issue's own measurement, the
// two systems in separate runs, and "latencyfloor" and "latencyoverhead"
// split it the same way, in separate runs too.
//
//	go run ./test/bench            # every scenario, 5 pairs each (~17 min on 2 cores, plus the Watermill scenarios)
//	go run ./test/bench -quick     # smaller N, 3 pairs: about 5 minutes
//	go run ./test/bench -scenarios envelope,latency -runs 7
//
// Invariants:
//
//   - Every process it starts is its own child, started with
//     exec.CommandContext and a parent-death signal: SIGINT or SIGTERM stops
//     them all and removes the temp dir, and a killed benchmark leaves no
//     server, sink or bridge running.
//   - Every wait is bounded: a run that stalls fails with the counts it
//     reached, it never hangs.
//   - Every message is checked: a run succeeds only when the sink has seen
//     each of the N event ids; duplicates are counted, never hidden.
//
// The benchmark re-executes its own binary for the helper processes: the
// first argument names the role (see roles). It is a main package without
// tests, so `go test ./...` builds it but never runs it.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// linkedFat is set by fat.go when the binary was built with -tags
// fatfloor, linking the bridge's third-party dependencies (the rssfloor
// scenarios).
var linkedFat bool

// roles are the hidden subcommands the benchmark re-executes itself with.
var roles = map[string]func(ctx context.Context, args []string) error{
	"_natsd": runNatsd,
	"_sink":  runSink,
	"_naive": runNaive,
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	var err error
	if len(os.Args) > 1 && roles[os.Args[1]] != nil {
		err = roles[os.Args[1]](ctx, os.Args[2:])
	} else {
		err = runBench(ctx, os.Args[1:])
	}
	stop()
	if err != nil {
		if errors.Is(err, context.Canceled) {
			fmt.Fprintln(os.Stderr, "bench: interrupted")
			os.Exit(130)
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

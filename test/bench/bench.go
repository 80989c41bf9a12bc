package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// runBench is the benchmark itself: flags, build, sink, scenarios, report.
// Progress goes to stderr, the Markdown report to stdout.
func runBench(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "usage: go run ./test/bench [flags]\n\nEnd-to-end benchmark of the bridge binary against a naive reference bridge and a Watermill-assembled one (docs/performance.md).\n\n")
		fs.PrintDefaults()
		fmt.Fprintf(out, "\nScenarios (A vs B, in the order they run; figures of a full run):\n")
		for _, sc := range allScenarios(defaultOptions(false)) {
			fmt.Fprintf(out, "  %-16s %s\n  %-16s A: %s; B: %s\n", sc.name, sc.title, "", sc.a.label(), sc.b.label())
		}
		fmt.Fprintf(out, "\nfloor and overhead split a missed throughput or CPU target: floor is what the\n"+
			"work the contract requires (the envelope, a confirmed ack) costs the naive\n"+
			"bridge, overhead what jetbridge costs beyond it. idemfloor splits a missed\n"+
			"idempotency target: what idempotency's two KV writes per message (kv.Create\n"+
			"before the POST, kv.Update after the 2xx) alone cost that floor. rssfloor and\n"+
			"rssoverhead split a missed peak RSS target the same way: rssfloor is the floor\n"+
			"built with -tags fatfloor, linking the bridge's third-party dependencies.\n"+
			"latencyfloor and latencyoverhead split a missed p99 latency target, in separate\n"+
			"runs like latency's; latfloor and latoverhead do it with both systems at once.\n"+
			"watermill and wmnaive measure jetbridge against the Watermill peer (issue 26,\n"+
			"built from its nested module test/bench/watermill) and the peer against the\n"+
			"naive bridge; latwatermill and latwmnaive do the same at the paced rate, both\n"+
			"at once. ordered, onekey and fleetrate measure issue 28: an ordered route over\n"+
			"1,000 interleaved keys vs the same route unordered, one key against a sink\n"+
			"answering after 5ms vs at once, and a fleet rate limit never reached vs none;\n"+
			"orderedone (only when named) is ordered with the route's subjects events.info.*.\n"+
			"The run ends with the targets of issue 26, the rest of issue 10's, then issue 28's.\n")
	}
	quick := fs.Bool("quick", false, "smaller backlogs, 3 runs, shorter windows: a few minutes")
	list := fs.String("scenarios", "", "comma-separated scenarios to run (default: all but baseline, latbaseline and orderedone): "+strings.Join(scenarioNames(), ","))
	runs := fs.Int("runs", 0, "paired runs per scenario (default 5, -quick 3)")
	n := fs.Int("n", 0, "backlog of the throughput scenarios (default 30000, -quick 10000)")
	bridgeBin := fs.String("bridge", "", "use this bridge binary instead of building ./cmd/bridge")
	baseline := fs.String("baseline", "", "a second bridge binary (a build of an earlier commit, say) that the baseline and latbaseline scenarios measure this build against, paired")
	keep := fs.Bool("keep", false, "keep the temp dir and the logs of every run (not their JetStream stores)")
	perfDir := fs.String("perf", "", "record each drain run's system process (RUN.perf.data) and JetStream server (RUN.server.perf.data) with Linux `perf record -g` into this directory (those runs' figures include perf's overhead)")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	o := defaultOptions(*quick)
	if *runs < 0 || *n < 0 {
		return errors.New("-runs and -n must not be negative")
	}
	if *runs > 0 {
		o.runs = *runs
	}
	if *n > 0 {
		o.n = *n
	}
	selected, err := selectScenarios(allScenarios(o), *list)
	if err != nil {
		return err
	}

	if slices.ContainsFunc(selected, func(sc scenario) bool { return sc.b.baseline }) {
		if *baseline == "" {
			return errors.New("the baseline and latbaseline scenarios need -baseline BINARY")
		}
		if fi, err := os.Stat(*baseline); err != nil || fi.IsDir() {
			return fmt.Errorf("-baseline %s: not a bridge binary", *baseline)
		}
	}

	tmp, err := os.MkdirTemp("", "jetbridge-bench-")
	if err != nil {
		return err
	}
	if *keep {
		fmt.Fprintln(os.Stderr, "bench: temp dir", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	e := &env{opts: o, tmp: tmp, baselineBin: *baseline, keep: *keep}
	if *perfDir != "" {
		if _, err := exec.LookPath("perf"); err != nil {
			return fmt.Errorf("-perf: %w", err)
		}
		if e.perfDir, err = filepath.Abs(*perfDir); err != nil {
			return err
		}
		if err := os.MkdirAll(e.perfDir, 0o755); err != nil {
			return fmt.Errorf("-perf: %w", err)
		}
	}
	if e.self, err = os.Executable(); err != nil {
		return err
	}
	if e.bridgeBin = *bridgeBin; e.bridgeBin == "" {
		if e.bridgeBin, err = buildIn(ctx, tmp, "bridge", "./cmd/bridge"); err != nil {
			return err
		}
	}
	if slices.ContainsFunc(selected, func(sc scenario) bool { return sc.a.fat || sc.b.fat }) {
		if e.fatSelf, err = buildIn(ctx, tmp, "bench-fat", "./test/bench", "-tags", "fatfloor"); err != nil {
			return err
		}
	}
	if slices.ContainsFunc(selected, func(sc scenario) bool { return sc.a.watermill || sc.b.watermill }) {
		if e.watermillBin, e.watermillMods, err = buildWatermill(ctx, tmp); err != nil {
			return err
		}
	}
	sinkProc, addrs, err := startChild(ctx, tmp, "sink", e.self, []string{"_sink"}, nil)
	if err != nil {
		return err
	}
	defer sinkProc.stop()
	e.sinkPID = sinkProc.pid()
	dest, ctl, ok := strings.Cut(addrs, " ")
	if !ok {
		return fmt.Errorf("sink printed %q, want two addresses", addrs)
	}
	e.sink = newSinkClient(dest, ctl)

	started := time.Now()
	fmt.Printf("### End-to-end benchmark\n\nMachine: %s.\n", machine())
	mode := "full"
	if *quick {
		mode = "quick"
	}
	fmt.Printf("Mode %s: %d paired runs per scenario (failure scenarios: %d), 1 KiB JSON payloads; A is the first row, B the second.\n", mode, o.runs, o.failureRuns)
	if e.watermillMods != "" {
		fmt.Printf("Watermill peer (test/bench/watermill): %s.\n", e.watermillMods)
	}
	results := map[string]*scenarioResult{}
	for _, sc := range selected {
		sr := e.runScenario(ctx, sc)
		results[sc.name] = sr
		sr.writeTable(os.Stdout)
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
	}
	writeTargets(os.Stdout, "Targets of issue 26", targets26(results, o))
	writeTargets(os.Stdout, "Other targets (issue 10)", otherTargets(results, o))
	writeTargets(os.Stdout, "Ordered delivery and the fleet rate limit (issue 28)", targets28(results))
	fmt.Printf("\nTotal %s; load average at the end %s.\n", formatDuration(time.Since(started)), loadavg())
	for _, sr := range results {
		if sr.err != nil {
			return fmt.Errorf("scenario %s: %w", sr.sc.name, sr.err)
		}
	}
	return nil
}

// runScenario runs the pairs of sc, A then B, stopping at the first failed
// run (its error is kept with the pairs completed before it).
func (e *env) runScenario(ctx context.Context, sc scenario) *scenarioResult {
	sr := &scenarioResult{sc: sc}
	for i := range sc.runs {
		if sc.together {
			dir := filepath.Join(e.tmp, fmt.Sprintf("%s-%d", sc.name, i+1))
			t0 := time.Now()
			ra, rb, err := e.runTogether(ctx, sc, dir, i%2 == 1)
			if err != nil {
				sr.err = fmt.Errorf("run %d: %w", i+1, err)
				fmt.Fprintf(os.Stderr, "bench: %s: %v\n", sc.name, sr.err)
				return sr
			}
			sr.a, sr.b = append(sr.a, ra), append(sr.b, rb)
			for _, x := range []struct {
				sys system
				r   result
			}{{sc.a, ra}, {sc.b, rb}} {
				fmt.Fprintf(os.Stderr, "bench: %s run %d/%d %s (together, %s): %s\n", sc.name, i+1, sc.runs, x.sys.label(), formatDuration(time.Since(t0)), summary(sc.kind, x.r))
			}
			continue
		}
		for j, sys := range []system{sc.a, sc.b} {
			dir := filepath.Join(e.tmp, fmt.Sprintf("%s-%d-%c", sc.name, i+1, 'a'+j))
			t0 := time.Now()
			r, err := e.run(ctx, sc, sys, dir)
			if err != nil {
				sr.err = fmt.Errorf("run %d, %s: %w", i+1, sys.label(), err)
				fmt.Fprintf(os.Stderr, "bench: %s: %v\n", sc.name, sr.err)
				return sr
			}
			if j == 0 {
				sr.a = append(sr.a, r)
			} else {
				sr.b = append(sr.b, r)
			}
			fmt.Fprintf(os.Stderr, "bench: %s run %d/%d %s (%s): %s\n", sc.name, i+1, sc.runs, sys.label(), formatDuration(time.Since(t0)), summary(sc.kind, r))
		}
	}
	return sr
}

// summary is a progress line's view of one run.
func summary(k kind, r result) string {
	var parts []string
	for _, m := range metrics(k) {
		parts = append(parts, m.header+" "+m.format(m.get(r)))
	}
	return strings.Join(parts, ", ")
}

func scenarioNames() []string {
	var names []string
	for _, sc := range allScenarios(defaultOptions(false)) {
		names = append(names, sc.name)
	}
	return names
}

// selectScenarios keeps the scenarios named in list ("" keeps all), in
// their usual order; an unknown name is an error naming it.
func selectScenarios(all []scenario, list string) ([]scenario, error) {
	if list == "" {
		return slices.DeleteFunc(all, func(sc scenario) bool { return sc.named }), nil
	}
	want := strings.Split(list, ",")
	for _, w := range want {
		if !slices.ContainsFunc(all, func(sc scenario) bool { return sc.name == w }) {
			return nil, fmt.Errorf("-scenarios: unknown scenario %q (known: %s)", w, strings.Join(scenarioNames(), ","))
		}
	}
	var out []scenario
	for _, sc := range all {
		if slices.Contains(want, sc.name) {
			out = append(out, sc)
		}
	}
	return out, nil
}

// watermillDir is the Watermill peer's nested module, relative to the
// jetbridge module's root.
const watermillDir = "test/bench/watermill"

// buildWatermill builds the Watermill peer with `go build` in its nested
// module into dir, and lists the Watermill modules it links ("path
// version, …") for the report.
func buildWatermill(ctx context.Context, dir string) (bin, mods string, err error) {
	root, err := moduleRoot(ctx)
	if err != nil {
		return "", "", err
	}
	src := filepath.Join(root, watermillDir)
	bin = filepath.Join(dir, "watermill")
	fmt.Fprintf(os.Stderr, "bench: building the Watermill peer in %s\n", watermillDir)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	cmd.Dir = src
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", "", fmt.Errorf("go build in %s: %w", watermillDir, err)
	}
	list := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Path}} {{.Version}}",
		"github.com/ThreeDotsLabs/watermill", "github.com/ThreeDotsLabs/watermill-nats/v2", "github.com/ThreeDotsLabs/watermill-http/v2")
	list.Dir = src
	out, err := list.Output()
	if err != nil {
		return "", "", fmt.Errorf("go list -m in %s: %w", watermillDir, err)
	}
	return bin, strings.Join(strings.Split(strings.TrimSpace(string(out)), "\n"), ", "), nil
}

// moduleRoot is the directory of the jetbridge module the benchmark runs
// in.
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("run the benchmark inside the jetbridge module (go run ./test/bench), or pass -bridge")
	}
	return filepath.Dir(gomod), nil
}

// buildIn builds pkg (with the extra go build flags) of the module the
// benchmark runs in, into dir/name: ./cmd/bridge, and the benchmark's own
// -tags fatfloor build for the rssfloor scenarios.
func buildIn(ctx context.Context, dir, name, pkg string, flags ...string) (string, error) {
	root, err := moduleRoot(ctx)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, name)
	fmt.Fprintf(os.Stderr, "bench: building %s %s\n", pkg, strings.Join(flags, " "))
	cmd := exec.CommandContext(ctx, "go", append(append([]string{"build"}, flags...), "-o", bin, pkg)...)
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s: %w", pkg, err)
	}
	return bin, nil
}

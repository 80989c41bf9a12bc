package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// metric is one column of a scenario's table.
type metric struct {
	header string
	get    func(result) float64
	format func(float64) string
	agg    func([]float64) float64 // median unless set
	ratio  bool                    // print the median of the paired A/B ratios
}

func fixed(prec int) func(float64) string {
	return func(v float64) string { return strconv.FormatFloat(v, 'f', prec, 64) }
}

// thousands formats v rounded, with a comma every three digits.
func thousands(v float64) string {
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func sum(v []float64) float64 {
	t := 0.0
	for _, x := range v {
		t += x
	}
	return t
}

func maxOf(v []float64) float64 { return slices.Max(v) }

// median of v (the mean of the two middle values for an even count).
func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Sorted(slices.Values(v))
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// metrics are the columns of a scenario kind.
func metrics(k kind) []metric {
	rss := metric{header: "peak RSS MiB", get: func(r result) float64 { return r.rssMB }, format: fixed(1), ratio: true}
	cpu := metric{header: "CPU s / 10k msgs", get: func(r result) float64 { return r.cpuPer10k }, format: fixed(2), ratio: true}
	dups := metric{header: "duplicates (all runs)", get: func(r result) float64 { return r.dups }, format: thousands, agg: sum}
	switch k {
	case drain:
		return []metric{
			{header: "msgs/s", get: func(r result) float64 { return r.rate }, format: thousands, ratio: true},
			cpu, rss,
			{header: "RSS at start MiB", get: func(r result) float64 { return r.startMB }, format: fixed(1), ratio: true},
			{header: "of which binary MiB", get: func(r result) float64 { return r.fileMB }, format: fixed(1), ratio: true},
			{header: "sink TCP conns (max of runs)", get: func(r result) float64 { return r.conns }, format: thousands, agg: maxOf},
			{header: "syscalls / msg", get: func(r result) float64 { return r.syscalls }, format: fixed(1), ratio: true},
			{header: "allocs / msg", get: func(r result) float64 { return r.allocs }, format: fixed(0), ratio: true},
			{header: "KB alloc / msg", get: func(r result) float64 { return r.allocKB }, format: fixed(1), ratio: true},
			{header: "server CPU s / 10k", get: func(r result) float64 { return r.serverCPU }, format: fixed(2), ratio: true},
			{header: "sink CPU s / 10k", get: func(r result) float64 { return r.sinkCPU }, format: fixed(2), ratio: true},
			dups,
		}
	case latency:
		return []metric{
			{header: "p50 ms", get: func(r result) float64 { return r.p50 }, format: fixed(2), ratio: true},
			{header: "p99 ms", get: func(r result) float64 { return r.p99 }, format: fixed(2), ratio: true},
			{header: "p99.9 ms", get: func(r result) float64 { return r.p999 }, format: fixed(2), ratio: true},
			cpu, rss, dups,
		}
	case breakerOpen:
		return []metric{
			{header: "CPU % of one core", get: func(r result) float64 { return r.cpuShare }, format: fixed(2)},
			{header: "requests in window", get: func(r result) float64 { return r.requests }, format: thousands},
			{header: "requests/s", get: func(r result) float64 { return r.reqRate }, format: fixed(2)},
		}
	default:
		return []metric{
			{header: "requests/s", get: func(r result) float64 { return r.reqRate }, format: fixed(1)},
			{header: "CPU % of one core", get: func(r result) float64 { return r.cpuShare }, format: fixed(1)},
		}
	}
}

// scenarioResult is every run of a scenario: a[i] and b[i] are pair i.
type scenarioResult struct {
	sc   scenario
	a, b []result
	err  error // the run that failed, if any; the pairs before it are kept
}

// pairs is the number of complete pairs (a run of A and one of B).
func (sr *scenarioResult) pairs() int { return min(len(sr.a), len(sr.b)) }

func (sr *scenarioResult) column(m metric, rs []result) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = m.get(r)
	}
	if m.agg != nil {
		return m.agg(v)
	}
	return median(v)
}

// ratio is the median over the complete pairs of A/B for m.
func (sr *scenarioResult) ratio(m metric) float64 {
	var v []float64
	for i := range sr.pairs() {
		if b := m.get(sr.b[i]); b != 0 {
			v = append(v, m.get(sr.a[i])/b)
		}
	}
	return median(v)
}

// writeTable prints the scenario as a Markdown table: the medians of A and
// B, then the paired ratios.
func (sr *scenarioResult) writeTable(w io.Writer) {
	ms := metrics(sr.sc.kind)
	fmt.Fprintf(w, "\n#### %s (%s)\n\n", sr.sc.title, sr.sc.name)
	pairs := sr.pairs()
	fmt.Fprintf(w, "Paired runs: %d, alternating A B; medians.\n\n", pairs)
	if pairs == 0 {
		fmt.Fprintf(w, "no complete pair: %v\n", sr.err)
		return
	}
	hdr := []string{"system"}
	for _, m := range ms {
		hdr = append(hdr, m.header)
	}
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(hdr, " | "), strings.Repeat("---|", len(hdr)))
	for _, row := range []struct {
		sys system
		rs  []result
	}{{sr.sc.a, sr.a[:pairs]}, {sr.sc.b, sr.b[:pairs]}} {
		cells := []string{row.sys.label()}
		for _, m := range ms {
			cells = append(cells, m.format(sr.column(m, row.rs)))
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
	if slices.ContainsFunc(ms, func(m metric) bool { return m.ratio }) {
		cells := []string{"ratio A / B (median of pairs)"}
		for _, m := range ms {
			if m.ratio {
				cells = append(cells, fmt.Sprintf("%.2f×", sr.ratio(m)))
			} else {
				cells = append(cells, "")
			}
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
	if sr.err != nil {
		fmt.Fprintf(w, "\nstopped early: %v\n", sr.err)
	}
}

// target is one line of a target table. A note is a line under a target
// that states its limit (see limits) or a peer's figure; it has no
// verdict. A target whose scenario did not run says so (notRun).
type target struct {
	measure, goal, got string
	met                bool
	note               bool
	notRun             bool
}

// check is the line of a target: got against goal, met or not.
func check(measure, goal, got string, met bool) target {
	return target{measure: measure, goal: goal, got: got, met: met}
}

// ratioText is r as a ratio with two decimals, or three when two would
// round it onto the target's bound (0.6995 is not "0.70×" against ≥ 0.7×).
func ratioText(r, bound float64) string {
	if t := fmt.Sprintf("%.2f", r); t == fmt.Sprintf("%.2f", bound) && r != bound {
		return fmt.Sprintf("%.3f×", r)
	}
	return fmt.Sprintf("%.2f×", r)
}

// noteLine is a line under a missed target stating its limit.
func noteLine(measure, goal, got string) target {
	return target{measure: measure, goal: goal, got: got, note: true}
}

// otherTargets evaluates the targets of issue 10 that issue 26 does not
// restate (issue26.go has the rest): the sink's connections, the cost of
// an open breaker and of a destination answering 500.
func otherTargets(res map[string]*scenarioResult, o options) []target {
	var ts []target
	for _, c := range []struct {
		name string
		mif  int
	}{{"conns256", 256}, {"conns1024", 1024}} {
		if sr, ok := ran(res, c.name); ok {
			m := metricOf(drain, "sink TCP conns (max of runs)")
			got := sr.column(m, sr.a[:sr.pairs()])
			ts = append(ts, check(fmt.Sprintf("sink TCP connections, %dk messages, max_in_flight %d", o.connsN/1000, c.mif),
				fmt.Sprintf("≤ %d", c.mif+2), thousands(got), got <= float64(c.mif+2)))
		}
	}
	if sr, ok := ran(res, "breaker"); ok {
		cpu := median(values(sr.a, func(r result) float64 { return r.cpuShare }))
		reqs := maxOf(values(sr.a, func(r result) float64 { return r.requests }))
		// One probe per delay, plus one for a probe at each end of the window.
		allowed := math.Floor(o.breakerFor.Seconds()/breakerDelay.Seconds()) + 1
		ts = append(ts, check(fmt.Sprintf("breaker open %s: bridge CPU", o.breakerFor), "< 2 % of one core", fmt.Sprintf("%.2f %%", cpu), cpu < 2))
		ts = append(ts, check(fmt.Sprintf("breaker open %s: requests (delay %s)", o.breakerFor, breakerDelay),
			fmt.Sprintf("≤ 1 per delay (≤ %.0f)", allowed), thousands(reqs), reqs <= allowed))
	}
	if sr, ok := ran(res, "status500"); ok {
		rate := median(values(sr.a, func(r result) float64 { return r.reqRate }))
		bound := float64(o.status500Backlog) / status500Backoff.Seconds()
		ts = append(ts, check(fmt.Sprintf("destination answering 500, %d messages, backoff %s", o.status500Backlog, status500BackoffYAML),
			fmt.Sprintf("paced: ≤ %.0f requests/s", bound), fmt.Sprintf("%.1f requests/s", rate), rate <= bound))
	}
	return ts
}

// ran is the result of scenario name if it completed at least one pair.
func ran(res map[string]*scenarioResult, name string) (*scenarioResult, bool) {
	sr, ok := res[name]
	return sr, ok && sr.pairs() > 0
}

// metricOf is the column of kind k with that header.
func metricOf(k kind, header string) metric {
	for _, m := range metrics(k) {
		if m.header == header {
			return m
		}
	}
	panic("no metric " + header)
}

// floorLimits are the note lines under a missed target (goal: cmp want ×
// naive) on measure m: what a floor reference reaches against the naive
// bridge (scenario floor, its line labelled floorLabel), hence what the
// target asks of jetbridge against that floor (want ÷ floor), and where
// jetbridge is against it (scenario over, labelled overLabel). Either line
// is left out when its scenario did not run.
func floorLimits(res map[string]*scenarioResult, m metric, floor, over, floorLabel, overLabel, cmp string, want float64) []target {
	var ts []target
	limit := math.NaN()
	if sr, ok := res[floor]; ok && sr.pairs() > 0 {
		limit = sr.ratio(m)
		ts = append(ts, noteLine(floorLabel, "—", fmt.Sprintf("%.2f×", limit)))
	}
	if sr, ok := res[over]; ok && sr.pairs() > 0 {
		goal := "—"
		if !math.IsNaN(limit) && limit > 0 {
			goal = fmt.Sprintf("%s %.2f× floor (%g× ÷ %.2f×)", cmp, want/limit, want, limit)
		}
		ts = append(ts, noteLine(overLabel, goal, fmt.Sprintf("%.2f×", sr.ratio(m))))
	}
	return ts
}

// limits are floorLimits under a missed target of the envelope scenario:
// the naive bridge doing only the contract's required work (floor), and
// jetbridge against it (overhead).
func limits(res map[string]*scenarioResult, m metric, what, cmp string, want float64) []target {
	return floorLimits(res, m, "floor", "overhead",
		fmt.Sprintf("↳ limit, %s: a naive bridge doing only the required work (envelope + confirmed ack collected async, K=64) vs naive K=64 (floor)", what),
		fmt.Sprintf("↳ %s: jetbridge vs that floor (overhead)", what), cmp, want)
}

// rssLimits are floorLimits under a missed peak RSS target: the floor
// built with the bridge's third-party dependencies (rssfloor), and
// jetbridge against it (rssoverhead).
func rssLimits(res map[string]*scenarioResult, m metric, want float64) []target {
	return floorLimits(res, m, "rssfloor", "rssoverhead",
		"↳ limit, peak RSS: the floor linked with the bridge's third-party dependencies vs naive K=64 (rssfloor)",
		"↳ peak RSS: jetbridge vs that floor (rssoverhead)", "≤", want)
}

// latLimits are floorLimits under a missed p99 latency target: the naive
// bridge doing only the required work at the same rate and K, in runs of
// its own like the target's (latencyfloor), and jetbridge against it
// (latencyoverhead).
func latLimits(res map[string]*scenarioResult, m metric, want float64) []target {
	return floorLimits(res, m, "latencyfloor", "latencyoverhead",
		"↳ limit, p99 latency: a naive bridge doing only the required work (envelope + confirmed ack collected async, K=32) vs naive K=32, separate runs (latencyfloor)",
		"↳ p99 latency: jetbridge vs that floor, separate runs (latencyoverhead)", "≤", want)
}

// latOnceLimits are latLimits with both systems of each run at once on
// one server (latfloor, latoverhead).
func latOnceLimits(res map[string]*scenarioResult, m metric, want float64) []target {
	return floorLimits(res, m, "latfloor", "latoverhead",
		"↳ limit, p99 latency: a naive bridge doing only the required work (envelope + confirmed ack collected async, K=32) vs naive K=32, at once (latfloor)",
		"↳ p99 latency: jetbridge vs that floor, at once (latoverhead)", "≤", want)
}

// idemLimits are the note lines under a missed idempotency target (want ×
// the same run without): what the two KV writes of idempotency alone cost
// a naive bridge doing the required work (the idemfloor scenario, as a
// ratio and as time added per message), and the time idempotency adds per
// message to jetbridge against what the target allows it. The time per
// message compares the two fairly: the same added time lowers the floor's
// ratio more than jetbridge's, the floor being faster. Left out when
// idemfloor did not run.
func idemLimits(res map[string]*scenarioResult, idem *scenarioResult, want float64) []target {
	sr, ok := res["idemfloor"]
	if !ok || sr.pairs() == 0 {
		return nil
	}
	rate := func(r result) float64 { return r.rate }
	floor := sr.ratio(metric{get: rate})
	ts := []target{noteLine("↳ limit, throughput: the two KV writes alone on the floor (naive + envelope + confirmed ack (async) + 2 KV writes vs without, K=64; idemfloor)",
		"—", fmt.Sprintf("%.2f× (%+.1f µs/msg)", floor, addedMicros(sr)))}
	pairs := idem.pairs()
	allowed := (1/want - 1) * 1e6 / median(values(idem.b[:pairs], rate))
	ts = append(ts, noteLine("↳ throughput: time idempotency adds to jetbridge per message (idempotency)",
		fmt.Sprintf("≤ %.1f µs/msg (%g× of its rate without)", allowed, want), fmt.Sprintf("%+.1f µs/msg", addedMicros(idem))))
	return ts
}

// addedMicros is the median over the complete pairs of sr of the time A
// takes per message beyond B's in a drain, in µs (1/rate A − 1/rate B).
func addedMicros(sr *scenarioResult) float64 {
	var v []float64
	for i := range sr.pairs() {
		if a, b := sr.a[i].rate, sr.b[i].rate; a > 0 && b > 0 {
			v = append(v, (1/a-1/b)*1e6)
		}
	}
	return median(v)
}

func values(rs []result, f func(result) float64) []float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	return v
}

// writeTargets prints ts as a table under title (nothing when ts is
// empty).
func writeTargets(w io.Writer, title string, ts []target) {
	if len(ts) == 0 {
		return
	}
	fmt.Fprintf(w, "\n#### %s\n\n| measure | target | this run | met |\n|---|---|---|---|\n", title)
	for _, t := range ts {
		met := "**no**"
		switch {
		case t.notRun:
			met = "not run"
		case t.note:
			met = "—"
		case t.met:
			met = "yes"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", t.measure, t.goal, t.got, met)
	}
}

// machine describes the machine: CPU model, cores, Go, kernel, load.
func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	kernel := "?"
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = strings.TrimSpace(string(b))
	}
	return fmt.Sprintf("%s, %d cores, %s %s/%s, Linux %s; load average at start %s",
		model, runtime.NumCPU(), runtime.Version(), runtime.GOOS, runtime.GOARCH, kernel, loadavg())
}

// loadavg is the 1, 5 and 15 minute load average from /proc/loadavg.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// formatDuration rounds d for progress lines.
func formatDuration(d time.Duration) string { return d.Round(100 * time.Millisecond).String() }

package main

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/cli"
	"github.com/sotercare/jetbridge/internal/cli/logs"
	"github.com/sotercare/jetbridge/internal/sotercare"
	"github.com/sotercare/jetbridge/producer"
)

// The demo's timing. The default duration plus the longest drain stays
// under 30 s.
const (
	demoDefaultDuration = 12 * time.Second
	demoDrainTimeout    = 12 * time.Second // after the producers stop
	demoReadyTimeout    = 15 * time.Second
	demoTick            = 200 * time.Millisecond // one reading per device per tick
)

// The receiver's behaviour, decided per event id and delivery attempt from
// the seed, so the same seed gives the same failures.
const (
	demoFailShare   = 0.15 // of attempts answered 503 (redelivered)
	demoRejectShare = 0.04 // of event ids answered 400 (dead-lettered)
	demoOutageFrom  = 0.35 // the notifier answers 503 to everything
	demoOutageTo    = 0.60 // between these fractions of --duration
)

var demoDevices = []string{"bed-1", "bed-2", "bed-3", "bath-1", "hall-1", "room-7"}

// demoConfig is the bridge configuration of the demo, loaded through
// config.Load like any file: store dir, notifier URL, event-log URL. The
// demo itself serves JetStream on a random port; the listen address is for
// "bridge run --config DIR/demo.yaml" later, which serves a kept store to
// the dlq commands.
const demoConfig = `# written by "bridge demo"; with --dir, serve the kept store with
#   bridge run --config demo.yaml
# and look at its dead letters with
#   bridge dlq list --config demo.yaml
nats:
  embedded:
    listen: ${JETBRIDGE_NATS_LISTEN:-127.0.0.1:4223}
    store_dir: %s
admin:
  listen: ""
log:
  format: console
shutdown_timeout: 5s
destinations:
  caregiver:
    url: %s/notifier/alerts
    timeout: 1s
    circuit_breaker:
      failure_rate: 0.5
      min_requests: 5
      window: 2s
      delay: 1s
  eventlog:
    url: %s/eventlog/readings
    timeout: 1s
routes:
  - name: caregiver-critical
    subjects: ["events.critical.care.caregiver.>", "events.info.care.caregiver.>"]
    destination: caregiver
    max_deliver: 6
    backoff: [100ms, 200ms, 400ms]
  - name: caregiver-alerts
    subjects: ["events.warning.care.caregiver.>"]
    destination: caregiver
    max_deliver: 4
    backoff: [200ms, 400ms, 800ms]
  - name: event-log
    subjects: ["events.*.care.eventlog.>"]
    destination: eventlog
    max_deliver: 3
    backoff: [200ms, 400ms]
`

// demoOptions are the flags of bridge demo.
type demoOptions struct {
	duration time.Duration
	seed     uint64
	dir      string
	verbose  bool
}

func newDemoCmd() *cobra.Command {
	var o demoOptions
	c := &cobra.Command{
		Use:   "demo",
		Short: "a self-contained tour in under 30 s: JetStream, a flaky receiver, the bridge",
		Long: `A self-contained tour: an embedded JetStream in a temporary directory, a local
receiver that fails some requests and has an outage, the bridge, and
SoterCare devices publishing readings. It prints live progress, then a table
counted from real outcomes (published, duplicates refused, delivered,
redelivered, dead-lettered, breaker transitions) and the dead letters. It
needs no configuration and no free port.`,
		Example: `  bridge demo
  bridge demo --seed 7 --duration 20s
  bridge demo --dir /tmp/jetbridge-demo    # keep the store, to try bridge dlq on it`,
		Args: cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error { return cmdDemo(o, c.OutOrStdout(), c.ErrOrStderr()) },
	}
	f := c.Flags()
	f.DurationVar(&o.duration, "duration", demoDefaultDuration, "how long the producers publish; the bridge then gets up to "+demoDrainTimeout.String()+" to settle the rest")
	f.Uint64Var(&o.seed, "seed", 0, "seed of the readings and of the receiver's failures (0: a random one, printed)")
	f.StringVar(&o.dir, "dir", "", "keep the JetStream store and demo.yaml in DIR, to look at the dead letters afterwards (default: a temporary directory, removed at the end)")
	f.BoolVarP(&o.verbose, "verbose", "v", false, "also print the bridge's logs on stderr")
	return c
}

func cmdDemo(o demoOptions, stdout, stderr io.Writer) error {
	if o.duration < time.Second || o.duration > 10*time.Minute {
		return usageErr("--duration %s: want 1s to 10m", o.duration)
	}
	duration, seed, dir, verbose := &o.duration, &o.seed, &o.dir, &o.verbose
	if *seed == 0 {
		*seed = rand.Uint64N(1_000_000) + 1
	}
	ctx, stop := signalContext()
	defer stop()
	d := &demo{
		out: stdout, duration: *duration, seed: *seed, keep: *dir != "",
		log: zerolog.Nop(), tally: newDemoTally(),
	}
	if *verbose {
		d.log, _ = logs.New("console", "debug", "", stderr)
	}
	if *dir != "" {
		if err := os.MkdirAll(*dir, 0o755); err != nil {
			return fmt.Errorf("--dir: %w", err)
		}
		d.dir = *dir
		// A kept store may hold an earlier run's event ids: tag this run's.
		d.runTag = strconv.FormatInt(time.Now().Unix()%(36*36*36), 36) + "-"
	} else {
		tmp, err := os.MkdirTemp("", "jetbridge-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		d.dir = tmp
	}
	return d.run(ctx)
}

// demo is one run of the tour.
type demo struct {
	out       io.Writer
	duration  time.Duration
	seed      uint64
	keep      bool
	dir       string
	runTag    string
	dlqStream string
	log       zerolog.Logger
	tally     *demoTally
	start     time.Time
	recv      *demoReceiver
}

func (d *demo) run(ctx context.Context) error {
	// The flaky receiver: the caregiver notifier and the event log.
	d.recv = &demoReceiver{seed: d.seed}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("receiver: %w", err)
	}
	hs := &http.Server{Handler: d.recv, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan struct{})
	go func() { defer close(served); _ = hs.Serve(ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
		<-served
	}()
	recvURL := "http://" + ln.Addr().String()

	// The configuration, from YAML text through config.Load.
	cfgPath := filepath.Join(d.dir, "demo.yaml")
	yaml := fmt.Sprintf(demoConfig, strconv.Quote(filepath.Join(d.dir, "jetstream")), recvURL, recvURL)
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o644); err != nil {
		return err
	}
	cfg, err := config.Load([]byte(yaml), cfgPath)
	if err != nil {
		return fmt.Errorf("demo config: %w", err)
	}
	cfg.NATS.Embedded.Listen = "127.0.0.1:0" // a random port: the demo needs no free 4223

	// Embedded JetStream on a random port, and the bridge in process.
	conn, err := openNATS(ctx, cfg, d.log)
	if err != nil {
		return err
	}
	defer conn.close()
	b, err := bridge.New(cfg, conn.js, bridge.Options{
		Logger:    d.log,
		OnSettle:  d.tally.settle,
		OnBreaker: d.tally.breaker,
	})
	if err != nil {
		return err
	}
	runCtx, cancelRun := context.WithCancel(context.Background())
	ran := make(chan struct{})
	var runErr error
	go func() { defer close(ran); runErr = b.Run(runCtx) }()
	// stopBridge stops the bridge and returns Run's error; it runs before
	// the connection and the embedded server are closed, on every path.
	stopBridge := sync.OnceValue(func() error {
		cancelRun()
		<-ran
		return runErr
	})
	defer stopBridge()
	select {
	case <-b.Ready():
	case <-ran:
		return fmt.Errorf("bridge: %w", runErr)
	case <-time.After(demoReadyTimeout):
		return errors.New("bridge: not ready in time")
	case <-ctx.Done():
		return nil
	}

	fmt.Fprintf(d.out, "jetbridge demo (seed %d): embedded JetStream at %s, receiver at %s\n", d.seed, conn.srv.ClientURL(), recvURL)
	fmt.Fprintf(d.out, "  %d SoterCare devices publish a reading every %s for %s; falls and abnormal vitals go to\n",
		len(demoDevices), demoTick, d.duration)
	fmt.Fprintf(d.out, "  the caregiver notifier, everything to the event log. The receiver fails %.0f%% of attempts\n", demoFailShare*100)
	fmt.Fprintf(d.out, "  with 503, rejects %.0f%% of events with 400, and the notifier is down from %s to %s.\n\n",
		demoRejectShare*100, d.at(demoOutageFrom), d.at(demoOutageTo))

	d.start = time.Now()
	d.tally.start = d.start
	printerDone := make(chan struct{})
	stopPrinter := make(chan struct{})
	go func() { defer close(printerDone); d.printProgress(stopPrinter) }()

	d.produce(ctx, producer.NewPublisher(conn.js, "events"))
	d.tally.note("producers stopped; waiting for the bridge to settle every stored event")
	drained := d.drain(ctx)
	close(stopPrinter)
	<-printerDone

	if err := stopBridge(); err != nil {
		return fmt.Errorf("bridge: %w", err)
	}
	q := deadletter.Open(conn.js, cfg)
	d.dlqStream = q.Stream()
	lctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dead, dlqErr := q.List(lctx, deadletter.Filter{}, false)
	return d.report(drained, dead, dlqErr, cfgPath)
}

// at is the offset of a fraction of the duration, for display.
func (d *demo) at(frac float64) string {
	return (time.Duration(float64(d.duration) * frac)).Round(100 * time.Millisecond).String()
}

// produce runs the devices until the duration has passed (or ctx ends),
// and switches the notifier outage on and off on the way.
func (d *demo) produce(ctx context.Context, p *producer.Publisher) {
	pctx, cancel := context.WithTimeout(ctx, d.duration)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		for _, step := range []struct {
			frac float64
			on   bool
			msg  string
		}{
			{demoOutageFrom, true, "notifier outage begins: it answers 503 to everything"},
			{demoOutageTo, false, "notifier outage ends"},
		} {
			t := time.NewTimer(time.Until(d.start.Add(time.Duration(float64(d.duration) * step.frac))))
			select {
			case <-t.C:
			case <-pctx.Done():
				t.Stop()
				d.recv.outage.Store(false)
				return
			}
			d.recv.outage.Store(step.on)
			d.tally.note(step.msg)
		}
	})
	for i, dev := range demoDevices {
		wg.Go(func() { d.device(pctx, p, i, dev) })
	}
	wg.Wait()
}

// device publishes one reading per tick through SoterCare's Submit, and
// now and then the previous one again (a device retrying after a lost
// answer), which JetStream refuses as a duplicate.
func (d *demo) device(ctx context.Context, p *producer.Publisher, i int, dev string) {
	rng := rand.New(rand.NewPCG(d.seed, uint64(i)))
	tick := time.NewTicker(demoTick)
	defer tick.Stop()
	var prev sotercare.Reading
	n := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		r := prev
		if n == 0 || rng.Float64() >= 0.06 {
			n++
			r = demoReading(rng, fmt.Sprintf("%s-%s%04d", dev, d.runTag, n), dev)
		}
		prev = r
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		rc, err := sotercare.Submit(pctx, p, r, "")
		cancel()
		d.tally.published(rc, err)
	}
}

// demoReading is a random reading: falls (a quarter of them detected),
// vitals (a fifth of them out of 50..120 bpm) and moisture.
func demoReading(rng *rand.Rand, id, dev string) sotercare.Reading {
	r := sotercare.Reading{EventID: id, DeviceID: dev, Timestamp: time.Now().UnixMilli()}
	switch x := rng.Float64(); {
	case x < 0.2:
		r.EventType, r.Unit = sotercare.TypeFall, sotercare.UnitBoolean
		if rng.Float64() < 0.25 {
			r.Value = 1
		}
	case x < 0.7:
		r.EventType, r.Unit = sotercare.TypeVitals, sotercare.UnitBPM
		switch y := rng.Float64(); {
		case y < 0.1:
			r.Value = 35 + math.Round(rng.Float64()*140)/10 // 35..49
		case y < 0.2:
			r.Value = 121 + math.Round(rng.Float64()*500)/10 // 121..171
		default:
			r.Value = 55 + math.Round(rng.Float64()*600)/10 // 55..115
		}
	default:
		r.EventType, r.Unit = sotercare.TypeMoisture, sotercare.UnitPercent
		r.Value = math.Round(rng.Float64()*1000) / 10
	}
	return r
}

// drain waits until every stored event has a final outcome, or the drain
// timeout passes (a few seconds only if the demo was interrupted).
func (d *demo) drain(ctx context.Context) bool {
	limit := demoDrainTimeout
	if ctx.Err() != nil {
		limit = 3 * time.Second
	}
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if d.tally.snapshot().open() == 0 {
			return true
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			return d.tally.snapshot().open() == 0
		}
	}
}

// printProgress prints the notes as they come and a progress line every
// second, until stop is closed.
func (d *demo) printProgress(stop <-chan struct{}) {
	every := time.Second
	if d.duration < 5*time.Second {
		every = 500 * time.Millisecond
	}
	line := time.NewTicker(every)
	defer line.Stop()
	notes := time.NewTicker(50 * time.Millisecond)
	defer notes.Stop()
	for {
		select {
		case <-stop:
			d.printNotes()
			d.printLine()
			fmt.Fprintln(d.out)
			return
		case <-notes.C:
			d.printNotes()
		case <-line.C:
			d.printNotes()
			d.printLine()
		}
	}
}

func (d *demo) printNotes() {
	for _, n := range d.tally.takeNotes() {
		fmt.Fprintf(d.out, "  %5.1fs  %s\n", n.at.Seconds(), n.text)
	}
}

func (d *demo) printLine() {
	s := d.tally.snapshot()
	fmt.Fprintf(d.out, "  %5.1fs  published %4d (duplicates refused %d) | delivered %4d | redeliveries %3d | dead-lettered %2d | in flight %3d | notifier breaker %s\n",
		time.Since(d.start).Seconds(), s.published, s.duplicates, s.delivered, s.redeliveries, s.deadLettered, s.open(), s.breakerState)
}

// report prints the final table, the dead letters and how to look at them.
func (d *demo) report(drained bool, dead []deadletter.Message, dlqErr error, cfgPath string) error {
	s := d.tally.snapshot()
	rc := d.recv.counts()
	reasons := make([]string, 0, len(s.deadReasons))
	for _, r := range slices.Sorted(maps.Keys(s.deadReasons)) {
		reasons = append(reasons, fmt.Sprintf("%d %s", s.deadReasons[r], r))
	}
	tw := tabwriter.NewWriter(d.out, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(name string, n int, what string) { fmt.Fprintf(tw, "  %s\t%d\t  %s\n", name, n, what) }
	fmt.Fprintf(d.out, "results after %.1fs (seed %d)\n", time.Since(d.start).Seconds(), d.seed)
	row("published", s.published, "publish calls by the producers")
	row("duplicates refused", s.duplicates, "same eventId again: JetStream stored nothing")
	row("delivered", s.delivered, fmt.Sprintf("2xx from the receiver (%d of them after a redelivery)", s.deliveredLater))
	row("redelivered", s.redeliveries, "redeliveries the broker scheduled after a 503 or no answer")
	row("dead-lettered", s.deadLettered, strings.Join(append(reasons, "see below"), ", "))
	row("breaker opened", s.opened, fmt.Sprintf("closed -> open; failed half-open probes reopened it %d times", s.probesFailed))
	row("breaker closed", s.closed, "half-open -> closed after a successful probe")
	if s.publishErrors > 0 {
		row("publish errors", s.publishErrors, "not stored")
	}
	_ = tw.Flush()
	fmt.Fprintf(d.out, "  receiver answered %d requests: %d 2xx, %d 503 (%d during the outage), %d 400\n\n",
		rc.total, rc.ok, rc.failed+rc.outage, rc.outage, rc.rejected)

	sum := s.delivered + s.deadLettered + s.duplicates + s.publishErrors
	if drained && sum == s.published {
		extra := ""
		if s.publishErrors > 0 {
			extra = fmt.Sprintf(" + %d publish errors", s.publishErrors)
		}
		fmt.Fprintf(d.out, "  %d published = %d delivered + %d dead-lettered + %d duplicates refused%s\n\n",
			s.published, s.delivered, s.deadLettered, s.duplicates, extra)
	} else {
		fmt.Fprintf(d.out, "  the table does not add up: %d published, but %d delivered + %d dead-lettered + %d duplicates refused + %d publish errors = %d (%d events still unsettled after %s)\n\n",
			s.published, s.delivered, s.deadLettered, s.duplicates, s.publishErrors, sum, s.open(), demoDrainTimeout)
	}

	switch {
	case dlqErr != nil:
		fmt.Fprintf(d.out, "dead letters: cannot read them: %v\n", dlqErr)
	case len(dead) == 0:
		fmt.Fprintln(d.out, "dead letters: none this time")
	default:
		shown := ":"
		if len(dead) > 5 {
			shown = "; the first 5:"
		}
		fmt.Fprintf(d.out, "dead letters (stream %s, %d in all)%s\n", d.dlqStream, len(dead), shown)
		tw := tabwriter.NewWriter(d.out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  SEQ\tROUTE\tREASON\tSTATUS\tEVENT ID\tSUBJECT")
		for _, m := range dead[:min(len(dead), 5)] {
			status := "-"
			if m.Status != 0 {
				status = strconv.Itoa(m.Status)
			}
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\n", m.Seq, cell(m.Route), cell(string(m.Reason)), status, cell(m.EventID), cell(m.Subject))
		}
		_ = tw.Flush()
	}
	if d.keep {
		fmt.Fprintf(d.out, "\nThe store and its config are kept in %s. The dlq commands read a running\n", d.dir)
		fmt.Fprintln(d.out, "bridge's JetStream, so serve the store first (it listens on 127.0.0.1:4223), then:")
		fmt.Fprintf(d.out, "  go run ./cmd/bridge run --config %s\n", cfgPath)
		fmt.Fprintf(d.out, "  go run ./cmd/bridge dlq list --config %s              # another terminal\n", cfgPath)
		fmt.Fprintf(d.out, "  go run ./cmd/bridge dlq show --config %s SEQ --payload\n", cfgPath)
	} else {
		fmt.Fprintln(d.out, "\nThis run's JetStream store was a temporary directory, removed now. To keep it and look")
		fmt.Fprintln(d.out, "at the dead letters afterwards, run the demo with --dir, then serve the kept store:")
		fmt.Fprintln(d.out, "  go run ./cmd/bridge demo --dir /tmp/jetbridge-demo")
		fmt.Fprintln(d.out, "  go run ./cmd/bridge run --config /tmp/jetbridge-demo/demo.yaml")
		fmt.Fprintln(d.out, "  go run ./cmd/bridge dlq list --config /tmp/jetbridge-demo/demo.yaml   # another terminal")
	}
	if !drained || sum != s.published {
		return &exitError{Code: 1, Msg: "demo: the bridge did not settle every event in time"}
	}
	return nil
}

// demoReceiver is the flaky local receiver: /notifier/alerts for the
// caregiver, /eventlog/readings for the event log.
type demoReceiver struct {
	seed   uint64
	outage atomic.Bool // the notifier answers 503 to everything

	mu   sync.Mutex
	seen map[string]int // requests per event id

	total, ok, failed, rejected, outaged atomic.Int64
}

type demoReceiverCounts struct{ total, ok, failed, rejected, outage int64 }

func (rv *demoReceiver) counts() demoReceiverCounts {
	return demoReceiverCounts{rv.total.Load(), rv.ok.Load(), rv.failed.Load(), rv.rejected.Load(), rv.outaged.Load()}
}

func (rv *demoReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	rv.total.Add(1)
	id := r.Header.Get("X-Event-Id")
	rv.mu.Lock()
	if rv.seen == nil {
		rv.seen = map[string]int{}
	}
	rv.seen[id]++
	n := rv.seen[id] // this id's n-th request, probes of held messages included
	rv.mu.Unlock()
	switch {
	case r.URL.Path == "/notifier/alerts" && rv.outage.Load():
		rv.outaged.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	case rv.share(id) < demoRejectShare:
		rv.rejected.Add(1)
		http.Error(w, "unknown resident", http.StatusBadRequest)
	case rv.share(id, strconv.Itoa(n)) < demoFailShare:
		rv.failed.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	default:
		rv.ok.Add(1)
		w.WriteHeader(http.StatusAccepted)
	}
}

// share maps the seed and parts to [0, 1): the same inputs, the same share.
func (rv *demoReceiver) share(parts ...string) float64 {
	h := fnv.New64a()
	_, _ = fmt.Fprint(h, rv.seed)
	for _, p := range parts {
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(p))
	}
	// FNV's high bits barely change with the last bytes: mix them
	// (the splitmix64 finalizer) before taking 53 of them.
	x := h.Sum64()
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	x ^= x >> 31
	return float64(x>>11) / (1 << 53)
}

// demoTally counts what really happened: publish results from the PubAcks,
// settlements from Options.OnSettle, breaker transitions from
// Options.OnBreaker.
type demoTally struct {
	start time.Time

	mu           sync.Mutex
	pub          int
	dups         int
	pubErrs      int
	stored       map[uint64]bool           // stream sequences this run stored
	final        map[uint64]bridge.Settled // their final settlement
	early        map[uint64]bridge.Settled // final settlements seen before the PubAck
	redeliveries int
	opened       int // closed -> open
	probesFailed int // half-open -> open
	closed       int
	states       map[string]bridge.BreakerState // per destination; absent: closed
	notes        []demoNote
	deadNoted    int
}

type demoNote struct {
	at   time.Duration
	text string
}

func newDemoTally() *demoTally {
	return &demoTally{
		stored: map[uint64]bool{}, final: map[uint64]bridge.Settled{}, early: map[uint64]bridge.Settled{},
		states: map[string]bridge.BreakerState{},
	}
}

func (t *demoTally) published(rc sotercare.Receipt, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case errors.Is(err, sotercare.ErrDuplicate):
		t.pub++
		t.dups++
	case errors.Is(err, sotercare.ErrInvalidReading):
		// never published: not a publish call
	case err != nil:
		t.pub++
		t.pubErrs++
		t.addNote("publish failed: " + err.Error())
	default:
		t.pub++
		t.stored[rc.Seq] = true
		if o, ok := t.early[rc.Seq]; ok { // settled before its PubAck arrived here
			delete(t.early, rc.Seq)
			t.final[rc.Seq] = o
		}
	}
}

func (t *demoTally) settle(s bridge.Settled) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch s.Outcome {
	case bridge.OutcomeRedeliveryScheduled:
		t.redeliveries++
		return
	case bridge.OutcomeDelivered, bridge.OutcomeDeadLettered:
	default:
		return
	}
	if _, done := t.final[s.Seq]; done {
		return // settled twice (a lost ack): counted once
	}
	if s.Outcome == bridge.OutcomeDeadLettered {
		if t.deadNoted < 3 {
			t.deadNoted++
			status := ""
			var de *bridge.DownstreamError
			if errors.As(s.Err, &de) {
				status = fmt.Sprintf(", HTTP %d", de.Status)
			}
			t.addNote(fmt.Sprintf("dead letter: %s on %s (%s%s)", s.EventID, s.Route, s.Reason, status))
		}
	}
	if t.stored[s.Seq] {
		t.final[s.Seq] = s
	} else {
		t.early[s.Seq] = s
	}
}

// breaker records a transition; Options.OnBreaker delivers them in the
// breaker's order (closed -> open -> half-open -> ...).
func (t *demoTally) breaker(dest string, from, to bridge.BreakerState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.states[dest] = to
	switch {
	case to == bridge.BreakerOpen && from == bridge.BreakerClosed:
		t.opened++
	case to == bridge.BreakerOpen:
		t.probesFailed++
	case to == bridge.BreakerClosed:
		t.closed++
	}
	t.addNote(fmt.Sprintf("breaker %s: %s -> %s", dest, from, to))
}

// note records a line for the progress printer.
func (t *demoTally) note(text string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.addNote(text)
}

func (t *demoTally) addNote(text string) {
	t.notes = append(t.notes, demoNote{at: time.Since(t.start), text: text})
}

func (t *demoTally) takeNotes() []demoNote {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.notes
	t.notes = nil
	return n
}

// demoCounts is a consistent snapshot of the tally.
type demoCounts struct {
	published, duplicates, publishErrors int
	stored, delivered, deadLettered      int
	deliveredLater, redeliveries         int
	opened, probesFailed, closed         int
	deadReasons                          map[string]int
	breakerState                         bridge.BreakerState
}

// open is the number of stored events without a final outcome yet.
func (c demoCounts) open() int { return c.stored - c.delivered - c.deadLettered }

func (t *demoTally) snapshot() demoCounts {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := demoCounts{
		published: t.pub, duplicates: t.dups, publishErrors: t.pubErrs, stored: len(t.stored),
		redeliveries: t.redeliveries, opened: t.opened, probesFailed: t.probesFailed, closed: t.closed,
		deadReasons: map[string]int{}, breakerState: t.states["caregiver"],
	}
	for _, s := range t.final {
		switch s.Outcome {
		case bridge.OutcomeDelivered:
			c.delivered++
			if s.Delivered > 1 {
				c.deliveredLater++
			}
		case bridge.OutcomeDeadLettered:
			c.deadLettered++
			c.deadReasons[string(s.Reason)]++
		}
	}
	return c
}

package test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/jetbridgetest"
)

// Names every scenario's configuration uses (the defaults, and route r).
const (
	streamName = "EVENTS"
	dlqStream  = "EVENTS_DLQ"
	routeName  = "r"
)

// Bounds of the reliability scenarios, sized for 2 cores under -race.
const (
	quietTimeout = 60 * time.Second // a backlog of 2,000 drained, including redeliveries after ack_wait
	countTimeout = 30 * time.Second // a number of requests reaches the sink
)

// scenario is the part of the configuration a reliability scenario varies.
type scenario struct {
	natsURL, sinkURL string
	maxInFlight      int
	ackWait          time.Duration
	shutdownTimeout  time.Duration
	idempotency      bool
}

// yaml is the scenario's configuration: one route r from events.> to the
// sink. The admin listener comes from $JETBRIDGE_ADMIN_LISTEN (none when
// unset), so each bridge process can get its own port.
func (s scenario) yaml() string {
	return fmt.Sprintf(`nats:
  url: %s
admin:
  listen: ${JETBRIDGE_ADMIN_LISTEN:-}
log:
  format: json
shutdown_timeout: %s
destinations:
  sink:
    url: %s/events
    timeout: 10s
routes:
  - name: %s
    subjects: ["events.>"]
    destination: sink
    ack_wait: %s
    max_in_flight: %d
    idempotency: %t
`, s.natsURL, s.shutdownTimeout, s.sinkURL, routeName, s.ackWait, s.maxInFlight, s.idempotency)
}

// config parses the scenario's configuration as the bridge would.
func (s scenario) config(t testing.TB) *config.Config {
	t.Helper()
	cfg, err := config.Load([]byte(s.yaml()), "scenario.yaml")
	if err != nil {
		t.Fatalf("config: %v\n%s", err, s.yaml())
	}
	return cfg
}

// file writes the scenario's configuration to a file and returns its path.
func (s scenario) file(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bridge.yaml")
	if err := os.WriteFile(path, []byte(s.yaml()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// provision creates the streams and the route's consumer exactly as the
// bridge does on start, so that a backlog can be published before any
// bridge process runs.
func (s scenario) provision(t testing.TB, js jetstream.JetStream) {
	t.Helper()
	b, err := bridge.New(s.config(t), js, bridge.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := b.Provision(ctx); err != nil {
		t.Fatalf("provision: %v", err)
	}
}

// waitCount waits until rec has got at least n requests, for up to
// timeout: some scenarios bound how soon (an asserted promptness), others
// need longer than the kit's Timeout (a backlog of 2,000 under -race).
func waitCount(t testing.TB, rec *jetbridgetest.Receiver, n int, timeout time.Duration) {
	t.Helper()
	natstest.Eventually(t, timeout, func() error {
		if got := rec.Count(); got < n {
			return fmt.Errorf("%d requests arrived, want at least %d", got, n)
		}
		return nil
	})
}

// delayed answers 200 after d.
func delayed(d time.Duration) jetbridgetest.Script {
	return func(jetbridgetest.Request) jetbridgetest.Response { return jetbridgetest.Response{Delay: d} }
}

// eventIDs are the X-Event-Id headers of reqs, in arrival order.
func eventIDs(reqs []jetbridgetest.Request) []string {
	ids := make([]string, len(reqs))
	for i, r := range reqs {
		ids[i] = r.Header.Get(jetbridgetest.HeaderEventID)
	}
	return ids
}

// byEventID groups reqs by X-Event-Id, each group in arrival order.
func byEventID(reqs []jetbridgetest.Request) map[string][]jetbridgetest.Request {
	m := make(map[string][]jetbridgetest.Request)
	for _, r := range reqs {
		id := r.Header.Get(jetbridgetest.HeaderEventID)
		m[id] = append(m[id], r)
	}
	return m
}

// account feeds every request the sink received and every dead letter to
// l, the ledger the scenario published, and checks it: nothing may be
// missing. It returns the report for the scenario's own bounds on
// duplicates.
func account(t *testing.T, js jetstream.JetStream, l *natstest.Ledger, reqs []jetbridgetest.Request) natstest.LedgerReport {
	t.Helper()
	ids := eventIDs(reqs)
	l.Delivered(ids...)
	l.ReadDeadLetters(t, js, dlqStream)
	r, err := l.Check()
	if err != nil {
		t.Fatal(err)
	}
	assertLedgerCatches(t, l.Prefix(), l.N(), ids)
	return r
}

// assertLedgerCatches is the negative control of a scenario's accounting:
// the same deliveries with one event left out, and with one copy added,
// must be reported as exactly that missing event and that extra duplicate.
func assertLedgerCatches(t *testing.T, prefix string, n int, ids []string) {
	t.Helper()
	if len(ids) == 0 {
		t.Fatal("negative control: no deliveries to tamper with")
	}
	victim := ids[len(ids)/2]
	dropped := slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return id == victim })
	l := natstest.NewLedger(prefix, n)
	l.Delivered(dropped...)
	r, err := l.Check()
	if err == nil || !slices.Equal(r.Missing, []string{victim}) {
		t.Fatalf("negative control: ledger without %s reported %v (missing %v), want exactly it missing", victim, err, r.Missing)
	}
	base := natstest.NewLedger(prefix, n)
	base.Delivered(ids...)
	want, _ := base.Check()
	base.Delivered(victim)
	got, _ := base.Check()
	if got.DuplicateCount != want.DuplicateCount+1 || got.Duplicates[victim] != want.Duplicates[victim]+1 {
		t.Fatalf("negative control: an extra copy of %s gave %d duplicates (%d for it), want %d (%d)",
			victim, got.DuplicateCount, got.Duplicates[victim], want.DuplicateCount+1, want.Duplicates[victim]+1)
	}
}

// consumerInfo reads route r's consumer.
func consumerInfo(t testing.TB, js jetstream.JetStream) *jetstream.ConsumerInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, streamName, routeName)
	if err != nil {
		t.Fatalf("consumer %s: %v", routeName, err)
	}
	return c.CachedInfo()
}

// The bridge binary is built once per test binary, with the race detector
// when the tests run with it, and removed by TestMain; the long
// multi-replica scenarios use a second build without it (plainBinary).
type binary struct {
	once sync.Once
	path string
	err  error
}

var (
	binDir          string
	binDirOnce      sync.Once
	binDirErr       error
	raceBin, plnBin binary
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// bridgeBinary is ./cmd/bridge built as the tests are: with -race when
// they run with it.
func bridgeBinary(t testing.TB) string {
	t.Helper()
	return buildBridge(t, &raceBin, "bridge", raceEnabled())
}

// plainBinary is ./cmd/bridge built without the race detector, for the
// scenarios whose replicas would not fit CI's time with it (issue 28's
// ordering runs): the race detector still covers the same code in the
// bridge package's in-process tests.
func plainBinary(t testing.TB) string {
	t.Helper()
	if !raceEnabled() {
		return bridgeBinary(t)
	}
	return buildBridge(t, &plnBin, "bridge-plain", false)
}

func buildBridge(t testing.TB, b *binary, name string, race bool) string {
	t.Helper()
	b.once.Do(func() {
		binDirOnce.Do(func() { binDir, binDirErr = os.MkdirTemp("", "jetbridge-bin-") })
		if b.err = binDirErr; b.err != nil {
			return
		}
		root, err := filepath.Abs("..")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(binDir, name)
		args := []string{"build", "-o", b.path}
		if race {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "./cmd/bridge")...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// raceEnabled tells whether this test binary was built with -race.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// proc is a `bridge run` process with its admin endpoints.
type proc struct {
	*child
	admin string // host:port of /healthz /readyz /status /metrics
}

// runBridge starts `bridge run --config cfgPath` with a fresh admin port
// (and env added) and waits until /readyz answers 200. A data race
// reported by the (race-built) bridge fails the test.
func runBridge(t *testing.T, cfgPath string, env ...string) *proc {
	t.Helper()
	return runBinary(t, bridgeBinary(t), cfgPath, env...)
}

// runBinary is runBridge with the bridge binary bin.
func runBinary(t *testing.T, bin, cfgPath string, env ...string) *proc {
	t.Helper()
	p := &proc{admin: freeAddr(t)}
	// A race-built binary sleeps 1 s at exit unless told not to; the exit
	// times measured here are the bridge's own.
	p.child = startBridge(t, bin, []string{"run", "--config", cfgPath},
		append([]string{"JETBRIDGE_ADMIN_LISTEN=" + p.admin, "GORACE=" + strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0")}, env...)...)
	t.Cleanup(func() {
		if strings.Contains(p.stderr.String(), "WARNING: DATA RACE") {
			t.Errorf("the bridge (pid %d) reported a data race:\n%s", p.cmd.Process.Pid, p.stderr.String())
		}
	})
	p.waitReadyz(t, http.StatusOK, readyTimeout)
	return p
}

// readyz is the status of GET /readyz, 0 when there is no answer.
func (p *proc) readyz() int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.admin+"/readyz", nil)
	if err != nil {
		return 0
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// waitReadyz waits until /readyz answers want and returns when it did.
func (p *proc) waitReadyz(t *testing.T, want int, timeout time.Duration) time.Time {
	t.Helper()
	natstest.Eventually(t, timeout, func() error {
		p.failIfExited(t)
		if got := p.readyz(); got != want {
			return fmt.Errorf("/readyz answers %d, want %d", got, want)
		}
		return nil
	})
	return time.Now()
}

// kill sends SIGKILL and waits until the process is reaped.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatalf("kill bridge pid %d: %v", p.cmd.Process.Pid, err)
	}
	<-p.done
}

// term sends SIGTERM.
func (p *proc) term(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM bridge pid %d: %v", p.cmd.Process.Pid, err)
	}
}

// metric is the value of the series name{labels} on the bridge's /metrics
// (labels as `k="v"` pairs), or -1 when the series is absent.
func (p *proc) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.admin+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
lines:
	for line := range strings.Lines(string(body)) {
		series, value, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || !strings.HasPrefix(series, name+"{") {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(series, l) {
				continue lines
			}
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("/metrics: %s: %v", line, err)
		}
		return v
	}
	return -1
}

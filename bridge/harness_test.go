package bridge

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
)

// harness runs one Bridge against its own embedded JetStream server and
// records every settlement and breaker transition.
type harness struct {
	t    testing.TB
	srv  *natstest.Server
	nc   *nats.Conn          // the bridge's connection: fault hooks may close it
	js   jetstream.JetStream // on nc
	pub  jetstream.JetStream // publish's own connection, which no fault touches
	cfg  *config.Config
	b    *Bridge
	logs *natstest.Buffer
	reg  *prometheus.Registry

	mu       sync.Mutex
	settled  []Settled
	breakers []string // "dest:from->to"

	stop func()
}

// testConfig loads a YAML configuration (fmt-formatted with args) through
// config.Load, so tests use the real defaults and validation.
func testConfig(t testing.TB, yaml string, args ...any) *config.Config {
	t.Helper()
	cfg, err := config.Load([]byte(fmt.Sprintf(yaml, args...)), "test.yaml")
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg
}

// harnessLogLevel is the level of the harness's bridge logger: debug, so
// that failing tests show every settlement. Benchmarks raise it, as
// production does, so that they measure the hot path rather than logging.
var harnessLogLevel = zerolog.DebugLevel

// startBridge runs a bridge (with the given faults, zero for the real one)
// on a fresh embedded server until the test ends.
func startBridge(t testing.TB, cfg *config.Config, f faults) *harness {
	t.Helper()
	srv := natstest.Start(t)
	return startBridgeOn(t, srv, cfg, f)
}

func startBridgeOn(t testing.TB, srv *natstest.Server, cfg *config.Config, f faults) *harness {
	t.Helper()
	return startHarness(t, srv, cfg, f, nil)
}

// startHarness builds the bridge with faults f, applies tweak (if any)
// between newBridge and Run, and runs it until the test ends.
func startHarness(t testing.TB, srv *natstest.Server, cfg *config.Config, f faults, tweak func(*Bridge)) *harness {
	t.Helper()
	return startHarnessAt(t, srv, srv.URL(), cfg, f, tweak)
}

// startHarnessAt is startHarness connecting to url, e.g. as a user of a
// natstest.UsersServer (srv nil).
func startHarnessAt(t testing.TB, srv *natstest.Server, url string, cfg *config.Config, f faults, tweak func(*Bridge)) *harness {
	t.Helper()
	nc, js := natstest.Connect(t, url)
	_, pub := natstest.Connect(t, url)
	h := &harness{t: t, srv: srv, nc: nc, js: js, pub: pub, cfg: cfg, logs: &natstest.Buffer{}, reg: prometheus.NewRegistry()}
	b, err := New(cfg, js, Options{
		Registerer: h.reg,
		Logger:     zerolog.New(h.logs).Level(harnessLogLevel),
		OnSettle: func(s Settled) {
			h.mu.Lock()
			h.settled = append(h.settled, s)
			h.mu.Unlock()
		},
		OnBreaker: func(dest string, from, to BreakerState) {
			h.mu.Lock()
			h.breakers = append(h.breakers, dest+":"+from.String()+"->"+to.String())
			h.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatalf("bridge: %v", err)
	}
	f.tweak(b)
	if tweak != nil {
		tweak(b)
	}
	h.b = b
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	select {
	case <-b.Ready():
	case err := <-done:
		cancel()
		t.Fatalf("Run: %v", err)
	}
	h.stop = sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("Run did not return within 30s of cancel")
		}
	})
	t.Cleanup(func() {
		h.stop()
		if t.Failed() || os.Getenv("JETBRIDGE_TEST_LOGS") != "" {
			t.Logf("bridge logs:\n%s", h.logs.String())
		}
	})
	return h
}

// publish stores one event with the given headers (Nats-Msg-Id from id).
func (h *harness) publish(subject, id string, data []byte, hdr map[string]string) uint64 {
	h.t.Helper()
	msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	if id != "" {
		msg.Header.Set(jetstream.MsgIDHeader, id)
	}
	for k, v := range hdr {
		msg.Header[k] = []string{v}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ack, err := h.pub.PublishMsg(ctx, msg)
	if err != nil {
		h.t.Fatalf("publish %s: %v", subject, err)
	}
	return ack.Sequence
}

// outcomes returns a copy of the settlements so far.
func (h *harness) outcomes() []Settled {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Settled(nil), h.settled...)
}

func (h *harness) transitions() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.breakers...)
}

// waitOutcomes waits until n settlements match keep (nil: all), or the
// timeout passes, and returns the matching ones. It never fails the test:
// negative controls use it too, and their checks decide.
func (h *harness) waitOutcomes(n int, timeout time.Duration, keep func(Settled) bool) []Settled {
	var got []Settled
	waitUntil(timeout, func() bool {
		got = got[:0]
		for _, s := range h.outcomes() {
			if keep == nil || keep(s) {
				got = append(got, s)
			}
		}
		return len(got) >= n
	})
	return got
}

func outcomeIs(o Outcome) func(Settled) bool {
	return func(s Settled) bool { return s.Outcome == o }
}

// waitUntil polls cond every 5 ms until it holds or timeout passes.
func waitUntil(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		<-time.After(5 * time.Millisecond)
	}
}

// deadLetters reads every message of the dead-letter stream.
func (h *harness) deadLetters() []*jetstream.RawStreamMsg {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := h.js.Stream(ctx, h.cfg.DeadLetter.Stream)
	if err != nil {
		h.t.Fatalf("dead-letter stream: %v", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		h.t.Fatalf("dead-letter stream info: %v", err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			continue // deleted
		}
		out = append(out, m)
	}
	return out
}

// quiet waits until the route's consumer has nothing pending or unacked.
func (h *harness) quiet(route string) {
	h.t.Helper()
	natstest.WaitQuiet(h.t, h.js, h.cfg.Stream.Name, route, 10*time.Second)
}

// killChildWhileSending runs the configuration in a child bridge process,
// publishes one event (id e1), waits until the destination has the request
// (which it must leave hanging), and kills the child by PID: a bridge that
// died in the middle of an attempt.
func killChildWhileSending(t testing.TB, srv *natstest.Server, sink *sinktest.Sink, yaml string) {
	t.Helper()
	child := natstest.StartChild(t, "TestChildBridge", "bridge",
		"JETBRIDGE_TEST_NATS_URL="+srv.URL(), "JETBRIDGE_TEST_CONFIG="+yaml)
	natstest.Eventually(t, 20*time.Second, func() error {
		if !strings.Contains(child.Output(), "child bridge ready") {
			return errors.New("child bridge not ready")
		}
		return nil
	})
	_, js := natstest.Connect(t, srv.URL())
	if _, err := js.Publish(context.Background(), "events.info.x", []byte(`{}`), jetstream.WithMsgID("e1")); err != nil {
		t.Fatal(err)
	}
	sink.WaitCount(t, 1, settleWait)
	child.Kill()
}

// leaveUnsettled fetches n deliveries of the consumer's one message and
// settles none, as if each bridge that received them had died.
func leaveUnsettled(t testing.TB, cons jetstream.Consumer, n int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		b, err := cons.Fetch(1, jetstream.FetchMaxWait(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range b.Messages() {
			if md, _ := m.Metadata(); md.NumDelivered != uint64(i) {
				t.Fatalf("delivery %d, want %d", md.NumDelivered, i)
			}
			got++
		}
		if got != 1 {
			t.Fatalf("delivery %d: got %d messages", i, got)
		}
	}
}

// expectBroken runs a check against a deliberately broken bridge and fails
// the test if the check passes: the test could not catch that break.
func expectBroken(t *testing.T, name string, check func(t testing.TB) error) {
	t.Helper()
	t.Run("negative control: "+name, func(t *testing.T) {
		if err := check(t); err == nil {
			t.Fatalf("the check passed against a deliberately broken bridge (%s): it cannot catch that break", name)
		} else {
			t.Logf("caught, as it should: %v", err)
		}
	})
}

// provisioned is a bridge that has provisioned its streams and consumers
// on js and does not run: what it is given stays for a later bridge.
func provisioned(t testing.TB, cfg *config.Config, js jetstream.JetStream, f faults) *Bridge {
	t.Helper()
	b, err := New(cfg, js, Options{})
	if err != nil {
		t.Fatal(err)
	}
	f.tweak(b)
	if err := b.Provision(context.Background()); err != nil {
		t.Fatal(err)
	}
	return b
}

// faults names the deliberately broken variants of the negative controls:
// each field replaces one part of the bridge (see parts.go), one value of
// a built bridge, or what a seam of it gives (see core_faults_test.go)
// with a broken one, so that a test can show it goes red when the
// behaviour it names is broken. The zero value is the real bridge.
type faults struct {
	// reserveCreate replaces the atomic create of a reservation (a racy
	// check-then-act store, for the contention tests).
	reserveCreate func(kv jetstream.KeyValue) func(ctx context.Context, key string, value []byte) (uint64, error)
	// beforeAck runs after the 2xx (and, with idempotency, after the event
	// was recorded as done) and before the ack: tests lose the ack there.
	// It is a hook, not a break.
	beforeAck                func()
	keepReservationOnFailure bool // a failed delivery leaves its reservation behind
	noTakeover               bool // an in-flight reservation is never taken over
	contentBlind             bool // a reservation's subject and payload digest are never compared (the event id alone decides)
	ignoreAdvisories         bool // MAX_DELIVERIES advisories are not processed

	transportRetryStatuses  bool // the transport retry also retries 5xx responses
	transportRetryOnlyOn5xx bool // the transport retry handles statuses only, so transport errors pass unretried
	statusRetryAnyCode      bool // the status retry ignores its codes and retries any 5xx
	breakerIgnoresStatuses  bool // the breaker counts transport errors only
	keepGetBody             bool // net/http may re-send a POST by itself on a reused connection
	retryAfterIgnored       bool // Retry-After is not read
	noHold                  bool // an open breaker's refusal is redelivered, spending the budget
	noBackPressure          bool // a 429 or 503 with Retry-After pauses nothing
	termWithoutDeadLetter   bool // terminate even when the dead letter was not stored
	noProgress              bool // no InProgress while an attempt runs
	progressAfterSettle     bool // a progress ack goes out just after the settlement
	maxDeliverOffByOne      bool // one delivery more than max_deliver is allowed
	noOverlap               bool // no pull is made while another is open
	alwaysPullHeartbeat     bool // every pull asks for an idle heartbeat, a full one before it or not
	bodyEndsWithTry         bool // a try's context (and its response body) ends when the try returns
	drainInNextTry          bool // a retried response is drained by the next try, inside its timeout
	keptForever             bool // a try's context is kept for its body and never released
}

// tweak applies the broken values f names to a built bridge.
func (f faults) tweak(b *Bridge) {
	f.breakSafetyNet(b)
	f.breakDestinations(b)
	f.breakCore(b)
}

package jetbridgetest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/natstest"
)

// Config is what StartBridge and Provision accept: a configuration as
// config.Load returns it, or the YAML text of one
// (docs/configuration.md; ${VAR} references are expanded from the environment, so
// t.Setenv works). The nats and admin sections are not used: the bridge
// runs on a connection to the kit's server and serves no admin endpoints.
type Config interface{ *config.Config | string }

func loadConfig[C Config](t testing.TB, cfg C) *config.Config {
	t.Helper()
	switch c := any(cfg).(type) {
	case string:
		loaded, err := config.Load([]byte(c), "jetbridgetest config")
		if err != nil {
			t.Fatalf("jetbridgetest: bridge configuration: %v", err)
		}
		return loaded
	case *config.Config:
		if c == nil {
			t.Fatalf("jetbridgetest: bridge configuration is nil")
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("jetbridgetest: bridge configuration: %v", err)
		}
		return c
	}
	panic("unreachable: Config admits *config.Config and string only")
}

// Provision creates the streams and consumers of cfg on srv exactly as a
// bridge does when it starts, without delivering anything: a test can
// publish a backlog before the first bridge runs, or test a producer
// alone.
func Provision[C Config](t testing.TB, srv *Server, cfg C) {
	t.Helper()
	c := loadConfig(t, cfg)
	b, err := bridge.New(c, srv.JetStream(), bridge.Options{})
	if err != nil {
		t.Fatalf("jetbridgetest: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	if err := b.Provision(ctx); err != nil {
		t.Fatalf("jetbridgetest: provision: %v", err)
	}
}

// Bridge is the real bridge (bridge.New and Run) running inside the test
// against a Server, on a connection of its own. It records every
// settlement; its logs are printed if the test fails. It is stopped in
// t.Cleanup.
type Bridge struct {
	cfg  *config.Config
	js   jetstream.JetStream
	b    *bridge.Bridge
	logs *natstest.Buffer
	// timeout of the waits: Timeout unless WithBridgeWaitTimeout or
	// SetWaitTimeout.
	timeout *waitTimeout

	cancel   context.CancelFunc
	done     chan error // Run's result, buffered
	stopOnce sync.Once
	runErr   error

	settled *record[bridge.Settled]
}

// BridgeOption configures StartBridge.
type BridgeOption func(*Bridge)

// WithBridgeWaitTimeout makes the bridge's waits (WaitSettled, WaitEvent,
// WaitQuiet, WaitDeadLetters) fail after d instead of Timeout; d <= 0
// means Timeout. Starting the bridge itself is still bounded by Timeout.
func WithBridgeWaitTimeout(d time.Duration) BridgeOption {
	return func(k *Bridge) { k.timeout.set(d) }
}

// SetWaitTimeout changes the timeout of the waits that start from now on
// (WithBridgeWaitTimeout); d <= 0 restores Timeout.
func (k *Bridge) SetWaitTimeout(d time.Duration) { k.timeout.set(d) }

// WaitTimeout is the timeout of the bridge's waits.
func (k *Bridge) WaitTimeout() time.Duration { return k.timeout.get() }

// StartBridge starts a bridge with cfg on a new connection to srv and
// returns once it has provisioned its streams and consumers and pulls.
// Stopping it (Stop, or t.Cleanup) waits for in-flight attempts up to the
// configuration's shutdown_timeout: set it short (e.g. 100ms) when the
// receiver hangs.
func StartBridge[C Config](t testing.TB, srv *Server, cfg C, opts ...BridgeOption) *Bridge {
	t.Helper()
	c := loadConfig(t, cfg)
	_, js := srv.Connect(t)
	k := &Bridge{cfg: c, js: js, logs: &natstest.Buffer{}, timeout: newWaitTimeout(Timeout), done: make(chan error, 1),
		settled: newRecord(func(s bridge.Settled) bridge.Settled { return s })}
	for _, o := range opts {
		o(k)
	}
	b, err := bridge.New(c, js, bridge.Options{
		Logger:   zerolog.New(k.logs).Level(zerolog.DebugLevel).With().Timestamp().Logger(),
		OnSettle: k.settled.add,
	})
	if err != nil {
		t.Fatalf("jetbridgetest: %v", err)
	}
	k.b = b
	ctx, cancel := context.WithCancel(context.Background())
	k.cancel = cancel
	go func() { k.done <- b.Run(ctx) }()
	t.Cleanup(func() {
		if err := k.stop(); err != nil {
			t.Errorf("jetbridgetest: %v", err)
		}
		if t.Failed() {
			t.Logf("jetbridgetest: bridge logs:\n%s", k.logs.String())
		}
	})
	timer := time.NewTimer(Timeout)
	defer timer.Stop()
	select {
	case <-b.Ready():
	case err := <-k.done:
		k.done <- err // for stop
		t.Fatalf("jetbridgetest: bridge Run returned before it was ready: %v", err)
	case <-timer.C:
		t.Fatalf("jetbridgetest: bridge not ready within %s: %v", Timeout, b.Readiness())
	}
	return k
}

// stop cancels Run and waits for it, once.
func (k *Bridge) stop() error {
	k.stopOnce.Do(func() {
		k.cancel()
		limit := k.cfg.ShutdownTimeout.D() + Timeout
		timer := time.NewTimer(limit)
		defer timer.Stop()
		select {
		case err := <-k.done:
			if err != nil {
				k.runErr = fmt.Errorf("bridge Run: %w", err)
			}
		case <-timer.C:
			k.runErr = fmt.Errorf("bridge Run did not return within %s of being stopped", limit)
		}
	})
	return k.runErr
}

// Stop stops the bridge as SIGTERM stops the service: it stops pulling,
// lets in-flight attempts finish within shutdown_timeout, settles them and
// returns. Safe to call more than once; t.Cleanup calls it too.
func (k *Bridge) Stop(t testing.TB) {
	t.Helper()
	if err := k.stop(); err != nil {
		t.Fatalf("jetbridgetest: %v", err)
	}
}

// Config is the bridge's validated configuration, defaults applied.
func (k *Bridge) Config() *config.Config { return k.cfg }

// Readiness is nil while the bridge is ready (connected, streams and
// consumers in place), else the reason it is not: what /readyz says.
func (k *Bridge) Readiness() error { return k.b.Readiness() }

// Logs are the bridge's JSON log lines so far (debug level and up).
func (k *Bridge) Logs() string { return k.logs.String() }

// Settlements returns every settlement so far, in the order the bridge
// made them: one per JetStream delivery it settled (delivered, redelivery
// scheduled, dead-lettered, duplicate skipped; see bridge.Settled).
func (k *Bridge) Settlements() []bridge.Settled { return k.settled.all() }

// final reports whether an outcome ends a message's life on a route.
func final(outcome bridge.Outcome) bool { return outcome != bridge.OutcomeRedeliveryScheduled }

// WaitSettled waits until at least n settlements have one of outcomes (any
// outcome when none are given) and returns those settlements in order.
// After Timeout it fails the test, listing the settlements so far.
func (k *Bridge) WaitSettled(t testing.TB, n int, outcomes ...bridge.Outcome) []bridge.Settled {
	t.Helper()
	match := func(s bridge.Settled) bool { return len(outcomes) == 0 || slices.Contains(outcomes, s.Outcome) }
	what := fmt.Sprintf("%d settlements by the bridge", n)
	if len(outcomes) > 0 {
		names := make([]string, len(outcomes))
		for i, o := range outcomes {
			names[i] = string(o)
		}
		what = fmt.Sprintf("%d settlements %s by the bridge", n, strings.Join(names, " or "))
	}
	got := k.wait(t, what, func(all []bridge.Settled) bool {
		c := 0
		for _, s := range all {
			if match(s) {
				c++
			}
		}
		return c >= n
	})
	return slices.DeleteFunc(got, func(s bridge.Settled) bool { return !match(s) })
}

// WaitEvent waits for the final settlement of event id on any route
// (delivered, dead-lettered or duplicate skipped; a scheduled redelivery
// is not final) and returns it. After Timeout it fails the test, listing
// the settlements so far.
func (k *Bridge) WaitEvent(t testing.TB, id string) bridge.Settled {
	t.Helper()
	is := func(s bridge.Settled) bool { return s.EventID == id && final(s.Outcome) }
	got := k.wait(t, "final settlement of event "+id+" by the bridge", func(all []bridge.Settled) bool { return slices.ContainsFunc(all, is) })
	return got[slices.IndexFunc(got, is)]
}

func (k *Bridge) wait(t testing.TB, what string, cond func([]bridge.Settled) bool) []bridge.Settled {
	t.Helper()
	return k.settled.wait(t, k.timeout.get(), what, cond, describeSettled)
}

// describeSettled lists settlements for a failure message.
func describeSettled(all []bridge.Settled) string {
	return list(all, "settlements", func(s bridge.Settled) string {
		line := fmt.Sprintf("route=%s seq=%d event=%q delivery=%d %s", s.Route, s.Seq, s.EventID, s.Delivered, s.Outcome)
		if s.Reason != "" {
			line += " reason=" + string(s.Reason)
		}
		if s.Err != nil {
			line += fmt.Sprintf(" error=%q", s.Err.Error())
		}
		return line
	})
}

// WaitQuiet waits until every route has nothing left to do (an ordered
// route: its partitioned copy is empty and caught up; otherwise its consumer):
// nothing pending and nothing delivered but unsettled (a scheduled
// redelivery counts as unsettled). After Timeout it fails the test with
// the consumers' counts.
func (k *Bridge) WaitQuiet(t testing.TB) {
	t.Helper()
	timeout := k.timeout.get()
	err := natstest.Poll(timeout, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		for _, r := range k.cfg.Routes {
			if r.Ordering != nil {
				if err := orderedQuiet(ctx, k.js, k.cfg.Stream.Name, r.Name, r.Subjects); err != nil {
					return err
				}
				continue
			}
			c, err := k.js.Consumer(ctx, k.cfg.Stream.Name, r.Name)
			if err != nil {
				return fmt.Errorf("consumer %s/%s: %w", k.cfg.Stream.Name, r.Name, err)
			}
			if i := c.CachedInfo(); i.NumPending != 0 || i.NumAckPending != 0 {
				return fmt.Errorf("route %s: %d pending, %d delivered but unsettled (%d redelivered)",
					r.Name, i.NumPending, i.NumAckPending, i.NumRedelivered)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("jetbridgetest: bridge not quiet within %s: %v", timeout, err)
	}
}

// orderedQuiet says whether an ordered route has nothing left to do: its
// partitioned copy (a work queue: a settled message leaves it) is empty and
// has taken in as many messages as the stream holds on the route's
// subjects. (The copy's own lag is as last reported by the server, which
// has not heard of a message published a moment ago.) A copy started
// after the stream's first messages (a route switched to ordering) never
// catches up with that count: WaitQuiet then times out.
func orderedQuiet(ctx context.Context, js jetstream.JetStream, stream, route string, filters []string) error {
	name := config.CopyStream(stream, route)
	s, err := js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("route %s: copy %s: %w", route, name, err)
	}
	i := s.CachedInfo()
	if i.State.Msgs != 0 {
		return fmt.Errorf("route %s: %d messages unsettled in its copy %s", route, i.State.Msgs, name)
	}
	src, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("route %s: stream %s: %w", route, stream, err)
	}
	stored := map[string]uint64{}
	for _, f := range filters {
		si, err := src.Info(ctx, jetstream.WithSubjectFilter(f))
		if err != nil {
			return fmt.Errorf("route %s: stream %s: %w", route, stream, err)
		}
		for subj, n := range si.State.Subjects {
			stored[subj] = n
		}
	}
	var want uint64
	for _, n := range stored {
		want += n
	}
	if i.State.LastSeq < want {
		return fmt.Errorf("route %s: its copy %s took in %d of the %d messages on its subjects", route, name, i.State.LastSeq, want)
	}
	return nil
}

// DeadLetters returns every dead letter on the configuration's dead-letter
// stream, in stream order, decoded (reason, failure, status, event id,
// original subject and sequence...) and with its payload.
func (k *Bridge) DeadLetters(t testing.TB) []deadletter.Message {
	t.Helper()
	d, err := k.deadLetters()
	if err != nil {
		t.Fatalf("jetbridgetest: dead letters: %v", err)
	}
	return d
}

func (k *Bridge) deadLetters() ([]deadletter.Message, error) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return deadletter.Open(k.js, k.cfg).List(ctx, deadletter.Filter{}, true)
}

// WaitDeadLetters waits until the dead-letter stream holds at least n dead
// letters and returns them all. After Timeout it fails the test.
func (k *Bridge) WaitDeadLetters(t testing.TB, n int) []deadletter.Message {
	t.Helper()
	var got []deadletter.Message
	timeout := k.timeout.get()
	err := natstest.Poll(timeout, func() error {
		d, err := k.deadLetters()
		if err != nil {
			return err
		}
		got = d
		if len(d) < n {
			return fmt.Errorf("%d dead letters", len(d))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("jetbridgetest: want %d dead letters within %s: %v; %s", n, timeout, err, describeSettled(k.Settlements()))
	}
	return got
}

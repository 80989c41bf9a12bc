package deadletter_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/natstest"
)

// settleWait bounds a wait for settlements.
const settleWait = 15 * time.Second

// harness runs one real Bridge against its own embedded JetStream server,
// so that the dead letters the tests read are the ones the bridge stored,
// and records every settlement.
type harness struct {
	t    testing.TB
	nc   *nats.Conn
	js   jetstream.JetStream
	cfg  *config.Config
	logs *natstest.Buffer

	mu      sync.Mutex
	settled []bridge.Settled
}

// testConfig loads a YAML configuration (fmt-formatted with args) through
// config.Load, so tests use the real defaults and validation.
func testConfig(t testing.TB, yaml string, args ...any) *config.Config {
	t.Helper()
	cfg, err := config.Load(fmt.Appendf(nil, yaml, args...), "test.yaml")
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg
}

// startBridge runs a bridge on cfg on a fresh embedded server until the
// test ends.
func startBridge(t testing.TB, cfg *config.Config) *harness {
	t.Helper()
	srv := natstest.Start(t)
	nc, js := natstest.Connect(t, srv.URL())
	h := &harness{t: t, nc: nc, js: js, cfg: cfg, logs: &natstest.Buffer{}}
	b, err := bridge.New(cfg, js, bridge.Options{
		Logger: zerolog.New(h.logs).Level(zerolog.DebugLevel),
		OnSettle: func(s bridge.Settled) {
			h.mu.Lock()
			h.settled = append(h.settled, s)
			h.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatalf("bridge: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	select {
	case <-b.Ready():
	case err := <-done:
		cancel()
		t.Fatalf("Run: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("Run did not return within 30s of cancel")
		}
		if t.Failed() || os.Getenv("JETBRIDGE_TEST_LOGS") != "" {
			t.Logf("bridge logs:\n%s", h.logs.String())
		}
	})
	return h
}

// publish stores one event with the given headers (Nats-Msg-Id from id)
// and returns its sequence.
func (h *harness) publish(subject, id string, data []byte, hdr map[string]string) uint64 {
	h.t.Helper()
	msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	if id != "" {
		msg.Header.Set(jetstream.MsgIDHeader, id)
	}
	for k, v := range hdr {
		msg.Header.Set(k, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ack, err := h.js.PublishMsg(ctx, msg)
	if err != nil {
		h.t.Fatalf("publish %s: %v", subject, err)
	}
	return ack.Sequence
}

func (h *harness) outcomes() []bridge.Settled {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]bridge.Settled(nil), h.settled...)
}

// waitOutcomes waits until n settlements that keep accepts (all when nil)
// were recorded, or timeout passes, and returns those it has.
func (h *harness) waitOutcomes(n int, timeout time.Duration, keep func(bridge.Settled) bool) []bridge.Settled {
	var got []bridge.Settled
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

// outcomeIs keeps the settlements of outcome o (a bridge.Outcome* constant).
func outcomeIs(o any) func(bridge.Settled) bool {
	return func(s bridge.Settled) bool { return any(s.Outcome) == o }
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

// deadLetters reads every message of the dead-letter stream, straight
// from the stream (not through the package under test).
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

// quietErr is quiet for checks that negative controls run too: it
// returns an error instead of failing the test.
func quietErr(h *harness, route string, timeout time.Duration) error {
	return natstest.Poll(timeout, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c, err := h.js.Consumer(ctx, h.cfg.Stream.Name, route)
		if err != nil {
			return err
		}
		info := c.CachedInfo()
		if info.NumPending != 0 || info.NumAckPending != 0 {
			return fmt.Errorf("consumer %s: NumPending=%d NumAckPending=%d", route, info.NumPending, info.NumAckPending)
		}
		return nil
	})
}

// expectBroken runs check against a deliberately broken variant and
// fails unless the check catches it: a negative control, showing that the
// test can fail.
func expectBroken(t *testing.T, name string, check func(t testing.TB) error) {
	t.Helper()
	t.Run("negative control: "+name, func(t *testing.T) {
		if err := check(t); err == nil {
			t.Fatalf("the check passed against a deliberately broken replay (%s): it cannot catch that break", name)
		} else {
			t.Logf("caught, as it should: %v", err)
		}
	})
}

package natstest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// pollInterval is how often Eventually re-checks its condition.
const pollInterval = 10 * time.Millisecond

// Connect connects to url and returns the connection and a JetStream
// handle; the connection is closed in t.Cleanup. By default the client
// reconnects forever every 20 ms without jitter, so it follows Restart
// quickly; opts are applied after these defaults and can override them.
func Connect(t testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	all := append([]nats.Option{
		nats.Name("natstest"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(20 * time.Millisecond),
		nats.ReconnectJitter(0, 0),
	}, opts...)
	nc, err := nats.Connect(url, all...)
	if err != nil {
		t.Fatalf("natstest: connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: jetstream.New: %v", err)
	}
	return nc, js
}

// Eventually calls cond about every 10 ms until it returns nil. If timeout
// passes first it fails the test with t.Fatalf and cond's last error. It
// must be called from the test goroutine.
func Eventually(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	if err := Poll(timeout, cond); err != nil {
		t.Fatalf("natstest: condition not met within %s: %v", timeout, err)
	}
}

// Poll calls cond about every 10 ms until it returns nil, and returns nil.
// If timeout passes first it returns cond's last error (after one last
// look, so a condition that became true meanwhile is not a failure).
// Unlike Eventually it does not fail the test, so callers word their own
// failure.
func Poll(timeout time.Duration, cond func() error) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			return cond()
		}
	}
}

// WaitQuiet waits until the durable consumer has nothing left to do:
// NumPending == 0 and NumAckPending == 0. It fails the test after timeout.
func WaitQuiet(t testing.TB, js jetstream.JetStream, stream, consumer string, timeout time.Duration) {
	t.Helper()
	Eventually(t, timeout, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c, err := js.Consumer(ctx, stream, consumer)
		if err != nil {
			return fmt.Errorf("consumer %s/%s: %w", stream, consumer, err)
		}
		info := c.CachedInfo() // fresh: js.Consumer just fetched it
		if info.NumPending != 0 || info.NumAckPending != 0 {
			return fmt.Errorf("consumer %s/%s not quiet: NumPending=%d NumAckPending=%d (redelivered %d, ack floor stream seq %d)",
				stream, consumer, info.NumPending, info.NumAckPending, info.NumRedelivered, info.AckFloor.Stream)
		}
		return nil
	})
}

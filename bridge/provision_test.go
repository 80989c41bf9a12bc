package bridge

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sotercare/jetbridge/internal/sinktest"
)

// A bridge that provisions streams which already match writes nothing:
// replicas starting together must not update a stream while another one
// creates its consumer on it (nats-server v2.15 races there). A changed
// setting is still applied, with exactly one update.
func TestProvisionLeavesMatchingStreamsAlone(t *testing.T) {
	sink := sinktest.New(t, sinktest.Always(200))
	cfg := testConfig(t, `
destinations:
  d: {url: %s}
routes:
  - {name: r, subjects: ["events.>"], destination: d}
`, sink.URL())
	h := startBridge(t, cfg, faults{})

	countUpdates := func(t *testing.T, provision func(context.Context) error) int {
		t.Helper()
		sub, err := h.nc.SubscribeSync("$JS.API.STREAM.UPDATE.>")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := h.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := provision(ctx); err != nil {
			t.Fatal(err)
		}
		// Every update request was published before provision returned
		// (each waits for its reply), so a flush is enough to see them.
		if err := h.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			if _, err := sub.NextMsg(0); err != nil {
				if err != nats.ErrTimeout {
					t.Fatal(err)
				}
				return n
			}
			n++
		}
	}

	if n := countUpdates(t, h.b.Provision); n != 0 {
		t.Fatalf("provisioning matching streams sent %d stream updates, want 0", n)
	}
	changed := sourceStreamConfig(cfg.Stream)
	changed.MaxAge += time.Hour
	if n := countUpdates(t, func(ctx context.Context) error { return ensureStream(ctx, h.js, changed) }); n != 1 {
		t.Fatalf("a changed max_age sent %d stream updates, want 1", n)
	}
	s, err := h.js.Stream(context.Background(), cfg.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.MaxAge; got != changed.MaxAge {
		t.Fatalf("max_age after update = %s, want %s", got, changed.MaxAge)
	}

	// Negative control: updating unconditionally, as CreateOrUpdateStream
	// alone does, is caught by the same count.
	always := func(ctx context.Context) error {
		_, err := h.js.CreateOrUpdateStream(ctx, changed)
		return err
	}
	if n := countUpdates(t, always); n != 1 {
		t.Fatalf("negative control: an unconditional update sent %d stream updates, want 1", n)
	}
}

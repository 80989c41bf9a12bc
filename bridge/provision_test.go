package bridge

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/natstest"
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
	if n := countUpdates(t, func(ctx context.Context) error { return ensureStream(ctx, h.js, changed, noWarn) }); n != 1 {
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

// noWarn ignores the differences ensureStream reports.
func noWarn(what, key, have, want string) {}

// Provisioning applies what the configuration states and nothing else: the
// limits an operator put on the streams and on the idempotency bucket
// (max_bytes, max_msgs, max_msg_size, discard new, a max value size)
// survive a restart of the bridge with a changed configuration, which
// changes the settings the configuration states (the source stream's
// max_age, the bucket's TTL). A storage type the bridge cannot change is
// reported, not fought.
func TestProvisionKeepsOperatorLimits(t *testing.T) {
	sink := sinktest.New(t, sinktest.Always(200))
	const yaml = `
stream: {max_age: %s}
idempotency: {bucket: DELIVERED, ttl: %s}
destinations:
  d: {url: %s}
routes:
  - {name: r, subjects: ["events.>"], destination: d, idempotency: true}
`
	srv := natstest.Start(t)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	provisioned(t, testConfig(t, yaml, "168h", "24h", sink.URL()), js, faults{})

	// The operator tightens every stream and the bucket.
	limit := func(name string) {
		t.Helper()
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		c := s.CachedInfo().Config
		c.MaxBytes, c.MaxMsgs, c.MaxMsgSize, c.Discard = 1<<20, 5000, 4096, jetstream.DiscardNew
		if _, err := js.UpdateStream(ctx, c); err != nil {
			t.Fatalf("operator's update of %s: %v", name, err)
		}
	}
	streams := []string{"EVENTS", "EVENTS_DLQ", "KV_DELIVERED"}
	for _, name := range streams {
		limit(name)
	}
	check := func(t testing.TB, js jetstream.JetStream) error {
		var errs []error
		for _, name := range streams {
			s, err := js.Stream(ctx, name)
			if err != nil {
				return err
			}
			c := s.CachedInfo().Config
			if c.MaxBytes != 1<<20 || c.MaxMsgs != 5000 || c.MaxMsgSize != 4096 || c.Discard != jetstream.DiscardNew {
				errs = append(errs, fmt.Errorf("%s: max_bytes %d, max_msgs %d, max_msg_size %d, discard %s: the operator's limits were changed", name, c.MaxBytes, c.MaxMsgs, c.MaxMsgSize, c.Discard))
			}
		}
		return errors.Join(errs...)
	}

	// A restart with a changed max_age and TTL applies them and keeps the
	// limits.
	provisioned(t, testConfig(t, yaml, "72h", "12h", sink.URL()), js, faults{})
	if err := check(t, js); err != nil {
		t.Error(err)
	}
	s, err := js.Stream(ctx, "EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.MaxAge; got != 72*time.Hour {
		t.Errorf("EVENTS max_age = %s, want 72h (the configuration's)", got)
	}
	kv, err := js.KeyValue(ctx, "DELIVERED")
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.TTL() != 12*time.Hour {
		t.Errorf("bucket TTL = %s, want 12h (the configuration's)", st.TTL())
	}

	// Negative control: provisioning the bucket as the bridge did before,
	// with CreateOrUpdateKeyValue, loses the operator's limits, and the
	// same check says so.
	expectBroken(t, "bucket provisioned with CreateOrUpdateKeyValue", func(t testing.TB) error {
		if _, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "DELIVERED", TTL: 6 * time.Hour, History: 1}); err != nil {
			return nil // not broken: the control failed to run
		}
		return check(t, js)
	})

	// Negative control: updating a stream with the bridge's whole
	// configuration, as ensureStream did before, loses them too.
	limit("KV_DELIVERED")
	expectBroken(t, "stream updated with the bridge's whole configuration", func(t testing.TB) error {
		if _, err := js.UpdateStream(ctx, sourceStreamConfig(testConfig(t, yaml, "48h", "12h", sink.URL()).Stream)); err != nil {
			return nil // not broken: the control failed to run
		}
		return check(t, js)
	})

	// A storage the bridge would not choose is reported and left alone.
	var warned []string
	mem := sourceStreamConfig(testConfig(t, yaml, "72h", "12h", sink.URL()).Stream)
	mem.Name, mem.Subjects, mem.Storage = "MEM", []string{"mem.>"}, jetstream.MemoryStorage
	if _, err := js.CreateStream(ctx, mem); err != nil {
		t.Fatal(err)
	}
	mem.Storage = jetstream.FileStorage
	err = ensureStream(ctx, js, mem, func(what, key, have, want string) { warned = append(warned, what+" "+key+" "+have+" "+want) })
	if err != nil || len(warned) != 1 || warned[0] != "stream MEM storage Memory File" {
		t.Errorf("a memory stream: err %v, warnings %q, want one: stream MEM storage Memory File", err, warned)
	}
}

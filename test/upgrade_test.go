package test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/jetbridgetest"
)

// upgradeBase is the commit before idempotency records said what they were
// for (subject and payload digest): the previous release, whose binary the
// rolling-upgrade test runs beside the current one.
const upgradeBase = "3c1a7b2fc9edbb13a370d46e6d9e90a029160a6e"

// oldBridgeBinary builds cmd/bridge from upgradeBase (git archive of the
// commit into a temporary directory, go build there). Outside a git
// checkout the test is skipped; a checkout without the commit (a shallow
// clone) fails it.
func oldBridgeBinary(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if err := exec.Command("git", "-C", root, "rev-parse", "--git-dir").Run(); err != nil {
		t.Skipf("not a git checkout (%v): the previous release's binary cannot be built", err)
	}
	if out, err := exec.Command("git", "-C", root, "cat-file", "-e", upgradeBase+"^{commit}").CombinedOutput(); err != nil {
		t.Fatalf("commit %s (the previous release) is missing from the checkout: fetch the history (%v) %s", upgradeBase, err, out)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	tarball := filepath.Join(dir, "src.tar")
	if out, err := exec.Command("git", "-C", root, "archive", "--format=tar", "-o", tarball, upgradeBase).CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", upgradeBase, err, out)
	}
	if out, err := exec.Command("tar", "-xf", tarball, "-C", src).CombinedOutput(); err != nil {
		t.Fatalf("tar: %v\n%s", err, out)
	}
	bin := filepath.Join(dir, "bridge-old")
	start := time.Now()
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/bridge")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build of %s: %v\n%s", upgradeBase, err, out)
	}
	t.Logf("built the previous release's bridge (%s) in %s", upgradeBase[:12], time.Since(start).Round(time.Millisecond))
	return bin
}

// runBridgeBinary is runBridge with a given binary.
func runBridgeBinary(t *testing.T, bin, cfgPath string) *proc {
	t.Helper()
	p := &proc{admin: freeAddr(t)}
	p.child = startBridge(t, bin, []string{"run", "--config", cfgPath},
		"JETBRIDGE_ADMIN_LISTEN="+p.admin, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	p.waitReadyz(t, http.StatusOK, readyTimeout)
	return p
}

// publishEventID stores one event with an Event-Id header and no
// Nats-Msg-Id, so the same event id can be stored again (a normal PubAck).
func publishEventID(t testing.TB, js jetstream.JetStream, subject, id, payload string) {
	t.Helper()
	msg := nats.NewMsg(subject)
	msg.Data = []byte(payload)
	msg.Header.Set("Event-Id", id)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatalf("publish %s: %v", subject, err)
	}
}

// waitMetric waits until the bridge's series name{labels} equals want.
func waitMetric(t *testing.T, p *proc, want float64, name string, labels ...string) {
	t.Helper()
	natstest.Eventually(t, countTimeout, func() error {
		if got := p.metric(t, name, labels...); got != want {
			return fmt.Errorf("%s%v = %v, want %v", name, labels, got, want)
		}
		return nil
	})
}

// A rolling upgrade on one idempotency bucket, with the previous release's
// binary (built from upgradeBase) and the current one as child processes on
// one server:
//
//  1. the old binary delivers 10 events: its records have no content;
//  2. the new binary, alone, skips the same 10 event ids as duplicates
//     (5 with the same content, 5 on another subject: an old record counts
//     as a duplicate whatever the content, as before), then delivers 10 new
//     events and records them with their content;
//  3. old and new run side by side: the new one holds event flight-1 in
//     flight (its request answered after 8 s, max_in_flight 1), and the old
//     one meets the new in-flight record for a second copy of flight-1, and
//     the new done records for the 10 new events published again: it reads
//     them all (waits for the in-flight one, then skips it) as 11
//     duplicates, with no idempotency error.
//
// Every event id reaches the destination exactly once, no message is
// redelivered, and the consumer settles after exactly one delivery per
// stored message.
func TestRollingUpgradeSharesIdempotencyRecords(t *testing.T) {
	oldBin := oldBridgeBinary(t)
	srv := jetbridgetest.NewServer(t)
	_, js := srv.Connect(t)
	sink := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(jetbridgetest.ByEvent(func(id string, attempt int) jetbridgetest.Response {
		if id == "flight-1" && attempt == 1 {
			return jetbridgetest.Response{Delay: 8 * time.Second}
		}
		return jetbridgetest.Response{}
	})))
	sc := scenario{natsURL: srv.URL(), sinkURL: sink.URL(), maxInFlight: 16, ackWait: 2 * time.Second, shutdownTimeout: 5 * time.Second, idempotency: true}
	oldCfg := sc.file(t)
	sc.maxInFlight = 1
	newCfg := sc.file(t)
	dup := []string{`route="r"`, `outcome="duplicate_skipped"`}
	delivered := []string{`route="r"`, `outcome="delivered"`}
	stored := 0
	pub := func(subject, id, payload string) {
		t.Helper()
		publishEventID(t, js, subject, id, payload)
		stored++
	}

	// 1. The previous release delivers 10 events.
	old1 := runBridgeBinary(t, oldBin, oldCfg)
	for i := range 10 {
		pub("events.info.upgrade", fmt.Sprintf("old-%d", i), fmt.Sprintf(`{"i":%d}`, i))
	}
	waitCount(t, sink, 10, countTimeout)
	natstest.WaitQuiet(t, js, streamName, routeName, quietTimeout)
	old1.term(t)
	<-old1.done

	// 2. The new release alone: the old records are duplicates.
	newer := runBridgeBinary(t, bridgeBinary(t), newCfg)
	for i := range 10 {
		subject := "events.info.upgrade"
		if i%2 == 1 {
			subject = "events.critical.upgrade"
		}
		pub(subject, fmt.Sprintf("old-%d", i), fmt.Sprintf(`{"i":%d}`, i))
	}
	waitMetric(t, newer, 10, "bridge_messages_total", dup...)
	for i := range 10 {
		pub("events.info.upgrade", fmt.Sprintf("new-%d", i), fmt.Sprintf(`{"i":%d}`, i))
	}
	waitMetric(t, newer, 10, "bridge_messages_total", delivered...)
	natstest.WaitQuiet(t, js, streamName, routeName, quietTimeout)

	// 3. Side by side: the new one holds flight-1 in flight.
	pub("events.info.upgrade", "flight-1", `{"f":1}`)
	natstest.Eventually(t, countTimeout, func() error {
		if n := len(sink.Events("flight-1")); n != 1 {
			return fmt.Errorf("%d requests for flight-1, want the new bridge's one (held 8 s)", n)
		}
		return nil
	})
	pub("events.info.upgrade", "flight-1", `{"f":1}`) // the new bridge has no free slot
	old2 := runBridgeBinary(t, oldBin, oldCfg)
	for i := range 10 {
		pub("events.info.upgrade", fmt.Sprintf("new-%d", i), fmt.Sprintf(`{"i":%d}`, i))
	}
	waitMetric(t, old2, 11, "bridge_messages_total", dup...)
	waitMetric(t, newer, 11, "bridge_messages_total", delivered...)
	natstest.WaitQuiet(t, js, streamName, routeName, quietTimeout)

	for _, c := range []struct {
		p      *proc
		name   string
		labels []string
		want   float64
	}{
		{newer, "bridge_messages_total", dup, 10},
		{newer, "bridge_messages_total", delivered, 11},
		{newer, "bridge_messages_total", []string{`route="r"`, `outcome="dead_lettered"`}, 0},
		{newer, "bridge_messages_total", []string{`route="r"`, `outcome="redelivery_scheduled"`}, 0},
		{newer, "bridge_idempotency_errors_total", []string{`route="r"`}, 0},
		{newer, "bridge_idempotency_conflicts_total", []string{`route="r"`, `part="subject"`}, 0},
		{old2, "bridge_messages_total", dup, 11},
		{old2, "bridge_messages_total", delivered, 0},
		{old2, "bridge_messages_total", []string{`route="r"`, `outcome="dead_lettered"`}, 0},
		{old2, "bridge_messages_total", []string{`route="r"`, `outcome="redelivery_scheduled"`}, 0},
		{old2, "bridge_idempotency_errors_total", []string{`route="r"`}, 0},
	} {
		if got := c.p.metric(t, c.name, c.labels...); got != c.want {
			t.Errorf("%s bridge: %s%v = %v, want %v", map[*proc]string{newer: "new", old2: "old"}[c.p], c.name, c.labels, got, c.want)
		}
	}
	reqs := sink.Requests()
	if len(reqs) != 21 {
		t.Errorf("%d requests, want 21 (10 old, 10 new, flight-1)", len(reqs))
	}
	for id, rs := range byEventID(reqs) {
		if len(rs) != 1 {
			t.Errorf("event %s sent %d times, want once", id, len(rs))
		}
	}
	info := consumerInfo(t, js)
	if info.NumRedelivered != 0 || info.Delivered.Consumer != uint64(stored) || stored != 42 {
		t.Errorf("consumer: %d redelivered, %d deliveries of %d stored messages; want none redelivered, one delivery each (42)",
			info.NumRedelivered, info.Delivered.Consumer, stored)
	}
}

// oldSkipsNewRecord delivers event k-1 with the new binary, stops it,
// then publishes k-1 again to the previous release's binary and checks that
// it reads the new binary's record as a duplicate: skipped, nothing sent,
// no idempotency error, the consumer quiet. rewrite, when set, replaces the
// record in the bucket before the old binary reads it (the negative
// control's seam).
func oldSkipsNewRecord(t *testing.T, oldBin string, rewrite func(old []byte) []byte) error {
	srv := jetbridgetest.NewServer(t)
	_, js := srv.Connect(t)
	sink := jetbridgetest.NewReceiver(t)
	sc := scenario{natsURL: srv.URL(), sinkURL: sink.URL(), maxInFlight: 4, ackWait: 2 * time.Second, shutdownTimeout: 5 * time.Second, idempotency: true}
	cfg := sc.file(t)
	newer := runBridgeBinary(t, bridgeBinary(t), cfg)
	publishEventID(t, js, "events.info.upgrade", "k-1", `{"k":1}`)
	waitCount(t, sink, 1, countTimeout)
	natstest.WaitQuiet(t, js, streamName, routeName, quietTimeout)
	newer.term(t)
	<-newer.done
	if rewrite != nil {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		kv, err := js.KeyValue(ctx, "EVENTS_DELIVERED")
		if err != nil {
			t.Fatal(err)
		}
		keys, err := kv.Keys(ctx)
		if err != nil || len(keys) != 1 {
			t.Fatalf("bucket keys %v, %v; want the one record", keys, err)
		}
		e, err := kv.Get(ctx, keys[0])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, keys[0], rewrite(e.Value())); err != nil {
			t.Fatal(err)
		}
	}
	old := runBridgeBinary(t, oldBin, cfg)
	publishEventID(t, js, "events.info.upgrade", "k-1", `{"k":1}`)
	var last error
	settled := func() error {
		if n := old.metric(t, "bridge_messages_total", `route="r"`, `outcome="duplicate_skipped"`); n != 1 {
			return fmt.Errorf("old bridge: %v duplicates skipped, want 1", n)
		}
		if n := old.metric(t, "bridge_idempotency_errors_total", `route="r"`); n != 0 {
			return fmt.Errorf("old bridge: %v idempotency errors, want 0", n)
		}
		if info := consumerInfo(t, js); info.NumPending != 0 || info.NumAckPending != 0 || info.NumRedelivered != 0 {
			return fmt.Errorf("consumer not settled: %d pending, %d ack pending, %d redelivered", info.NumPending, info.NumAckPending, info.NumRedelivered)
		}
		if n := sink.Count(); n != 1 {
			return fmt.Errorf("%d requests, want 1", n)
		}
		return nil
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if last = settled(); last == nil || time.Now().After(deadline) {
			return last
		}
		<-time.After(50 * time.Millisecond)
	}
}

// The previous release reads a record the new one wrote (done, with the
// subject and digest) as a duplicate. Negative control: the same record
// encoded naively, with the subject and digest as extra fields, is
// unreadable to the previous release, which then holds the message
// (idempotency errors, never settled): the check catches it.
func TestPreviousReleaseReadsNewRecords(t *testing.T) {
	oldBin := oldBridgeBinary(t)
	if err := oldSkipsNewRecord(t, oldBin, nil); err != nil {
		t.Fatal(err)
	}
	t.Run("negative control: subject and digest as extra fields", func(t *testing.T) {
		err := oldSkipsNewRecord(t, oldBin, func(rec []byte) []byte {
			f := strings.Fields(string(rec)) // done EVENTS/<digest>/<subject> seq delivered
			c := strings.SplitN(f[1], "/", 3)
			if len(f) != 4 || len(c) != 3 {
				t.Fatalf("the new binary's record has %d fields, want 4 with the content in the second", len(f))
			}
			return []byte(strings.Join([]string{f[0], c[0], f[2], f[3], c[2], c[1]}, " "))
		})
		if err == nil {
			t.Fatal("the check passed with a record the previous release cannot read: it cannot catch that break")
		}
		t.Logf("caught, as it should: %v", err)
	})
}

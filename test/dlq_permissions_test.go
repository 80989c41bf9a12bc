package test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/jetbridgetest"
	"github.com/sotercare/jetbridge/producer"
)

// The nats-server permissions of
// docs/security.md#who-may-write-dead-letters (testdata/dlq-permissions.conf):
// the bridge's user provisions, dead-letters and replays; a producer
// publishes events but can plant no dead letter and call no JetStream API.
func TestDLQPermissionsSnippet(t *testing.T) {
	snippet, err := os.ReadFile(filepath.Join("testdata", "dlq-permissions.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkDLQPermissions(t, string(snippet)); err != nil {
		t.Fatal(err)
	}
	// Negative control: a producer allowed to publish anywhere plants a
	// dead letter, and the check says so.
	loose := strings.Replace(string(snippet), `allow: ["events.>"]`, `allow: [">"]`, 1)
	loose = strings.Replace(loose, `deny: ["dlq.>", "$JS.>", "$KV.>", "$O.>", "$SYS.>"]`, `deny: []`, 1)
	if loose == string(snippet) {
		t.Fatal("the negative control did not change the snippet")
	}
	t.Run("negative control: producer may publish anywhere", func(t *testing.T) {
		if err := checkDLQPermissions(t, loose); err == nil {
			t.Fatal("the check passed with a producer allowed to publish on the dead-letter prefix")
		} else {
			t.Logf("caught, as it should: %v", err)
		}
	})
}

// checkDLQPermissions starts a nats-server with the authorization block
// and a bridge as its bridge user, and returns what the permissions got
// wrong.
func checkDLQPermissions(t *testing.T, authorization string) error {
	t.Setenv("BRIDGE_NATS_PASSWORD", "bridge-pass-0123456789")
	t.Setenv("PRODUCER_NATS_PASSWORD", "producer-pass-0123456789")
	dir := t.TempDir()
	conf := filepath.Join(dir, "nats.conf")
	body := fmt.Sprintf("listen: \"127.0.0.1:-1\"\njetstream {store_dir: %q}\n%s", filepath.Join(dir, "js"), authorization)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		return err
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		return err
	}
	opts.NoSigs, opts.NoLog = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		return err
	}
	go ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		return errors.New("nats-server not ready")
	}
	url := ns.ClientURL()

	// The bridge, as its user, rejecting everything at first.
	sink := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(jetbridgetest.Always(400)))
	cfg, err := config.Load([]byte(fmt.Sprintf(`
nats: {url: %q, user: bridge, password: "${BRIDGE_NATS_PASSWORD}"}
admin: {listen: ""}
destinations:
  d: {url: %q}
routes:
  - {name: ra, subjects: ["events.>"], destination: d}
`, url, sink.URL())), "bridge.yaml")
	if err != nil {
		return err
	}
	bnc, err := nats.Connect(url, nats.UserInfo("bridge", os.Getenv("BRIDGE_NATS_PASSWORD")))
	if err != nil {
		return fmt.Errorf("bridge user: %w", err)
	}
	t.Cleanup(bnc.Close)
	bjs, err := jetstream.New(bnc)
	if err != nil {
		return err
	}
	b, err := bridge.New(cfg, bjs, bridge.Options{})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-b.Ready():
	case err := <-done:
		return fmt.Errorf("bridge as its user: %w", err)
	}

	// A producer, whose refused publishes come back as async errors.
	violations := make(chan string, 16)
	pnc, err := nats.Connect(url, nats.UserInfo("producer", os.Getenv("PRODUCER_NATS_PASSWORD")),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				violations <- err.Error()
			}
		}))
	if err != nil {
		return fmt.Errorf("producer user: %w", err)
	}
	t.Cleanup(pnc.Close)
	pjs, err := jetstream.New(pnc)
	if err != nil {
		return err
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer wcancel()

	// The producer publishes an event; the bridge dead-letters it.
	if _, err := producer.NewPublisher(pjs, "events").Publish(wctx, producer.Event{ID: "ev-1", Type: "order.created", Payload: []byte(`{}`)}); err != nil {
		return fmt.Errorf("producer publishing an event: %w", err)
	}
	q := deadletter.Open(bjs, cfg)
	var first []deadletter.Message
	natstest.Eventually(t, 20*time.Second, func() error {
		first, err = q.List(wctx, deadletter.Filter{}, false)
		if err != nil || len(first) != 1 {
			return fmt.Errorf("%d dead letters (%v), want 1", len(first), err)
		}
		return nil
	})

	// The producer tries to plant a dead letter and to call the JetStream
	// API: each is refused by the server (an async permissions violation),
	// or, if it was not, its effect shows: the check stops there.
	msgs := func(stream string) uint64 {
		s, err := bjs.Stream(wctx, stream)
		if err != nil {
			return 0
		}
		info, err := s.Info(wctx)
		if err != nil {
			return 0
		}
		return info.State.Msgs
	}
	attempts := []struct {
		subject  string
		happened func() bool // the publish took effect
	}{
		{"dlq.ra.$JS.API.STREAM.PURGE.EVENTS", func() bool { return msgs(cfg.DeadLetter.Stream) > 1 }},
		{"$JS.API.STREAM.PURGE.EVENTS", func() bool { return msgs(cfg.Stream.Name) == 0 }},
		{"$KV.EVENTS_DELIVERED.ra.b.x", func() bool { return false }},
	}
	for _, a := range attempts {
		msg := &nats.Msg{Subject: a.subject, Header: nats.Header{deadletter.HeaderOriginalSubject: {"$JS.API.STREAM.PURGE.EVENTS"}, deadletter.HeaderOriginalStream: {"EVENTS"}}, Data: []byte(`{}`)}
		if err := pnc.PublishMsg(msg); err != nil {
			return err
		}
		if err := pnc.Flush(); err != nil {
			return err
		}
		var verdict error
		natstest.Eventually(t, 20*time.Second, func() error {
			select {
			case v := <-violations:
				if !strings.Contains(v, a.subject) {
					verdict = fmt.Errorf("publish on %s: violation %q names another subject", a.subject, v)
				}
				return nil
			default:
			}
			if a.happened() {
				verdict = fmt.Errorf("the producer published on %s and it took effect", a.subject)
				return nil
			}
			return fmt.Errorf("no permissions violation for %s yet", a.subject)
		})
		if verdict != nil {
			return verdict
		}
	}
	var errs []error
	// the dead-letter stream still holds the bridge's one dead letter
	if l, err := q.List(wctx, deadletter.Filter{}, false); err != nil || len(l) != 1 {
		errs = append(errs, fmt.Errorf("%d dead letters after the producer's attempt (%v), want 1", len(l), err))
	}

	// The bridge's user replays the real one once the destination is fixed.
	sink.SetScript(jetbridgetest.Always(200))
	before := sink.Count()
	for _, d := range first {
		if _, err := q.Replay(wctx, d.Seq, false); err != nil {
			errs = append(errs, fmt.Errorf("replay as the bridge user: %w", err))
		}
	}
	if len(errs) == 0 {
		waitCount(t, sink, before+1, 20*time.Second)
	}
	return errors.Join(errs...)
}

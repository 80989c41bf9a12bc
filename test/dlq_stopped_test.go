package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/jetbridgetest"
	"github.com/sotercare/jetbridge/producer"
)

// Dead letters while the bridge is down (docs/operating.md#dead-letters-while-the-bridge-is-down)
// and bridge run --no-delivery (docs/operating.md#forensics-without-delivery),
// with the real binary on real embedded stores.

// embeddedYAML is a configuration with the embedded JetStream on listen
// and store, one route r from events.> to dest (one at a time, so dead
// letters are stored in publishing order), the admin endpoints on
// $JETBRIDGE_ADMIN_LISTEN.
func embeddedYAML(t *testing.T, listen, store, dest string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bridge.yaml")
	yaml := fmt.Sprintf(`nats:
  url: ""
  embedded: {listen: "%s", store_dir: "%s"}
admin:
  listen: ${JETBRIDGE_ADMIN_LISTEN:-}
log: {format: json}
destinations:
  sink:
    url: %s/events
    circuit_breaker: {enabled: false}
routes:
  - name: r
    subjects: ["events.>"]
    destination: sink
    max_in_flight: 1
`, listen, store, dest)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// noNATSEnv keeps the test's $NATS_URL and $BRIDGE_CONFIG from the
// commands: the configuration's embedded store is what they must use.
var noNATSEnv = []string{"NATS_URL=", "BRIDGE_CONFIG="}

// bridgeCmd runs the bridge binary to completion (a dlq command).
func bridgeCmd(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bridgeBinary(t), args...)
	cmd.Env = append(os.Environ(), noNATSEnv...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("bridge %q: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// publishTo publishes events with the given ids on subject events.<id>
// through the embedded server's listener.
func publishTo(t *testing.T, url string, ids ...string) {
	t.Helper()
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second), nats.NoReconnect())
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	pub := producer.NewPublisher(js, "events")
	for _, id := range ids {
		if _, err := pub.Publish(ctx, producer.Event{ID: id, Subject: "events." + id, Payload: []byte(`{"n":1}`)}); err != nil {
			t.Fatalf("publish %s: %v", id, err)
		}
	}
}

// stop sends SIGTERM and wants exit 0 after the drain.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	p.term(t)
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("bridge exited %d after SIGTERM, want 0", code)
	}
}

// routeState is route r as /status shows it.
type routeState struct {
	Pending    uint64     `json:"pending"`
	AckPending int        `json:"ack_pending"`
	InFlight   int64      `json:"in_flight"`
	Delivering bool       `json:"delivering"`
	CheckedAt  *time.Time `json:"checked_at"`
}

// status is GET /status: the ready field and route r.
func (p *proc) status(t *testing.T) (ready string, r routeState, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.admin+"/status", nil)
	if err != nil {
		return "", r, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", r, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", r, err
	}
	var st struct {
		Ready  string       `json:"ready"`
		Routes []routeState `json:"routes"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &st) != nil || len(st.Routes) != 1 {
		return "", r, fmt.Errorf("/status: %d %s", resp.StatusCode, body)
	}
	return st.Ready, st.Routes[0], nil
}

// readyzBody is GET /readyz's status code and body.
func (p *proc) readyzBody(t *testing.T) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + p.admin + "/readyz")
	if err != nil {
		t.Fatalf("GET /readyz: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// waitIdle waits until the bridge's route has nothing pending, in ack
// pending or in flight, as /status reports it.
func (p *proc) waitIdle(t *testing.T) {
	t.Helper()
	natstest.Eventually(t, quietTimeout, func() error {
		p.failIfExited(t)
		_, r, err := p.status(t)
		if err != nil {
			return err
		}
		if r.CheckedAt == nil || r.Pending != 0 || r.AckPending != 0 || r.InFlight != 0 {
			return fmt.Errorf("route r: %+v", r)
		}
		return nil
	})
}

// times are the RFC 3339 times of dlq output, which vary per run.
var times = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)

// The dead letters of a stopped embedded bridge are listed, shown,
// replayed and purged by the dlq commands on its store (locked, served
// without a listener); the bridge started again delivers the replayed
// events and only those. While another process holds the store and
// nothing answers on nats.embedded.listen, the commands refuse and change
// nothing; once it has ended (the control), the same commands work.
func TestDLQOnAStoppedEmbeddedBridge(t *testing.T) {
	// Given a bridge on its embedded store that dead-lettered e1, e2, e3
	// (the destination answered 400), then stopped.
	rec := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(jetbridgetest.Always(400)))
	listen, store := freeAddr(t), filepath.Join(t.TempDir(), "store")
	cfg := embeddedYAML(t, listen, store, rec.URL())
	b := runBridge(t, cfg, noNATSEnv...)
	publishTo(t, "nats://"+listen, "e1", "e2", "e3")
	natstest.Eventually(t, countTimeout, func() error {
		if n := b.metric(t, "bridge_dead_letters_total", `route="r"`, `reason="rejected"`); n != 3 {
			return fmt.Errorf("%v dead letters", n)
		}
		return nil
	})
	wantList := "SEQ  ROUTE  REASON    FAILURE            STATUS  EVENT ID  SUBJECT    FAILED AT\n" +
		"1    r      rejected  downstream-status  400     e1        events.e1  T\n" +
		"2    r      rejected  downstream-status  400     e2        events.e2  T\n" +
		"3    r      rejected  downstream-status  400     e3        events.e3  T\n"
	// (while it runs, the commands go through its listener, as before)
	if out, errOut, code := bridgeCmd(t, "dlq", "list", "--config", cfg); code != 0 || times.ReplaceAllString(out, "T") != wantList {
		t.Fatalf("dlq list with the bridge running: exit %d\n%s%s", code, out, errOut)
	}
	b.stop(t)
	if rec.Count() != 3 {
		t.Fatalf("the receiver got %d requests, want 3", rec.Count())
	}

	// When another process holds the store and serves no listener on
	// nats.embedded.listen (an embedded server on another port).
	holder := natstest.StartChild(t, "TestChildNatsd", natsdRole,
		"JETBRIDGE_TEST_STORE_DIR="+store, "JETBRIDGE_TEST_NATS_LISTEN="+freeAddr(t))
	natstest.Eventually(t, readyTimeout, func() error {
		if !strings.Contains(holder.Output(), "natsd ready") {
			return errors.New("the store holder is not ready")
		}
		return nil
	})
	refusal := fmt.Sprintf("bridge: nats.embedded.store_dir %s is in use by process %d, and nats.embedded.listen %s does not answer: "+
		"nats: no servers available for connection (dial tcp %s: connect: connection refused); "+
		"a store is never opened by two processes at once: try again once that process (a bridge starting or stopping, "+
		"or another bridge dlq command) serves the store or has ended, or point --server at the NATS server of the bridge that holds it\n",
		store, holder.PID(), listen, listen)
	// Then each command refuses, exit 1, and changes nothing.
	for _, args := range [][]string{{"list"}, {"show", "1"}, {"replay", "--all"}, {"purge", "--all"}} {
		out, errOut, code := bridgeCmd(t, append(append([]string{"dlq"}, args...), "--config", cfg)...)
		if code != 1 || out != "" || errOut != refusal {
			t.Errorf("dlq %s while process %d holds the store: exit %d\nstdout: %q\nstderr: %q\nwant stderr: %q", args[0], holder.PID(), code, out, errOut, refusal)
		}
	}
	if err := holder.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := holder.Wait(30 * time.Second); err != nil || code != 0 {
		t.Fatalf("the store holder: exit %d, %v", code, err)
	}

	// When the store is free (the control: the same commands work), while
	// something else holds the listen address: the private server binds
	// no port, so it cannot collide.
	squatter, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, code := bridgeCmd(t, "dlq", "list", "--config", cfg)
	if code != 0 || errOut != "" || times.ReplaceAllString(out, "T") != wantList {
		t.Fatalf("dlq list on the stopped bridge's store: exit %d\n%s%s\nwant:\n%s", code, out, errOut, wantList)
	}
	out, errOut, code = bridgeCmd(t, "dlq", "show", "--config", cfg, "2")
	wantShow := `dead letter 2 on EVENTS_DLQ
subject: dlq.r.events.e2
stored:  T

headers:
  Bridge-Deliveries: 1
  Bridge-Destination: sink
  Bridge-Error: destination sink answered 400
  Bridge-Failed-At: T
  Bridge-Failure: downstream-status
  Bridge-Original-Sequence: 2
  Bridge-Original-Stream: EVENTS
  Bridge-Original-Subject: events.e2
  Bridge-Reason: rejected
  Bridge-Route: r
  Bridge-Status: 400
  Content-Type: application/json
  Event-Id: e2
  Event-Severity: INFO
  Event-Type: events.e2
  Nats-Expected-Stream: EVENTS_DLQ
  Nats-Msg-Id: dlq:r:EVENTS:2

payload: 7 bytes (--payload to print it)
`
	if code != 0 || errOut != "" || times.ReplaceAllString(out, "T") != wantShow {
		t.Fatalf("dlq show 2: exit %d\n%s%s\nwant:\n%s", code, out, errOut, wantShow)
	}
	out, errOut, code = bridgeCmd(t, "dlq", "replay", "--config", cfg, "1", "3")
	wantReplay := "replayed dlq_seq=1 id=e1 -> events.e1 stream=EVENTS seq=4\n" +
		"replayed dlq_seq=3 id=e3 -> events.e3 stream=EVENTS seq=5\n" +
		"replayed 2, duplicates 0, kept 0, failed 0\n"
	if code != 0 || out != wantReplay {
		t.Fatalf("dlq replay 1 3: exit %d\n%s%s\nwant:\n%s", code, out, errOut, wantReplay)
	}
	out, errOut, code = bridgeCmd(t, "dlq", "purge", "--config", cfg, "2")
	if want := "deleted 2\ndeleted 1, failed 0\n"; code != 0 || out != want {
		t.Fatalf("dlq purge 2: exit %d\n%s%s\nwant:\n%s", code, out, errOut, want)
	}
	out, errOut, code = bridgeCmd(t, "dlq", "list", "--config", cfg)
	if code != 0 || out != "" || errOut != "no dead letters\n" {
		t.Fatalf("dlq list after replay and purge: exit %d\n%s%s", code, out, errOut)
	}
	if err := squatter.Close(); err != nil {
		t.Fatal(err)
	}

	// Then the bridge, started again with the destination fixed, delivers
	// the two replayed events, once each, and nothing else.
	rec.SetScript(jetbridgetest.Always(200))
	b = runBridge(t, cfg, noNATSEnv...)
	rec.WaitCount(t, 5)
	b.waitIdle(t)
	if n := b.metric(t, "bridge_messages_total", `route="r"`, `outcome="delivered"`); n != 2 {
		t.Errorf("bridge_messages_total{outcome=delivered} = %v, want 2", n)
	}
	b.stop(t)
	got := eventIDs(rec.Requests()[3:])
	slices.Sort(got)
	if !slices.Equal(got, []string{"e1", "e3"}) {
		t.Errorf("delivered after the restart: %q, want e1 and e3 once each", got)
	}
}

// bridge run --no-delivery serves the embedded server, /status and the
// dlq commands but delivers nothing while events are pending; a normal
// start afterwards (the control) delivers them all, once each.
func TestRunNoDelivery(t *testing.T) {
	rec := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(jetbridgetest.Always(200)))
	listen := freeAddr(t)
	cfg := embeddedYAML(t, listen, filepath.Join(t.TempDir(), "store"), rec.URL())

	// Given a bridge started with --no-delivery
	p := &proc{admin: freeAddr(t)}
	p.child = startBridge(t, bridgeBinary(t), []string{"run", "--no-delivery", "--config", cfg},
		append(slices.Clone(noNATSEnv), "JETBRIDGE_ADMIN_LISTEN="+p.admin)...)
	const notDelivering = "not delivering (no-delivery mode): streams and consumers are provisioned, nothing is pulled"
	natstest.Eventually(t, readyTimeout, func() error {
		p.failIfExited(t)
		ready, r, err := p.status(t)
		if err != nil {
			return err
		}
		if ready != notDelivering || r.Delivering || r.CheckedAt == nil {
			return fmt.Errorf("/status ready %q, route %+v", ready, r)
		}
		return nil
	})
	var rz map[string]string
	if code, body := p.readyzBody(t); code != http.StatusServiceUnavailable || json.Unmarshal([]byte(body), &rz) != nil ||
		!maps.Equal(rz, map[string]string{"status": "not ready", "reason": notDelivering}) {
		t.Errorf("/readyz: %d %s", code, body)
	}

	// When events are published to its embedded server
	published := time.Now()
	ids := []string{"n1", "n2", "n3", "n4", "n5"}
	publishTo(t, "nats://"+listen, ids...)

	// Then they stay pending, nothing pulled, for readiness rounds that
	// began well after the publish (a delivering bridge empties the
	// route within them: the control below)
	natstest.Eventually(t, countTimeout, func() error {
		p.failIfExited(t)
		_, r, err := p.status(t)
		if err != nil {
			return err
		}
		if r.CheckedAt == nil || r.CheckedAt.Before(published.Add(3*time.Second)) {
			return fmt.Errorf("route r checked at %v", r.CheckedAt)
		}
		if r.Pending != 5 || r.AckPending != 0 || r.InFlight != 0 || r.Delivering {
			t.Fatalf("route r with --no-delivery: %+v, want 5 pending, nothing pulled", r)
		}
		return nil
	})
	if n := rec.Count(); n != 0 {
		t.Fatalf("the receiver got %d requests with --no-delivery, want 0", n)
	}
	// and the dlq commands work through its listener
	if out, errOut, code := bridgeCmd(t, "dlq", "list", "--config", cfg); code != 0 || out != "" || errOut != "no dead letters\n" {
		t.Errorf("dlq list beside --no-delivery: exit %d\n%s%s", code, out, errOut)
	}
	p.stop(t)
	if n := rec.Count(); n != 0 {
		t.Fatalf("the receiver got %d requests with --no-delivery, want 0", n)
	}

	// Control: a normal start delivers every pending event once.
	b := runBridge(t, cfg, noNATSEnv...)
	rec.WaitCount(t, 5)
	b.waitIdle(t)
	b.stop(t)
	got := eventIDs(rec.Requests())
	slices.Sort(got)
	if !slices.Equal(got, ids) {
		t.Errorf("delivered by the normal start: %q, want %q once each", got, ids)
	}
}
